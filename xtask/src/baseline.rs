//! An earlier revision's release agent, for benchmarks that run it beside this code: checked
//! out in a worktree of its own under `target/baselines/` and built there with its own xtask
//! (its BPF object and its agent), once per commit.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{output, run, workspace_root};

/// Builds `rev`'s release `lb-agent` and returns its path.
pub fn build(rev: &str) -> Result<PathBuf> {
    let root = workspace_root();
    let commit = output(
        Command::new("git").args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")]).current_dir(&root),
    )
    .with_context(|| format!("--against {rev}: not a revision of this repository"))?;
    let dir = root.join("target/baselines").join(&commit[..12]);
    if !dir.join("Cargo.toml").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        run(Command::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(&dir)
            .arg(&commit)
            .current_dir(&root))?;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for args in
        [&["xtask", "build-ebpf"][..], &["build", "--release", "--package", "lb-agent", "--bin", "lb-agent"]]
    {
        run(Command::new(&cargo).args(args).current_dir(&dir).env_remove("CARGO_TARGET_DIR"))?;
    }
    Ok(dir.join("target/release/lb-agent"))
}
