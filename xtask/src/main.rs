//! `cargo xtask`: everything that is not a plain `cargo build` of a host crate.
//!
//! - `setup`: installs the Debian packages, the nightly `rust-src` and a bpf-linker built
//!   against nightly's own LLVM. Unattended and idempotent.
//! - `build-ebpf`: builds the XDP object that `lb-agent` embeds.
//! - `test`: setup, BPF build, lints, the import-circle check (`modules`) and the book with
//!   its links (`docs`), then every test (unit, BPF fixtures, netns labs).
//! - `demo`: a three-node lab: a VRRP election, TCP over DSR and full NAT and UDP to a VIP,
//!   and the connections carrying on through the owner's hard failure.
//! - `image`: the container image, built offline from scratch with podman.

mod baseline;
mod demo;
mod docs;
mod ebpf;
mod files;
mod image;
mod modules;
mod peers;
mod setup;
mod sizes;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "lb-agent's build, setup, test and demo tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything a fresh machine needs (apt packages, nightly rust-src, bpf-linker).
    Setup,
    /// Build the BPF object embedded by lb-agent.
    BuildEbpf,
    /// Setup, BPF build, then all tests. This is what CI runs.
    Test {
        /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Build a three-node lab and show a VIP's election, its connections and their survival
    /// of the owner's hard failure.
    Demo,
    /// The import-circle and size checks alone (part of `test`).
    Modules,
    /// Build the book (`docs/`, mdBook) into `target/book`, failing on a broken internal link
    /// (part of `test`).
    Docs,
    /// Build the container image offline (`FROM scratch`, podman), tagged with the version.
    Image,
    /// Benchmarks against the peer measured in the same run; writes its tables into the book (docs/src/benchmarks.md).
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// VRRP failover outage and CPU: keepalived against lb-agent, same lab, same run.
    Failover {
        /// One interval and 100 VIPs: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
        /// Runs of each case (keepalived and lb-agent alternating); the table gives medians.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// One case alone, as `ipv6/10/hard` (family, advert interval in ms, `hard` or
        /// `graceful`), without the CPU measurement; `cpu`: the CPU measurement alone.
        #[arg(long)]
        case: Option<String>,
    },
    /// Data path: delivered pps and marginal cost per packet against kube-proxy's iptables
    /// and nftables modes, plus TCP requests/s and p99 with wrk; same lab, same run.
    Dataplane {
        /// One short run per mode: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
        /// Distinct UDP flows (source ports) the generator cycles through.
        #[arg(long, default_value_t = 1)]
        flows: u32,
        /// Skip the TCP (wrk) part.
        #[arg(long)]
        no_tcp: bool,
        /// Over IPv6, against ip6tables and `ip6` nftables (UDP only).
        #[arg(long)]
        ipv6: bool,
        /// Only the XDP modes (the ceiling, lb-agent, the bare DNATs), for work on the program.
        #[arg(long)]
        xdp_only: bool,
        /// DSR to a backend on another node: lb-agent against Katran's balancer, built from
        /// its source (`tests/peers/katran`); IPv4, no kernel modes, no TCP part.
        #[arg(long, conflicts_with = "ipv6")]
        dsr: bool,
    },
    /// The XDP program's own time on each service path of each family (BPF_PROG_TEST_RUN),
    /// this code's object against earlier revisions' in the same run, and IPv6's time over
    /// IPv4's; prints tables, writes none.
    Program {
        /// Distinct flows (client ports) each path cycles through, 1 to 60,000.
        #[arg(long, default_value_t = 1)]
        flows: u32,
        /// A git revision whose object runs beside this code's (e.g. `HEAD~1`); repeatable.
        #[arg(long)]
        against: Vec<String>,
        /// Only this path, in both families: `local`, `full-nat`, `dsr` or `reply`.
        #[arg(long)]
        path: Option<String>,
    },
    /// VRRP under CPU pressure: N agents in one spread group on this machine, cold start and
    /// after disturbances (an agent stopped for 300 ms, a CPU hog), settle times, CPU and
    /// transitions; the code at `--against` and this code alternate run by run.
    VrrpLoad {
        /// Two runs of 4 nodes × 100 VIPs: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
        #[arg(long, default_value_t = 8)]
        nodes: u32,
        #[arg(long, default_value_t = 1000)]
        vips: u32,
        /// Advertisement interval, ms.
        #[arg(long, default_value_t = 10)]
        interval_ms: u32,
        /// Runs of each binary, alternating.
        #[arg(long, default_value_t = 10)]
        runs: u32,
        /// Only the cold start and the settled CPU (no SIGSTOP, no CPU hog).
        #[arg(long)]
        no_disturb: bool,
        /// A git revision to build and run beside this code (e.g. `HEAD~3`, a landed commit).
        #[arg(long)]
        against: Option<String>,
    },
    /// Routed fabric (BGP, ECMP): spread over the nodes, connections through a graceful stop,
    /// an upgrade, a SIGKILL and a node's hard loss, and a bgpOwner failover; DSR against full
    /// NAT (the peers' behaviour) in the same run.
    Bgp {
        /// 100 connections and a 300-connection spread: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
    },
    /// The control half's cost at rest: API requests and agent memory of three `--kubernetes`
    /// agents with 1,000 and 10,000 Services, against the lab API server.
    Control {
        /// 1,000 Services only: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
        /// One size only (the book's table is left as it is).
        #[arg(long)]
        only: Option<u32>,
    },
    /// Control path at cluster scale: cold start, endpoint changes, bursts and memory for
    /// 1,000 to 20,000 Services, against kube-proxy's iptables and nftables shapes.
    Scale {
        /// 1,000 Services, one repetition: a smoke run of the benchmark itself.
        #[arg(long)]
        quick: bool,
        /// Only this many Services (one row of the table).
        #[arg(long)]
        only: Option<u32>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::BuildEbpf => {
            setup::check_bpf_toolchain()?;
            ebpf::build()
        }
        Task::Test { cargo_test_args } => test(&cargo_test_args),
        Task::Image => {
            setup::run()?;
            ebpf::build()?;
            image::build().map(|_| ())
        }
        Task::Demo => {
            setup::run()?;
            ebpf::build()?;
            demo::run()
        }
        Task::Modules => modules::check(&workspace_root()).and_then(|()| sizes::check(&workspace_root())),
        Task::Docs => docs::build(&workspace_root()),
        Task::Bench { which: Bench::Failover { quick, repeat, case } } => {
            prepare_bench()?;
            let repeat = repeat.to_string();
            let mut args = vec!["--repeat", repeat.as_str()];
            if quick {
                args.push("--quick");
            }
            if let Some(case) = &case {
                args.extend(["--case", case.as_str()]);
            }
            let table = (!quick && case.is_none()).then_some("failover");
            run_bench("bench-failover", &args, table)
        }
        Task::Bench {
            which: Bench::VrrpLoad { quick, nodes, vips, interval_ms, runs, no_disturb, against },
        } => {
            prepare_bench()?;
            let baseline = against.as_deref().map(baseline::build).transpose()?;
            let (nodes, vips, runs) = if quick { (4, 100, 2) } else { (nodes, vips, runs) };
            let [nodes, vips, interval, runs] = [nodes, vips, interval_ms, runs].map(|n| n.to_string());
            let mut args =
                vec!["--nodes", &nodes, "--vips", &vips, "--interval-ms", &interval, "--runs", &runs];
            if no_disturb {
                args.push("--no-disturb");
            }
            let label = against.map(|rev| format!("{rev} (baseline)"));
            if let (Some(bin), Some(label)) = (&baseline, &label) {
                args.extend(["--baseline", bin.to_str().context("a UTF-8 path")?, "--baseline-label", label]);
            }
            run_bench("bench-vrrp-load", &args, (!quick).then_some("vrrp-load"))
        }
        Task::Bench { which: Bench::Bgp { quick } } => {
            prepare_bench()?;
            cargo(&["build", "--release", "--package", "lb-lab", "--bin", "hold-connections"])?;
            let args: &[&str] = if quick { &["--connections", "100", "--spread", "300"] } else { &[] };
            run_bench("bench-bgp", args, (!quick).then_some("bgp"))
        }
        Task::Bench { which: Bench::Control { quick, only } } => {
            prepare_bench()?;
            run_sized_bench("bench-control", "control", quick, only)
        }
        Task::Bench { which: Bench::Scale { quick, only } } => {
            prepare_bench()?;
            run_sized_bench("bench-scale", "scale", quick, only)
        }
        Task::Bench { which: Bench::Program { flows, against, path } } => {
            let objects = against
                .iter()
                .map(|rev| Ok(format!("{rev}={}", baseline::build_object(rev)?.display())))
                .collect::<Result<Vec<_>>>()?;
            prepare_bench()?;
            let flows = flows.to_string();
            let mut args = vec!["--flows", flows.as_str()];
            for object in &objects {
                args.extend(["--against", object.as_str()]);
            }
            if let Some(path) = &path {
                args.extend(["--path", path.as_str()]);
            }
            run_bench("bench-program", &args, None)
        }
        Task::Bench { which: Bench::Dataplane { quick, flows, no_tcp, ipv6, xdp_only, dsr } } => {
            prepare_bench()?;
            cargo(&["build", "--release", "--package", "lb-lab", "--bin", "bench-http"])?;
            let katran = if dsr { Some(peers::katran()?.to_string_lossy().into_owned()) } else { None };
            let flows = flows.to_string();
            let mut args = vec!["--flows", flows.as_str()];
            if let Some(object) = &katran {
                args.extend(["--dsr", object.as_str()]);
            }
            if quick {
                args.push("--quick");
            }
            if no_tcp {
                args.push("--no-tcp");
            }
            if ipv6 {
                args.push("--ipv6");
            }
            if xdp_only {
                args.push("--xdp-only");
            }
            let family = if ipv6 { "ipv6" } else { "ipv4" };
            // A run without the kernel modes has tables of its own (the book keeps one, at a
            // million flows, where conntrack would need resizing to compare).
            let only = if dsr {
                "-dsr"
            } else if xdp_only {
                "-xdp-only"
            } else {
                ""
            };
            let table = format!("dataplane-{family}-{flows}-flows{only}");
            let written = !quick && (!(xdp_only || dsr) || docs::has_bench_table(&workspace_root(), &table));
            run_bench("bench-dataplane", &args, written.then_some(table.as_str()))
        }
    }
}

/// Runs the lab's benchmark binary `bin` (release) with `args`, its output shown as it comes;
/// with `table`, a full run's tables are then written into the book's benchmarks page under
/// that name (see `docs::write_bench_table`).
fn run_bench(bin: &str, args: &[&str], table: Option<&str>) -> Result<()> {
    let mut all = vec!["run", "--release", "--quiet", "--package", "lb-lab", "--bin", bin, "--"];
    all.extend_from_slice(args);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(&all).current_dir(workspace_root()).stdout(std::process::Stdio::piped());
    eprintln!("+ {}", describe(&command));
    let mut child = command.spawn().context("starting the benchmark")?;
    let mut printed = String::new();
    let stdout = child.stdout.take().context("the benchmark's output")?;
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line?;
        println!("{line}");
        printed.push_str(&line);
        printed.push('\n');
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{bin} failed: {status}");
    }
    match table {
        Some(name) => docs::write_bench_table(&workspace_root(), name, &printed),
        None => Ok(()),
    }
}

/// A benchmark run at several sizes: `--quick` (its smallest) or `--only N` leave the book's
/// `table` as it is.
fn run_sized_bench(bin: &str, table: &str, quick: bool, only: Option<u32>) -> Result<()> {
    let only = only.map(|n| n.to_string());
    let mut args = Vec::new();
    if quick {
        args.push("--quick");
    }
    if let Some(n) = &only {
        args.extend(["--only", n]);
    }
    run_bench(bin, &args, (!quick && only.is_none()).then_some(table))
}

/// Everything a benchmark needs: packages, the BPF object, the release agent.
fn prepare_bench() -> Result<()> {
    setup::run()?;
    ebpf::build()?;
    cargo(&["build", "--release", "--package", "lb-agent", "--bin", "lb-agent"])
}

fn test(extra: &[String]) -> Result<()> {
    setup::run()?;
    ebpf::build()?;
    // The DSR benchmark's peer, which the `katran_peer` test checks.
    peers::katran()?;
    // The lab tests start the agent binary, so build it before the tests need it.
    cargo(&["build", "--package", "lb-agent", "--bin", "lb-agent"])?;
    // The image test runs the binary taken out of the image.
    image::build_or_skip()?;
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
    modules::check(&workspace_root())?;
    sizes::check(&workspace_root())?;
    docs::build(&workspace_root())?;
    // Build every test, then flush the build to disk before any runs: a few GB of artefacts
    // being written back stood CPUs of this VM still for 150–700 ms at a time (measured; see the lab's
    // `freeze` module), and the timing-sensitive labs would measure that instead of the agent.
    cargo(&["test", "--no-run"])?;
    run(&mut Command::new("sync"))?;
    let mut args = vec!["test", "--no-fail-fast"];
    args.extend(extra.iter().map(String::as_str));
    cargo(&args)
}

/// Runs the host cargo (the stable toolchain that runs xtask) in the workspace root.
fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args(args).current_dir(workspace_root()))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", describe(cmd));
    let status = cmd.status().with_context(|| format!("could not start {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", describe(cmd));
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("could not start {}", describe(cmd)))?;
    if !out.status.success() {
        bail!("{} failed: {}\n{}", describe(cmd), out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").into()
}
