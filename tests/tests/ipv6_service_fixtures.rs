//! Fixture tables for the IPv6 service paths through BPF_PROG_TEST_RUN: the real object (the
//! uplink program tail-calling `lb_xdp6` and its stages) and the agent's IPv6 map sync, one
//! input frame each, and the exact action and output frame it must produce.
//!
//! As for IPv4 (`service_fixtures.rs`), the runs happen inside lab node n0, with permanent
//! neighbours, so the kernel's FIB gives fixed next hops.

use std::net::Ipv6Addr;

use aya::{Ebpf, maps::HashMap, programs::Xdp};
use lb_agent::{
    config::Config,
    dataplane::{EMBEDDED_OBJECT, ServiceMapsByFamily, UPLINK_PROGRAM, load_ipv6_path},
    map_contents::{self, MapContents},
};
use lb_common::{
    counters::Reason,
    hash::flow_hash,
    maps::{OWNED_VIPS6, OwnedVip, UplinkKey, Vip6Key},
    service::{Addr6, FlowKey6, Settings, UPLINK_ADDRS6},
};
use lb_lab::{
    Lab,
    cluster::pod_ip6,
    fixture::{
        CLIENT_MAC, NODE_MAC, PEER_MAC, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, expect_verdicts,
        ifindex_of, mac_of, permanent_neighbour, reason_packets, run_uplink,
    },
    packet::{ipv6_frame, transport_checksum6, transport6},
};

const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);
/// The lab's addresses on the segment (see `Host::global6`): n0, n1 and the client.
const NODE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 10);
const PEER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 11);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 100);
const SNAT_FIRST: u16 = 61_000;
const SNAT_SPAN: u32 = 4_536;

const CONFIG: &str = "
interface: eth0
node: n0
vips: [{address: '2001:db8:6::10'}]
services:
  - name: local
    vip: '2001:db8:6::10'
    ports: [{port: 80, targetPort: 8080}, {port: 80, protocol: UDP, targetPort: 8080}]
    endpoints: [{address: 'fd00:10:244::2', node: n0}]
  - name: full-nat
    vip: '2001:db8:6::10'
    ports: [{port: 81, protocol: UDP, targetPort: 8080}]
    endpoints: [{address: 'fd00:10:244:1::2', node: n1}]
  - name: dsr
    vip: '2001:db8:6::10'
    remoteMode: dsr
    ports: [{port: 82, targetPort: 8080}, {port: 82, protocol: UDP, targetPort: 8080}]
    endpoints: [{address: 'fd00:10:244:1::2', node: n1}]
  - name: dsr-here
    vip: '2001:db8:6::10'
    remoteMode: dsr
    ports: [{port: 84, targetPort: 8080}]
    endpoints: [{address: 'fd00:10:244::2', node: n0}]
  - name: empty
    vip: '2001:db8:6::10'
    ports: [{port: 85}]
";

fn local_pod() -> Ipv6Addr {
    pod_ip6(0, 2)
}

fn remote_pod() -> Ipv6Addr {
    pod_ip6(1, 2)
}

struct Fixture {
    ebpf: Ebpf,
    _maps: ServiceMapsByFamily,
    ifindex: u32,
}

impl Fixture {
    fn load(ifindex: u32) -> Fixture {
        let mut ebpf = Ebpf::load(EMBEDDED_OBJECT).expect("loading the embedded object");
        let program: &mut Xdp = ebpf.program_mut(UPLINK_PROGRAM).unwrap().try_into().unwrap();
        program.load().expect("the verifier accepts lb_xdp");
        load_ipv6_path(&mut ebpf).expect("the verifier accepts the IPv6 path");
        let mut owned: HashMap<_, Vip6Key, OwnedVip> =
            HashMap::try_from(ebpf.map_mut(OWNED_VIPS6).unwrap()).unwrap();
        owned.insert(Vip6Key::new(VIP6.octets()), OwnedVip::new(NODE_MAC), 0).unwrap();
        let mut sources: HashMap<_, UplinkKey, Vip6Key> =
            HashMap::try_from(ebpf.map_mut(UPLINK_ADDRS6).unwrap()).unwrap();
        sources.insert(UplinkKey::new(ifindex, 0), Vip6Key::new(NODE6.octets()), 0).unwrap();
        let config = Config::parse(CONFIG).expect("the fixture config is valid");
        let mut maps = ServiceMapsByFamily::take(&mut ebpf, None).expect("the service maps");
        maps.v4
            .set_settings(Settings {
                node_addr: [192, 0, 2, 10],
                snat_port_min: SNAT_FIRST,
                snat_port_max: 65_535,
            })
            .unwrap();
        let plan: MapContents<Addr6> = map_contents::for_node(&config, "n0");
        assert_eq!(plan.services.len(), 7, "every IPv6 service port planned");
        maps.v6.apply(&plan).expect("syncing the fixture services");
        Fixture { ebpf, _maps: maps, ifindex }
    }

    fn run(&self, input: &[u8]) -> (u32, Vec<u8>) {
        run_uplink(&self.ebpf, input, self.ifindex)
    }

    fn reason(&self, reason: Reason) -> u64 {
        reason_packets(&self.ebpf, reason)
    }
}

/// A frame with a valid TCP/UDP segment, `macs` as (source, destination).
fn segment_frame(
    macs: ([u8; 6], [u8; 6]),
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    proto: u8,
    ports: (u16, u16),
) -> Vec<u8> {
    ipv6_frame(
        macs.0,
        macs.1,
        src,
        dst,
        hop_limit,
        proto,
        &transport6(proto, src, dst, ports.0, ports.1, b"fixture"),
    )
}

/// IPv6 in IPv6 as the load balancer sends it (RFC 2473): the inner traffic class and flow
/// label, hop limit 64, next header 41.
fn encapsulated(macs: ([u8; 6], [u8; 6]), src: Ipv6Addr, dst: Ipv6Addr, inner_frame: &[u8]) -> Vec<u8> {
    let mut f = ipv6_frame(macs.0, macs.1, src, dst, 64, 41, &inner_frame[14..]);
    f[14..18].copy_from_slice(&inner_frame[14..18]);
    f
}

fn snat_port(sport: u16, dport: u16, proto: u8) -> u16 {
    let key = FlowKey6::new(CLIENT6.octets(), VIP6.octets(), sport.to_be_bytes(), dport.to_be_bytes(), proto);
    SNAT_FIRST + (flow_hash(&key) % SNAT_SPAN) as u16
}

/// Whether a frame's TCP/UDP checksum (IPv6, no extension headers) is right.
fn checksum_valid(frame: &[u8]) -> bool {
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[22..38]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[38..54]).unwrap());
    transport_checksum6(frame[20], src, dst, &frame[54..]) == 0
}

/// Runs `f` (given eth0's ifindex and the local pod's and its host interface's MACs) inside
/// lab node n0 with IPv6 and a local pod, the peer, the client and the pod as permanent
/// neighbours.
fn in_node_with_local_pod(f: impl FnOnce(u32, [u8; 6], [u8; 6]) + Send + 'static) {
    let mut lab = Lab::new(2);
    lab.enable_ipv6();
    lab.add_pod(0);
    assert_eq!(lab.pods[0].ip6, Some(local_pod()));
    let node = &lab.nodes[0].ns;
    let pod_mac = mac_of(&lab.pods[0].ns, "eth0");
    let host_mac = mac_of(node, "pv0");
    for (ip, mac, dev) in
        [(PEER6, PEER_MAC, "eth0"), (CLIENT6, CLIENT_MAC, "eth0"), (local_pod(), pod_mac, "pv0")]
    {
        permanent_neighbour(node, ip, mac, dev);
    }
    let ifindex = ifindex_of(node, "eth0");
    node.run(move || f(ifindex, pod_mac, host_mac));
}

#[test]
fn ipv6_service_paths_produce_the_exact_frames() {
    in_node_with_local_pod(fixtures);
}

fn fixtures(ifindex: u32, pod_mac: [u8; 6], host_mac: [u8; 6]) {
    let f = Fixture::load(ifindex);
    let to_node = (CLIENT_MAC, NODE_MAC);
    let to_pod = (host_mac, pod_mac);
    let (local, remote) = (local_pod(), remote_pod());

    // Local endpoint: DNAT to the pod, hop limit down, redirected to its host interface.
    let input = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_000, 80));
    let expected = segment_frame(to_pod, CLIENT6, local, 63, 6, (40_000, 8080));
    check(&f, "local TCP", &input, XDP_REDIRECT, &expected);
    let input = segment_frame(to_node, CLIENT6, VIP6, 64, 17, (40_001, 80));
    let expected = segment_frame(to_pod, CLIENT6, local, 63, 17, (40_001, 8080));
    check(&f, "local UDP", &input, XDP_REDIRECT, &expected);
    // The flow's second packet takes its cached next hop.
    check(&f, "local UDP, same flow", &input, XDP_REDIRECT, &expected);

    // Full NAT: DNAT, and SNAT to this node's IPv6 address on the uplink, towards n1.
    let port = snat_port(40_002, 81, 17);
    let input = segment_frame(to_node, CLIENT6, VIP6, 64, 17, (40_002, 81));
    let expected = segment_frame((NODE_MAC, PEER_MAC), NODE6, remote, 63, 17, (port, 8080));
    check(&f, "full NAT, forward", &input, XDP_TX, &expected);
    // …and its reply, translated back to VIP:81 → client.
    let input = segment_frame((PEER_MAC, NODE_MAC), remote, NODE6, 64, 17, (8080, port));
    let expected = segment_frame((NODE_MAC, CLIENT_MAC), VIP6, CLIENT6, 63, 17, (81, 40_002));
    check(&f, "full NAT, reply", &input, XDP_TX, &expected);
    let input = segment_frame(to_node, CLIENT6, VIP6, 64, 17, (40_002, 81));
    let expected = segment_frame((NODE_MAC, PEER_MAC), NODE6, remote, 63, 17, (port, 8080));
    check(&f, "full NAT, same flow keeps its port", &input, XDP_TX, &expected);

    // DSR: the client's packet, hop limit down, inside IPv6 to the endpoint.
    let input = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_003, 82));
    let inner = segment_frame(to_node, CLIENT6, VIP6, 63, 6, (40_003, 82));
    let expected = encapsulated((NODE_MAC, PEER_MAC), NODE6, remote, &inner);
    check(&f, "DSR encapsulation", &input, XDP_TX, &expected);

    // DSR arriving here for the local endpoint: unwrapped, translated, redirected.
    let inner = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_004, 84));
    let input = encapsulated((PEER_MAC, NODE_MAC), PEER6, local, &inner);
    let expected = segment_frame(to_pod, CLIENT6, local, 63, 6, (40_004, 8080));
    check(&f, "DSR decapsulation", &input, XDP_REDIRECT, &expected);

    // Too big for the tunnel (1480 bytes and 40 more over a 1500-byte route): ICMPv6 Packet
    // Too Big back to the client from the VIP, with the route's MTU less the outer header and
    // the packet's first 1232 bytes (RFC 4443 §3.2: at most 1280 in all).
    let big = ipv6_frame(
        CLIENT_MAC,
        NODE_MAC,
        CLIENT6,
        VIP6,
        64,
        17,
        &transport6(17, CLIENT6, VIP6, 40_010, 82, &[0x5a; 1480 - 40 - 8]),
    );
    let mut message = vec![2, 0, 0, 0];
    message.extend_from_slice(&1460u32.to_be_bytes());
    message.extend_from_slice(&big[14..14 + 1232]);
    let check = lb_lab::packet::icmpv6_checksum(VIP6, CLIENT6, &message);
    message[2..4].copy_from_slice(&check.to_be_bytes());
    let expected = ipv6_frame(NODE_MAC, CLIENT_MAC, VIP6, CLIENT6, 64, 58, &message);
    let before = f.reason(Reason::TooBig);
    let (action, out) = f.run(&big);
    assert_eq!(action, XDP_TX, "too big: action");
    assert_eq!(out, expected, "too big: the Packet Too Big frame");
    assert_eq!(f.reason(Reason::TooBig), before + 1, "too big: counted");

    // Dropped: a port no service exposes, a service without endpoints, a cut-short header.
    let unexposed = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_005, 99));
    let empty = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_006, 85));
    let mut short = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_007, 80));
    short.truncate(14 + 40 + 12);
    short[18..20].copy_from_slice(&12u16.to_be_bytes());
    let cases = [
        ("unexposed port", unexposed, Reason::UnexposedPort),
        ("no endpoints", empty, Reason::NoBackend),
        ("truncated TCP", short, Reason::MalformedL4),
    ];
    expect_verdicts(
        &f.ebpf,
        f.ifindex,
        cases.into_iter().map(|(name, input, reason)| (name, input, XDP_DROP, reason)).collect(),
    );

    // Passed untouched to the kernel, and counted.
    let tcp = transport6(6, CLIENT6, VIP6, 40_008, 80, b"fixture");
    let behind = |next_header: u8, extension: &[u8]| {
        let mut payload = extension.to_vec();
        payload[0] = 6;
        payload.extend_from_slice(&tcp);
        ipv6_frame(CLIENT_MAC, NODE_MAC, CLIENT6, VIP6, 64, next_header, &payload)
    };
    let hop_by_hop = behind(0, &[0, 0, 1, 4, 0, 0, 0, 0]);
    let fragment = behind(44, &[0, 0, 0, 1, 0, 0, 0, 7]);
    let base = segment_frame(to_node, CLIENT6, VIP6, 64, 6, (40_008, 80));
    let mut hop_limit_1 = base.clone();
    hop_limit_1[21] = 1;
    let mut beyond = base.clone();
    beyond[18..20].copy_from_slice(&1400u16.to_be_bytes());
    let cases = [
        ("a hop-by-hop header before TCP", hop_by_hop, Reason::Ipv6Extension),
        ("a fragment", fragment, Reason::Fragment),
        ("hop limit 1", hop_limit_1, Reason::TtlExpired),
        ("payload length beyond the frame", beyond, Reason::MalformedIpv6),
        (
            "to another address",
            segment_frame(to_node, CLIENT6, PEER6, 64, 6, (40_009, 80)),
            Reason::Ipv6Passed,
        ),
        (
            "IPv6 in IPv6 for an address that is no endpoint here",
            encapsulated((PEER_MAC, NODE_MAC), PEER6, pod_ip6(0, 9), &base),
            Reason::Ipv6Passed,
        ),
    ];
    expect_verdicts(
        &f.ebpf,
        f.ifindex,
        cases.into_iter().map(|(name, input, reason)| (name, input, XDP_PASS, reason)).collect(),
    );

    // Random frames under the IPv6 EtherType, TCP/UDP/IPv6-in-IPv6 to the VIP, never abort.
    let mut noise = lb_lab::packet::Noise::new(0x2545_f491_4f6c_dd1d);
    let mut next = move || noise.byte();
    for len in 14..=120usize {
        for _ in 0..20 {
            let mut frame: Vec<u8> = (0..len).map(|_| next()).collect();
            frame[12..14].copy_from_slice(&[0x86, 0xdd]);
            if len > 14 {
                frame[14] = 0x60;
            }
            if len > 20 {
                frame[20] = [6, 17, 41][usize::from(next()) % 3];
            }
            if len > 53 && next() % 2 == 0 {
                frame[38..54].copy_from_slice(&VIP6.octets());
            }
            let (action, _) = f.run(&frame);
            assert_ne!(action, 0, "XDP_ABORTED on {frame:02x?}");
        }
    }
}

fn check(f: &Fixture, name: &str, input: &[u8], action: u32, expected: &[u8]) {
    let (got, out) = f.run(input);
    assert_eq!(got, action, "{name}: action");
    assert_eq!(out, expected, "{name}: frame\n got      {out:02x?}\n expected {expected:02x?}");
    if !name.contains("encapsulation") {
        assert!(checksum_valid(&out), "{name}: TCP/UDP checksum");
    }
}
