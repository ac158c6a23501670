//! One table of service-path cases, run for each address family through BPF_PROG_TEST_RUN: the
//! real object (the uplink program, tail-calling `lb_xdp6` for IPv6) and the agent's map sync,
//! one input frame each, and the exact action, output frame and counter it must produce.
//!
//! A case names addresses by role (`f.vip()`, `f.client()`, `f.pod(1, 2)`), so the table is
//! the same for both families; the few cases only one family has say so in [`cases`]. Each
//! case also says which of its frames face the client, so the table runs on each kind of
//! uplink too (plain, and a VLAN the program tags and untags). Adding a family adds an arm to
//! `LabFamily`, an uplink kind a variant of `UplinkKind`, not test code.
//!
//! The program asks the kernel's FIB for next hops, so the runs happen inside a lab node's
//! namespace, with permanent neighbour entries: every MAC in the expected frames is known.

use std::net::IpAddr;

use aya::Ebpf;
use lb_agent::dataplane::EMBEDDED_OBJECT;
use lb_common::counters::Reason;
use lb_lab::{
    cases::{Case, Expect, Facing, UplinkKind, case, run_cases},
    family::{
        IpFamily, LabFamily, LocalMacs, claiming_length, cut_to, echo, encapsulated, fragment,
        in_node_with_local_pod, ip_frame, load_services_of, patched, segment, segment_frame, snat_port,
        with_unparsed_header,
    },
    fixture::{CLIENT_MAC, NODE, NODE_MAC, PEER_MAC, XDP_REDIRECT, XDP_TX, add_uplink, run_uplink},
    packet::{Noise, icmpv6_checksum},
};

const SNAT_FIRST: u16 = 61_000;
const SNAT_SPAN: u32 = 4_536;

fn service_paths_produce_the_exact_frames(f: IpFamily) {
    in_node_with_local_pod(f, move |ifindex, macs| run_family(f, ifindex, macs));
}

lb_lab::for_each_family!(service_paths_produce_the_exact_frames);

/// The table. Rows run in order on one program: a reply follows its forward packet.
fn cases(f: IpFamily, local: LocalMacs) -> Vec<Case> {
    use Expect::*;
    let (vip, client, node, peer) = (f.vip(), f.client(), f.node(), f.peer());
    let (here, there) = (f.pod(0, 2), f.pod(1, 2));
    let to_node = (CLIENT_MAC, NODE_MAC);
    let to_pod = (local.host, local.pod);
    let out_to_peer = (NODE_MAC, PEER_MAC);
    let port = snat_port(client, vip, (40_002, 81), 17, SNAT_FIRST, SNAT_SPAN);
    let tcp_to_vip = |sport: u16, dport: u16| segment_frame(to_node, client, vip, 64, 6, (sport, dport));
    let mut table = vec![
        // Local endpoint: DNAT to the pod, TTL or hop limit down, redirected to its host interface.
        case(
            "local TCP",
            tcp_to_vip(40_000, 80),
            Frame(XDP_REDIRECT, segment_frame(to_pod, client, here, 63, 6, (40_000, 8080))),
        )
        .facing(Facing::Input),
        case(
            "local UDP",
            segment_frame(to_node, client, vip, 64, 17, (40_001, 80)),
            Frame(XDP_REDIRECT, segment_frame(to_pod, client, here, 63, 17, (40_001, 8080))),
        )
        .facing(Facing::Input),
        // The flow's second packet takes its cached next hop.
        case(
            "local UDP, same flow",
            segment_frame(to_node, client, vip, 64, 17, (40_001, 80)),
            Frame(XDP_REDIRECT, segment_frame(to_pod, client, here, 63, 17, (40_001, 8080))),
        )
        .facing(Facing::Input),
        // Full NAT: DNAT, and SNAT to this node's address on the uplink, towards n1…
        case(
            "full NAT, forward",
            segment_frame(to_node, client, vip, 64, 17, (40_002, 81)),
            Frame(XDP_TX, segment_frame(out_to_peer, node, there, 63, 17, (port, 8080))),
        )
        .facing(Facing::Input),
        // …its reply, translated back to VIP:81 → client…
        case(
            "full NAT, reply",
            segment_frame((PEER_MAC, NODE_MAC), there, node, 64, 17, (8080, port)),
            Frame(XDP_TX, segment_frame((NODE_MAC, CLIENT_MAC), vip, client, 63, 17, (81, 40_002))),
        )
        .facing(Facing::Output),
        // …and the flow's next packet keeps its source port.
        case(
            "full NAT, same flow keeps its port",
            segment_frame(to_node, client, vip, 64, 17, (40_002, 81)),
            Frame(XDP_TX, segment_frame(out_to_peer, node, there, 63, 17, (port, 8080))),
        )
        .facing(Facing::Input),
        // DSR: the client's packet, TTL down, inside IPIP or IPv6-in-IPv6 to the endpoint.
        case(
            "DSR encapsulation",
            tcp_to_vip(40_003, 82),
            Frame(
                XDP_TX,
                encapsulated(
                    out_to_peer,
                    node,
                    there,
                    &segment_frame(to_node, client, vip, 63, 6, (40_003, 82)),
                ),
            ),
        )
        .facing(Facing::Input),
        // DSR arriving here for the local endpoint: unwrapped, translated, redirected.
        case(
            "DSR decapsulation",
            encapsulated((PEER_MAC, NODE_MAC), peer, here, &tcp_to_vip(40_004, 84)),
            Frame(XDP_REDIRECT, segment_frame(to_pod, client, here, 63, 6, (40_004, 8080))),
        )
        .facing(Facing::Neither),
        // An echo request to the VIP is answered in place.
        case(
            "echo",
            echo(to_node, client, vip, true, 64),
            CountedFrame(
                XDP_TX,
                echo((NODE_MAC, CLIENT_MAC), vip, client, false, 64),
                Reason::IcmpEchoReplied,
            ),
        ),
        // Dropped: a port no service exposes, a service without endpoints, a cut-short header.
        case("unexposed port", tcp_to_vip(40_005, 99), Dropped(Reason::UnexposedPort)).facing(Facing::Input),
        case("no endpoints", tcp_to_vip(40_006, 85), Dropped(Reason::NoBackend)).facing(Facing::Input),
        case("truncated TCP", cut_to(tcp_to_vip(40_007, 80), f, 12), Dropped(Reason::MalformedL4))
            .facing(Facing::Input),
        // Passed untouched to the kernel, and counted.
        case(
            "more fragments",
            fragment(to_node, client, vip, (40_008, 80), 0, true),
            Passed(Reason::Fragment),
        )
        .facing(Facing::Input),
        case(
            "a later fragment",
            fragment(to_node, client, vip, (40_008, 80), 2, false),
            Passed(Reason::Fragment),
        )
        .facing(Facing::Input),
        case(
            "a header before TCP the fast path leaves alone",
            with_unparsed_header(to_node, client, vip, (40_008, 80)),
            Passed(f.unparsed_header()),
        )
        .facing(Facing::Input),
        case(
            "TTL or hop limit 1",
            patched(tcp_to_vip(40_008, 80), f.hop_limit_at(), &[1]),
            Passed(Reason::TtlExpired),
        )
        .facing(Facing::Input),
        case(
            "length beyond the frame",
            claiming_length(tcp_to_vip(40_008, 80), f, 1400),
            Passed(f.malformed()),
        )
        .facing(Facing::Input),
        case(
            "the other family's EtherType",
            patched(tcp_to_vip(40_008, 80), 12, &f.other().ether_type()),
            Passed(f.other().malformed()),
        )
        .facing(Facing::Input),
        case(
            "to another address",
            segment_frame(to_node, client, peer, 64, 6, (40_009, 80)),
            Passed(f.passed()),
        )
        .facing(Facing::Input),
        case(
            "a tunnel for an address that is no endpoint here",
            encapsulated((PEER_MAC, NODE_MAC), peer, f.pod(0, 9), &tcp_to_vip(40_008, 80)),
            Passed(f.passed()),
        )
        .facing(Facing::Neither),
    ];
    match f {
        IpFamily::V4 => {
            table.push(
                case(
                    "IPv4 header length 4 words",
                    patched(tcp_to_vip(40_008, 80), 14, &[0x44]),
                    Passed(Reason::MalformedIpv4),
                )
                .facing(Facing::Input),
            );
        }
        IpFamily::V6 => table.push(packet_too_big(vip, client)),
    }
    table
}

/// IPv6 only (IPv4 sets DF and lets the tunnel's path answer): a UDP packet of 1480 bytes
/// that IPv6 in IPv6 would take past the 1500-byte route is answered with ICMPv6 Packet Too
/// Big from the VIP, with the route's MTU less the outer header and the packet's first 1232
/// bytes (RFC 4443 §3.2: at most 1280 in all).
fn packet_too_big(vip: IpAddr, client: IpAddr) -> Case {
    let (IpAddr::V6(vip6), IpAddr::V6(client6)) = (vip, client) else { unreachable!("an IPv6 case") };
    let big = ip_frame(
        (CLIENT_MAC, NODE_MAC),
        client,
        vip,
        64,
        17,
        &segment(17, client, vip, (40_010, 82), &[0x5a; 1480 - 40 - 8]),
    );
    let mut message = vec![2, 0, 0, 0];
    message.extend_from_slice(&1460u32.to_be_bytes());
    message.extend_from_slice(&big[14..14 + 1232]);
    let sum = icmpv6_checksum(vip6, client6, &message);
    message[2..4].copy_from_slice(&sum.to_be_bytes());
    let answer = ip_frame((NODE_MAC, CLIENT_MAC), vip, client, 64, 58, &message);
    case("too big for the tunnel", big, Expect::CountedFrame(XDP_TX, answer, Reason::TooBig))
}

/// Makes `ifindex` serve `kind`: for a VLAN, the interface plain and the VLAN as two uplinks
/// (every VIP is served on any).
fn serve_uplink_kind(ebpf: &mut Ebpf, ifindex: u32, kind: UplinkKind) {
    if let UplinkKind::Vlan(id) = kind {
        for (vlan, slot) in [(0, 1), (id, 2)] {
            add_uplink(ebpf, (ifindex, vlan), slot, NODE, NODE_MAC);
        }
    }
}

/// The kinds of uplink the table runs on: the client plain, and on VLAN 30 of the interface.
const UPLINK_KINDS: [UplinkKind; 2] = [UplinkKind::Untagged, UplinkKind::Vlan(30)];

fn run_family(f: IpFamily, ifindex: u32, local: LocalMacs) {
    for kind in UPLINK_KINDS {
        let (mut ebpf, _maps) = load_services_of(&[f], EMBEDDED_OBJECT, ifindex, SNAT_FIRST);
        serve_uplink_kind(&mut ebpf, ifindex, kind);
        let table = cases(f, local).into_iter().map(|c| kind.shape(c)).collect();
        run_cases(&ebpf, ifindex, &format!("{}, {}", f.as_str(), kind.label()), table);
    }
    let (ebpf, _maps) = load_services_of(&[f], EMBEDDED_OBJECT, ifindex, SNAT_FIRST);
    if f == IpFamily::V4 {
        zero_udp_checksum_stays_zero(&ebpf, ifindex);
    }
    random_frames_never_abort(f, &ebpf, ifindex);
    random_clients_are_translated_exactly(f, &ebpf, ifindex, local);
}

/// Clients at random addresses and ports, sending random payloads (so the checksums they
/// carry are random too), reach the local pod with exactly the frame built from scratch: the
/// incremental checksum update (IPv6: a word sum written out, see `rewrite::addresses_diff`)
/// agrees with a full one, carries and all.
fn random_clients_are_translated_exactly(f: IpFamily, ebpf: &Ebpf, ifindex: u32, local: LocalMacs) {
    let mut noise = Noise::new(0x2545_f491_4f6c_dd1d ^ f as u64);
    let mut next = move || noise.byte();
    let (vip, here) = (f.vip(), f.pod(0, 2));
    for round in 0..400 {
        let client = match f.client() {
            IpAddr::V4(c) => {
                let [a, b, ..] = c.octets();
                IpAddr::from([a, b, next(), next().max(1)])
            }
            IpAddr::V6(c) => {
                let mut octets = c.octets();
                octets[8..].iter_mut().for_each(|o| *o = next());
                IpAddr::from(octets)
            }
        };
        let sport = u16::from_be_bytes([next(), next()]).max(1024);
        let proto = [6, 17][round % 2];
        let data: Vec<u8> = (0..usize::from(next() % 48)).map(|_| next()).collect();
        let frame = |macs, dst, ttl, dport| {
            ip_frame(macs, client, dst, ttl, proto, &segment(proto, client, dst, (sport, dport), &data))
        };
        let input = frame((CLIENT_MAC, NODE_MAC), vip, 64, 80);
        let (action, out) = run_uplink(ebpf, &input, ifindex);
        let name = format!("{}: {client} port {sport}, protocol {proto}", f.as_str());
        assert_eq!(action, XDP_REDIRECT, "{name}");
        assert_eq!(out, frame((local.host, local.pod), here, 63, 8080), "{name}");
    }
}

/// IPv4 only (IPv6 requires the UDP checksum, RFC 8200 §8.1): UDP without a checksum keeps
/// none through a rewrite.
fn zero_udp_checksum_stays_zero(ebpf: &Ebpf, ifindex: u32) {
    let f = IpFamily::V4;
    let mut input = segment_frame((CLIENT_MAC, NODE_MAC), f.client(), f.vip(), 64, 17, (40_010, 80));
    input[40..42].copy_from_slice(&[0, 0]);
    let (action, out) = run_uplink(ebpf, &input, ifindex);
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(&out[40..42], &[0, 0], "a zero UDP checksum stays zero");
}

/// Random frames under the family's EtherType, its version set and often addressed to the
/// VIP (IPv6: with TCP, UDP or IPv6-in-IPv6 next), never abort.
fn random_frames_never_abort(f: IpFamily, ebpf: &Ebpf, ifindex: u32) {
    let mut noise = Noise::new(0x9e37_79b9_7f4a_7c15 ^ f as u64);
    let mut next = move || noise.byte();
    let vip = match f.vip() {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    };
    let (version, dst_at) = match f {
        IpFamily::V4 => (0x45, 30),
        IpFamily::V6 => (0x60, 38),
    };
    for len in 14..=120usize {
        for _ in 0..20 {
            let mut frame: Vec<u8> = (0..len).map(|_| next()).collect();
            frame[12..14].copy_from_slice(&f.ether_type());
            if len > 14 {
                frame[14] = version;
            }
            if f == IpFamily::V6 && len > 20 {
                frame[20] = [6, 17, 41][usize::from(next()) % 3];
            }
            if len >= dst_at + vip.len() && next() % 2 == 0 {
                frame[dst_at..dst_at + vip.len()].copy_from_slice(&vip);
            }
            let (action, _) = run_uplink(ebpf, &frame, ifindex);
            assert_ne!(action, 0, "{}: XDP_ABORTED on {frame:02x?}", f.as_str());
        }
    }
}
