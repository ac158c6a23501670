//! Points the agent at the BPF object built by `cargo xtask build-ebpf`.
//!
//! The BPF build is not run from here: doing so would rebuild it for every host profile (test,
//! clippy, release). xtask builds it once into `target/bpf`, and this script only tracks it.

use std::path::PathBuf;

fn main() {
    let object = match std::env::var_os("LB_EBPF_OBJECT") {
        Some(path) => PathBuf::from(path),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bpf/bpfel-unknown-none/release/lb-ebpf")
        }
    };
    println!("cargo::rerun-if-env-changed=LB_EBPF_OBJECT");
    println!("cargo::rerun-if-changed={}", object.display());
    if !object.exists() {
        println!(
            "cargo::error=the BPF object {} does not exist: run `cargo xtask build-ebpf` first (see README)",
            object.display()
        );
        return;
    }
    println!("cargo::rustc-env=LB_EBPF_OBJECT={}", object.display());
}
