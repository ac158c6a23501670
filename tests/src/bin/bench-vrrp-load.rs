//! `cargo xtask bench vrrp-load`: does a spread group of N agents on this machine settle, and
//! what does it cost once settled and while disturbed. Two agent binaries (the baseline, by
//! default the last landed commit, and the code under test) alternate run by run in one
//! invocation. Prints the book's table (docs/src/benchmarks.md).
//!
//! Method, per run: a lab of N nodes on one segment, every agent (release, `info` logging, as
//! shipped) in one spread group with V VIPs at advert interval I. A capture on the client's
//! port records every advertisement on the segment. A VRID's *master change* is an advert from
//! another source than its previous one (the first advert of a VRID counts as one); the group
//! is *settled* once no VRID changed master for [`QUIET`].
//! - **Cold start**: from the agents' spawn to the last master change before the quiet period
//!   (runs that are still changing after [`SETTLE_LIMIT`] are "not settled").
//! - **Settled CPU**: each agent's CPU (utime + stime from `/proc/<pid>/stat`) over 10 s once
//!   settled, as a share of one core; the median agent and the busiest.
//! - **SIGSTOP 300 ms**: one agent (the run's index picks it) is stopped for 300 ms and
//!   continued; settle time counts from SIGCONT.
//! - **CPU hog 2 s**: a busy thread pinned to CPU 0 for 2 s; settle time counts from its end.
//! - **Storm CPU**: each agent's CPU over the 2 s after a disturbance, beside the settled CPU
//!   (target: ≤ 2×, no positive feedback).
//! - **Transitions**: `lbagent_vrrp_transitions_total` summed over the agents, per second, over
//!   the settled window and over the run.

use std::{
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use lb_lab::{Agent, Lab, agent::AGENT_LISTEN};

/// No master change for this long: settled.
const QUIET: Duration = Duration::from_secs(1);
/// A cold start not settled by then is reported as not settled.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);
/// After a disturbance, how long the bench waits for the group to settle again.
const RESETTLE_LIMIT: Duration = Duration::from_secs(10);
/// The CPU window once settled.
const CPU_WINDOW: Duration = Duration::from_secs(10);
/// The storm-CPU window after a disturbance.
const STORM_WINDOW: Duration = Duration::from_secs(2);

struct Args {
    nodes: usize,
    vips: usize,
    interval: Duration,
    runs: usize,
    /// (label, binary) pairs, alternated in this order every run.
    binaries: Vec<(String, PathBuf)>,
    disturb: bool,
}

fn args() -> Args {
    let value = lb_lab::bench::arg;
    let number = |flag: &str, default: usize| value(flag).map_or(default, |v| v.parse().expect(flag));
    let mut binaries = Vec::new();
    if let Some(baseline) = value("--baseline") {
        let label = value("--baseline-label").unwrap_or_else(|| "baseline".into());
        binaries.push((label, PathBuf::from(baseline)));
    }
    binaries.push(("this code".into(), lb_lab::agent_binary()));
    Args {
        nodes: number("--nodes", 8),
        vips: number("--vips", 1000),
        interval: Duration::from_millis(number("--interval-ms", 10) as u64),
        runs: number("--runs", 10),
        binaries,
        disturb: !std::env::args().any(|a| a == "--no-disturb"),
    }
}

/// Every VRRP advertisement seen on the segment: (when, VRID, source, priority).
#[derive(Default)]
struct Adverts {
    seen: Vec<(Instant, u8, Ipv4Addr, u8)>,
}

impl Adverts {
    /// The master changes at or after `from`: for each VRID, the adverts whose source differs
    /// from that VRID's previous advert (resignations, priority 0, are left out).
    fn changes_since(&self, from: Instant) -> Vec<Instant> {
        let mut last: std::collections::BTreeMap<u8, Ipv4Addr> = Default::default();
        let mut changes = Vec::new();
        for &(at, vrid, source, priority) in &self.seen {
            if priority == 0 {
                continue;
            }
            if last.insert(vrid, source) != Some(source) && at >= from {
                changes.push(at);
            }
        }
        changes
    }

    /// The last master change at or after `from`, once the group has been quiet for [`QUIET`]
    /// since and at least `vrids` VRIDs have a master.
    fn settled_at(&self, from: Instant, now: Instant, vrids: usize) -> Option<Option<Instant>> {
        let mastered: std::collections::BTreeSet<u8> =
            self.seen.iter().filter(|s| s.3 != 0).map(|s| s.1).collect();
        let last = self.changes_since(from).last().copied();
        let quiet_since = last.unwrap_or(from).max(from);
        (mastered.len() >= vrids && now >= quiet_since + QUIET).then_some(last)
    }
}

/// Records every VRRP advertisement the client's interface receives, on a thread in the
/// client's namespace, until dropped.
struct Capture {
    adverts: Arc<Mutex<Adverts>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    fn start(lab: &Lab) -> Capture {
        let adverts = Arc::new(Mutex::new(Adverts::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let path = format!("/run/netns/{}", lab.client.ns.name());
        let (a, s) = (adverts.clone(), stop.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("the client's namespace");
            // SAFETY: a valid namespace fd; setns only changes this thread's namespace.
            assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
            let socket = packet_socket("eth0");
            ready_tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::Relaxed) {
                // SAFETY: reading into a buffer we own, of its length.
                let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                let Ok(n) = usize::try_from(n) else { continue };
                if let Some((vrid, source, priority)) = vrrp_advert(&buf[..n]) {
                    a.lock().unwrap().seen.push((Instant::now(), vrid, source, priority));
                }
            }
        });
        ready_rx.recv().expect("the capture started");
        Capture { adverts, stop, thread: Some(thread) }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An AF_PACKET datagram socket for IPv4 on `interface`, with a large buffer and a 100 ms
/// receive timeout (so its thread notices when to stop).
fn packet_socket(interface: &str) -> OwnedFd {
    let protocol = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(protocol)) };
    assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just opened and is owned from here on.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(interface).unwrap();
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no {interface}");
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid start.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol;
    addr.sll_ifindex = index as i32;
    // SAFETY: binding our socket to a valid sockaddr_ll of its size.
    let bound =
        unsafe { libc::bind(fd, (&raw const addr).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) };
    assert_eq!(bound, 0, "binding the capture: {}", std::io::Error::last_os_error());
    let set = |level, option, value: &[u8]| {
        // SAFETY: a valid option value of its length.
        unsafe { libc::setsockopt(fd, level, option, value.as_ptr().cast(), value.len() as u32) };
    };
    set(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(16i32 << 20).to_ne_bytes());
    let timeout = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    // SAFETY: timeval is plain data; viewed as its bytes for setsockopt.
    let bytes = unsafe {
        std::slice::from_raw_parts((&raw const timeout).cast::<u8>(), std::mem::size_of::<libc::timeval>())
    };
    set(libc::SOL_SOCKET, libc::SO_RCVTIMEO, bytes);
    socket
}

/// (VRID, source, priority) of an IPv4 datagram carrying a VRRP advertisement.
fn vrrp_advert(ip: &[u8]) -> Option<(u8, Ipv4Addr, u8)> {
    let header = usize::from(*ip.first()? & 0x0f) * 4;
    if *ip.get(9)? != 112 {
        return None;
    }
    let source = Ipv4Addr::new(*ip.get(12)?, *ip.get(13)?, *ip.get(14)?, *ip.get(15)?);
    Some((*ip.get(header + 1)?, source, *ip.get(header + 2)?))
}

fn agent_config(lab: &Lab, node: usize, args: &Args) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: web\n    spread: true\n    \
         advertInterval: {}ms\n    nodes:\n",
        lab.nodes[node].name,
        args.interval.as_millis()
    );
    for n in &lab.nodes {
        yaml.push_str(&format!("      - name: {}\n        address: {}\n", n.name, n.ip));
    }
    yaml.push_str("    vips:\n");
    for i in 0..args.vips as u32 {
        // 198.18.0.0/15 (benchmarking): room for 131,072 VIPs.
        yaml.push_str(&format!("      - address: {}\n", Ipv4Addr::from(0xc612_0000u32 + i + 1)));
    }
    yaml
}

/// Each process's CPU ticks (utime + stime).
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

/// Each agent's CPU over `window`, as a share of one core. With `LB_BENCH_PERF=<dir>`, the
/// first agent is profiled meanwhile into `<dir>/<what>.data` (`perf report -i …`).
fn cpu_shares(agents: &[Agent], window: Duration, what: &str) -> Vec<f64> {
    let profile = lb_lab::bench::Profile::start(what, ["-p", &agents[0].pid().to_string()], 999);
    let before: Vec<u64> = agents.iter().map(|a| ticks(a.pid())).collect();
    let started = Instant::now();
    std::thread::sleep(window);
    drop(profile);
    let elapsed = started.elapsed().as_secs_f64();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    agents.iter().zip(before).map(|(a, t0)| (ticks(a.pid()) - t0) as f64 / hz / elapsed).collect()
}

/// `lbagent_vrrp_transitions_total` summed over the agents (an agent that does not answer
/// counts nothing: under a storm, a scrape may time out).
fn transitions(agents: &[Agent]) -> f64 {
    agents
        .iter()
        .filter_map(|a| a.try_get("/metrics"))
        .map(|response| {
            response
                .lines()
                .filter(|l| l.starts_with("lbagent_vrrp_transitions_total{"))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

/// Waits until the group is settled after `from` (or `limit` passes): the settle time from
/// `from`, `None` when it did not settle.
fn wait_settled(capture: &Capture, from: Instant, limit: Duration, vrids: usize) -> Option<Duration> {
    loop {
        let now = Instant::now();
        if let Some(last) = capture.adverts.lock().unwrap().settled_at(from, now, vrids) {
            return Some(last.map_or(Duration::ZERO, |l| l - from));
        }
        if now > from + limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A busy thread pinned to CPU 0 for `long`.
fn hog_cpu0(long: Duration) {
    std::thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data; pinning only this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let until = Instant::now() + long;
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    })
    .join()
    .unwrap();
}

#[derive(Default)]
struct RunResult {
    cold: Option<Duration>,
    settled_cpu: Vec<f64>,
    settled_transitions_per_s: f64,
    stop: Option<Duration>,
    stop_cpu: Vec<f64>,
    hog: Option<Duration>,
    hog_cpu: Vec<f64>,
    transitions: f64,
}

fn run(args: &Args, binary: &Path, index: usize) -> RunResult {
    let mut lab = Lab::new(args.nodes);
    for n in 0..args.nodes {
        lab.enable_native_xdp(n);
    }
    let configs: Vec<String> = (0..args.nodes).map(|n| agent_config(&lab, n, args)).collect();
    let capture = Capture::start(&lab);
    let bin = binary.to_str().expect("a UTF-8 binary path");
    // Every agent at once, as a fresh DaemonSet starts.
    let started = Instant::now();
    let agents: Vec<Agent> = (0..args.nodes)
        .map(|n| {
            // As shipped: `info` logging (the lab's default is `debug`).
            lab.start_agent_under(n, &configs[n], &[], &[], &["env", "LB_LOG=info", bin])
        })
        .collect();
    // The planner shares one instance per (owner, backup) pair: n·(n−1) of them here.
    let vrids = (args.nodes * (args.nodes - 1)).min(args.vips);
    let cold = wait_settled(&capture, started, SETTLE_LIMIT, vrids);
    let mut result = RunResult { cold, ..Default::default() };
    let t0 = transitions(&agents);
    let window_start = Instant::now();
    result.settled_cpu = cpu_shares(&agents, CPU_WINDOW, "settled");
    let t1 = transitions(&agents);
    // Settled means staying so: a master change in the CPU window was a relapse.
    if !capture.adverts.lock().unwrap().changes_since(window_start).is_empty() {
        result.cold = None;
    }
    result.settled_transitions_per_s = (t1 - t0) / CPU_WINDOW.as_secs_f64();
    if args.disturb {
        let victim = &agents[index % agents.len()];
        victim.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(300));
        victim.signal(libc::SIGCONT);
        let continued = Instant::now();
        result.stop_cpu = cpu_shares(&agents, STORM_WINDOW, "sigstop");
        result.stop = wait_settled(&capture, continued, RESETTLE_LIMIT, vrids);

        hog_cpu0(Duration::from_secs(2));
        let hog_ended = Instant::now();
        result.hog_cpu = cpu_shares(&agents, STORM_WINDOW, "hog");
        result.hog = wait_settled(&capture, hog_ended, RESETTLE_LIMIT, vrids);
    }
    result.transitions = transitions(&agents);
    if std::env::var_os("LB_BENCH_DEBUG").is_some() {
        // What the first agent went through: its transitions by kind and its last log lines.
        let metrics = agents[0].try_get("/metrics").unwrap_or_default();
        let mut kinds: std::collections::BTreeMap<String, f64> = Default::default();
        for line in metrics.lines().filter(|l| l.starts_with("lbagent_vrrp_transitions_total{")) {
            let from = line.split("from=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
            let to = line.split("to=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
            *kinds.entry(format!("{from}->{to}")).or_default() +=
                line.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()).unwrap_or(0.0);
        }
        eprintln!("n0 transitions: {kinds:?}");
        let changes = capture.adverts.lock().unwrap().changes_since(started);
        let mut per_half_second =
            vec![0u32; 1 + changes.last().map_or(0, |c| (*c - started).as_millis() / 500) as usize];
        for c in changes {
            per_half_second[((c - started).as_millis() / 500) as usize] += 1;
        }
        eprintln!("master changes per 500 ms from the spawn: {per_half_second:?}");
        for a in &agents {
            let log = a.log_text();
            let first = log.lines().next().and_then(|l| l.get(..27)).unwrap_or("").to_owned();
            let running = log.lines().find(|l| l.contains("lb-agent running")).and_then(|l| l.get(..27));
            eprintln!("agent log starts {first}, running at {running:?}");
        }
        let log = agents[0].log_text();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("n0 log (last 40 lines):\n{}", lines[lines.len().saturating_sub(40)..].join("\n"));
    }
    drop(capture);
    drop(agents);
    drop(lab);
    result
}

/// The median of `values`, NaN (shown as no value) for none.
fn median(values: Vec<f64>) -> f64 {
    lb_lab::bench::median(values).unwrap_or(f64::NAN)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// "k of n ≤ target; max m ms" for settle times.
fn settles(times: &[Option<Duration>], target: Duration) -> String {
    let within = times.iter().filter(|t| t.is_some_and(|t| t <= target)).count();
    let worst =
        times.iter().map(|t| t.map_or("never".into(), |t| format!("{} ms", t.as_millis()))).max_by_key(|s| {
            if s == "never" { u128::MAX } else { s.trim_end_matches(" ms").parse().unwrap_or(0) }
        });
    format!("{within}/{} (worst {})", times.len(), worst.unwrap_or_default())
}

fn pct(share: f64) -> String {
    format!("{:.1}", share * 100.0)
}

fn main() {
    let args = args();
    let mut results: Vec<Vec<RunResult>> = args.binaries.iter().map(|_| Vec::new()).collect();
    for index in 0..args.runs {
        for (b, (label, binary)) in args.binaries.iter().enumerate() {
            let r = run(&args, binary, index);
            eprintln!(
                "run {index} {label}: cold {:?}, settled CPU median {} max {} %, {:.1} transitions/s settled; \
                 SIGSTOP {:?} (CPU max {} %), hog {:?} (CPU max {} %), {} transitions in all",
                r.cold,
                pct(median(r.settled_cpu.clone())),
                pct(max(&r.settled_cpu)),
                r.settled_transitions_per_s,
                r.stop,
                pct(max(&r.stop_cpu)),
                r.hog,
                pct(max(&r.hog_cpu)),
                r.transitions
            );
            results[b].push(r);
        }
    }
    println!(
        "| {} nodes × {} VIPs × {} ms | cold start settles ≤ 5 s | after SIGSTOP 300 ms, ≤ 2 s | after a 2 s CPU hog, ≤ 2 s | settled CPU per agent, % of a core (median / busiest) | CPU after a disturbance (busiest, median of runs) | transitions/s settled |",
        args.nodes,
        args.vips,
        args.interval.as_millis()
    );
    println!("|---|---|---|---|---|---|---|");
    for ((label, _), runs) in args.binaries.iter().zip(&results) {
        let all = |f: fn(&RunResult) -> Option<Duration>| runs.iter().map(f).collect::<Vec<_>>();
        let settled_median = median(runs.iter().map(|r| median(r.settled_cpu.clone())).collect());
        let settled_max = median(runs.iter().map(|r| max(&r.settled_cpu)).collect());
        let storm = median(
            runs.iter().map(|r| max(&r.stop_cpu).max(max(&r.hog_cpu))).filter(|c| !c.is_nan()).collect(),
        );
        println!(
            "| {label} | {} | {} | {} | {} / {} | {} | {:.1} |",
            settles(&all(|r| r.cold), Duration::from_secs(5)),
            if args.disturb { settles(&all(|r| r.stop), Duration::from_secs(2)) } else { "not run".into() },
            if args.disturb { settles(&all(|r| r.hog), Duration::from_secs(2)) } else { "not run".into() },
            pct(settled_median),
            pct(settled_max),
            if args.disturb { pct(storm) } else { "not run".into() },
            median(runs.iter().map(|r| r.settled_transitions_per_s).collect()),
        );
    }
}
