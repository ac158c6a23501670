//! The container image, built offline: `Containerfile.scratch` over a root filesystem holding
//! the release agent and exactly the shared libraries it loads (found with `ldd`), so no
//! registry or base image is needed. `Containerfile` (docker.io bases) stays for users with a
//! registry.
//!
//! `cargo xtask test` builds it too, and `tests/tests/forward_lab.rs` runs the binary and
//! libraries taken back out of the image. Where podman cannot run at all, the step is skipped
//! with the reason, written where that test finds it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cargo, output, run, workspace_root};

/// The image's name; the tag is the workspace version (as kustomize's `images:` sets it).
pub const NAME: &str = "lb-agent";

/// Why the image step was skipped, for the test that runs the image's binary.
pub fn skip_marker() -> PathBuf {
    workspace_root().join("target/image/skipped")
}

/// Builds the image; its reference.
pub fn build() -> Result<String> {
    let reference = format!("{NAME}:{}", env!("CARGO_PKG_VERSION"));
    cargo(&["build", "--release", "--package", "lb-agent", "--bin", "lb-agent"])?;
    let context = workspace_root().join("target/image");
    let rootfs = context.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("clearing {}", rootfs.display()))?;
    }
    let _ = fs::remove_file(skip_marker());
    let binary = workspace_root().join("target/release/lb-agent");
    let staged = rootfs.join("usr/local/bin/lb-agent");
    stage(&binary, &staged)?;
    // Symbols only: the code is the release build's, and the BPF object inside is untouched
    // (it is data in the binary).
    run(Command::new("strip").arg("--strip-all").arg(&staged))?;
    for library in shared_libraries(&binary)? {
        stage(&library, &rootfs.join(library.strip_prefix("/").expect("ldd paths are absolute")))?;
    }
    let containerfile = workspace_root().join("Containerfile.scratch");
    run(Command::new("podman").args([
        "build",
        "--pull=never",
        "--network=none",
        "--file",
        containerfile.to_str().unwrap(),
        "--tag",
        &reference,
        context.to_str().unwrap(),
    ]))?;
    let size: u64 =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &reference]))?
            .parse()
            .context("podman image inspect: a size in bytes")?;
    eprintln!("image {reference}: {:.1} MiB", size as f64 / (1024.0 * 1024.0));
    Ok(reference)
}

/// For `cargo xtask test`: builds the image where podman runs; where it cannot run at all,
/// says so and leaves the reason for the image test. A build that fails with podman working
/// is an error.
pub fn build_or_skip() -> Result<()> {
    let usable = Command::new("podman").args(["info", "--format", "{{.Host.OCIRuntime.Name}}"]).output();
    let reason = match usable {
        Err(e) => Some(format!("podman is not installed ({e})")),
        Ok(out) if !out.status.success() => {
            Some(format!("podman cannot run here: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
        Ok(_) => None,
    };
    if let Some(reason) = reason {
        eprintln!("image: SKIPPED: {reason}");
        let marker = skip_marker();
        fs::create_dir_all(marker.parent().unwrap())?;
        fs::write(&marker, reason)?;
        return Ok(());
    }
    build().map(|_| ())
}

/// The shared objects `binary` loads, the dynamic loader included, as `ldd` resolves them.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let listing = output(Command::new("ldd").arg(binary))?;
    let mut libraries = Vec::new();
    for line in listing.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, `/lib64/ld-linux-x86-64.so.2
        // (0x…)`, or the kernel's `linux-vdso.so.1 (0x…)`, which is no file.
        let path = match line.split_once("=>") {
            Some((_, resolved)) => resolved.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(path) if path.starts_with('/') => libraries.push(PathBuf::from(path)),
            Some("not") | None => bail!("ldd {}: cannot resolve {line:?}", binary.display()),
            Some(_) => {}
        }
    }
    if libraries.is_empty() {
        bail!(
            "ldd {}: no libraries found (a static binary needs no staging; adjust image.rs)",
            binary.display()
        );
    }
    Ok(libraries)
}

/// Copies `from` (following links) to `to`, keeping its mode.
fn stage(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to.parent().unwrap())?;
    fs::copy(from, to).with_context(|| format!("copying {} into the image", from.display()))?;
    Ok(())
}
