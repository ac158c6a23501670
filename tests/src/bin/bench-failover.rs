//! `cargo xtask bench failover`: client-side outage on failover, keepalived against lb-agent, in
//! the same three-node lab, at advert intervals of 1 s, 100 ms and 10 ms; plus agent CPU with
//! 1,000 VIPs. Prints a Markdown table (the README's).
//!
//! Method: the client pings the VIP every 2 ms; the outage is the largest gap between replies.
//! Hard failure: the master's switch port goes down, then its process is killed. Graceful stop:
//! SIGTERM to the master. Both implementations answer ICMP from the kernel (keepalived adds the
//! VIP; lb-agent runs with `vipMode: both`), so only the VRRP machinery differs.

use std::{
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use lb_lab::{Agent, Lab, Process, agent::AGENT_LISTEN};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VRID: u8 = 10;
const PRIORITIES: [u8; 3] = [200, 150, 100];

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Keepalived,
    LbAgent,
}

#[derive(Clone, Copy, PartialEq)]
enum Failure {
    Hard,
    Graceful,
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

fn keepalived_conf(lab: &Lab, node: usize, interval: Duration, vips: &[Ipv4Addr]) -> String {
    let mut addrs: Vec<String> = vips.iter().take(20).map(|v| format!("    {v}/32")).collect();
    let mut excluded: Vec<String> = vips.iter().skip(20).map(|v| format!("    {v}/32")).collect();
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
         virtual_router_id {VRID}\n  priority {prio}\n  advert_int {adv}\n  version 3\n{addrs}\n{excluded_block}}}\n",
        name = lab.nodes[node].name,
        prio = PRIORITIES[node],
        adv = interval.as_secs_f64(),
        addrs = addrs.join("\n"),
    )
}

fn agent_conf(lab: &Lab, node: usize, interval: Duration, vips: &[Ipv4Addr]) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: web\n    vrid: {VRID}\n    \
         advertInterval: {}ms\n    vipMode: both\n    nodes:\n",
        lab.nodes[node].name,
        interval.as_millis()
    );
    for n in &lab.nodes {
        yaml.push_str(&format!("      - name: {}\n        address: {}\n", n.name, n.ip));
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

fn start(lab: &mut Lab, peer: Peer, node: usize, interval: Duration, vips: &[Ipv4Addr]) -> Running {
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

/// The largest gap between echo replies while `during` runs, in ms, and the replies lost.
fn outage(lab: &Lab, during: impl FnOnce()) -> (f64, u64) {
    let ns = lab.client.ns.name().to_owned();
    let pinger = std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "ping", "-D", "-n", "-i", "0.002", "-W", "1", "-w", "6"])
            .arg(VIP.to_string())
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

fn wait_answered(lab: &Lab) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab.client.output_ok(&["ping", "-c", "1", "-W", "1", &VIP.to_string()]) {
        assert!(Instant::now() < deadline, "VIP never answered");
    }
    // Let every node settle into Backup behind the master.
    std::thread::sleep(Duration::from_millis(500));
}

fn failover(peer: Peer, interval: Duration, failure: Failure) -> (f64, u64) {
    let mut lab = Lab::new(3);
    let mut running: Vec<Running> = (0..3).map(|i| start(&mut lab, peer, i, interval, &[VIP])).collect();
    wait_answered(&lab);
    let result = outage(&lab, || match failure {
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
    let addresses: Vec<Ipv4Addr> = (0..vips as u32).map(|i| Ipv4Addr::from(0xc633_0000u32 + i + 1)).collect();
    let mut lab = Lab::new(3);
    let running: Vec<Running> =
        (0..3).map(|i| start(&mut lab, peer, i, Duration::from_millis(10), &addresses)).collect();
    std::thread::sleep(Duration::from_secs(3));
    // keepalived forks its VRRP child: count the whole process group.
    let pgid = running[0].pid();
    let ticks = || -> u64 {
        std::fs::read_dir("/proc")
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
            .sum()
    };
    let (t0, w0) = (ticks(), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let (t1, w1) = (ticks(), Instant::now());
    drop(running);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (t1 - t0) as f64 / hz / (w1 - w0).as_secs_f64()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let intervals: &[Duration] = if quick {
        &[Duration::from_millis(100)]
    } else {
        &[Duration::from_secs(1), Duration::from_millis(100), Duration::from_millis(10)]
    };
    println!(
        "| advert interval | failure | keepalived outage (ms) | lb-agent outage (ms) | ratio | lost replies (keepalived / lb-agent) |"
    );
    println!("|---|---|---|---|---|---|");
    for &interval in intervals {
        for failure in [Failure::Hard, Failure::Graceful] {
            let (k_gap, k_lost) = failover(Peer::Keepalived, interval, failure);
            let (l_gap, l_lost) = failover(Peer::LbAgent, interval, failure);
            println!(
                "| {} ms | {} | {:.0} | {:.0} | {:.2} | {} / {} |",
                interval.as_millis(),
                if failure == Failure::Hard { "hard" } else { "graceful" },
                k_gap,
                l_gap,
                l_gap / k_gap,
                k_lost,
                l_lost
            );
        }
    }
    let vips = if quick { 100 } else { 1000 };
    let k = cpu_share(Peer::Keepalived, vips);
    let l = cpu_share(Peer::LbAgent, vips);
    println!();
    println!("| master CPU, {vips} VIPs, 10 ms adverts | keepalived | lb-agent | ratio |");
    println!("|---|---|---|---|");
    println!("| CPU seconds per second | {k:.4} | {l:.4} | {:.2} |", l / k.max(1e-9));
}
