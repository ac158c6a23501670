//! An earlier revision's release agent or BPF object, for benchmarks that run it beside this
//! code: checked out in a worktree of its own under `target/baselines/` and built there with
//! its own xtask, once per commit.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{output, run, workspace_root};

/// Builds `rev`'s release `lb-agent` (and its BPF object) and returns its path.
pub fn build(rev: &str) -> Result<PathBuf> {
    let dir = worktree(rev)?;
    build_object_in(&dir)?;
    cargo_in(&dir, &["build", "--release", "--package", "lb-agent", "--bin", "lb-agent"])?;
    Ok(dir.join("target/release/lb-agent"))
}

/// Builds `rev`'s BPF object alone and returns its path.
pub fn build_object(rev: &str) -> Result<PathBuf> {
    build_object_in(&worktree(rev)?)
}

/// Builds the BPF object of the worktree at `dir` and returns its path.
fn build_object_in(dir: &std::path::Path) -> Result<PathBuf> {
    cargo_in(dir, &["xtask", "build-ebpf"])?;
    Ok(dir.join("target/bpf/bpfel-unknown-none/release/lb-ebpf"))
}

/// Runs cargo with `args` in a worktree, with its own target dir.
fn cargo_in(dir: &std::path::Path, args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args(args).current_dir(dir).env_remove("CARGO_TARGET_DIR"))
}

/// `rev`'s worktree, checked out once per commit.
fn worktree(rev: &str) -> Result<PathBuf> {
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
    Ok(dir)
}
