//! IPv6 packet fixtures through BPF_PROG_TEST_RUN: Neighbor Discovery and ICMPv6 echo for owned
//! VIPs, and everything the program must leave alone or refuse. Each case is one input frame,
//! the action, the exact output frame where one is sent, and the counter it must bump. The
//! expected frames are built here byte by byte, independently of `lb_common::ndp`.

use std::net::Ipv6Addr;

use aya::{
    Ebpf,
    maps::{Array, HashMap, PerCpuHashMap},
};
use lb_common::{
    counters::Reason,
    maps::{OWNED_VIPS6, OwnedVip, VIP_LEASES, VIP_STATS6, Vip6Key, VipStats},
};
use lb_lab::{
    fixture::{self, XDP_DROP, XDP_PASS, XDP_TX},
    packet::{icmpv6, ipv6_frame, neighbor_solicitation},
};

const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0x100);
const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0x10);
/// Owned under a lease that has run out.
const EXPIRED_VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0x11);
/// Owned, with the kernel holding it too (VIP mode `both`).
const SHARED_VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0x12);
const OTHER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 0x99);
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const EXPIRED_LEASE: u16 = 300;

fn load() -> Ebpf {
    let mut ebpf = fixture::load_uplink();
    let mut owned: HashMap<_, Vip6Key, OwnedVip> =
        HashMap::try_from(ebpf.map_mut(OWNED_VIPS6).unwrap()).unwrap();
    owned.insert(Vip6Key::new(VIP.octets()), OwnedVip::new(VIP_MAC), 0).unwrap();
    let expired = OwnedVip::new(VIP_MAC).with_lease(EXPIRED_LEASE);
    owned.insert(Vip6Key::new(EXPIRED_VIP.octets()), expired, 0).unwrap();
    owned.insert(Vip6Key::new(SHARED_VIP.octets()), OwnedVip::with_kernel(VIP_MAC), 0).unwrap();
    // The lease slot holds 1 ns: long gone.
    let mut leases: Array<_, u64> = Array::try_from(ebpf.map_mut(VIP_LEASES).unwrap()).unwrap();
    leases.set(u32::from(EXPIRED_LEASE), 1, 0).unwrap();
    ebpf
}

/// Runs one frame, as received on the loopback device (the program serves any interface:
/// no uplink map is written).
fn run(ebpf: &Ebpf, input: &[u8]) -> (u32, Vec<u8>) {
    fixture::run_uplink(ebpf, input, 1)
}

fn reason(ebpf: &Ebpf, reason: Reason) -> u64 {
    fixture::reason_packets(ebpf, reason)
}

/// The advertisement the owner of `target` must send in answer to a solicitation from
/// `to`/`to_mac` (RFC 4861 §4.4, §7.2.4): Solicited and Override, the target link-layer option.
fn advertisement(to_mac: [u8; 6], to: Ipv6Addr, target: Ipv6Addr, flags: u8) -> Vec<u8> {
    let mut body = vec![flags, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    body.extend_from_slice(&[2, 1]);
    body.extend_from_slice(&VIP_MAC);
    ipv6_frame(VIP_MAC, to_mac, target, to, 255, 58, &icmpv6(136, 0, &body, target, to))
}

fn echo(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    kind: u8,
    hop_limit: u8,
) -> Vec<u8> {
    let body = [0x12, 0x34, 0, 7, b'p', b'i', b'n', b'g', b'v', b'6'];
    ipv6_frame(src_mac, dst_mac, src, dst, hop_limit, 58, &icmpv6(kind, 0, &body, src, dst))
}

/// `frame` with the byte at `at` set to `value`.
fn with_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    frame[at] = value;
    frame
}

#[test]
fn owned_vips_answer_neighbor_discovery_and_echo_with_exact_frames() {
    let ebpf = load();
    let solicitation = neighbor_solicitation(CLIENT_MAC, CLIENT, VIP);
    // Without the source link-layer option (a unicast reachability probe): the answer grows.
    let mut bare = vec![0, 0, 0, 0];
    bare.extend_from_slice(&VIP.octets());
    let unicast_probe =
        ipv6_frame(CLIENT_MAC, VIP_MAC, CLIENT, VIP, 255, 58, &icmpv6(135, 0, &bare, CLIENT, VIP));
    let dad = neighbor_solicitation(CLIENT_MAC, Ipv6Addr::UNSPECIFIED, VIP);
    let mut padded = solicitation.clone();
    padded.extend_from_slice(&[0; 6]);
    let cases: Vec<(&str, Vec<u8>, Vec<u8>, Reason)> = vec![
        ("solicitation", solicitation, advertisement(CLIENT_MAC, CLIENT, VIP, 0x60), Reason::NdpAdvertised),
        ("trailing bytes", padded, advertisement(CLIENT_MAC, CLIENT, VIP, 0x60), Reason::NdpAdvertised),
        ("no option", unicast_probe, advertisement(CLIENT_MAC, CLIENT, VIP, 0x60), Reason::NdpAdvertised),
        // A duplicate address probe for the VIP is defended to all nodes, not Solicited.
        (
            "DAD probe",
            dad,
            advertisement([0x33, 0x33, 0, 0, 0, 1], ALL_NODES, VIP, 0x20),
            Reason::NdpAdvertised,
        ),
        (
            "echo",
            echo(CLIENT_MAC, VIP_MAC, CLIENT, VIP, 128, 64),
            echo(VIP_MAC, CLIENT_MAC, VIP, CLIENT, 129, 64),
            Reason::IcmpEchoReplied,
        ),
    ];
    for (name, input, expected, counted) in cases {
        let before = reason(&ebpf, counted);
        let (action, out) = run(&ebpf, &input);
        assert_eq!(action, XDP_TX, "{name}");
        assert_eq!(out, expected, "{name}: the frame sent");
        assert_eq!(reason(&ebpf, counted), before + 1, "{name}: counted as {}", counted.label());
    }
    // Four advertisements for the VIP, counted per VIP as ARP replies are.
    let stats: PerCpuHashMap<_, Vip6Key, VipStats> =
        PerCpuHashMap::try_from(ebpf.map(VIP_STATS6).unwrap()).unwrap();
    let answers: u64 = stats.get(&Vip6Key::new(VIP.octets()), 0).unwrap().iter().map(|s| s.arp_replies).sum();
    assert_eq!(answers, 4);
}

#[test]
fn malformed_foreign_and_unserved_ipv6_is_never_answered_and_is_counted() {
    let ebpf = load();
    let good = neighbor_solicitation(CLIENT_MAC, CLIENT, VIP);
    // Byte offsets: IPv6 header at 14 (hop limit 21, payload length 18–19), ICMPv6 at 54
    // (code 55, checksum 56–57, target 62–77), the option at 78 (length 79).
    let mut short_option = good.clone();
    short_option.truncate(84);
    short_option[19] = 30;
    let udp = ipv6_frame(CLIENT_MAC, VIP_MAC, CLIENT, VIP, 64, 17, &[0x30, 0x39, 0, 80, 0, 8, 0, 0]);
    let mut truncated = good.clone();
    truncated.truncate(70);
    let cases: Vec<(&str, Vec<u8>, u32, Reason)> = vec![
        ("hop limit 64", with_byte(good.clone(), 21, 64), XDP_PASS, Reason::MalformedNdp),
        ("bad checksum", with_byte(good.clone(), 57, good[57] ^ 1), XDP_PASS, Reason::MalformedNdp),
        ("code 1", with_byte(good.clone(), 55, 1), XDP_PASS, Reason::MalformedNdp),
        ("option of length 0", with_byte(good.clone(), 79, 0), XDP_PASS, Reason::MalformedNdp),
        ("option cut short", short_option, XDP_PASS, Reason::MalformedNdp),
        ("shorter than a solicitation", with_byte(good.clone(), 19, 16), XDP_PASS, Reason::MalformedNdp),
        ("multicast target", with_byte(good.clone(), 62, 0xff), XDP_PASS, Reason::MalformedNdp),
        ("payload past the frame", truncated, XDP_PASS, Reason::MalformedIpv6),
        ("not owned", neighbor_solicitation(CLIENT_MAC, CLIENT, OTHER), XDP_PASS, Reason::NdpNotOwned),
        (
            "lease run out",
            neighbor_solicitation(CLIENT_MAC, CLIENT, EXPIRED_VIP),
            XDP_DROP,
            Reason::LeaseExpired,
        ),
        (
            "echo to another address",
            echo(CLIENT_MAC, VIP_MAC, CLIENT, OTHER, 128, 64),
            XDP_PASS,
            Reason::Ipv6Passed,
        ),
        (
            "echo, lease run out",
            echo(CLIENT_MAC, VIP_MAC, CLIENT, EXPIRED_VIP, 128, 64),
            XDP_DROP,
            Reason::LeaseExpired,
        ),
        ("UDP to an owned VIP", udp.clone(), XDP_DROP, Reason::UnexposedPort),
        ("UDP to a VIP the kernel holds too", udp_to(SHARED_VIP), XDP_PASS, Reason::Ipv6Passed),
        ("version 4 in an IPv6 frame", with_byte(udp, 14, 0x40), XDP_PASS, Reason::MalformedIpv6),
    ];
    fixture::expect_verdicts(&ebpf, 1, cases);
}

fn udp_to(vip: Ipv6Addr) -> Vec<u8> {
    ipv6_frame(CLIENT_MAC, VIP_MAC, CLIENT, vip, 64, 17, &[0x30, 0x39, 0, 80, 0, 8, 0, 0])
}

#[test]
fn random_ipv6_frames_never_abort() {
    let ebpf = load();
    let mut noise = lb_lab::packet::Noise::new(0x0001_dea6);
    let good = neighbor_solicitation(CLIENT_MAC, CLIENT, VIP);
    for round in 0..2000 {
        let mut frame = good.clone();
        let len = 14 + usize::from(noise.byte()) % 90;
        frame.resize(len, 0);
        for _ in 0..1 + round % 6 {
            let at = 14 + usize::from(noise.byte()) % (len - 14).max(1);
            if at < frame.len() {
                frame[at] = noise.byte();
            }
        }
        let (action, _) = run(&ebpf, &frame);
        assert!(
            matches!(action, XDP_PASS | XDP_TX | XDP_DROP),
            "round {round}: action {action} for {frame:02x?}"
        );
    }
}

/// An IPv6 VRRP source's MAC is learned, and the same source from another MAC while it is live
/// is counted (passed on either way, for the agent to judge), as for IPv4.
#[test]
fn an_ipv6_vrrp_source_heard_from_another_mac_is_counted() {
    use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V6};
    use lb_common::maps::{VRRP_SPEAKERS6, VrrpSpeaker};
    let ebpf = load();
    let member = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb);
    let member_mac = [0x02, 0, 0, 0, 0, 0x0b];
    let advert =
        Advertisement { vrid: 20, priority: 100, max_adver_int_cs: 100, addresses: vec![VIP.into()] }.encode(
            member,
            VRRP_MULTICAST_V6,
            ChecksumMode::Rfc,
        );
    let frame = |mac: [u8; 6]| {
        ipv6_frame(mac, [0x33, 0x33, 0, 0, 0, 0x12], member, VRRP_MULTICAST_V6, 255, 112, &advert)
    };
    let speaker = || -> VrrpSpeaker {
        let map: HashMap<_, Vip6Key, VrrpSpeaker> =
            HashMap::try_from(ebpf.map(VRRP_SPEAKERS6).unwrap()).unwrap();
        map.get(&Vip6Key::new(member.octets()), 0).unwrap()
    };
    let passed = reason(&ebpf, Reason::Ipv6Passed);
    assert_eq!(run(&ebpf, &frame(member_mac)), (XDP_PASS, frame(member_mac)));
    assert_eq!(speaker().mac, member_mac);
    for _ in 0..2 {
        assert_eq!(run(&ebpf, &frame(CLIENT_MAC)).0, XDP_PASS);
    }
    let s = speaker();
    assert_eq!((s.mac, s.other_mac, s.other_mac_adverts), (member_mac, CLIENT_MAC, 2));
    assert_eq!(reason(&ebpf, Reason::Ipv6Passed), passed + 3);
}
