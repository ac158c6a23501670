//! Builds `lb-ebpf` for `bpfel-unknown-none` with nightly and bpf-linker.

use std::{env, path::PathBuf, process::Command};

use anyhow::Result;

use crate::{run, setup::tools_dir, workspace_root};

/// A target dir of its own, so the BPF build's flags never invalidate host artifacts.
pub fn target_dir() -> PathBuf {
    workspace_root().join("target/bpf")
}

pub fn build() -> Result<()> {
    let path = env::join_paths(
        std::iter::once(tools_dir().join("bin"))
            .chain(env::split_paths(&env::var_os("PATH").unwrap_or_default())),
    )?;
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--package", "lb-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--target-dir"])
        .arg(target_dir())
        .current_dir(workspace_root())
        .env("PATH", path)
        // BTF in the object lets bpftool and the verifier log name our types. bpf-linker has
        // LLVM expand `memcpy` "in order" by default (loads and stores kept together for JITs
        // that match copy patterns; the x86-64 and arm64 JITs do not), and that mode also
        // stops LLVM expanding a `memset` into stores: each becomes a call of a byte loop,
        // five instructions a byte (zeroing the FIB parameter block took about 330).
        // `tests/tests/bpf_object.rs` checks that the object calls none.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f-Clink-arg=--disable-expand-memcpy-in-order",
        )
        // Set by the outer stable cargo; they must not leak into the nightly build.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO");
    run(&mut cmd)
}
