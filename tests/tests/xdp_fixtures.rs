//! Answers for owned VIPs through BPF_PROG_TEST_RUN: the real XDP object, one input frame each,
//! the action and exact output frame it must produce, and the counter it must bump.
//!
//! One table runs for both families ([`shared_cases`]: address resolution, echo, leases, UDP
//! to a VIP, addresses by role), as do the lease, uplink and VRRP-speaker tables; then each
//! family's own resolution protocol's table (ARP's malformations, NDP's). The expected frames
//! are built here byte by byte, independently of `lb_common::arp` and `lb_common::ndp`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::{Ebpf, maps::HashMap};
use lb_common::{
    counters::Reason,
    maps::{ACTION_STATS, OwnedVip, VIP_LEASES},
};
use lb_lab::{
    cases::{Case, Expect, case, run_cases},
    family::{
        FAMILIES, IpFamily, LabFamily, echo, ip_frame, own_vip, resolution_answer, resolution_request,
        vip_answers, vrrp_speaker,
    },
    fixture::{self, XDP_DROP, XDP_PASS, XDP_TX, run_uplink},
    packet::{arp_frame, icmpv6, ipv6_frame, neighbor_solicitation},
};

const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
/// The lease slot of [`expired_vip`], holding 1 ns: long gone.
const EXPIRED_LEASE: u16 = 300;
/// The loopback device: an interface every test host has, to arrive on.
const ARRIVAL: u32 = 1;

/// Owned under a lease that has run out.
fn expired_vip(f: IpFamily) -> IpAddr {
    f.pick(Ipv4Addr::new(198, 51, 100, 11).into(), Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x11).into())
}

/// Owned, with the kernel holding it too (VIP mode `both`).
fn shared_vip(f: IpFamily) -> IpAddr {
    f.pick(Ipv4Addr::new(198, 51, 100, 12).into(), Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x12).into())
}

/// Not owned.
fn other_address(f: IpFamily) -> IpAddr {
    f.pick(Ipv4Addr::new(198, 51, 100, 99).into(), Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x99).into())
}

/// The object with the family's VIP owned, [`expired_vip`] under a lease long run out and
/// [`shared_vip`] held by the kernel too.
fn load(f: IpFamily) -> Ebpf {
    let mut ebpf = fixture::load_uplink();
    own_vip(&mut ebpf, f.vip(), OwnedVip::new(VIP_MAC));
    own_vip(&mut ebpf, expired_vip(f), OwnedVip::new(VIP_MAC).with_lease(EXPIRED_LEASE));
    own_vip(&mut ebpf, shared_vip(f), OwnedVip::with_kernel(VIP_MAC));
    set_lease(&mut ebpf, EXPIRED_LEASE, 1);
    ebpf
}

fn set_lease(ebpf: &mut Ebpf, slot: u16, deadline_ns: u64) {
    let mut leases: aya::maps::Array<_, u64> =
        aya::maps::Array::try_from(ebpf.map_mut(VIP_LEASES).unwrap()).unwrap();
    leases.set(u32::from(slot), deadline_ns, 0).unwrap();
}

fn udp_to(f: IpFamily, vip: IpAddr) -> Vec<u8> {
    ip_frame((CLIENT_MAC, VIP_MAC), f.client(), vip, 64, 17, &[0x30, 0x39, 0, 80, 0, 8, 0, 0])
}

/// The table both families run.
fn shared_cases(f: IpFamily) -> Vec<Case> {
    use Expect::*;
    let (vip, client) = (f.vip(), f.client());
    let answered = f.pick(Reason::ArpReplied, Reason::NdpAdvertised);
    let request = resolution_request(CLIENT_MAC, client, vip);
    let answer = resolution_answer(VIP_MAC, CLIENT_MAC, client, vip, 0x60);
    let mut padded = request.clone();
    padded.resize(request.len() + 18, 0);
    // An ARP reply keeps the request's Ethernet padding; an advertisement is sent at its size.
    let padded_answer = f.pick([&answer[..], &[0; 18]].concat(), answer.clone());
    let ping = |to: IpAddr| echo((CLIENT_MAC, VIP_MAC), client, to, true, 64);
    vec![
        case("a request for an owned VIP", request, CountedFrame(XDP_TX, answer, answered)),
        case("a request with trailing bytes", padded, CountedFrame(XDP_TX, padded_answer, answered)),
        case(
            "a request for an address not owned",
            resolution_request(CLIENT_MAC, client, other_address(f)),
            Passed(f.pick(Reason::ArpNotOwned, Reason::NdpNotOwned)),
        ),
        case(
            "a request, lease run out",
            resolution_request(CLIENT_MAC, client, expired_vip(f)),
            Dropped(Reason::LeaseExpired),
        ),
        case(
            "echo",
            ping(vip),
            CountedFrame(
                XDP_TX,
                echo((VIP_MAC, CLIENT_MAC), vip, client, false, 64),
                Reason::IcmpEchoReplied,
            ),
        ),
        case("echo to another address", ping(other_address(f)), Passed(f.passed())),
        case("echo, lease run out", ping(expired_vip(f)), Dropped(Reason::LeaseExpired)),
        case("UDP to an owned VIP", udp_to(f, vip), Dropped(Reason::UnexposedPort)),
        case("UDP to a VIP the kernel holds too", udp_to(f, shared_vip(f)), Passed(f.passed())),
    ]
}

#[test]
fn owned_vips_are_answered_and_the_rest_left_alone_in_both_families() {
    for f in FAMILIES {
        let ebpf = load(f);
        run_cases(&ebpf, ARRIVAL, f.as_str(), shared_cases(f));
        // The two answers to requests, counted per VIP; three frames sent back in all.
        assert_eq!(vip_answers(&ebpf, f.vip()), 2, "{}: answers counted for the VIP", f.as_str());
        assert_eq!(fixture::counted(&ebpf, ACTION_STATS, XDP_TX), 3, "{}: XDP_TX counted", f.as_str());
    }
}

/// A VIP held under VRRP lease slot 10 is answered (address resolution and echo) while that
/// lease runs, and neither once it has run out; then the request is dropped, not passed, since
/// in VIP mode `both` the kernel would answer for the agent that is gone.
#[test]
fn an_owned_vip_is_claimed_only_while_its_lease_runs() {
    use lb_agent::dataplane::leases::monotonic_ns;
    for f in FAMILIES {
        let mut ebpf = load(f);
        own_vip(&mut ebpf, f.vip(), OwnedVip::new(VIP_MAC).with_lease(10));
        let request = resolution_request(CLIENT_MAC, f.client(), f.vip());
        let ping = echo((CLIENT_MAC, VIP_MAC), f.client(), f.vip(), true, 64);
        let leases =
            [("running", 1_000_000_000, XDP_TX), ("run out", -1, XDP_DROP), ("never written", 0, XDP_DROP)];
        for (what, from_now, verdict) in leases {
            let deadline = if from_now == 0 { 0 } else { monotonic_ns().saturating_add_signed(from_now) };
            set_lease(&mut ebpf, 10, deadline);
            let before = fixture::reason_packets(&ebpf, Reason::LeaseExpired);
            let name = f.as_str();
            assert_eq!(run_uplink(&ebpf, &request, ARRIVAL).0, verdict, "{name}: a request, lease {what}");
            assert_eq!(run_uplink(&ebpf, &ping, ARRIVAL).0, verdict, "{name}: echo, lease {what}");
            let expired = if verdict == XDP_DROP { 2 } else { 0 };
            assert_eq!(
                fixture::reason_packets(&ebpf, Reason::LeaseExpired) - before,
                expired,
                "{name}: lease {what}"
            );
        }
    }
}

/// With several uplinks, an owned VIP is answered (address resolution and echo) only on its own
/// uplink's interface; elsewhere the frame goes to the kernel untouched, counted. A table of
/// (the VIP's uplink slot, the slot of the interface the frame arrives on, the verdict), for
/// each family.
#[test]
fn an_owned_vip_is_answered_only_on_its_uplink() {
    use lb_common::maps::ANY_UPLINK;
    let uplinks: [(&str, u8, Option<u8>, u32); 4] = [
        ("a single uplink: any interface", ANY_UPLINK, None, XDP_TX),
        ("arrived on its uplink", 2, Some(2), XDP_TX),
        ("arrived on another uplink", 2, Some(1), XDP_PASS),
        ("arrived on an interface that is no uplink", 2, None, XDP_PASS),
    ];
    for f in FAMILIES {
        let request = resolution_request(CLIENT_MAC, f.client(), f.vip());
        let ping = echo((CLIENT_MAC, VIP_MAC), f.client(), f.vip(), true, 64);
        for (what, vip_slot, arrival_slot, verdict) in uplinks {
            let mut ebpf = load(f);
            own_vip(&mut ebpf, f.vip(), OwnedVip::new(VIP_MAC).on_uplink(vip_slot));
            if let Some(slot) = arrival_slot {
                fixture::add_uplink(&mut ebpf, (ARRIVAL, 0), slot, fixture::NODE, VIP_MAC);
            }
            for (kind, frame) in [("a request", &request), ("echo", &ping)] {
                let (action, out) = run_uplink(&ebpf, frame, ARRIVAL);
                let name = format!("{}: {kind}, {what}", f.as_str());
                assert_eq!(action, verdict, "{name}");
                if verdict == XDP_PASS {
                    assert_eq!(&out, frame, "{name}: passed unmodified");
                }
            }
            let wrong = if verdict == XDP_PASS { 2 } else { 0 };
            assert_eq!(
                fixture::reason_packets(&ebpf, Reason::WrongInterface),
                wrong,
                "{}: {what}",
                f.as_str()
            );
        }
        // In VIP mode `both` the kernel would answer the request on the wrong interface: it is
        // dropped there instead.
        let mut ebpf = load(f);
        own_vip(&mut ebpf, f.vip(), OwnedVip::with_kernel(VIP_MAC).on_uplink(2));
        assert_eq!(
            run_uplink(&ebpf, &request, ARRIVAL).0,
            XDP_DROP,
            "{}: kernel-held, wrong interface",
            f.as_str()
        );
        assert_eq!(fixture::reason_packets(&ebpf, Reason::WrongInterface), 1);
    }
}

/// VRRP advertisements pass; the MAC of each source is learned from them, and one that claims a
/// source from another MAC while the learned one is live is counted and remembered for the
/// agent. Once the learned MAC has gone quiet past three advertised intervals, a new MAC is
/// learned instead. For each family.
#[test]
fn a_vrrp_source_heard_from_another_mac_is_counted() {
    use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6};
    for f in FAMILIES {
        let ebpf = load(f);
        let name = f.as_str();
        let member: IpAddr =
            f.pick(Ipv4Addr::new(192, 0, 2, 11).into(), Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb).into());
        let group: IpAddr = f.pick(VRRP_MULTICAST_V4.into(), VRRP_MULTICAST_V6.into());
        let group_mac = f.pick(lb_lab::packet::multicast_mac(VRRP_MULTICAST_V4), [0x33, 0x33, 0, 0, 0, 0x12]);
        let member_mac = [0x02, 0, 0, 0, 0, 0x11];
        let frame = |mac: [u8; 6], interval_cs: u16| {
            let advert = Advertisement {
                vrid: 20,
                priority: 100,
                max_adver_int_cs: interval_cs,
                addresses: vec![f.vip()],
            };
            ip_frame(
                (mac, group_mac),
                member,
                group,
                255,
                112,
                &advert.encode(member, group, ChecksumMode::Rfc),
            )
        };
        let passed = fixture::reason_packets(&ebpf, f.passed());
        // Learned from the member's own advertisements (1 s interval: live for 3 s).
        assert_eq!(
            run_uplink(&ebpf, &frame(member_mac, 100), ARRIVAL),
            (XDP_PASS, frame(member_mac, 100)),
            "{name}"
        );
        assert_eq!(vrrp_speaker(&ebpf, member).mac, member_mac, "{name}");
        // The same address from the client's MAC: passed, counted, remembered.
        for _ in 0..3 {
            assert_eq!(run_uplink(&ebpf, &frame(CLIENT_MAC, 100), ARRIVAL).0, XDP_PASS, "{name}");
        }
        let s = vrrp_speaker(&ebpf, member);
        assert_eq!((s.mac, s.other_mac, s.other_mac_adverts), (member_mac, CLIENT_MAC, 3), "{name}");
        assert_eq!(fixture::reason_packets(&ebpf, f.passed()), passed + 4, "{name}: passed, counted");
        // The member goes on: still its MAC.
        run_uplink(&ebpf, &frame(member_mac, 1), ARRIVAL);
        // 10 ms interval: live 30 ms. Past that, another MAC is learned, not counted.
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(run_uplink(&ebpf, &frame(CLIENT_MAC, 1), ARRIVAL).0, XDP_PASS, "{name}");
        let s = vrrp_speaker(&ebpf, member);
        assert_eq!((s.mac, s.other_mac_adverts), (CLIENT_MAC, 3), "{name}");
        // Too short to hold a VRRP header: passed untouched for the agent to reject.
        let short = ip_frame((CLIENT_MAC, group_mac), member, group, 255, 112, &[0x31]);
        assert_eq!(run_uplink(&ebpf, &short, ARRIVAL), (XDP_PASS, short.clone()), "{name}: too short");
    }
}

/// An advert with this node's own address, arriving on the uplink where it is this node's
/// (IPv4: the uplink's address; IPv6: its VRRP link-local, `VRRP_OWN6`), came from another host:
/// each is counted, whatever its MAC, and passed on. An uplink is an interface and a VLAN: on
/// another interface, or untagged on the parent of the VLAN where the address is this node's,
/// the same address is another link's, so its MAC is learned and nothing counted.
#[test]
fn an_advert_with_this_nodes_own_address_is_counted_on_its_uplink_only() {
    use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6};
    use lb_common::maps::{UplinkKey, VRRP_OWN6, Vip6Key};
    use lb_lab::cases::tagged;
    const ELSEWHERE: u32 = 999;
    // Where the address is this node's (interface, VLAN), the tag the advert arrives with, and
    // whether it is counted.
    let rows: [(&str, UplinkKey, Option<u16>, bool); 4] = [
        ("untagged uplink, arriving there", UplinkKey::new(ARRIVAL, 0), None, true),
        ("another interface's", UplinkKey::new(ELSEWHERE, 0), None, false),
        ("VLAN 30's, arriving on VLAN 30", UplinkKey::new(ARRIVAL, 30), Some(30), true),
        ("VLAN 30's, arriving untagged on its parent", UplinkKey::new(ARRIVAL, 30), None, false),
    ];
    for f in FAMILIES {
        for (row, key, tci, counted) in rows {
            let mut ebpf = load(f);
            let name = format!("{}, {row}", f.as_str());
            let own: IpAddr = f.pick(
                Ipv4Addr::new(192, 0, 2, 10).into(),
                Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa).into(),
            );
            // The uplink itself, so that its VLAN is served; IPv4's address is its source.
            let source = match own {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => Ipv4Addr::new(192, 0, 2, 99),
            };
            fixture::add_uplink(&mut ebpf, (key.ifindex, key.vlan), 1, source, VIP_MAC);
            if let IpAddr::V6(v6) = own {
                let mut map: HashMap<_, UplinkKey, Vip6Key> =
                    HashMap::try_from(ebpf.map_mut(VRRP_OWN6).unwrap()).unwrap();
                map.insert(key, Vip6Key::new(v6.octets()), 0).unwrap();
            }
            let (group, group_mac): (IpAddr, [u8; 6]) = f.pick(
                (VRRP_MULTICAST_V4.into(), lb_lab::packet::multicast_mac(VRRP_MULTICAST_V4)),
                (VRRP_MULTICAST_V6.into(), [0x33, 0x33, 0, 0, 0, 0x12]),
            );
            let advert =
                Advertisement { vrid: 20, priority: 254, max_adver_int_cs: 5, addresses: vec![f.vip()] };
            let frame = |mac: [u8; 6]| {
                let frame = ip_frame(
                    (mac, group_mac),
                    own,
                    group,
                    255,
                    112,
                    &advert.encode(own, group, ChecksumMode::Rfc),
                );
                tci.map_or(frame.clone(), |tci| tagged(&frame, tci))
            };
            // Own: every advert counted, from one MAC or another. Another link's: the one MAC learned.
            let macs: &[[u8; 6]] = if counted {
                &[CLIENT_MAC, CLIENT_MAC, [0x02, 0, 0, 0, 0, 0x77]]
            } else {
                &[CLIENT_MAC, CLIENT_MAC]
            };
            for (i, mac) in macs.iter().enumerate() {
                assert_eq!(
                    run_uplink(&ebpf, &frame(*mac), ARRIVAL),
                    (XDP_PASS, frame(*mac)),
                    "{name}: passed on"
                );
                let s = vrrp_speaker(&ebpf, own);
                let expected = if counted { i as u64 + 1 } else { 0 };
                assert_eq!(s.other_mac_adverts, expected, "{name}: advert {i}");
                if !counted {
                    assert_eq!(s.mac, CLIENT_MAC, "{name}: learned");
                }
            }
        }
    }
}

/// Random mutations of each family's request for the VIP never abort the program.
#[test]
fn mutated_requests_never_abort() {
    for f in FAMILIES {
        let ebpf = load(f);
        let mut noise = lb_lab::packet::Noise::new(0x0001_dea6);
        let good = resolution_request(CLIENT_MAC, f.client(), f.vip());
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
            let (action, _) = run_uplink(&ebpf, &frame, ARRIVAL);
            assert!(
                matches!(action, XDP_PASS | XDP_TX | XDP_DROP),
                "{} round {round}: action {action} for {frame:02x?}",
                f.as_str()
            );
        }
    }
}

fn with_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    frame[at] = value;
    frame
}

/// ARP's own cases: what the program must pass untouched, and the reason it must count.
#[test]
fn arp_that_is_not_a_request_for_an_owned_vip_passes_untouched_and_is_counted() {
    use Expect::Passed;
    let f = IpFamily::V4;
    let (IpAddr::V4(vip), IpAddr::V4(client)) = (f.vip(), f.client()) else { unreachable!() };
    let request = resolution_request(CLIENT_MAC, f.client(), f.vip());
    let mut broadcast_sender = request.clone();
    broadcast_sender[22..28].copy_from_slice(&[0xff; 6]);
    let cases = vec![
        case(
            "ARP reply",
            arp_frame(2, VIP_MAC, CLIENT_MAC, client, VIP_MAC, vip),
            Passed(Reason::ArpIgnored),
        ),
        case(
            "gratuitous announcement of the VIP",
            resolution_request(CLIENT_MAC, f.vip(), f.vip()),
            Passed(Reason::ArpIgnored),
        ),
        case("non-IPv4 protocol type", with_byte(request.clone(), 16, 0x86), Passed(Reason::ArpIgnored)),
        case("Ethernet header only", request[..14].to_vec(), Passed(Reason::MalformedArp)),
        case("ARP body cut short", request[..41].to_vec(), Passed(Reason::MalformedArp)),
        case("hardware length 8", with_byte(request.clone(), 18, 8), Passed(Reason::MalformedArp)),
        case("protocol length 16", with_byte(request.clone(), 19, 16), Passed(Reason::MalformedArp)),
        case("broadcast sender hardware address", broadcast_sender, Passed(Reason::MalformedArp)),
        case("multicast Ethernet source", with_byte(request.clone(), 6, 0x01), Passed(Reason::MalformedArp)),
        case(
            "an ARP body under the IPv4 EtherType",
            with_byte(with_byte(request.clone(), 12, 0x08), 13, 0x00),
            Passed(Reason::MalformedIpv4),
        ),
        case(
            "tagged with a VLAN not served",
            with_byte(with_byte(request.clone(), 12, 0x81), 13, 0x00),
            Passed(Reason::VlanNotServed),
        ),
    ];
    let ebpf = load(f);
    let count = cases.len() as u64;
    run_cases(&ebpf, ARRIVAL, "ARP", cases);
    assert_eq!(fixture::counted(&ebpf, ACTION_STATS, XDP_PASS), count, "every case passed");
    assert_eq!(fixture::counted(&ebpf, ACTION_STATS, XDP_TX), 0);
    assert_eq!(vip_answers(&ebpf, f.vip()), 0);
}

#[test]
fn random_arp_frames_never_abort() {
    // Every length from 14 to 128 under the ARP EtherType, random body.
    let ebpf = load(IpFamily::V4);
    let mut noise = lb_lab::packet::Noise::new(0x2545_f491_4f6c_dd1d);
    let mut next = move || noise.byte();
    for len in 14..=128usize {
        for _ in 0..20 {
            let mut frame: Vec<u8> = (0..len).map(|_| next()).collect();
            frame[12..14].copy_from_slice(&[0x08, 0x06]);
            let (action, _) = run_uplink(&ebpf, &frame, ARRIVAL);
            assert!(action == XDP_PASS || action == XDP_TX, "len {len}: action {action}");
        }
    }
    assert_eq!(fixture::counted(&ebpf, ACTION_STATS, 0), 0, "XDP_ABORTED");
}

/// NDP's own cases (RFC 4861): the answers only Neighbor Discovery has, and the solicitations
/// it must refuse.
#[test]
fn neighbor_discovery_answers_and_refusals() {
    use Expect::{CountedFrame, Passed};
    let f = IpFamily::V6;
    let (IpAddr::V6(vip), IpAddr::V6(client)) = (f.vip(), f.client()) else { unreachable!() };
    let good = neighbor_solicitation(CLIENT_MAC, client, vip);
    let advertisement = resolution_answer(VIP_MAC, CLIENT_MAC, client.into(), vip.into(), 0x60);
    // Without the source link-layer option (a unicast reachability probe): the answer grows.
    let bare = [&[0, 0, 0, 0][..], &vip.octets()].concat();
    let unicast_probe =
        ipv6_frame(CLIENT_MAC, VIP_MAC, client, vip, 255, 58, &icmpv6(135, 0, &bare, client, vip));
    let dad = neighbor_solicitation(CLIENT_MAC, Ipv6Addr::UNSPECIFIED, vip);
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let defended = resolution_answer(VIP_MAC, [0x33, 0x33, 0, 0, 0, 1], all_nodes.into(), vip.into(), 0x20);
    // Byte offsets: IPv6 header at 14 (hop limit 21, payload length 18–19), ICMPv6 at 54
    // (code 55, checksum 56–57, target 62–77), the option at 78 (length 79).
    let mut short_option = good.clone();
    short_option.truncate(84);
    short_option[19] = 30;
    let mut truncated = good.clone();
    truncated.truncate(70);
    let cases = vec![
        case(
            "no source link-layer option",
            unicast_probe,
            CountedFrame(XDP_TX, advertisement, Reason::NdpAdvertised),
        ),
        // A duplicate address probe for the VIP is defended to all nodes, not Solicited.
        case("DAD probe", dad, CountedFrame(XDP_TX, defended, Reason::NdpAdvertised)),
        case("hop limit 64", with_byte(good.clone(), 21, 64), Passed(Reason::MalformedNdp)),
        case("bad checksum", with_byte(good.clone(), 57, good[57] ^ 1), Passed(Reason::MalformedNdp)),
        case("code 1", with_byte(good.clone(), 55, 1), Passed(Reason::MalformedNdp)),
        case("option of length 0", with_byte(good.clone(), 79, 0), Passed(Reason::MalformedNdp)),
        case("option cut short", short_option, Passed(Reason::MalformedNdp)),
        case("shorter than a solicitation", with_byte(good.clone(), 19, 16), Passed(Reason::MalformedNdp)),
        case("multicast target", with_byte(good.clone(), 62, 0xff), Passed(Reason::MalformedNdp)),
        case("payload past the frame", truncated, Passed(Reason::MalformedIpv6)),
        case(
            "version 4 in an IPv6 frame",
            with_byte(udp_to(f, f.vip()), 14, 0x40),
            Passed(Reason::MalformedIpv6),
        ),
    ];
    let ebpf = load(f);
    run_cases(&ebpf, ARRIVAL, "NDP", cases);
    assert_eq!(vip_answers(&ebpf, f.vip()), 2, "the two advertisements counted for the VIP");
}
