//! Runs the lab demo binary (it lives in the lab crate, which depends on the agent).

use anyhow::Result;

use crate::cargo;

pub fn run() -> Result<()> {
    cargo(&["build", "--package", "lb-agent", "--bin", "lb-agent"])?;
    cargo(&["run", "--quiet", "--package", "lb-lab", "--bin", "lab-demo"])
}
