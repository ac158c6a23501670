//! `cargo xtask bench bgp`: the routed fabric's numbers (the book, docs/src/routed-fabrics.md).
//!
//! The lab of `tests/tests/bgp_lab.rs`: a ToR running FRR (eBGP, ECMP over an L4 hash, BFD at
//! 100 ms × 3) in front of three nodes, each with FRR and an agent; pods on n0 and n1, none on
//! n2; a client on a subnet behind the ToR.
//!
//! The peer in the same run: the same VIP served on two ports, one by DSR (what lb-agent keeps
//! across a rehash) and one by full NAT, which translates replies on the node that made the
//! flow, as kube-proxy does behind MetalLB, Cilium or kube-vip in BGP mode ("expect every
//! active connection to break when a node goes down", MetalLB's BGP docs): the anchor.
//!
//! Cases, in order, on one lab:
//! - spread: N short TCP connections from distinct source ports; each node's share of the
//!   packets to the VIP;
//! - graceful: long-lived connections sending a request every 50 ms on both ports; SIGTERM to
//!   n1's agent (withdraw, drain, exit); resets and failed requests; then n1's agent restarts;
//! - upgrade: a 5 ms ping to the VIP while n2's agent stops (SIGTERM) and a new one starts;
//! - upgrade in place: the connections again and a 5 ms ping while n2's agent executes itself
//!   again (SIGUSR2); resets, failed requests, replies lost, and changes to the ToR's route
//!   (`--upgrade-only`: that case alone, beside a control as long with nothing done);
//! - a DaemonSet roll, on a Kubernetes lab of its own: the connections (DSR) and a 5 ms ping
//!   while n2's pod is replaced, its agent and FRR sidecar stopped and the next pod's started
//!   (`--roll-only`: that case alone; [`daemonset_roll`]);
//! - SIGKILL: n2's agent killed; time until the ToR forwards to n0 and n1 only;
//! - SIGSTOP: n2's (restarted) agent frozen; time until its routes' keeper has withdrawn them
//!   and the ToR forwards to n0 and n1 only, then until it routes again once thawed;
//! - hard loss: the connections again; every frame to or from n2 dropped at the switch, every
//!   link up ([`Fabric::fail_hard`]);
//!   time until the ToR drops it, resets and failed requests, the longest wait any request saw;
//! - backends changing, on a lab of its own (two pods on n0 and n1 each): a control with
//!   nothing done, a third endpoint joining with no fault, then a fourth as n2 is lost hard;
//!   resets and failed requests ([`backends_change`]);
//! - bgpOwner failover, on another lab: a 5 ms ping while the master fails hard; the outage,
//!   and the VRRP takeover inside it (cut to the backup's transition, from its log).

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, Ipv4Addr},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use lb_lab::{
    Lab,
    cluster::{LAB_VIP, ServiceLab, service_config},
    fabric::Fabric,
    roll::RoutedCluster,
};

const VIP: Ipv4Addr = LAB_VIP;
const DSR_PORT: u16 = 80;
const NAT_PORT: u16 = 81;
const TARGET_PORT: u16 = 8080;

const CONVERGE: Duration = Duration::from_secs(60);

fn arg(name: &str, default: u64) -> u64 {
    lb_lab::bench::arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn config(lab: &Lab, me: usize, services: &str, announce: &str, vrrp: &str) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nxdpMode: native\nlisten: {}\nroutes: {{drain: 3s}}\ngroups:\n  - name: edge\n    \
         announce: {announce}\n{vrrp}    nodes:\n",
        lab.nodes[me].name,
        lb_lab::agent::AGENT_LISTEN
    );
    for node in &lab.nodes {
        yaml.push_str(&format!("      - {{name: {}, address: {}}}\n", node.name, node.ip));
    }
    yaml.push_str(&format!("    vips:\n      - address: {VIP}\nservices:\n{services}"));
    yaml
}

fn bgp(lab: &Lab, me: usize, services: &str) -> String {
    config(lab, me, services, "bgp", "")
}

fn bgp_owner(lab: &Lab, me: usize, services: &str) -> String {
    config(
        lab,
        me,
        services,
        "bgpOwner",
        "    vrid: 30\n    advertInterval: 100ms\n    priorities: {n0: 200, n1: 150, n2: 100}\n",
    )
}

fn services(lab: &Lab) -> String {
    services_on(lab, &[0, 1])
}

/// Both services, with the lab's pods `pods` as their endpoints.
fn services_on(lab: &Lab, pods: &[usize]) -> String {
    [
        service_config(lab, "dsr", VIP, DSR_PORT, TARGET_PORT, "dsr", pods),
        service_config(lab, "nat", VIP, NAT_PORT, TARGET_PORT, "fullNat", pods),
    ]
    .concat()
}

/// The lab with `pods[n]` pods on node n, its agents serving what `services` makes of it.
fn fabric_of(
    pods: &[usize],
    config: fn(&Lab, usize, &str) -> String,
    services: impl Fn(&Lab) -> String,
) -> Fabric {
    let cluster = ServiceLab::new(pods, false, TARGET_PORT, VIP, config);
    let mut fabric = Fabric::new(cluster);
    let services = services(&fabric.cluster.lab);
    fabric.cluster.start(&services);
    fabric
}

fn fabric(config: fn(&Lab, usize, &str) -> String) -> Fabric {
    fabric_of(&[1, 1, 0], config, services)
}

/// Every agent reloads (SIGHUP) with the services' endpoints now `pods`.
fn reload_endpoints(fabric: &Fabric, pods: &[usize]) {
    let lab = &fabric.cluster.lab;
    for (node, agent) in fabric.cluster.agents.iter().enumerate() {
        std::fs::write(&agent.config, bgp(lab, node, &services_on(lab, pods))).expect("writing a config");
        agent.signal(libc::SIGHUP);
    }
}

/// Long-lived connections from the far client (`hold-connections`, beside this binary), ready.
struct Load {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Load {
    /// `per_port` connections to each of the VIP's `ports` (comma-separated).
    fn start(fabric: &Fabric, ports: &str, per_port: u64) -> Load {
        let exe = std::env::current_exe().expect("this benchmark's path");
        let tool = exe.with_file_name("hold-connections");
        let mut child = Command::new("ip")
            .args(["netns", "exec", fabric.far.ns.name()])
            .arg(&tool)
            .arg(VIP.to_string())
            .arg(ports)
            .args([&per_port.to_string(), "50", "600"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the connection holder");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line).expect("reading the holder");
        assert_eq!(line.trim(), "ready", "the connection holder did not get ready");
        Load { child, out }
    }

    /// Stops it; per port: (port, opened, reset, sent, failed, longest wait in ms).
    fn finish(mut self) -> Vec<serde_json::Value> {
        // SAFETY: a plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut line = String::new();
        self.out.read_line(&mut line).expect("reading the holder's summary");
        let _ = self.child.wait();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("the holder's summary {line:?}: {e}"))
    }
}

/// The connection holder's ports where both services run.
fn both_ports() -> String {
    format!("{DSR_PORT},{NAT_PORT}")
}

fn describe(stats: &[serde_json::Value]) -> (String, String) {
    let port = |p: u16| stats.iter().find(|s| s["port"] == p).cloned().unwrap_or_default();
    let line = |s: serde_json::Value| {
        format!(
            "{} of {} reset ({} while opening), {} of {} requests failed, {} answered after over 100 ms, longest wait {:.0} ms",
            s["reset"],
            s["opened"],
            s["reset_opening"],
            s["failed"],
            s["sent"],
            s["slow"],
            s["max_wait_ms"].as_f64().unwrap_or(0.0)
        )
    };
    (line(port(DSR_PORT)), line(port(NAT_PORT)))
}

fn vip_packets(fabric: &Fabric) -> Vec<f64> {
    let sample = format!("lbagent_vip_packets_total{{vip=\"{VIP}\"}}");
    fabric.cluster.agents.iter().map(|a| a.metric(&sample)).collect()
}

fn spread(fabric: &Fabric, connections: u64) -> String {
    let before = vip_packets(fabric);
    let script = format!(
        "import socket\nfor _ in range({connections}):\n    s = socket.create_connection(('{VIP}', {DSR_PORT}), 5)\n    \
         s.makefile().readline()\n    s.close()\n"
    );
    let out = fabric.far.ns.output(&["python3", "-c", &script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(500));
    let entered: Vec<f64> = vip_packets(fabric).iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: f64 = entered.iter().sum();
    entered.iter().map(|c| format!("{:.1} %", 100.0 * c / total)).collect::<Vec<_>>().join(" / ")
}

fn restart(fabric: &mut Fabric, node: usize, config: fn(&Lab, usize, &str) -> String) {
    let yaml = config(&fabric.cluster.lab, node, &services(&fabric.cluster.lab));
    let mut agent = fabric.cluster.lab.start_agent(node, &yaml);
    agent.wait_ready();
    fabric.cluster.agents[node] = agent;
}

/// A 5 ms ping from the far client to the VIP while `during` runs (it starts a second in):
/// the largest gap between replies in ms, replies lost, and pings sent.
fn ping_outage(far_ns: &str, seconds: u32, during: impl FnOnce()) -> (f64, u64, u64) {
    let ns = far_ns.to_owned();
    let pinger = std::thread::spawn(move || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "ping",
                "-D",
                "-n",
                "-i",
                "0.005",
                "-W",
                "1",
                "-c",
                &(seconds * 200).to_string(),
            ])
            .arg(VIP.to_string())
            .output()
            .expect("running ping")
    });
    std::thread::sleep(Duration::from_secs(1));
    during();
    let out = pinger.join().expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let stamps: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let gap = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max) * 1000.0;
    let transmitted: u64 = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (gap, transmitted.saturating_sub(stamps.len() as u64), transmitted)
}

fn main() {
    let connections = arg("--connections", 1000);
    let per_port = connections / 2;
    if std::env::args().any(|a| a == "--upgrade-only") {
        // Each upgrade in place beside a control of the same length with nothing done, for
        // the lab's own floor.
        let mut fabric = fabric(bgp);
        fabric.wait_next_hops(IpAddr::V4(VIP), &[0, 1, 2], CONVERGE);
        for _ in 0..arg("--repeat", 3) {
            for upgrade in [false, true] {
                let (case, method, dsr, nat) = upgrade_in_place(&mut fabric, connections, upgrade);
                println!("| {case} | {method} | {dsr} | {nat} |");
            }
        }
        return;
    }
    if std::env::args().any(|a| a == "--roll-only") {
        let (case, method, dsr, nat) = daemonset_roll(connections);
        println!("| {case} | {method} | {dsr} | {nat} |");
        return;
    }
    if std::env::args().any(|a| a == "--backends-only") {
        for (case, method, dsr, nat) in backends_change(connections, per_port) {
            println!("| {case} | {method} | {dsr} | {nat} |");
        }
        return;
    }
    let spread_connections = arg("--spread", 3000);
    let vip = IpAddr::V4(VIP);
    let mut rows = Vec::new();

    let mut fabric = fabric(bgp);
    fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);
    fabric.wait_bfd_up(CONVERGE);
    rows.push((
        "spread",
        format!("{spread_connections} TCP connections, share per node (n0 / n1 / n2)"),
        spread(&fabric, spread_connections),
        "-".to_owned(),
    ));

    let load = Load::start(&fabric, &both_ports(), per_port);
    std::thread::sleep(Duration::from_secs(2));
    fabric.cluster.agents[1].signal(libc::SIGTERM);
    let withdrawn = fabric.wait_next_hops(vip, &[0, 2], Duration::from_secs(10));
    fabric.cluster.agents[1].wait_exit(Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    let (dsr, nat) = describe(&load.finish());
    rows.push((
        "graceful (SIGTERM n1)",
        format!(
            "{connections} connections, a request every 50 ms; withdrawn in {} ms",
            withdrawn.as_millis()
        ),
        dsr,
        nat,
    ));
    restart(&mut fabric, 1, bgp);
    fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);

    let mut back = Duration::ZERO;
    let far = fabric.far.ns.name().to_owned();
    let (gap, lost, sent) = ping_outage(&far, 15, || {
        fabric.cluster.agents[2].signal(libc::SIGTERM);
        fabric.cluster.agents[2].wait_exit(Duration::from_secs(20));
        restart(&mut fabric, 2, bgp);
        back = fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);
    });
    rows.push((
        "upgrade (n2's agent stopped and started)",
        format!(
            "5 ms ping, {sent} sent; announced again {} ms after the new agent was ready",
            back.as_millis()
        ),
        format!("{lost} replies lost, largest gap {gap:.0} ms"),
        "-".to_owned(),
    ));

    rows.push(upgrade_in_place(&mut fabric, connections, true));

    fabric.wait_bfd_up(CONVERGE);
    fabric.cluster.agents[2].kill();
    let killed = fabric.wait_next_hops(vip, &[0, 1], Duration::from_secs(10));
    rows.push((
        "SIGKILL (n2's agent)",
        "until the ToR forwards to n0 and n1 only".to_owned(),
        format!("{} ms", killed.as_millis()),
        "-".to_owned(),
    ));
    restart(&mut fabric, 2, bgp);
    fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);

    fabric.cluster.agents[2].signal(libc::SIGSTOP);
    let frozen = fabric.wait_next_hops(vip, &[0, 1], Duration::from_secs(20));
    fabric.cluster.agents[2].signal(libc::SIGCONT);
    let thawed = fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);
    rows.push((
        "SIGSTOP (n2's agent frozen, routes.holdTime 3 s)",
        "until the ToR forwards to n0 and n1 only; then thawed".to_owned(),
        format!("{} ms; routed again {} ms after the thaw", frozen.as_millis(), thawed.as_millis()),
        "-".to_owned(),
    ));
    fabric.wait_bfd_up(CONVERGE);

    let load = Load::start(&fabric, &both_ports(), per_port);
    let before = vip_packets(&fabric);
    std::thread::sleep(Duration::from_secs(2));
    let entering: Vec<f64> = vip_packets(&fabric).iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("before the cut, packets entering each node over 2 s: {entering:?}");
    fabric.fail_hard(2);
    let lost = fabric.wait_next_hops(vip, &[0, 1], Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(3));
    let (dsr, nat) = describe(&load.finish());
    rows.push((
        "hard loss (n2's traffic dropped, links up: BFD)",
        format!("{connections} connections; the ToR dropped n2 in {} ms", lost.as_millis()),
        dsr,
        nat,
    ));
    drop(fabric);

    let after_upgrades =
        rows.iter().position(|r| r.0.starts_with("upgrade in place")).map_or(rows.len(), |i| i + 1);
    rows.insert(after_upgrades, daemonset_roll(connections));
    rows.extend(backends_change(connections, per_port));
    let owner = fabric_owner();
    rows.push(owner);

    println!("| case | method | DSR (lb-agent keeps flows) | full NAT (the peers' behaviour) |");
    println!("|---|---|---|---|");
    for (case, method, dsr, nat) in rows {
        println!("| {case} | {method} | {dsr} | {nat} |");
    }
}

/// An upgrade in place (`upgrade`), or as long with nothing done: n2's agent executes its
/// binary again in the same process and keeps its routes, so even full NAT's flows, which only
/// n2 can translate, stay. The connections and a 5 ms ping throughout.
fn upgrade_in_place(
    fabric: &mut Fabric,
    connections: u64,
    upgrade: bool,
) -> (&'static str, String, String, String) {
    fabric.wait_bfd_up(CONVERGE);
    let load = Load::start(fabric, &both_ports(), connections / 2);
    let routes = fabric.watch_routes();
    let far = fabric.far.ns.name().to_owned();
    let (gap, lost, sent) = ping_outage(&far, 10, || {
        if upgrade {
            fabric.cluster.agents[2].restart_in_place(|| {});
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    let changes = routes.changes_to(VIP);
    if !changes.is_empty() {
        // What moved the route, for the reader of the run: the agent's view and BFD's.
        let log = fabric.cluster.agents[2].log_text();
        let relevant: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("route") || l.contains("keeper") || l.contains("SIGUSR2"))
            .collect();
        eprintln!("the ToR's route changed: {changes:#?}\nn2's agent: {relevant:#?}");
        eprintln!("{}", fabric.tor_show("show bfd peers brief", ""));
    }
    let changes = changes.len();
    let (dsr, nat) = describe(&load.finish());
    let case =
        if upgrade { "upgrade in place (SIGUSR2 to n2's agent)" } else { "as long, nothing done (control)" };
    let method = format!(
        "{connections} connections and a 5 ms ping ({sent} sent): {lost} replies lost, largest gap {gap:.0} ms; \
         changes to the ToR's route: {changes}"
    );
    (case, method, dsr, nat)
}

/// A DaemonSet roll of n2, on a Kubernetes lab of its own ([`RoutedCluster`]: the agents run
/// `--kubernetes` as their DaemonSet's pods, the benchmark plays the kubelet): the connections
/// (DSR only: the cluster's Service has one port) and a 5 ms ping while n2's pod is deleted,
/// its agent and FRR sidecar stopped, and the next pod's started. The node never leaves the
/// ECMP set: the ToR keeps its routes by graceful restart, and the next agent takes them over.
fn daemonset_roll(connections: u64) -> (&'static str, String, String, String) {
    let mut cluster = RoutedCluster::start();
    cluster.new_revision();
    let load = Load::start(&cluster.fabric, &DSR_PORT.to_string(), connections);
    let routes = cluster.fabric.watch_routes();
    let far = cluster.fabric.far.ns.name().to_owned();
    let mut replaced = Duration::ZERO;
    let (gap, lost, sent) = ping_outage(&far, 25, || {
        let started = Instant::now();
        cluster.stop_pod(2, true);
        cluster.start_pod(2);
        replaced = started.elapsed();
    });
    std::thread::sleep(Duration::from_secs(2));
    let changes = routes.changes_to(VIP).len();
    let (dsr, _) = describe(&load.finish());
    let method = format!(
        "{connections} DSR connections and a 5 ms ping ({sent} sent): {lost} replies lost, largest gap {gap:.0} ms; \
         pod replaced in {} ms; changes to the ToR's route: {changes}",
        replaced.as_millis()
    );
    ("DaemonSet roll (n2's pod replaced, `--kubernetes`)", method, dsr, "-".to_owned())
}

/// Backends that change, with and without a rehash. Pods 0 and 1 on n0, 2 and 3 on n1; the
/// services start on pods 0 and 2. A control first: the connections held with nothing done.
/// Then pod 1 joins with no fault: every flow keeps its backend in each node's connection
/// table, whatever the new ring says. Then pod 3 joins at the moment n2 is lost hard: the
/// flows ECMP moves to another node meet no entry there and take the new ring's backend,
/// which for the slots that moved to pod 3 is not theirs (the endpoint answers a
/// mid-connection segment with a reset). What breaks is measured.
fn backends_change(connections: u64, per_port: u64) -> Vec<(&'static str, String, String, String)> {
    let fabric = fabric_of(&[2, 2, 0], bgp, |lab| services_on(lab, &[0, 2]));
    let vip = IpAddr::V4(VIP);
    fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);
    fabric.wait_bfd_up(CONVERGE);
    let mut rows = Vec::new();

    // The floor the two cases below stand on: the same connections for as long, nothing done.
    let load = Load::start(&fabric, &both_ports(), per_port);
    std::thread::sleep(Duration::from_secs(6));
    let (dsr, nat) = describe(&load.finish());
    rows.push(("nothing changes (control)", format!("{connections} connections for 6 s"), dsr, nat));

    let load = Load::start(&fabric, &both_ports(), per_port);
    std::thread::sleep(Duration::from_secs(2));
    let before = reasons(&fabric);
    reload_endpoints(&fabric, &[0, 1, 2]);
    std::thread::sleep(Duration::from_secs(4));
    let (dsr, nat) = describe(&load.finish());
    eprintln!(
        "a backend added, no rehash: XDP paths taken meanwhile, per node: {:?}",
        since(&fabric, &before)
    );
    rows.push((
        "a backend added, no rehash",
        format!("{connections} connections; a third endpoint joins (every agent reloaded)"),
        dsr,
        nat,
    ));

    let load = Load::start(&fabric, &both_ports(), per_port);
    std::thread::sleep(Duration::from_secs(2));
    fabric.fail_hard(2);
    reload_endpoints(&fabric, &[0, 1, 2, 3]);
    let lost = fabric.wait_next_hops(vip, &[0, 1], Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(3));
    let (dsr, nat) = describe(&load.finish());
    rows.push((
        "a backend added during a hard loss (rehash)",
        format!(
            "{connections} connections; a fourth endpoint joins as n2 is cut off; the ToR dropped n2 in {} ms",
            lost.as_millis()
        ),
        dsr,
        nat,
    ));
    rows
}

/// Each agent's XDP reason counters (`lbagent_xdp_reason_packets_total`), by reason.
fn reasons(fabric: &Fabric) -> Vec<std::collections::BTreeMap<String, f64>> {
    let prefix = "lbagent_xdp_reason_packets_total{reason=\"";
    let parse = |text: String| {
        text.lines()
            .filter_map(|l| {
                let (reason, value) = l.strip_prefix(prefix)?.split_once("\"} ")?;
                Some((reason.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    };
    fabric.cluster.agents.iter().map(|a| parse(a.metrics())).collect()
}

/// What each agent counted since `before`, the reasons that moved only.
fn since(
    fabric: &Fabric,
    before: &[std::collections::BTreeMap<String, f64>],
) -> Vec<std::collections::BTreeMap<String, f64>> {
    reasons(fabric)
        .into_iter()
        .zip(before)
        .map(|(now, then)| {
            now.into_iter()
                .map(|(reason, n)| (reason.clone(), n - then.get(&reason).copied().unwrap_or(0.0)))
                .filter(|(_, n)| *n != 0.0)
                .collect()
        })
        .collect()
}

/// bgpOwner: a 5 ms ping while the master is cut off; the outage, and VRRP's share of it.
fn fabric_owner() -> (&'static str, String, String, String) {
    let fabric = fabric(bgp_owner);
    let vip = IpAddr::V4(VIP);
    fabric.wait_next_hops(vip, &[0], CONVERGE);
    fabric.wait_bfd_up(CONVERGE);
    let mut cut_at = SystemTime::now();
    let mut routed = Duration::ZERO;
    let (gap, lost, sent) = ping_outage(fabric.far.ns.name(), 6, || {
        cut_at = SystemTime::now();
        let started = Instant::now();
        fabric.fail_hard(0);
        fabric.wait_next_hops(vip, &[1], Duration::from_secs(20));
        routed = started.elapsed();
    });
    let vrrp = takeover_after(&fabric.cluster.agents[1].log_text(), cut_at);
    (
        "bgpOwner failover (the master's traffic dropped)",
        format!(
            "5 ms ping, {sent} sent; VRRP takeover {vrrp}; the ToR forwards to the new master {} ms after the cut",
            routed.as_millis()
        ),
        format!("outage (largest gap between replies) {gap:.0} ms, {lost} replies lost"),
        "-".to_owned(),
    )
}

/// How long after `cut` the agent's log shows its transition to master.
fn takeover_after(log: &str, cut: SystemTime) -> String {
    let cut: chrono_free::Utc = chrono_free::Utc::from(cut);
    for line in log.lines().filter(|l| l.contains("VRRP transition") && l.contains("to=\"master\"")) {
        if let Some(at) = chrono_free::Utc::parse(line.split_whitespace().next().unwrap_or(""))
            && at >= cut
        {
            return format!("{} ms after the cut", (at.0 - cut.0) / 1_000_000);
        }
    }
    "not in the log".to_owned()
}

/// RFC 3339 timestamps of the agent's log (`2026-11-25T05:49:14.784874Z`) as nanoseconds since
/// the epoch, without a date crate.
mod chrono_free {
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Utc(pub i128);

    impl From<std::time::SystemTime> for Utc {
        fn from(t: std::time::SystemTime) -> Self {
            Utc(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128))
        }
    }

    impl Utc {
        pub fn parse(s: &str) -> Option<Utc> {
            let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
            let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
            let (y, m, day) = (d.next()??, d.next()??, d.next()??);
            let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
            let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
            let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
            let nanos: i128 = format!("{frac:0<9}")[..9].parse().ok()?;
            // Days from the civil date (Howard Hinnant's algorithm).
            let y = if m <= 2 { y - 1 } else { y };
            let era = y.div_euclid(400);
            let yoe = y - era * 400;
            let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            let days = era * 146_097 + doe - 719_468;
            let secs = days * 86_400 + h * 3600 + min * 60 + sec;
            Some(Utc(secs as i128 * 1_000_000_000 + nanos))
        }
    }
}
