//! Idempotent machine setup. Each step checks before it acts, so a second run costs seconds.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{output, run as run_cmd};

/// Debian 12 packages the demo, the tests and the benchmarks use: all in Debian itself, so a
/// stock machine sets up. (kubectl is not among them: see [`kustomize_note`].)
const APT_PACKAGES: &[&str] = &[
    "iproute2", // ip netns, veth, bridge
    "arping",   // the lab client's ARP requests
    "ndisc6",   // the lab client's Neighbor Discovery
    "iputils-ping",
    "tcpdump",
    "ethtool",
    "bpftool",
    "keepalived", // a real VRRP peer for interop tests and benchmarks
    "iperf3",
    "wrk",
    "iptables", // kube-proxy baselines
    "nftables",
    "curl",
    "prometheus",      // promtool, for the alerting rules' tests
    "python3-scapy",   // hostile VRRP advertisements crafted by a tool that is not ours
    "podman",          // builds the FROM-scratch image whose binary the image test runs
    "python3-seccomp", // applies the containers' seccomp profile to that binary in the lab
    "frr",             // the routed-fabric lab: a ToR and each node's BGP/BFD speaker
    "bird2",           // a second ToR implementation, so nothing rests on FRR-to-FRR quirks
    "clang",           // builds Katran's balancer, the DSR benchmark's peer, from its C source
];

pub fn run() -> Result<()> {
    apt_packages()?;
    kustomize_note();
    check_bpf_toolchain()
}

/// The tests that render `deploy/` with kustomize need kubectl 1.21 or later (components).
/// Debian 12 carries only `kubernetes-client` 1.20, so setup installs none and says so; those
/// tests are then compiled as ignored (`tests/build.rs`), and the summary counts them skipped.
fn kustomize_note() {
    let version = output(Command::new("kubectl").args(["version", "--client", "-o", "json"]));
    let minor = version.ok().and_then(|json| {
        let at = json.find("\"minor\"")?;
        json[at + 7..].split('"').nth(1)?.trim_end_matches('+').parse::<u32>().ok()
    });
    if minor.is_none_or(|m| m < 21) {
        eprintln!(
            "note: kubectl 1.21 or later is not installed ({}): the two tests that render deploy/ \
             with kustomize will be skipped. Debian 12's kubernetes-client is 1.20, whose kustomize \
             has no components; install kubectl from the Kubernetes project's own packages to run them.",
            minor.map_or("none found".to_owned(), |m| format!("found 1.{m}"))
        );
    }
}

/// The nightly toolchain with `rust-src`, and a bpf-linker built against nightly's own LLVM.
pub fn check_bpf_toolchain() -> Result<()> {
    nightly_rust_src()?;
    bpf_linker()
}

fn apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("Debian packages missing: {}; run setup as root (apt-get)", missing.join(" "));
    }
    eprintln!("installing Debian packages: {}", missing.join(" "));
    let apt =
        |args: &[&str]| run_cmd(Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive"));
    apt(&["update", "-q"])?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(&missing);
    apt(&install)
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|uid| uid == "0")
}

fn nightly_rust_src() -> Result<()> {
    if output(Command::new("rustc").args(["+nightly", "--version"])).is_err() {
        // Fresh machines of this kind ship a nightly; install one only where it is missing.
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let installed =
        output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    }
    Ok(())
}

/// Where bpf-linker and its LLVM links live: stable across runs, never /tmp.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = env::var_os("LB_TOOLS_DIR") {
        return dir.into();
    }
    let home = env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".local/lb-agent-tools")
}

const BPF_LINKER_VERSION: &str = "0.13.0";

const MDBOOK_VERSION: &str = "0.5.4";

/// mdBook, which builds the book under `docs/`: from crates.io into the tools directory (Debian
/// 12 has no package), without its `serve` and `watch` features. Returns its path.
pub fn mdbook() -> Result<PathBuf> {
    let tools = tools_dir();
    let mdbook = tools.join("bin/mdbook");
    let version = output(Command::new(&mdbook).arg("--version")).unwrap_or_default();
    if version.ends_with(&format!("v{MDBOOK_VERSION}")) {
        return Ok(mdbook);
    }
    eprintln!("installing mdbook {MDBOOK_VERSION} (a few minutes, once)");
    run_cmd(
        Command::new("cargo")
            .args(["install", "mdbook", "--version", MDBOOK_VERSION, "--locked", "--force"])
            .args(["--no-default-features", "--features", "search", "--root"])
            .arg(&tools)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO_TARGET_DIR"),
    )?;
    Ok(mdbook)
}

/// bpf-linker must load the same LLVM as the nightly rustc that emits the bitcode. No system
/// LLVM 22 exists here, so it is built against the libLLVM inside nightly's sysroot, and rebuilt
/// whenever that library changes (a stamp records which one it was built for).
fn bpf_linker() -> Result<()> {
    let sysroot = PathBuf::from(output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?);
    let libllvm = find_libllvm(&sysroot.join("lib"))?;
    let tools = tools_dir();
    let stamp_path = tools.join("bpf-linker.stamp");
    let stamp = format!("bpf-linker {BPF_LINKER_VERSION} against {}\n", libllvm.display());
    let linker = tools.join("bin/bpf-linker");
    if linker.exists() && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return Ok(());
    }

    let prefix = tools.join("llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    let file_name = libllvm.file_name().context("libLLVM has a file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(file_name)] {
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    }
    eprintln!("building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)", libllvm.display());
    run_cmd(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked", "--force"])
            .args(["--no-default-features", "--features", "llvm-22", "--root"])
            .arg(&tools)
            .env("LLVM_PREFIX", &prefix)
            // Run the stable cargo, not whatever toolchain invoked xtask.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO_TARGET_DIR"),
    )?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

/// The versioned `libLLVM.so.<major>.<minor>-rust-…` that nightly ships.
fn find_libllvm(lib_dir: &Path) -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && !p.is_symlink())
        })
        .collect();
    found.sort();
    match found.pop() {
        Some(path) => Ok(path),
        None => bail!("no libLLVM.so.* in {}: is the nightly toolchain complete?", lib_dir.display()),
    }
}
