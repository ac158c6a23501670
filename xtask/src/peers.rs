//! The benchmarks' peer programs that are built from source: Katran's balancer, the XDP
//! program of Facebook's L4 load balancer, for the DSR comparison (`bench dataplane --dsr`).
//!
//! Its BPF sources are vendored, unmodified, in `tests/peers/katran` (GPL-2.0, see the
//! README there): this machine reaches no code host, and the program needs nothing of Katran's
//! userspace (folly, gRPC), whose map setup `lb_lab::katran` does. `cargo xtask test` builds it
//! too, for the `katran_peer` test.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{output, run, workspace_root};

/// Builds Katran's `balancer.bpf.c` as Katran's own `Makefile-bpf` does (clang, `-O2`, the
/// same defines: no optional feature), and returns the object's path.
pub fn katran() -> Result<PathBuf> {
    let root = workspace_root();
    let source = root.join("tests/peers/katran");
    let out = root.join("target/peers");
    // glibc's headers pick their 32-bit stubs for any target that is not the host's; the BPF
    // program uses none of them.
    let stubs = out.join("include/gnu");
    fs::create_dir_all(&stubs).with_context(|| format!("creating {}", stubs.display()))?;
    fs::write(stubs.join("stubs-32.h"), "")?;
    let multiarch = output(Command::new("gcc").arg("-print-multiarch"))
        .map(|m| m.trim().to_owned())
        .unwrap_or_else(|_| "x86_64-linux-gnu".to_owned());
    let object = out.join("katran-balancer.o");
    run(Command::new("clang")
        .arg("-I")
        .arg(&source)
        .arg("-I")
        .arg(out.join("include"))
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-D__KERNEL__", "-Wno-unused-value", "-Wno-pointer-sign"])
        .args(["-Wno-compare-distinct-pointer-types", "-O2", "-g", "-target", "bpf", "-c"])
        .arg(source.join("katran/lib/bpf/balancer.bpf.c"))
        .arg("-o")
        .arg(&object))
    .context("building Katran's balancer with clang (`cargo xtask setup` installs clang)")?;
    Ok(object)
}
