//! What the BPF fixture tables share: the segment's addresses as the fixtures use them, the
//! XDP verdicts, and one BPF_PROG_TEST_RUN of the uplink program on a frame.

use std::{net::Ipv4Addr, time::Duration};

use aya::{
    Ebpf,
    maps::PerCpuArray,
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_agent::dataplane::{EMBEDDED_OBJECT, UPLINK_PROGRAM, flow_tables::FlowTable};
use lb_common::{
    counters::Reason,
    flow_table,
    maps::{PacketCounter, REASON_STATS, UPLINKS, Uplink, UplinkKey},
    service::{ConnectionKey, Flow, IPV6_SERVICE_PROGRAMS},
};

use crate::Netns;

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
pub const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
pub const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub const NODE_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x10];
pub const PEER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
pub const PEER_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x11];

/// A family's connection table (`FLOW_TABLE`, `FLOW_TABLE6`), mapped. One the agent did not
/// load has no header yet: it is keyed as the programs then are
/// ([`flow_table::DEFAULT_KEYING`]), and gets that header.
pub fn flow_table(ebpf: &Ebpf, name: &str) -> FlowTable {
    let Some(aya::maps::Map::Array(data)) = ebpf.map(name) else { panic!("no array {name}") };
    FlowTable::new(data).unwrap_or_else(|_| {
        FlowTable::initialize(data, flow_table::Header::fresh(flow_table::DEFAULT_KEYING))
            .expect("mapping the connection table")
    })
}

/// Pins, at `path`, an empty connection table as a build before `FLOW_TABLE` kept it (`FLOWS`:
/// the kernel's LRU hash of `ConnectionKey` → `Flow`), for the conversion tests.
pub fn pin_earlier_flows(
    path: &std::path::Path,
) -> aya::maps::HashMap<aya::maps::MapData, ConnectionKey, Flow> {
    let created = std::process::Command::new("bpftool")
        .args(["map", "create", path.to_str().unwrap(), "type", "lru_hash", "key", "8", "value", "8"])
        .args(["entries", "64", "name", "FLOWS"])
        .output()
        .expect("running bpftool");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let map = aya::maps::Map::LruHashMap(aya::maps::MapData::from_pin(path).expect("the pinned FLOWS"));
    aya::maps::HashMap::try_from(map).expect("FLOWS as a hash map")
}

/// The embedded object with its uplink program through the verifier, on fresh (unpinned) maps.
pub fn load_uplink() -> Ebpf {
    load_uplink_from(EMBEDDED_OBJECT)
}

/// [`load_uplink`] of any build's object (`cargo xtask bench program` compares revisions).
pub fn load_uplink_from(object: &[u8]) -> Ebpf {
    let mut ebpf = Ebpf::load(object).expect("loading the object");
    let program: &mut Xdp = ebpf.program_mut(UPLINK_PROGRAM).unwrap().try_into().unwrap();
    program.load().expect("the verifier accepts lb_xdp");
    // An earlier build's object (`cargo xtask bench program --against`) has fewer stages, at
    // the same slots: the ones it has are loaded.
    let present: Vec<(u32, &'static str)> =
        IPV6_SERVICE_PROGRAMS.into_iter().filter(|(_, name)| ebpf.program(name).is_some()).collect();
    lb_agent::dataplane::load_ipv6_stages(&mut ebpf, &present).expect("the verifier accepts the IPv6 path");
    ebpf
}

/// Makes interface `ifindex`, VLAN `vlan` (zero for none) an uplink: slot `slot`, this node's
/// address `source` and MAC `mac` there.
pub fn add_uplink(ebpf: &mut Ebpf, (ifindex, vlan): (u32, u16), slot: u8, source: Ipv4Addr, mac: [u8; 6]) {
    let mut uplinks: aya::maps::HashMap<_, UplinkKey, Uplink> =
        aya::maps::HashMap::try_from(ebpf.map_mut(UPLINKS).expect("the uplink map")).unwrap();
    let uplink = Uplink { source: source.octets(), mac, slot, _pad: 0 };
    uplinks.insert(UplinkKey::new(ifindex, vlan), uplink, 0).expect("writing an uplink");
}

/// Packets counted at `index` of the per-CPU counter array `map`, summed over CPUs.
pub fn counted(ebpf: &Ebpf, map: &str, index: u32) -> u64 {
    let array: PerCpuArray<_, PacketCounter> = PerCpuArray::try_from(ebpf.map(map).unwrap()).unwrap();
    array.get(&index, 0).unwrap().iter().map(|c| c.packets).sum()
}

/// Packets counted for `reason`.
pub fn reason_packets(ebpf: &Ebpf, reason: Reason) -> u64 {
    counted(ebpf, REASON_STATS, reason as u32)
}

/// Runs each case `(name, frame, action, reason)` through the uplink program of `ebpf` (as
/// received on `ifindex`) and checks its action, that a passed frame is left untouched, and
/// that `reason` counted it once.
pub fn expect_verdicts(ebpf: &Ebpf, ifindex: u32, cases: Vec<(&str, Vec<u8>, u32, Reason)>) {
    for (name, input, action, reason) in cases {
        let before = reason_packets(ebpf, reason);
        let (got, out) = run_uplink(ebpf, &input, ifindex);
        assert_eq!(got, action, "{name}");
        if action == XDP_PASS {
            assert_eq!(out, input, "{name}: passed untouched");
        }
        assert_eq!(reason_packets(ebpf, reason), before + 1, "{name}: counted as {}", reason.label());
    }
}

/// Runs the loaded uplink program of `ebpf` on `input`, as received on `ifindex`; returns
/// the verdict and the frame as the program left it.
pub fn run_uplink(ebpf: &Ebpf, input: &[u8], ifindex: u32) -> (u32, Vec<u8>) {
    run_xdp(ebpf.program(UPLINK_PROGRAM).unwrap().try_into().unwrap(), input, ifindex)
}

/// Runs the loaded XDP `program` on `input`, as received on `ifindex` (zero: no interface);
/// returns the verdict and the frame as the program left it.
pub fn run_xdp(program: &Xdp, input: &[u8], ifindex: u32) -> (u32, Vec<u8>) {
    let (action, out, _) = run_xdp_timed(program, input, ifindex);
    (action, out)
}

/// [`run_xdp`], with the kernel's time for the run (the program's and the test run's own).
pub fn run_xdp_timed(program: &Xdp, input: &[u8], ifindex: u32) -> (u32, Vec<u8>, Duration) {
    let mut out = vec![0u8; input.len() + 256];
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let ctx: Vec<u8> =
        [0, input.len() as u32, 0, ifindex, 0, 0].iter().flat_map(|v| v.to_ne_bytes()).collect();
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..Default::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out, result.duration)
}

/// Runs the uplink's TC egress program (`lb_reply`, loaded) on `input`: the frame as it
/// leaves. The program always lets the packet go; returns the frame it leaves with.
pub fn run_reply(ebpf: &Ebpf, input: &[u8]) -> Vec<u8> {
    let program: &aya::programs::SchedClassifier =
        ebpf.program(lb_agent::dataplane::REPLY_PROGRAM).unwrap().try_into().unwrap();
    let (action, out, _) = run_tc_timed(program, input);
    assert_eq!(action, 0, "lb_reply lets every packet go (TC_ACT_OK)");
    out
}

/// Runs the loaded TC `program` on `input`; returns its verdict, the frame as it left it, and
/// the kernel's time for the run (the program's and the test run's own).
pub fn run_tc_timed(program: &aya::programs::SchedClassifier, input: &[u8]) -> (u32, Vec<u8>, Duration) {
    let mut out = vec![0u8; input.len() + 256];
    let result = program
        .test_run(TestRunOptions { data_in: Some(input), data_out: Some(&mut out), ..Default::default() })
        .expect("BPF_PROG_TEST_RUN of a TC program");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out, result.duration)
}

/// `dev`'s MAC address in `ns`.
pub fn mac_of(ns: &Netns, dev: &str) -> [u8; 6] {
    let out = ns.run_cmd(&["cat", &format!("/sys/class/net/{dev}/address")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let bytes: Vec<u8> = text.trim().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    bytes.try_into().unwrap()
}

/// `dev`'s interface index in `ns`.
pub fn ifindex_of(ns: &Netns, dev: &str) -> u32 {
    let out = ns.run_cmd(&["cat", &format!("/sys/class/net/{dev}/ifindex")]);
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Makes `ip` reachable at `mac` on `dev` in `ns` for good, so the program's FIB lookups
/// find every neighbour the fixtures expect.
pub fn permanent_neighbour(ns: &Netns, ip: impl Into<std::net::IpAddr>, mac: [u8; 6], dev: &str) {
    let ip: std::net::IpAddr = ip.into();
    let mac = crate::format_mac(&mac);
    ns.run_cmd(&["ip", "neigh", "replace", &ip.to_string(), "lladdr", &mac, "dev", dev, "nud", "permanent"]);
}

/// Runs `f` (given eth0's ifindex) inside node n0 of a two-node lab, whose FIB reaches n1's
/// pods through the peer, with the peer and the client as permanent neighbours: the fixtures'
/// next hops are then fixed.
pub fn in_lab_node(f: impl FnOnce(u32) + Send + 'static) {
    let lab = crate::Lab::new(2);
    let node = &lab.nodes[0].ns;
    for (ip, mac) in [(PEER, PEER_MAC), (CLIENT, CLIENT_MAC)] {
        permanent_neighbour(node, ip, mac, "eth0");
    }
    let ifindex = ifindex_of(node, "eth0");
    node.run(move || f(ifindex));
}
