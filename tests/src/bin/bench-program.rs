//! `cargo xtask bench program`: the XDP program's own time on each IPv4 service path, through
//! BPF_PROG_TEST_RUN, for this code's object and for earlier revisions' (`--against REV`), in one
//! run. For work on the program: a change's cost or saving in nanoseconds, without a lab's
//! generator, veths and NAPI thread, whose noise is larger than most changes.
//!
//! Method: node n0 of a two-node lab with a local pod (the program asks the kernel's FIB, so it
//! runs in n0's namespace, neighbours permanent), each object loaded through the verifier with
//! the agent's own map sync of the service fixtures' config (`fixture::SERVICES_CONFIG`): local
//! delivery (UDP :80 to the pod), full NAT (UDP :81 to n1's pod), DSR (TCP :82, IPIP to n1's
//! pod), and full NAT's replies (n1's pod to n0's port). Every
//! flow is sent once per object before timing, so the runs time established flows. Then 40
//! rounds, the objects in rotating order, each running 2,000 single BPF_PROG_TEST_RUNs per path
//! (one packet each, flows in a fixed scattered order); the median and first quartile of each
//! object's 80,000 runs. A single run's time includes the test-run's own fixed cost, given as
//! the `lb_pass` row (a program that only returns).
//!
//! Prints a Markdown table; writes nothing into the book.

use std::{net::Ipv4Addr, path::PathBuf};

use aya::{Ebpf, programs::Xdp};
use lb_agent::dataplane::{EMBEDDED_OBJECT, ServiceMaps, UPLINK_PROGRAM};
use lb_lab::{
    family::{IpFamily, in_node_with_local_pod, segment_frame, snat_port},
    fixture::{
        CLIENT, CLIENT_MAC, NODE, NODE_MAC, PEER_MAC, VIP, XDP_PASS, XDP_REDIRECT, XDP_TX, load_services,
        run_xdp_timed,
    },
};

const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// Full NAT's source ports: wide, so that many flows each find one.
const SNAT_FIRST: u16 = 1_024;
const SNAT_SPAN: u32 = 65_535 - SNAT_FIRST as u32 + 1;
const FIRST_CLIENT_PORT: u16 = 1_024;
const ROUNDS: usize = 40;
const RUNS_PER_ROUND: usize = 2_000;

/// A service path: its name, frames (one a flow), and the action the program must take.
struct Path {
    name: &'static str,
    frames: Vec<Vec<u8>>,
    action: u32,
}

fn paths(flows: u16) -> Vec<Path> {
    let to_vip = |proto: u8, port: u16| -> Vec<Vec<u8>> {
        (0..flows)
            .map(|i| {
                segment_frame((CLIENT_MAC, NODE_MAC), CLIENT, VIP, 64, proto, (FIRST_CLIENT_PORT + i, port))
            })
            .collect()
    };
    let replies = (0..flows)
        .map(|i| {
            let port =
                snat_port(CLIENT.into(), VIP.into(), (FIRST_CLIENT_PORT + i, 81), 17, SNAT_FIRST, SNAT_SPAN);
            segment_frame((PEER_MAC, NODE_MAC), REMOTE_POD, NODE, 64, 17, (8080, port))
        })
        .collect();
    vec![
        Path {
            name: "local delivery (UDP: DNAT, redirect to the pod)",
            frames: to_vip(17, 80),
            action: XDP_REDIRECT,
        },
        Path { name: "full NAT (UDP)", frames: to_vip(17, 81), action: XDP_TX },
        Path { name: "DSR (TCP, IPIP)", frames: to_vip(6, 82), action: XDP_TX },
        Path { name: "full NAT's reply (UDP)", frames: replies, action: XDP_TX },
    ]
}

/// Median and first quartile, in ns.
fn quantiles(mut times: Vec<u64>) -> (u64, u64) {
    times.sort_unstable();
    (times[times.len() / 2], times[times.len() / 4])
}

/// Each object's runs of `program` over `frames` (all flows first sent once), interleaved;
/// with the share of runs whose action was not `action`.
fn measure(
    objects: &[(Ebpf, ServiceMaps)],
    program: &str,
    frames: &[Vec<u8>],
    action: u32,
    ifindex: u32,
) -> Vec<(u64, u64, f64)> {
    let programs: Vec<&Xdp> =
        objects.iter().map(|(o, _)| o.program(program).unwrap().try_into().unwrap()).collect();
    for p in &programs {
        for frame in frames {
            run_xdp_timed(p, frame, ifindex);
        }
    }
    let mut times = vec![Vec::with_capacity(ROUNDS * RUNS_PER_ROUND); objects.len()];
    let mut other = vec![0usize; objects.len()];
    for round in 0..ROUNDS {
        for turn in 0..objects.len() {
            let k = (turn + round) % objects.len();
            for i in 0..RUNS_PER_ROUND {
                // A stride coprime with any flow count below it scatters the order.
                let frame = &frames[(i * 7_919) % frames.len()];
                let (got, _, time) = run_xdp_timed(programs[k], frame, ifindex);
                other[k] += usize::from(got != action);
                times[k].push(time.as_nanos() as u64);
            }
        }
    }
    times
        .into_iter()
        .zip(other)
        .map(|(t, o)| {
            let (median, p25) = quantiles(t);
            (median, p25, o as f64 / (ROUNDS * RUNS_PER_ROUND) as f64)
        })
        .collect()
}

fn arg(name: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).filter(|w| w[0] == name).map(|w| w[1].clone()).collect()
}

fn main() {
    let flows: u16 = arg("--flows").first().map_or(1, |f| {
        f.parse().ok().filter(|n| (1..=60_000).contains(n)).unwrap_or_else(|| {
            eprintln!("--flows: expected a number of flows from 1 to 60000, got {f}");
            std::process::exit(2)
        })
    });
    // `--against LABEL=PATH`: an earlier revision's object, built by xtask.
    let mut objects: Vec<(String, Vec<u8>)> = vec![("this code".into(), EMBEDDED_OBJECT.to_vec())];
    for against in arg("--against") {
        let Some((label, path)) = against.split_once('=') else {
            eprintln!("--against: expected LABEL=PATH, got {against}");
            std::process::exit(2)
        };
        let bytes = std::fs::read(PathBuf::from(path)).unwrap_or_else(|e| {
            eprintln!("--against {label}: reading {path}: {e}");
            std::process::exit(2)
        });
        objects.push((label.to_string(), bytes));
    }
    in_node_with_local_pod(IpFamily::V4, move |ifindex, _| {
        let loaded: Vec<(Ebpf, ServiceMaps)> = objects
            .iter()
            .map(|(label, bytes)| {
                eprintln!("loading {label}'s object");
                let (mut ebpf, maps) = load_services(bytes, SNAT_FIRST);
                let pass: &mut Xdp = ebpf.program_mut("lb_pass").unwrap().try_into().unwrap();
                pass.load().expect("the verifier accepts lb_pass");
                (ebpf, maps)
            })
            .collect();
        println!(
            "BPF_PROG_TEST_RUN, one packet a run, 64-byte UDP over IPv4, {flows} flow(s) a path; {} runs per \
             object and path, objects interleaved; median (first quartile), ns a run.\n",
            ROUNDS * RUNS_PER_ROUND
        );
        let mut header = "| path |".to_string();
        let mut rule = "|---|".to_string();
        for (i, (label, _)) in objects.iter().enumerate() {
            header += &format!(" {label} |");
            rule += "---|";
            if i > 0 {
                header += &format!(" {label} ÷ this code |");
                rule += "---|";
            }
        }
        println!("{header}\n{rule}");
        let row = |name: &str, results: Vec<(u64, u64, f64)>| {
            let mut line = format!("| {name} |");
            let base = results[0].0 as f64;
            for (i, (median, p25, other)) in results.iter().enumerate() {
                let note = if *other > 0.0 {
                    format!(", {:.1} % another action", other * 100.0)
                } else {
                    String::new()
                };
                line += &format!(" {median} ({p25}{note}) |");
                if i > 0 {
                    line += &format!(" {:.2} |", *median as f64 / base);
                }
            }
            println!("{line}");
        };
        for path in paths(flows) {
            row(path.name, measure(&loaded, UPLINK_PROGRAM, &path.frames, path.action, ifindex));
        }
        let pass = segment_frame((CLIENT_MAC, NODE_MAC), CLIENT, VIP, 64, 17, (FIRST_CLIENT_PORT, 80));
        row("lb_pass (the test run's own cost)", measure(&loaded, "lb_pass", &[pass], XDP_PASS, ifindex));
    });
}
