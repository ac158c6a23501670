//! `cargo xtask bench failover`: client-side outage on failover, keepalived against lb-agent, in
//! the same three-node lab, at advert intervals of 1 s, 100 ms and 10 ms, for an IPv4 VIP
//! (VRRPv3 over IPv4) and an IPv6 VIP (VRRPv3 over IPv6: adverts from link-local addresses, the
//! client following unsolicited Neighbor Advertisements); plus agent CPU with 1,000 VIPs.
//! Prints a Markdown table (the book's, docs/src/benchmarks.md).
//!
//! Method: the client pings the VIP every 2 ms; the outage is the largest gap between replies.
//! With `--repeat N` each case runs N times, keepalived and lb-agent alternating, and the table
//! gives the medians (the outage depends on where in an advert interval the failure falls).
//! Hard failure: the master's switch port goes down, then its process is killed. Graceful stop:
//! SIGTERM to the master. Both implementations answer ICMP from the kernel (keepalived adds the
//! VIP; lb-agent runs with `vipMode: both`), so only the VRRP machinery differs.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::Command,
    time::{Duration, Instant},
};

use lb_lab::{
    Agent, Lab, Process,
    agent::AGENT_LISTEN,
    bench::{arg, median},
};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);
const VRID: u8 = 10;
const PRIORITIES: [u8; 3] = [200, 150, 100];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Peer {
    Keepalived,
    LbAgent,
}

#[derive(Clone, Copy, PartialEq)]
enum Failure {
    Hard,
    Graceful,
}

impl Failure {
    fn name(self) -> &'static str {
        match self {
            Failure::Hard => "hard",
            Failure::Graceful => "graceful",
        }
    }
}

enum Running {
    Agent(Agent),
    Keepalived(Process),
}

impl Running {
    fn kill(&mut self) {
        match self {
            Running::Agent(a) => a.kill(),
            Running::Keepalived(p) => p.kill(),
        }
    }

    fn terminate(&mut self) {
        let pid = match self {
            Running::Agent(a) => a.pid(),
            Running::Keepalived(p) => p.pid(),
        };
        // SAFETY: signalling a child we spawned.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(1500));
    }

    fn pid(&self) -> u32 {
        match self {
            Running::Agent(a) => a.pid(),
            Running::Keepalived(p) => p.pid(),
        }
    }
}

/// The prefix length a single address is written with.
fn host_prefix(vip: &IpAddr) -> u8 {
    if vip.is_ipv4() { 32 } else { 128 }
}

fn keepalived_conf(lab: &Lab, node: usize, interval: Duration, vips: &[IpAddr]) -> String {
    let mut addrs: Vec<String> =
        vips.iter().take(20).map(|v| format!("    {v}/{}", host_prefix(v))).collect();
    let mut excluded: Vec<String> =
        vips.iter().skip(20).map(|v| format!("    {v}/{}", host_prefix(v))).collect();
    // VRRPv3 over IPv6 for IPv6 addresses (keepalived would otherwise carry them in IPv4 adverts).
    let native_ipv6 = if vips.first().is_some_and(IpAddr::is_ipv6) { "  native_ipv6\n" } else { "" };
    let excluded_block = if excluded.is_empty() {
        String::new()
    } else {
        excluded.insert(0, "  virtual_ipaddress_excluded {".into());
        excluded.push("  }".into());
        excluded.join("\n") + "\n"
    };
    addrs.insert(0, "  virtual_ipaddress {".into());
    addrs.push("  }".into());
    format!(
        "global_defs {{\n  router_id {name}\n}}\nvrrp_instance web {{\n  state BACKUP\n  interface eth0\n  \
         virtual_router_id {VRID}\n  priority {prio}\n  advert_int {adv}\n  version 3\n{native_ipv6}{addrs}\n\
         {excluded_block}}}\n",
        name = lab.nodes[node].name,
        prio = PRIORITIES[node],
        adv = interval.as_secs_f64(),
        addrs = addrs.join("\n"),
    )
}

fn agent_conf(lab: &Lab, node: usize, interval: Duration, vips: &[IpAddr]) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: web\n    vrid: {VRID}\n    \
         advertInterval: {}ms\n    vipMode: both\n    nodes:\n",
        lab.nodes[node].name,
        interval.as_millis()
    );
    for n in &lab.nodes {
        yaml.push_str(&format!("      - name: {}\n        address: {}\n", n.name, n.ip));
        if vips.iter().any(IpAddr::is_ipv6) {
            yaml.push_str(&format!("        address6: {}\n", n.link_local()));
        }
    }
    yaml.push_str("    priorities:\n");
    for (n, p) in lab.nodes.iter().zip(PRIORITIES) {
        yaml.push_str(&format!("      {}: {p}\n", n.name));
    }
    yaml.push_str("    vips:\n");
    for v in vips {
        yaml.push_str(&format!("      - address: {v}\n"));
    }
    yaml
}

fn start(lab: &mut Lab, peer: Peer, node: usize, interval: Duration, vips: &[IpAddr]) -> Running {
    match peer {
        Peer::LbAgent => {
            lab.enable_native_xdp(node);
            let mut agent = lab.start_agent(node, &agent_conf(lab, node, interval, vips));
            agent.wait_ready();
            Running::Agent(agent)
        }
        Peer::Keepalived => {
            Running::Keepalived(lab.start_keepalived(node, &keepalived_conf(lab, node, interval, vips)))
        }
    }
}

/// The largest gap between echo replies from `vip` while `during` runs, in ms, and the replies
/// lost.
fn outage(lab: &Lab, vip: IpAddr, during: impl FnOnce()) -> (f64, u64) {
    let ns = lab.client.ns.name().to_owned();
    let pinger = std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "ping", "-D", "-n", "-i", "0.002", "-W", "1", "-w", "6"])
            .arg(vip.to_string())
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(1000));
    during();
    let out = pinger.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let stamps: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let gap = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max) * 1000.0;
    let sent = stamps.len() as u64;
    let transmitted: u64 = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(sent);
    (gap, transmitted.saturating_sub(sent))
}

fn wait_answered(lab: &Lab, vip: IpAddr) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab.client.output_ok(&["ping", "-c", "1", "-W", "1", &vip.to_string()]) {
        assert!(Instant::now() < deadline, "VIP never answered");
    }
    // Let every node settle into Backup behind the master.
    std::thread::sleep(Duration::from_millis(500));
}

fn failover(peer: Peer, vip: IpAddr, interval: Duration, failure: Failure) -> (f64, u64) {
    let mut lab = Lab::new(3);
    if vip.is_ipv6() {
        lab.enable_ipv6();
    }
    let mut running: Vec<Running> = (0..3).map(|i| start(&mut lab, peer, i, interval, &[vip])).collect();
    wait_answered(&lab, vip);
    let result = outage(&lab, vip, || match failure {
        Failure::Hard => {
            lab.cut(0);
            running[0].kill();
        }
        Failure::Graceful => running[0].terminate(),
    });
    drop(running);
    result
}

/// CPU seconds used per wall second by the master's process with `vips` VIPs at 10 ms.
fn cpu_share(peer: Peer, vips: usize) -> f64 {
    let addresses: Vec<IpAddr> =
        (0..vips as u32).map(|i| Ipv4Addr::from(0xc633_0000u32 + i + 1).into()).collect();
    let mut lab = Lab::new(3);
    let running: Vec<Running> =
        (0..3).map(|i| start(&mut lab, peer, i, Duration::from_millis(10), &addresses)).collect();
    std::thread::sleep(Duration::from_secs(3));
    // keepalived forks its VRRP child: count the whole process group.
    let pgid = running[0].pid();
    // The processes counted (the master's own, and any in its group) and their CPU ticks.
    let ticks = || -> (usize, u64) {
        let counted: Vec<u64> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|stat| {
                let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                let pgrp: u32 = fields.get(2)?.parse().ok()?;
                let pid: u32 = stat.split_whitespace().next()?.parse().ok()?;
                (pgrp == pgid || pid == pgid)
                    .then(|| fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0))
            })
            .collect();
        (counted.len(), counted.iter().sum())
    };
    let ((processes, t0), w0) = (ticks(), Instant::now());
    eprintln!("{peer:?}: {processes} processes counted (the master {pgid} and its process group)");
    std::thread::sleep(Duration::from_secs(10));
    let ((_, t1), w1) = (ticks(), Instant::now());
    drop(running);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (t1 - t0) as f64 / hz / (w1 - w0).as_secs_f64()
}

/// `--repeat N`, default 1.
fn repeat() -> usize {
    arg("--repeat").and_then(|n| n.parse().ok()).unwrap_or(1).max(1)
}

/// `--case FAMILY/INTERVAL_MS/FAILURE` (as `ipv6/10/hard`): that case alone, without the CPU
/// measurement; `--case cpu`: the CPU measurement alone.
fn case() -> Option<String> {
    arg("--case").map(|c| c.to_lowercase())
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let repeat = repeat();
    let only = case();
    let intervals: &[Duration] = if quick {
        &[Duration::from_millis(100)]
    } else {
        &[Duration::from_secs(1), Duration::from_millis(100), Duration::from_millis(10)]
    };
    println!(
        "| VIP | advert interval | failure | keepalived outage (ms) | lb-agent outage (ms) | ratio | lost replies (keepalived / lb-agent) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for vip in [IpAddr::V4(VIP), IpAddr::V6(VIP6)] {
        if only.as_deref() == Some("cpu") {
            break;
        }
        for &interval in intervals {
            for failure in [Failure::Hard, Failure::Graceful] {
                let family = if vip.is_ipv4() { "ipv4" } else { "ipv6" };
                let name = format!("{family}/{}/{}", interval.as_millis(), failure.name());
                if only.as_ref().is_some_and(|o| *o != name) {
                    continue;
                }
                let (mut k, mut l) = (Vec::new(), Vec::new());
                for _ in 0..repeat {
                    k.push(failover(Peer::Keepalived, vip, interval, failure));
                    l.push(failover(Peer::LbAgent, vip, interval, failure));
                }
                let gaps = |runs: &[(f64, u64)]| median(runs.iter().map(|r| r.0)).expect("runs");
                let lost = |runs: &[(f64, u64)]| median(runs.iter().map(|r| r.1)).expect("runs");
                let (k_gap, k_lost, l_gap, l_lost) = (gaps(&k), lost(&k), gaps(&l), lost(&l));
                if repeat > 1 {
                    let all = |runs: &[(f64, u64)]| {
                        runs.iter().map(|r| format!("{:.0}", r.0)).collect::<Vec<_>>().join(" ")
                    };
                    eprintln!(
                        "{vip} {interval:?} {}: keepalived {} | lb-agent {}",
                        failure.name(),
                        all(&k),
                        all(&l)
                    );
                }
                println!(
                    "| {} | {} ms | {} | {:.0} | {:.0} | {:.2} | {} / {} |",
                    if vip.is_ipv4() { "IPv4" } else { "IPv6" },
                    interval.as_millis(),
                    failure.name(),
                    k_gap,
                    l_gap,
                    l_gap / k_gap,
                    k_lost,
                    l_lost
                );
            }
        }
    }
    if only.as_ref().is_some_and(|o| o != "cpu") {
        return;
    }
    let vips = if quick { 100 } else { 1000 };
    let k = cpu_share(Peer::Keepalived, vips);
    let l = cpu_share(Peer::LbAgent, vips);
    println!();
    println!("| master CPU, {vips} VIPs, 10 ms adverts | keepalived | lb-agent | ratio |");
    println!("|---|---|---|---|");
    println!("| CPU seconds per second | {k:.4} | {l:.4} | {:.2} |", l / k.max(1e-9));
}
