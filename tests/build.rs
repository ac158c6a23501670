//! Which optional tools this machine has, as cfgs. A test that needs a missing one is compiled
//! as ignored, with the reason, so the test summary counts it as skipped, never as passed:
//!
//! - `no_kustomize`: no kubectl of 1.21 or later, whose kustomize renders components. Debian 12
//!   carries only `kubernetes-client` 1.20, so `cargo xtask setup` does not install it.
//! - `no_image`: `cargo xtask test` found that podman cannot run here and skipped the image
//!   (its reason is in `target/image/skipped`).

use std::{path::Path, process::Command};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_kustomize)");
    println!("cargo::rustc-check-cfg=cfg(no_image)");
    // A missing path counts as changed: the probes run again until the tool is there.
    println!("cargo::rerun-if-env-changed=PATH");
    for path in ["/usr/bin/kubectl", "/usr/local/bin/kubectl"] {
        println!("cargo::rerun-if-changed={path}");
    }
    match kubectl_minor() {
        Some(minor) if minor >= 21 => {}
        found => {
            let found = found.map_or("no kubectl".to_owned(), |minor| format!("kubectl 1.{minor}"));
            println!(
                "cargo::warning=the kustomize tests are skipped: {found}, and they need kubectl 1.21 or later"
            );
            println!("cargo::rustc-cfg=no_kustomize");
        }
    }
    let marker = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/image/skipped");
    println!("cargo::rerun-if-changed={}", marker.display());
    if let Ok(reason) = std::fs::read_to_string(&marker) {
        println!("cargo::warning=the image test is skipped: {}", reason.trim());
        println!("cargo::rustc-cfg=no_image");
    }
}

/// kubectl's client minor version, from `kubectl version --client -o json` (`"minor": "30"`,
/// or `"30+"` from some distributions).
fn kubectl_minor() -> Option<u32> {
    let out = Command::new("kubectl").args(["version", "--client", "-o", "json"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("\"minor\"")?;
    let value = text[at + 7..].split('"').nth(1)?;
    value.trim_end_matches('+').parse().ok()
}
