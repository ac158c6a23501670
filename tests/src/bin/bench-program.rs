//! `cargo xtask bench program`: the XDP program's own time on each service path of each
//! family, through BPF_PROG_TEST_RUN, for this code's object and for earlier revisions'
//! (`--against REV`), in one run. For work on the program: a change's cost or saving in
//! nanoseconds, without a lab's generator, veths and NAPI thread, whose noise is larger than
//! most changes; and IPv6's time against IPv4's, path by path.
//!
//! Method: node n0 of a two-node dual-stack lab with a local pod (the program asks the
//! kernel's FIB, so it runs in n0's namespace, neighbours permanent), each object loaded
//! through the verifier (with the IPv6 path it tail-calls) with the agent's own map sync of the
//! family-generic service fixtures' config for both families (`family::services_config`):
//! local delivery (UDP :80 to the pod), full NAT (UDP :81 to n1's pod), DSR (TCP :82, IPIP or
//! IPv6 in IPv6 to n1's pod), full NAT's replies (n1's pod to n0's port), and, through the TC
//! egress program `lb_reply`, the local pod's replies to local delivery's flows (its address
//! and port back to the VIP's; TC test runs cost more than XDP's). Each object is
//! loaded four times (a load's placement in memory shifts all its times a little); every flow
//! is sent once to each load before timing, so the runs time established flows. Then 40
//! rounds, the objects in rotating order, each running 2,000 single BPF_PROG_TEST_RUNs per path
//! (one packet each, flows in a fixed scattered order) on its next load; the median, first
//! quartile and mean of the fastest 90 % of each object's 80,000 runs. A run's time comes in
//! the clock's steps (10 ns on some hosts), so medians move in whole steps; the mean resolves
//! below one, and the ratios are the means'. A single run's time includes the test-run's own
//! fixed cost, given as the `lb_pass` row (a program that only returns; `bench_pass_tc` for
//! TC); the IPv6 ÷ IPv4 table takes it off both. Two objects alike differ by up to 3 % (runs of
//! one object against itself).
//!
//! `--path local|full-nat|dsr|reply|local-reply` times one path in both families (the others'
//! flows are still set up: replies need full NAT's ports and local delivery's flows).
//! `LB_BENCH_PERF=<dir>` profiles each path's runs (`perf report -i <dir>/ipv6-reply.data
//! --no-children`).
//!
//! Prints Markdown tables; writes nothing into the book.

use std::{path::PathBuf, sync::mpsc};

use std::time::Duration;

use aya::{
    Ebpf,
    programs::{SchedClassifier, Xdp},
};
use lb_agent::dataplane::{EMBEDDED_OBJECT, REPLY_PROGRAM, UPLINK_PROGRAM};
use lb_lab::{
    bench::{Profile, arg, arg_values, median, quantile},
    family::{
        FAMILIES, IpFamily, LabFamily, in_node_with_local_pod, load_services_of, segment_frame, snat_port,
    },
    fixture::{CLIENT_MAC, NODE_MAC, PEER_MAC, XDP_PASS, XDP_REDIRECT, XDP_TX, run_tc_timed, run_xdp_timed},
};

/// Full NAT's source ports: wide, so that many flows each find one.
const SNAT_FIRST: u16 = 1_024;
const SNAT_SPAN: u32 = 65_535 - SNAT_FIRST as u32 + 1;
const FIRST_CLIENT_PORT: u16 = 1_024;
const ROUNDS: usize = 40;
/// Each object is loaded this many times, and the rounds take its loads in turn. Where a load's
/// programs and maps land in memory shifts its times by a few per cent for the whole run (with
/// one load each, two objects with the same IPv4 program differed by up to 6 %): the loads
/// average that out.
const LOADS: usize = 4;
const RUNS_PER_ROUND: usize = 2_000;

/// A service path: its name, the program it runs, frames (one a flow), and what the program
/// must do with them.
struct Path {
    name: &'static str,
    /// The path's name in file names (`LB_BENCH_PERF`'s profiles).
    slug: &'static str,
    program: &'static str,
    frames: Vec<Vec<u8>>,
    expect: Expect,
}

/// What a path's program must do with each of its frames.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Return this action.
    Action(u32),
    /// Let it go (`TC_ACT_OK`) rewritten: `lb_reply`'s translation.
    Rewritten,
}

impl Expect {
    fn met(self, frame: &[u8], action: u32, out: &[u8]) -> bool {
        match self {
            Expect::Action(expected) => action == expected,
            Expect::Rewritten => action == TC_ACT_OK && out != frame,
        }
    }
}

const TC_ACT_OK: u32 = 0;

/// A loaded program of either kind.
#[derive(Clone, Copy)]
enum Loaded<'a> {
    Xdp(&'a Xdp),
    Tc(&'a SchedClassifier),
}

impl Loaded<'_> {
    /// One test run on `frame`: the action, the frame as it left, the kernel's time.
    fn run(self, frame: &[u8], ifindex: u32) -> (u32, Vec<u8>, Duration) {
        match self {
            Loaded::Xdp(program) => run_xdp_timed(program, frame, ifindex),
            Loaded::Tc(program) => run_tc_timed(program, frame),
        }
    }
}

const TC_PASS: &str = "bench_pass_tc";
/// The TC path's name: its rows are less `bench_pass_tc`'s time in the family ratios.
const LOCAL_REPLY: &str = "local delivery's reply (UDP, TC egress)";

fn paths(f: IpFamily, flows: u16) -> Vec<Path> {
    let (client, vip) = (f.client(), f.vip());
    let to_vip = |proto: u8, port: u16| -> Vec<Vec<u8>> {
        (0..flows)
            .map(|i| {
                segment_frame((CLIENT_MAC, NODE_MAC), client, vip, 64, proto, (FIRST_CLIENT_PORT + i, port))
            })
            .collect()
    };
    let replies = (0..flows)
        .map(|i| {
            let port = snat_port(client, vip, (FIRST_CLIENT_PORT + i, 81), 17, SNAT_FIRST, SNAT_SPAN);
            segment_frame((PEER_MAC, NODE_MAC), f.pod(1, 2), f.node(), 64, 17, (8080, port))
        })
        .collect();
    // The local pod's answers to local delivery's flows, leaving by the uplink.
    let pod_mac = [0x02, 0, 0, 0, 0, 0x22];
    let local_replies = (0..flows)
        .map(|i| {
            segment_frame((pod_mac, PEER_MAC), f.pod(0, 2), client, 64, 17, (8080, FIRST_CLIENT_PORT + i))
        })
        .collect();
    vec![
        Path {
            name: "local delivery (UDP: DNAT, redirect to the pod)",
            slug: "local",
            program: UPLINK_PROGRAM,
            frames: to_vip(17, 80),
            expect: Expect::Action(XDP_REDIRECT),
        },
        Path {
            name: "full NAT (UDP)",
            slug: "full-nat",
            program: UPLINK_PROGRAM,
            frames: to_vip(17, 81),
            expect: Expect::Action(XDP_TX),
        },
        Path {
            name: "DSR (TCP, encapsulated)",
            slug: "dsr",
            program: UPLINK_PROGRAM,
            frames: to_vip(6, 82),
            expect: Expect::Action(XDP_TX),
        },
        Path {
            name: "full NAT's reply (UDP)",
            slug: "reply",
            program: UPLINK_PROGRAM,
            frames: replies,
            expect: Expect::Action(XDP_TX),
        },
        Path {
            name: LOCAL_REPLY,
            slug: "local-reply",
            program: REPLY_PROGRAM,
            frames: local_replies,
            expect: Expect::Rewritten,
        },
    ]
}

/// One object's time on one path: median, first quartile and the mean of the fastest 90 %
/// (ns), and the share of runs that did not do what the path expects.
#[derive(Clone, Copy)]
struct Timing {
    median: u64,
    p25: u64,
    /// A single run's time is a difference of two clock reads, in this host's clock steps
    /// (10 ns on some): medians move in whole steps. The mean of many runs resolves below a
    /// step (each run lands on the step below or above its true time in proportion); the
    /// slowest tenth (interrupts, preemption) is left out.
    mean: f64,
    other: f64,
}

/// The mean of the fastest `share` of `times`.
fn trimmed_mean(times: &[u64], share: f64) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let kept = &sorted[..((sorted.len() as f64 * share) as usize).max(1)];
    kept.iter().sum::<u64>() as f64 / kept.len() as f64
}

/// Each object's runs of `program` over `frames` (all flows first sent once to each load),
/// interleaved; `objects` holds each object's loads.
fn measure(
    objects: &[Vec<Ebpf>],
    program: &str,
    frames: &[Vec<u8>],
    expect: Expect,
    ifindex: u32,
) -> Vec<Timing> {
    let programs = programs(objects, program);
    set_up(&programs, frames, ifindex);
    let mut times = vec![Vec::with_capacity(ROUNDS * RUNS_PER_ROUND); objects.len()];
    let mut other = vec![0usize; objects.len()];
    for round in 0..ROUNDS {
        for turn in 0..objects.len() {
            let k = (turn + round) % objects.len();
            let program = programs[k][round % LOADS];
            for i in 0..RUNS_PER_ROUND {
                // A stride coprime with any flow count below it scatters the order.
                let frame = &frames[(i * 7_919) % frames.len()];
                let (got, out, time) = program.run(frame, ifindex);
                other[k] += usize::from(!expect.met(frame, got, &out));
                times[k].push(time.as_nanos() as u64);
            }
        }
    }
    times
        .into_iter()
        .zip(other)
        .map(|(t, o)| {
            let (median, p25, mean) =
                (median(t.iter().copied()), quantile(t.iter().copied(), 0.25), trimmed_mean(&t, 0.9));
            Timing {
                median: median.expect("timed runs"),
                p25: p25.expect("timed runs"),
                mean,
                other: o as f64 / (ROUNDS * RUNS_PER_ROUND) as f64,
            }
        })
        .collect()
}

/// Sends every frame once to every load of `programs`: the flows are then established.
fn set_up(programs: &[Vec<Loaded>], frames: &[Vec<u8>], ifindex: u32) {
    for p in programs.iter().flatten() {
        for frame in frames {
            p.run(frame, ifindex);
        }
    }
}

/// `program` of each of `objects`' loads. An earlier object without it (`bench_pass_tc`, a
/// test run's own cost, which is the kernel's) takes this code's.
fn programs<'a>(objects: &'a [Vec<Ebpf>], program: &str) -> Vec<Vec<Loaded<'a>>> {
    let loaded = |i: usize, o: &'a Ebpf| {
        let program = o.program(program).or_else(|| objects[0][i].program(program)).unwrap();
        match program.try_into() {
            Ok(xdp) => Loaded::Xdp(xdp),
            Err(_) => Loaded::Tc(program.try_into().unwrap()),
        }
    };
    objects.iter().map(|loads| loads.iter().enumerate().map(|(i, o)| loaded(i, o)).collect()).collect()
}

/// The rows: each family's paths, then `lb_pass`'s, one timing per object. Both families run
/// in one dual-stack lab on the same loads, so that their ratio compares like with like.
fn run(objects: Vec<(String, Vec<u8>)>, flows: u16, only: Option<String>) -> Vec<(String, Vec<Timing>)> {
    let (rows, results) = mpsc::channel();
    in_node_with_local_pod(IpFamily::V6, move |ifindex, _| {
        let loaded: Vec<Vec<Ebpf>> = objects
            .iter()
            .map(|(label, bytes)| {
                eprintln!("loading {label}'s object {LOADS} times");
                (0..LOADS)
                    .map(|_| {
                        let (mut ebpf, _maps) = load_services_of(&FAMILIES, bytes, ifindex, SNAT_FIRST);
                        let pass: &mut Xdp = ebpf.program_mut("lb_pass").unwrap().try_into().unwrap();
                        pass.load().expect("the verifier accepts lb_pass");
                        for program in [REPLY_PROGRAM, TC_PASS] {
                            let Some(tc) = ebpf.program_mut(program) else { continue };
                            let tc: &mut SchedClassifier = tc.try_into().unwrap();
                            tc.load().unwrap_or_else(|e| panic!("the verifier refused {program}: {e}"));
                        }
                        ebpf
                    })
                    .collect()
            })
            .collect();
        for f in FAMILIES {
            let (timed, skipped): (Vec<Path>, Vec<Path>) =
                paths(f, flows).into_iter().partition(|p| only.as_deref().is_none_or(|o| o == p.slug));
            // Paths left out still set up their flows: the replies need full NAT's ports, and
            // local delivery's replies its flows.
            for path in &skipped {
                set_up(&programs(&loaded, path.program), &path.frames, ifindex);
            }
            for path in timed {
                // LB_BENCH_PERF=<dir>: this thread's profile per path (kernel and BPF functions,
                // helpers), as `<dir>/<family>-<path>.data`.
                // SAFETY: a system call without arguments.
                let tid = unsafe { libc::gettid() };
                let name = format!("{}-{}", f.pick("ipv4", "ipv6"), path.slug);
                let profile = Profile::start(&name, ["-t", &tid.to_string()], 4999);
                if profile.is_some() {
                    // perf needs a moment to attach before the runs start.
                    std::thread::sleep(std::time::Duration::from_millis(300));
                }
                let timings = measure(&loaded, path.program, &path.frames, path.expect, ifindex);
                drop(profile);
                rows.send((format!("{}, {}", f.pick("IPv4", "IPv6"), path.name), timings)).unwrap();
            }
        }
        let f = IpFamily::V4;
        let pass =
            segment_frame((CLIENT_MAC, NODE_MAC), f.client(), f.vip(), 64, 17, (FIRST_CLIENT_PORT, 80));
        for (row, program, expect) in [
            (PASS_ROW, "lb_pass", Expect::Action(XDP_PASS)),
            (TC_PASS_ROW, TC_PASS, Expect::Action(TC_ACT_OK)),
        ] {
            rows.send((
                row.to_string(),
                measure(&loaded, program, std::slice::from_ref(&pass), expect, ifindex),
            ))
            .unwrap();
        }
    });
    results.iter().collect()
}

const PASS_ROW: &str = "lb_pass (the test run's own cost)";
const TC_PASS_ROW: &str = "bench_pass_tc (a TC test run's own cost)";

/// A Markdown table: a column per object (`labels`), and each later object's time over the
/// first's.
fn print_table(labels: &[String], rows: &[(String, Vec<Timing>)]) {
    let mut header = "| path |".to_string();
    let mut rule = "|---|".to_string();
    for (i, label) in labels.iter().enumerate() {
        header += &format!(" {label} |");
        rule += "---|";
        if i > 0 {
            header += &format!(" {label} ÷ this code |");
            rule += "---|";
        }
    }
    println!("{header}\n{rule}");
    for (name, timings) in rows {
        let mut line = format!("| {name} |");
        for (i, t) in timings.iter().enumerate() {
            let note = if t.other > 0.0 {
                format!(", {:.1} % another action", t.other * 100.0)
            } else {
                String::new()
            };
            line += &format!(" {} ({}; {:.1}{note}) |", t.median, t.p25, t.mean);
            if i > 0 {
                line += &format!(" {:.3} |", t.mean / timings[0].mean);
            }
        }
        println!("{line}");
    }
}

/// Each path's IPv6 time over its IPv4 time (means of the fastest 90 %), for each object, both
/// less the test run's own cost (the `lb_pass` row, `bench_pass_tc`'s for TC): the program's
/// time alone, as the target and `bench dataplane`'s program column count it. `rows`
/// as [`run`] returns them.
fn print_family_ratios(labels: &[String], rows: &[(String, Vec<Timing>)]) {
    let (paths, pass) = rows.split_at(rows.len() - 2);
    let (v4, v6) = paths.split_at(paths.len() / 2);
    let net = |row: &(String, Vec<Timing>), k: usize| {
        let own_cost = if row.0.ends_with(LOCAL_REPLY) { &pass[1] } else { &pass[0] };
        (row.1[k].mean - own_cost.1[k].mean).max(1.0)
    };
    println!("\n| path | {} |\n|---|{}", labels.join(" | "), "---|".repeat(labels.len()));
    for (row4, row6) in v4.iter().zip(v6) {
        let name = row4.0.trim_start_matches("IPv4, ");
        let ratios: Vec<String> =
            (0..labels.len()).map(|k| format!("{:.2}", net(row6, k) / net(row4, k))).collect();
        println!("| {name} | {} |", ratios.join(" | "));
    }
}

fn main() {
    let flows: u16 = arg("--flows").map_or(1, |f| {
        f.parse().ok().filter(|n| (1..=60_000).contains(n)).unwrap_or_else(|| {
            eprintln!("--flows: expected a number of flows from 1 to 60000, got {f}");
            std::process::exit(2)
        })
    });
    // `--against LABEL=PATH`: an earlier revision's object, built by xtask.
    let mut objects: Vec<(String, Vec<u8>)> = vec![("this code".into(), EMBEDDED_OBJECT.to_vec())];
    for against in arg_values("--against") {
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
    let only = arg("--path");
    let slugs: Vec<&str> = paths(IpFamily::V4, 1).iter().map(|p| p.slug).collect();
    if let Some(path) = only.as_deref().filter(|p| !slugs.contains(p)) {
        eprintln!("--path: expected one of {}, got {path}", slugs.join(", "));
        std::process::exit(2)
    }
    let labels: Vec<String> = objects.iter().map(|(label, _)| label.clone()).collect();
    println!(
        "BPF_PROG_TEST_RUN, one packet a run, {flows} flow(s) a path; {} runs per object and path, objects \
         interleaved; median (first quartile; mean of the fastest 90 %), ns a run; ratios of the means.",
        ROUNDS * RUNS_PER_ROUND
    );
    let frame_len = |f: IpFamily| paths(f, 1)[0].frames[0].len();
    println!(
        "A local-delivery frame is {} bytes in IPv4, {} in IPv6; DSR encapsulates in IPIP and in IPv6 in \
         IPv6.\n",
        frame_len(IpFamily::V4),
        frame_len(IpFamily::V6)
    );
    let rows = run(objects, flows, only);
    print_table(&labels, &rows);
    println!("\nIPv6 ÷ IPv4, the program's time alone (each less its test run's own cost):");
    print_family_ratios(&labels, &rows);
}
