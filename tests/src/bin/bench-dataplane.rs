//! `cargo xtask bench dataplane`: lb-agent's XDP path against kube-proxy's iptables and
//! nftables modes, in one lab, one run, alternating modes. Prints the book's tables (docs/src/benchmarks.md).
//!
//! The lab: client → bridge → LB node n0 → pod veth, 64-byte UDP to VIP:80, DNAT to the pod.
//! - Generator: `bench_gen` through BPF_PROG_TEST_RUN live frames on the client's eth0, in a
//!   thread pinned to CPU 0; it cycles the source port over `--flows` values.
//! - Forwarder: n0's eth0 runs NAPI in a kernel thread (`threaded`), pinned to CPU 1; its CPU
//!   time comes from that thread's schedstat.
//! - Receiver: `bench_sink_tc` at the pod's TC ingress counts what arrives, once the kernel has
//!   built its skb (GRO on, no XDP on the pod's side), as it does for any traffic to a pod.
//! - Modes: `xdp-drop` (the ceiling: a sink on n0 itself), `lb-agent` (the full program: Maglev,
//!   connection table, counters), `lb-agent-vlan` (the same with the VIP on VLAN 30 of n0's
//!   uplink and the generator's frames tagged 30 in the frame: the tagged path against the
//!   untagged one; IPv4 only), `xdp-dnat` (a bare DNAT and redirect), `xdp-dnat-table` (the
//!   same with a lookup in a connection table of the agent's shape), `xdp-dnat-line` (with a
//!   lookup in `flow_table`'s one-line buckets instead), `xdp-dnat-shard` (those buckets in 32 KiB
//!   shards the kernel allocates in its huge-page direct map), `iptables` and `nftables` (kube-proxy's
//!   rule shapes, with conntrack).
//! - Marginal cost per packet: 1/pps(mode) − 1/pps(xdp-drop), from the same run.
//! - TCP: wrk against two HTTP responders in pods on n0, through the VIP.
//! - `--dsr <katran object>`: delivery to a backend on another node by IPIP, lb-agent's DSR
//!   against Katran's balancer (`katran`: its own XDP program, built from its source in
//!   `tests/peers/katran` by xtask, its maps set by `lb_lab::katran` as Katran's userspace sets
//!   them: one VIP, one real, a per-CPU LRU the size of lb-agent's flow table). The real is a
//!   pod on n1; both send their IPIP frames back out of n0's uplink (XDP_TX), and `bench_sink`
//!   counts them at the switch's end of that link, as a NIC would put them on the wire. No
//!   kernel modes (kube-proxy has no DSR) and no TCP run.
//! - `--ipv6`: the same over IPv6 (VIP 2001:db8:6::10, pods with IPv6 addresses, the UDP
//!   checksum computed by the generator, where IPv4 sends none), against kube-proxy's
//!   ip6tables and `ip6` nftables shapes; no bare-DNAT modes (they are IPv4's yardsticks) and no
//!   TCP run. Its `lb-agent-ipv4` mode is lb-agent's IPv4 mode in the same run (64-byte frames
//!   to the IPv4 VIP), so that the two families' program times are compared per repetition.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, ArrayOfMaps, MapData, PerCpuArray},
    programs::{TestRun, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};
use lb_agent::dataplane::{EMBEDDED_OBJECT, PASS_PROGRAM};
use lb_common::{
    flow_table::{self, Shard},
    service::{
        MAX_FLOWS,
        bench::{BENCH_CONFIG, BENCH_COUNT, BENCH_SHARDS, BenchConfig},
    },
};
use lb_lab::{
    Agent, Lab, Netns,
    agent::AGENT_LISTEN,
    bench::median,
    fixture::{ifindex_of, mac_of, permanent_neighbour},
    katran,
    packet::{ipv4_frame, ipv6_frame},
    spawn_in,
};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
const TARGET_PORT: u16 = 8080;
const GENERATOR_CPU: usize = 0;
const FORWARDER_CPU: usize = 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    XdpDrop,
    LbAgent,
    LbAgentIpv4,
    LbAgentVlan,
    XdpDnat,
    XdpDnatTable,
    XdpDnatLine,
    XdpDnatShard,
    Iptables,
    Nftables,
    Katran,
}

impl Mode {
    const ALL: [Mode; 11] = [
        Mode::XdpDrop,
        Mode::LbAgent,
        Mode::LbAgentIpv4,
        Mode::LbAgentVlan,
        Mode::XdpDnat,
        Mode::XdpDnatTable,
        Mode::XdpDnatLine,
        Mode::XdpDnatShard,
        Mode::Iptables,
        Mode::Nftables,
        Mode::Katran,
    ];

    /// The mode's name in file names (`LB_BENCH_PERF`'s profiles).
    fn slug(self) -> &'static str {
        match self {
            Mode::XdpDrop => "xdp-drop",
            Mode::LbAgent => "lb-agent",
            Mode::LbAgentIpv4 => "lb-agent-ipv4",
            Mode::LbAgentVlan => "lb-agent-vlan",
            Mode::XdpDnat => "xdp-dnat",
            Mode::XdpDnatTable => "xdp-dnat-table",
            Mode::XdpDnatLine => "xdp-dnat-line",
            Mode::XdpDnatShard => "xdp-dnat-shard",
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Katran => "katran",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::XdpDrop => "XDP_DROP at the LB (ceiling)",
            Mode::LbAgent => "lb-agent (full program)",
            Mode::LbAgentIpv4 => "lb-agent over IPv4, same run (64-byte frames)",
            Mode::LbAgentVlan => "lb-agent, VIP on VLAN 30 (tagged)",
            Mode::XdpDnat => "bare XDP DNAT + redirect",
            Mode::XdpDnatTable => "bare XDP DNAT + connection table",
            Mode::XdpDnatLine => "bare XDP DNAT + one-line table",
            Mode::XdpDnatShard => "bare XDP DNAT + one-line table, huge pages",
            Mode::Iptables => "kube-proxy iptables",
            Mode::Nftables => "kube-proxy nftables",
            Mode::Katran => "Katran (balancer.bpf.c, IPIP)",
        }
    }
}

/// What stays up across modes.
struct Bench {
    lab: Lab,
    /// The run is over IPv6 (`--ipv6`).
    ipv6: bool,
    /// The flows the generator cycles through: the connection tables are sized for them.
    flows: u32,
    pod_sinks: Vec<Ebpf>,
    _switch_pass: Ebpf,
    napi_thread: u32,
    pod_macs: Vec<[u8; 6]>,
    host_ifs: Vec<(String, [u8; 6], u32)>,
    _servers: Vec<lb_lab::Process>,
    /// The DSR run's backend side (`--dsr`).
    dsr: Option<Dsr>,
}

/// What the DSR run adds to the lab.
struct Dsr {
    /// The real: a pod on n1, routed through n1.
    real: Ipv4Addr,
    /// n1's MAC: Katran's "default gateway", where it sends every encapsulated frame.
    gateway_mac: [u8; 6],
    /// Counts the IPIP frames n0 sends, at the switch's end of n0's link.
    sink: Ebpf,
    /// Katran's balancer object.
    katran: PathBuf,
}

/// A mode's state on n0; dropping it tears the mode down.
enum Active {
    Agent(Agent),
    /// A program on n0; dropping it detaches it.
    Program {
        _attached: Ebpf,
    },
    /// The ceiling's sink on n0, which is also where packets are counted.
    Sink(Ebpf),
    /// Netfilter rules, removed by `deactivate`.
    Rules,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let flows: u32 = args
        .iter()
        .position(|a| a == "--flows")
        .and_then(|i| args.get(i + 1))
        .and_then(|f| f.parse().ok())
        .unwrap_or(1);
    let repetitions = if quick { 1 } else { 5 };
    let packets: u32 = if quick { 300_000 } else { 2_000_000 };
    let ipv6 = args.iter().any(|a| a == "--ipv6");
    // `--xdp-only`: the ceiling, lb-agent and the bare DNATs, for work on the program (the
    // kernel modes take most of a run's time).
    let xdp_only = args.iter().any(|a| a == "--xdp-only");
    let katran_object = args
        .iter()
        .position(|a| a == "--dsr")
        .map(|i| PathBuf::from(args.get(i + 1).expect("--dsr takes the path of Katran's balancer object")));
    assert!(!(ipv6 && katran_object.is_some()), "--dsr is an IPv4 run");
    let modes: Vec<Mode> = Mode::ALL
        .into_iter()
        .filter(|m| match katran_object {
            Some(_) => matches!(m, Mode::XdpDrop | Mode::LbAgent | Mode::Katran),
            None => *m != Mode::Katran,
        })
        .filter(|m| {
            !(ipv6
                && matches!(
                    m,
                    Mode::LbAgentVlan
                        | Mode::XdpDnat
                        | Mode::XdpDnatTable
                        | Mode::XdpDnatLine
                        | Mode::XdpDnatShard
                ))
        })
        .filter(|m| *m != Mode::LbAgentIpv4 || ipv6)
        .filter(|m| !(xdp_only && matches!(m, Mode::Iptables | Mode::Nftables)))
        .collect();

    let bench = Bench::new(ipv6, flows, katran_object);
    let machine = machine();
    eprintln!("machine: {machine}");

    // Every run's sample, by mode; repetition r of each mode ran back to back.
    let mut samples: Vec<(Mode, Vec<Sample>)> = modes.iter().map(|m| (*m, Vec::new())).collect();
    // The kernel times each BPF program run (`run_time_ns`), for the program-cost column.
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").expect("enabling BPF run-time stats");
    for rep in 0..repetitions {
        for (i, &mode) in modes.iter().enumerate() {
            let active = bench.activate(mode);
            let sample = bench.measure(active.as_ref(), packets, flows, mode);
            if let (Some(Active::Agent(agent)), Some(_)) = (&active, &bench.dsr) {
                // The DSR run measures lb-agent's DSR path, not another that also leaves by the
                // uplink. (Not all `packets`: the generator outruns the forwarder, and the
                // frames its ring cannot take never reach the program.)
                let dsr = agent.metric(r#"lbagent_xdp_reason_packets_total{reason="forwarded_dsr"}"#);
                assert!(dsr > f64::from(packets / 2), "lb-agent sent only {dsr} of {packets} packets by DSR");
            }
            drop(active);
            bench.deactivate(mode);
            eprintln!(
                "rep {rep} {:<32} {:>8.0} kpps  {:>6.3} µs/packet on the forwarder  {}",
                mode.name(),
                sample.pps / 1e3,
                sample.cpu_ns / 1e3,
                sample.program_ns.map_or("—".into(), |ns| format!("program {ns:.0} ns/packet")),
            );
            samples[i].1.push(sample);
        }
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
    print_tables(&machine, flows, packets, repetitions, &samples, ipv6, bench.dsr.is_some());
    // The TCP run compares with the kernel modes, which `--xdp-only` and `--dsr` leave out.
    if !ipv6 && !xdp_only && bench.dsr.is_none() && !args.iter().any(|a| a == "--no-tcp") {
        println!();
        bench.tcp(if quick { 2 } else { 5 }, repetitions);
    }
}

/// Puts a fresh shard in every slot of `bench_dnat_shard`'s table.
fn fill_shards(ebpf: &mut Ebpf) {
    let mut shards: ArrayOfMaps<_, Array<MapData, Shard>> =
        ArrayOfMaps::try_from(ebpf.map_mut(BENCH_SHARDS).unwrap()).unwrap();
    for i in 0..shards.len() {
        let shard = Array::<MapData, Shard>::create(1, 0).expect("a shard");
        shards.set(i, &shard, 0).expect("putting a shard in");
    }
}

/// One run of one mode.
#[derive(Clone, Copy)]
struct Sample {
    /// Delivered packets per second.
    pps: f64,
    /// Forwarder thread CPU per delivered packet.
    cpu_ns: f64,
    /// The XDP program's own run time per packet on n0 (`run_time_ns / run_cnt`), for modes
    /// that run one there.
    program_ns: Option<f64>,
}

fn range(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max))
}

/// The book's tables. Ratios between modes are taken per repetition (the runs of one
/// repetition are back to back, so the host's drift mostly cancels) and their median reported.
fn print_tables(
    machine: &str,
    flows: u32,
    packets: u32,
    repetitions: usize,
    samples: &[(Mode, Vec<Sample>)],
    ipv6: bool,
    dsr: bool,
) {
    let of = |m: Mode| &samples.iter().find(|(x, _)| *x == m).unwrap().1;
    let drop = of(Mode::XdpDrop);
    let lb = of(Mode::LbAgent);
    // Per repetition: marginal µs/packet by pps, and forwarder CPU above the drop run's.
    let marginal = |s: &Sample, r: usize| (1.0 / s.pps - 1.0 / drop[r].pps) * 1e6;
    let above = |s: &Sample, r: usize| (s.cpu_ns - drop[r].cpu_ns) / 1e3;
    let paired = |m: Mode, f: &dyn Fn(&Sample, usize) -> f64| -> Vec<f64> {
        of(m).iter().enumerate().map(|(r, s)| f(s, r) / f(&lb[r], r)).collect()
    };
    let fmt_range = |v: &[f64], digits: usize| {
        let (lo, hi) = range(v);
        format!(
            "{:.*} ({:.*}–{:.*})",
            digits,
            median(v.iter().copied()).expect("repetitions"),
            digits,
            lo,
            digits,
            hi
        )
    };

    println!(
        "Machine: {machine}. {}-byte UDP over {}, {flows} flow(s), {packets} packets per run, {repetitions} runs per mode alternating; medians (range); ratios taken within each repetition, then their median.{}",
        if ipv6 { 84 } else { 64 },
        if ipv6 { "IPv6" } else { "IPv4" },
        if dsr {
            " Delivery by IPIP to a backend on another node (DSR), counted as it leaves the LB node."
        } else {
            ""
        },
    );
    println!();
    println!(
        "| mode | delivered kpps | lb-agent ÷ mode | marginal µs/packet | ÷ lb-agent's | forwarder CPU above the ceiling, µs/packet | ÷ lb-agent's | XDP program ns/packet | ÷ lb-agent's |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, runs) in samples {
        let kpps: Vec<f64> = runs.iter().map(|s| s.pps / 1e3).collect();
        let pps_ratio: Vec<f64> = runs.iter().zip(lb).map(|(s, l)| l.pps / s.pps).collect();
        // The IPv4 row of an IPv6 run: its frames are 20 bytes shorter than the ceiling's, so
        // the columns taken against the ceiling would compare nothing.
        let (marg, marg_ratio, cpu, cpu_ratio) = if *mode == Mode::XdpDrop || *mode == Mode::LbAgentIpv4 {
            ("—".to_owned(), "—".to_owned(), "—".to_owned(), "—".to_owned())
        } else {
            let m: Vec<f64> = runs.iter().enumerate().map(|(r, s)| marginal(s, r)).collect();
            let c: Vec<f64> = runs.iter().enumerate().map(|(r, s)| above(s, r)).collect();
            (
                fmt_range(&m, 3),
                fmt_range(&paired(*mode, &marginal), 2),
                fmt_range(&c, 3),
                fmt_range(&paired(*mode, &above), 2),
            )
        };
        let program: Vec<f64> = runs.iter().filter_map(|s| s.program_ns).collect();
        let (prog, prog_ratio) = if program.len() == runs.len() && *mode != Mode::XdpDrop {
            let ratios: Vec<f64> =
                runs.iter().zip(lb).map(|(s, l)| s.program_ns.unwrap() / l.program_ns.unwrap()).collect();
            (fmt_range(&program, 0), fmt_range(&ratios, 2))
        } else if program.len() == runs.len() {
            (fmt_range(&program, 0), "—".to_owned())
        } else {
            ("—".to_owned(), "—".to_owned())
        };
        let name = match mode {
            Mode::Iptables if ipv6 => mode.name().replace("iptables", "ip6tables"),
            Mode::LbAgent if dsr => "lb-agent (full program, DSR: IPIP)".to_owned(),
            _ => mode.name().to_owned(),
        };
        println!(
            "| {} | {} | {} | {marg} | {marg_ratio} | {cpu} | {cpu_ratio} | {prog} | {prog_ratio} |",
            name,
            fmt_range(&kpps, 0),
            fmt_range(&pps_ratio, 2),
        );
    }
}

impl Bench {
    fn new(ipv6: bool, flows: u32, katran_object: Option<PathBuf>) -> Bench {
        let mut lab = Lab::new(if katran_object.is_some() { 2 } else { 1 });
        if ipv6 {
            lab.enable_ipv6();
        }
        let pods: Vec<usize> = (0..2).map(|_| lab.add_pod(0)).collect();
        let node = &lab.nodes[0];
        // Frames straight to n0: no ARP (NDP) in the measurement. The IPv6 run has an IPv4 mode.
        permanent_neighbour(&lab.client.ns, VIP, node.mac, "eth0");
        if ipv6 {
            permanent_neighbour(&lab.client.ns, VIP6, node.mac, "eth0");
        }
        // The generator's XDP_TX frames need NAPI on the far end of the client's veth.
        let switch_pass = {
            let port = lab.client.switch_port.clone();
            lab.switch.run(move || attach(PASS_PROGRAM, &port))
        };
        // n0 receives through NAPI in every mode (GRO on; the sending side's TSO off), run by
        // a kernel thread pinned to its own CPU.
        lab.switch.run_cmd(&["ethtool", "-K", &node.switch_port, "tso", "off"]);
        // VLAN 30's frames reach n0 with the tag in the frame, as from a NIC without receive
        // VLAN offload (the agent turns it off).
        lab.switch.run_cmd(&["ethtool", "-K", &node.switch_port, "txvlan", "off"]);
        node.ns.run_cmd(&["ethtool", "-K", "eth0", "gro", "on"]);
        let before = napi_threads();
        node.ns.run_cmd(&["sh", "-c", "echo 1 > /sys/class/net/eth0/threaded"]);
        let napi_thread = napi_threads().into_iter().find(|t| !before.contains(t)).expect("n0's NAPI thread");
        pin(napi_thread, FORWARDER_CPU);

        let mut pod_sinks = Vec::new();
        let mut pod_macs = Vec::new();
        let mut host_ifs = Vec::new();
        for (k, &p) in pods.iter().enumerate() {
            let pod = &lab.pods[p];
            // GRO lets the pod's veth take redirected frames without an XDP program there.
            pod.ns.run_cmd(&["ethtool", "-K", "eth0", "gro", "on"]);
            pod_sinks.push(pod.ns.run(|| attach_tc_ingress("bench_sink_tc", "eth0")));
            pod_macs.push(mac_of(&pod.ns, "eth0"));
            let host_if = format!("pv{k}");
            host_ifs.push((host_if.clone(), mac_of(&node.ns, &host_if), ifindex_of(&node.ns, &host_if)));
        }
        let servers = pods
            .iter()
            .map(|&p| spawn_in(&lab.pods[p].ns, &[responder().as_str(), &TARGET_PORT.to_string()]))
            .collect();
        let dsr = katran_object.map(|object| Dsr::new(&mut lab, object));
        Bench {
            lab,
            ipv6,
            flows,
            pod_sinks,
            _switch_pass: switch_pass,
            napi_thread,
            pod_macs,
            host_ifs,
            _servers: servers,
            dsr,
        }
    }

    fn node(&self) -> &Netns {
        &self.lab.nodes[0].ns
    }

    /// Pod `k`'s address in this run's family.
    fn pod(&self, k: usize) -> IpAddr {
        let pod = &self.lab.pods[k];
        if self.ipv6 { pod.ip6.expect("IPv6 pods").into() } else { pod.ip.into() }
    }

    /// `address:port` as iptables' and nftables' DNAT take it (`[address]:port` for IPv6).
    fn to(&self, k: usize) -> String {
        std::net::SocketAddr::new(self.pod(k), TARGET_PORT).to_string()
    }

    fn activate(&self, mode: Mode) -> Option<Active> {
        if self.ipv6 && mode != Mode::LbAgentIpv4 {
            return self.activate6(mode);
        }
        if let Some(dsr) = &self.dsr {
            return self.activate_dsr(mode, dsr);
        }
        let pod = self.lab.pods[0].ip;
        match mode {
            Mode::XdpDrop => Some(Active::Sink(self.node().run(|| attach("bench_sink", "eth0")))),
            Mode::LbAgentVlan => {
                let config = format!(
                    "node: n0\ninterface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\n\
                     groups:\n  - {{name: bench, vlan: 30, vrid: 30, priorities: {{n0: 200}}, advertInterval: 100ms, nodes: [{{name: n0, address: 10.30.0.10}}], \
                     vips: [{{address: {VIP}}}]}}\n\
                     dataplane: {{keepOnExit: false, capacity: {{flows: {0}, replyNat: {0}}}}}\nservices:\n  - name: bench\n    vip: {VIP}\n    ports:\n      \
                     - {{port: 80, protocol: UDP, targetPort: {TARGET_PORT}}}\n    endpoints:\n{1}",
                    table_flows(self.flows),
                    format_args!("      - {{address: {pod}, node: n0}}\n")
                );
                let mut agent = self.lab.start_agent(0, &config);
                agent.wait_ready();
                // A lone member: master once its master-down interval passes.
                agent.wait_metric(
                    r#"lbagent_vrrp_state{group="bench",vrid="30",family="ipv4",state="master"}"#,
                    1.0,
                );
                Some(Active::Agent(agent))
            }
            Mode::LbAgent | Mode::LbAgentIpv4 => {
                let config = format!(
                    "node: n0\ninterface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nvips: [{{address: {VIP}}}]\n\
                     dataplane: {{keepOnExit: false, capacity: {{flows: {0}, replyNat: {0}}}}}\nservices:\n  - name: bench\n    vip: {VIP}\n    ports:\n      \
                     - {{port: 80, protocol: UDP, targetPort: {TARGET_PORT}}}\n      - {{port: 80, targetPort: {TARGET_PORT}}}\n    \
                     endpoints:\n{1}",
                    table_flows(self.flows),
                    format_args!("      - {{address: {pod}, node: n0}}\n")
                );
                let mut agent = self.lab.start_agent(0, &config);
                agent.wait_ready();
                Some(Active::Agent(agent))
            }
            Mode::Katran => None,
            Mode::XdpDnat | Mode::XdpDnatTable | Mode::XdpDnatLine | Mode::XdpDnatShard => {
                let program = match mode {
                    Mode::XdpDnatTable => "bench_dnat_table",
                    Mode::XdpDnatLine => "bench_dnat_line",
                    Mode::XdpDnatShard => "bench_dnat_shard",
                    _ => "bench_dnat",
                };
                let (_, host_mac, host_index) = self.host_ifs[0].clone();
                let flows = self.flows;
                let config = BenchConfig {
                    flows: 0,
                    ifindex: host_index,
                    vip: VIP.octets(),
                    target: pod.octets(),
                    port: 80u16.to_be_bytes(),
                    target_port: TARGET_PORT.to_be_bytes(),
                    smac: host_mac,
                    dmac: self.pod_macs[0],
                };
                Some(Active::Program {
                    _attached: self.node().run(move || {
                        let mut ebpf = attach_sized(program, "eth0", flows);
                        let mut map: Array<_, BenchConfig> =
                            Array::try_from(ebpf.map_mut(BENCH_CONFIG).unwrap()).unwrap();
                        map.set(0, config, 0).unwrap();
                        if mode == Mode::XdpDnatShard {
                            fill_shards(&mut ebpf);
                        }
                        ebpf
                    }),
                })
            }
            Mode::Iptables => {
                let rules = format!(
                    "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-BENCH - [0:0]\n:KUBE-SEP-BENCH - [0:0]\n\
                     -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                     -A KUBE-SERVICES -d {VIP}/32 -p udp -m udp --dport 80 -j KUBE-SVC-BENCH\n\
                     -A KUBE-SERVICES -d {VIP}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BENCH-TCP\n\
                     -A KUBE-SVC-BENCH -j KUBE-SEP-BENCH\n\
                     -A KUBE-SEP-BENCH -p udp -m udp -j DNAT --to-destination {pod}:{TARGET_PORT}\n\
                     COMMIT\n"
                );
                let rules = rules.replace(
                    ":KUBE-SEP-BENCH - [0:0]\n",
                    &format!(
                        ":KUBE-SEP-BENCH - [0:0]\n:KUBE-SVC-BENCH-TCP - [0:0]\n:KUBE-SEP-TCP-0 - [0:0]\n:KUBE-SEP-TCP-1 - [0:0]\n\
                         -A KUBE-SVC-BENCH-TCP -m statistic --mode random --probability 0.5 -j KUBE-SEP-TCP-0\n\
                         -A KUBE-SVC-BENCH-TCP -j KUBE-SEP-TCP-1\n\
                         -A KUBE-SEP-TCP-0 -p tcp -m tcp -j DNAT --to-destination {}:{TARGET_PORT}\n\
                         -A KUBE-SEP-TCP-1 -p tcp -m tcp -j DNAT --to-destination {}:{TARGET_PORT}\n",
                        self.lab.pods[0].ip, self.lab.pods[1].ip
                    ),
                );
                let path = self.lab.path("iptables.rules");
                std::fs::write(&path, rules).unwrap();
                let restore = format!("{}-restore < {}", iptables(), path.display());
                self.node().run_cmd(&["sh", "-c", &restore]);
                Some(Active::Rules)
            }
            Mode::Nftables => {
                let ruleset = format!(
                    "table ip kube-proxy {{\n\
                     chain endpoint-udp {{ meta l4proto udp dnat to {pod}:{TARGET_PORT}; }}\n\
                     chain endpoint-tcp-0 {{ meta l4proto tcp dnat to {}:{TARGET_PORT}; }}\n\
                     chain endpoint-tcp-1 {{ meta l4proto tcp dnat to {}:{TARGET_PORT}; }}\n\
                     chain service-udp {{ numgen random mod 1 vmap {{ 0 : goto endpoint-udp }}; }}\n\
                     chain service-tcp {{ numgen random mod 2 vmap {{ 0 : goto endpoint-tcp-0, 1 : goto endpoint-tcp-1 }}; }}\n\
                     map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; \
                     elements = {{ {VIP} . udp . 80 : goto service-udp, {VIP} . tcp . 80 : goto service-tcp }}; }}\n\
                     chain services {{ ip daddr . meta l4proto . th dport vmap @service-ips; }}\n\
                     chain nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; jump services; }}\n\
                     }}\n",
                    self.lab.pods[0].ip, self.lab.pods[1].ip
                );
                let path = self.lab.path("nftables.rules");
                std::fs::write(&path, ruleset).unwrap();
                self.node().run_cmd(&["nft", "-f", path.to_str().unwrap()]);
                Some(Active::Rules)
            }
        }
    }

    /// As [`Bench::activate`] over IPv6: kube-proxy's ip6tables and `ip6` nftables shapes
    /// (the UDP service of the IPv4 run; TCP is not measured over IPv6).
    fn activate6(&self, mode: Mode) -> Option<Active> {
        let (vip, to) = (VIP6, self.to(0));
        match mode {
            Mode::XdpDrop => Some(Active::Sink(self.node().run(|| attach("bench_sink", "eth0")))),
            Mode::LbAgent => {
                let config = format!(
                    "node: n0\ninterface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nvips: [{{address: '{vip}'}}]\n\
                     dataplane: {{keepOnExit: false, capacity6: {{flows: {1}, replyNat: {1}}}}}\nservices:\n  - name: bench\n    vip: '{vip}'\n    ports:\n      \
                     - {{port: 80, protocol: UDP, targetPort: {TARGET_PORT}}}\n    endpoints:\n      - {{address: '{}', node: n0}}\n",
                    self.pod(0),
                    table_flows(self.flows)
                );
                let mut agent = self.lab.start_agent(0, &config);
                agent.wait_ready();
                Some(Active::Agent(agent))
            }
            Mode::LbAgentVlan
            | Mode::LbAgentIpv4
            | Mode::XdpDnat
            | Mode::XdpDnatTable
            | Mode::XdpDnatLine
            | Mode::XdpDnatShard
            | Mode::Katran => None,
            Mode::Iptables => {
                let rules = format!(
                    "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-BENCH - [0:0]\n:KUBE-SEP-BENCH - [0:0]\n\
                     -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                     -A KUBE-SERVICES -d {vip}/128 -p udp -m udp --dport 80 -j KUBE-SVC-BENCH\n\
                     -A KUBE-SVC-BENCH -j KUBE-SEP-BENCH\n\
                     -A KUBE-SEP-BENCH -p udp -m udp -j DNAT --to-destination {to}\n\
                     COMMIT\n"
                );
                let path = self.lab.path("ip6tables.rules");
                std::fs::write(&path, rules).unwrap();
                let restore = format!("{}-restore < {}", ip6tables(), path.display());
                self.node().run_cmd(&["sh", "-c", &restore]);
                Some(Active::Rules)
            }
            Mode::Nftables => {
                let ruleset = format!(
                    "table ip6 kube-proxy {{\n\
                     chain endpoint-udp {{ meta l4proto udp dnat to {to}; }}\n\
                     chain service-udp {{ numgen random mod 1 vmap {{ 0 : goto endpoint-udp }}; }}\n\
                     map service-ips {{ type ipv6_addr . inet_proto . inet_service : verdict; \
                     elements = {{ {vip} . udp . 80 : goto service-udp }}; }}\n\
                     chain services {{ ip6 daddr . meta l4proto . th dport vmap @service-ips; }}\n\
                     chain nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; jump services; }}\n\
                     }}\n"
                );
                let path = self.lab.path("nftables6.rules");
                std::fs::write(&path, ruleset).unwrap();
                self.node().run_cmd(&["nft", "-f", path.to_str().unwrap()]);
                Some(Active::Rules)
            }
        }
    }

    /// As [`Bench::activate`] for the DSR run: lb-agent with the real as a DSR endpoint on n1,
    /// and Katran with the real as its one real.
    fn activate_dsr(&self, mode: Mode, dsr: &Dsr) -> Option<Active> {
        match mode {
            Mode::XdpDrop => Some(Active::Sink(self.node().run(|| attach("bench_sink", "eth0")))),
            Mode::LbAgent => {
                let config = format!(
                    "node: n0\ninterface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nvips: [{{address: {VIP}}}]\n\
                     dataplane: {{keepOnExit: false, capacity: {{flows: {0}, replyNat: {0}}}}}\nservices:\n  - name: bench\n    vip: {VIP}\n    \
                     remoteMode: dsr\n    ports:\n      - {{port: 80, protocol: UDP}}\n    endpoints:\n      - {{address: {1}, node: n1}}\n",
                    table_flows(self.flows),
                    dsr.real,
                );
                let mut agent = self.lab.start_agent(0, &config);
                agent.wait_ready();
                Some(Active::Agent(agent))
            }
            Mode::Katran => {
                let (object, real, gateway_mac) = (dsr.katran.clone(), dsr.real, dsr.gateway_mac);
                let lru_entries = table_flows(self.flows);
                Some(Active::Program {
                    _attached: self
                        .node()
                        .run(move || attach_katran(&object, real, gateway_mac, lru_entries)),
                })
            }
            _ => None,
        }
    }

    fn deactivate(&self, mode: Mode) {
        match mode {
            Mode::Iptables => {
                let iptables = if self.ipv6 { ip6tables() } else { iptables() };
                self.node().run_cmd(&[&iptables, "-t", "nat", "-F"]);
                self.node().run_cmd(&[&iptables, "-t", "nat", "-X"]);
            }
            Mode::Nftables => {
                let family = if self.ipv6 { "ip6" } else { "ip" };
                self.node().run_cmd(&["nft", "delete", "table", family, "kube-proxy"]);
            }
            _ => {}
        }
        let _ = self.node().output(&["conntrack", "-F"]);
    }

    /// Sends `packets` frames and returns (delivered packets per second, forwarder ns/packet).
    /// Delivered means counted by the pods' sinks (the DSR run: by the sink at the switch's end
    /// of n0's link), or by the ceiling mode's sink on n0.
    fn measure(&self, active: Option<&Active>, packets: u32, flows: u32, mode: Mode) -> Sample {
        let tagged = mode == Mode::LbAgentVlan;
        let ipv6 = self.ipv6 && mode != Mode::LbAgentIpv4;
        let received = || -> u64 {
            match (active, &self.dsr) {
                (Some(Active::Sink(ebpf)), _) => count(ebpf),
                (_, Some(dsr)) => count(&dsr.sink),
                (_, None) => self.pod_sinks.iter().map(count).sum(),
            }
        };
        let frame = {
            let payload = [0u8; 22];
            let mut udp = Vec::new();
            udp.extend_from_slice(&1024u16.to_be_bytes());
            udp.extend_from_slice(&80u16.to_be_bytes());
            udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            udp.extend_from_slice(&[0, 0]);
            udp.extend_from_slice(&payload);
            if ipv6 {
                // The generator writes the UDP checksum.
                ipv6_frame(
                    self.lab.client.mac,
                    self.lab.nodes[0].mac,
                    self.lab.client.global6(),
                    VIP6,
                    64,
                    17,
                    &udp,
                )
            } else {
                let frame = ipv4_frame(self.lab.client.mac, self.lab.nodes[0].mac, CLIENT, VIP, 64, 17, &udp);
                if tagged { [&frame[..12], &[0x81, 0x00, 0x00, 30], &frame[12..]].concat() } else { frame }
            }
        };
        let client_if = ifindex_of(&self.lab.client.ns, "eth0");
        let client_ns = &self.lab.client.ns;
        let generate = |packets: u32| {
            let frame = frame.clone();
            client_ns.run(move || {
                pin_self(GENERATOR_CPU);
                let mut ebpf = Ebpf::load(EMBEDDED_OBJECT).unwrap();
                let mut config: Array<_, BenchConfig> =
                    Array::try_from(ebpf.map_mut(BENCH_CONFIG).unwrap()).unwrap();
                config.set(0, BenchConfig { flows, ..Default::default() }, 0).unwrap();
                let program: &mut Xdp = ebpf.program_mut("bench_gen").unwrap().try_into().unwrap();
                program.load().unwrap();
                let ctx: Vec<u8> = [0, frame.len() as u32, 0, client_if, 0, 0]
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect();
                let started = Instant::now();
                program
                    .test_run(TestRunOptions {
                        data_in: Some(&frame),
                        ctx_in: Some(&ctx),
                        repeat: packets,
                        attrs: TestRunAttrs::new().xdp_live_frames(64),
                        ..Default::default()
                    })
                    .expect("live-frames generator");
                started.elapsed()
            })
        };
        // Every flow (twice) before measuring, in every mode: the runs measure established flows
        // (the connection table, conntrack and the next hops hold them), not their set-up.
        generate(flows.max(64) * 2);
        std::thread::sleep(Duration::from_millis(100));
        // LB_BENCH_PERF=<dir>: a kernel profile of the forwarder thread per mode, for finding
        // where a mode's time goes (`perf report -i <dir>/<mode>.data`).
        let profile = lb_lab::bench::Profile::start(mode.slug(), ["-t", &self.napi_thread.to_string()], 2999);
        let program = self.uplink_program();
        let before_program = program.map(program_stats);
        let (before_rx, before_cpu) = (received(), schedstat(self.napi_thread));
        let elapsed = generate(packets);
        std::thread::sleep(Duration::from_millis(100));
        let delivered = received() - before_rx;
        let cpu_ns = schedstat(self.napi_thread) - before_cpu;
        drop(profile);
        let program_ns = program.zip(before_program).and_then(|(id, (time0, runs0))| {
            let (time, runs) = program_stats(id);
            (runs > runs0).then(|| (time - time0) as f64 / (runs - runs0) as f64)
        });
        Sample {
            pps: delivered as f64 / elapsed.as_secs_f64(),
            cpu_ns: cpu_ns as f64 / delivered.max(1) as f64,
            program_ns,
        }
    }

    /// The id of the XDP program on n0's uplink, if one is attached.
    fn uplink_program(&self) -> Option<u32> {
        let out = self.node().run_cmd(&["ip", "-j", "-d", "link", "show", "dev", "eth0"]);
        let links: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let id = links.get(0)?.get("xdp")?.get("prog")?.get("id")?.as_u64()?;
        Some(id as u32)
    }

    /// TCP requests per second and p99 latency through the VIP, with wrk.
    fn tcp(&self, seconds: u32, repetitions: usize) {
        let modes = [Mode::LbAgent, Mode::Iptables, Mode::Nftables];
        let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); modes.len()];
        for _ in 0..repetitions {
            for (i, &mode) in modes.iter().enumerate() {
                let active = self.activate_tcp(mode);
                let out = self.lab.client.ns.output(&[
                    "taskset",
                    "-c",
                    &GENERATOR_CPU.to_string(),
                    "wrk",
                    "-t1",
                    "-c64",
                    &format!("-d{seconds}s"),
                    "--latency",
                    &format!("http://{VIP}:80/"),
                ]);
                drop(active);
                self.deactivate(mode);
                let text = String::from_utf8_lossy(&out.stdout);
                let rps = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Requests/sec:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0.0);
                let p99 = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("99%"))
                    .map(|v| latency_ms(v.trim()))
                    .unwrap_or(f64::NAN);
                eprintln!("tcp {:<28} {rps:>10.0} req/s  p99 {p99:.2} ms", mode.name());
                results[i].push((rps, p99));
            }
        }
        // Every mode ran every repetition: none is empty.
        let lb_rps = median(results[0].iter().map(|r| r.0)).expect("runs");
        println!(
            "TCP through the VIP: wrk, 64 connections, {seconds} s per run, two HTTP responders in pods; medians."
        );
        println!();
        println!("| mode | requests/s | lb-agent ÷ mode | p99 latency (ms) |");
        println!("|---|---|---|---|");
        for (i, mode) in modes.iter().enumerate() {
            let rps = median(results[i].iter().map(|r| r.0)).expect("runs");
            let p99 = median(results[i].iter().map(|r| r.1)).expect("runs");
            println!("| {} | {rps:.0} | {:.2} | {p99:.2} |", mode.name(), lb_rps / rps);
        }
    }

    fn activate_tcp(&self, mode: Mode) -> Option<Active> {
        if mode != Mode::LbAgent {
            return self.activate(mode);
        }
        let endpoints: String =
            self.lab.pods.iter().map(|p| format!("      - {{address: {}, node: n0}}\n", p.ip)).collect();
        let config = format!(
            "node: n0\ninterface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nvips: [{{address: {VIP}}}]\n\
             dataplane: {{keepOnExit: false}}\nservices:\n  - name: bench\n    vip: {VIP}\n    ports:\n      \
             - {{port: 80, targetPort: {TARGET_PORT}}}\n    endpoints:\n{endpoints}"
        );
        let mut agent = self.lab.start_agent(0, &config);
        agent.wait_ready();
        Some(Active::Agent(agent))
    }
}

impl Dsr {
    /// The real (a pod on n1), n1 resolved on n0, and the sink at the switch's end of n0's link.
    fn new(lab: &mut Lab, katran: PathBuf) -> Dsr {
        let pod = lab.add_pod(1);
        let real = lab.pods[pod].ip;
        let (n0, n1) = (&lab.nodes[0], &lab.nodes[1]);
        // No ARP in the measurement.
        permanent_neighbour(&n0.ns, n1.ip, n1.mac, "eth0");
        let gateway_mac = n1.mac;
        // The far end of n0's link counts what n0 sends (its XDP_TX frames need NAPI there in
        // any case), as a NIC's transmit would hand them to the wire: no switch, no n1, in
        // either mode's cost.
        let port = n0.switch_port.clone();
        let sink = lab.switch.run(move || attach("bench_sink", &port));
        Dsr { real, gateway_mac, sink, katran }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Active::Agent(agent) = self {
            agent.signal(libc::SIGTERM);
            let _ = agent.wait_exit(Duration::from_secs(10));
        }
    }
}

/// The ip6tables command of the IPv6 run: Debian's `ip6tables` (nf_tables backend), or
/// `LB_BENCH_IP6TABLES`.
fn ip6tables() -> String {
    std::env::var("LB_BENCH_IP6TABLES").unwrap_or_else(|_| "ip6tables".into())
}

/// The iptables command the iptables mode uses: Debian's `iptables` (the nf_tables backend,
/// as kube-proxy's image picks on a host without legacy rules), or `LB_BENCH_IPTABLES` (e.g.
/// `iptables-legacy`, the x_tables backend older hosts run).
fn iptables() -> String {
    std::env::var("LB_BENCH_IPTABLES").unwrap_or_else(|_| "iptables".into())
}

/// A program's (run time ns, runs) so far, from the kernel's BPF stats.
fn program_stats(id: u32) -> (u64, u64) {
    let out = Command::new("bpftool").args(["-j", "prog", "show", "id", &id.to_string()]).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let field = |name: &str| info.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
    (field("run_time_ns"), field("run_cnt"))
}

fn count(ebpf: &Ebpf) -> u64 {
    let array: PerCpuArray<_, u64> = PerCpuArray::try_from(ebpf.map(BENCH_COUNT).unwrap()).unwrap();
    array.get(&0, 0).unwrap().iter().sum()
}

fn attach(program: &str, interface: &str) -> Ebpf {
    let mut ebpf = Ebpf::load(EMBEDDED_OBJECT).expect("loading the BPF object");
    let xdp: &mut Xdp = ebpf.program_mut(program).unwrap().try_into().unwrap();
    xdp.load().unwrap_or_else(|e| panic!("loading {program}: {e}"));
    xdp.attach(interface, XdpMode::Driver)
        .unwrap_or_else(|e| panic!("attaching {program} to {interface}: {e}"));
    ebpf
}

/// The flows the connection tables hold: the object's size, or more for a bigger run.
fn table_flows(flows: u32) -> u32 {
    flows.max(MAX_FLOWS).next_power_of_two()
}

/// `attach` with the yardsticks' connection tables sized for `flows` flows.
fn attach_sized(program: &str, interface: &str, flows: u32) -> Ebpf {
    let flows = table_flows(flows);
    let keying = flow_table::Keying::for_flows(flows, flow_table::DEFAULT_KEYING.seed);
    let shards = flow_table::shards_for(flows);
    let mut ebpf = aya::EbpfLoader::new()
        .map_max_entries("BENCH_FLOWS", flows)
        .map_max_entries("BENCH_LINE_TABLE", keying.buckets())
        .map_max_entries(BENCH_SHARDS, shards)
        .override_global("BENCH_LINE_KEYING", &keying, true)
        .override_global("BENCH_SHARD_COUNT", &shards, true)
        .load(EMBEDDED_OBJECT)
        .expect("loading the BPF object");
    let xdp: &mut Xdp = ebpf.program_mut(program).unwrap().try_into().unwrap();
    xdp.load().unwrap_or_else(|e| panic!("loading {program}: {e}"));
    xdp.attach(interface, XdpMode::Driver)
        .unwrap_or_else(|e| panic!("attaching {program} to {interface}: {e}"));
    ebpf
}

/// Katran's balancer, its maps set for VIP:80 and `real` ([`katran::load`]), attached to eth0 in
/// driver mode.
fn attach_katran(object: &Path, real: Ipv4Addr, gateway_mac: [u8; 6], lru_entries: u32) -> Ebpf {
    let mut katran = katran::load(object, VIP, 80, real, gateway_mac, lru_entries);
    katran
        .program()
        .attach("eth0", XdpMode::Driver)
        .unwrap_or_else(|e| panic!("attaching Katran's balancer_ingress: {e}"));
    katran.ebpf
}

fn attach_tc_ingress(program: &str, interface: &str) -> Ebpf {
    let mut ebpf = Ebpf::load(EMBEDDED_OBJECT).expect("loading the BPF object");
    let tc: &mut aya::programs::SchedClassifier = ebpf.program_mut(program).unwrap().try_into().unwrap();
    tc.load().unwrap_or_else(|e| panic!("loading {program}: {e}"));
    tc.attach(interface, aya::programs::TcAttachType::Ingress)
        .unwrap_or_else(|e| panic!("attaching {program} to {interface}: {e}"));
    ebpf
}

fn napi_threads() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with("napi/eth0").then_some(pid)
        })
        .collect()
}

fn pin(pid: u32, cpu: usize) {
    let status = Command::new("taskset").args(["-pc", &cpu.to_string(), &pid.to_string()]).output().unwrap();
    assert!(status.status.success(), "pinning {pid} to CPU {cpu}");
}

fn pin_self(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Nanoseconds the thread has run.
fn schedstat(tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn latency_ms(text: &str) -> f64 {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_alphabetic()).unwrap_or(text.len()));
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        _ => f64::NAN,
    }
}

/// The HTTP responder binary built beside this one.
fn responder() -> String {
    let exe = std::env::current_exe().unwrap();
    exe.with_file_name("bench-http").to_string_lossy().into_owned()
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} vCPU {model}, kernel {}", kernel.trim())
}
