//! Packet fixtures through BPF_PROG_TEST_RUN: the real XDP object, one input frame each, the
//! action and output frame it must produce, and the counter it must bump.

use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    maps::{HashMap, PerCpuHashMap},
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_agent::dataplane::UPLINK_PROGRAM;
use lb_common::{
    counters::Reason,
    maps::{ACTION_STATS, OWNED_VIPS, OwnedVip, VIP_STATS, VipKey, VipStats},
};
use lb_lab::{
    fixture::{self, XDP_DROP, XDP_PASS, XDP_TX},
    packet::{arp_frame, arp_request},
};

const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const OTHER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 99);

struct Program {
    ebpf: Ebpf,
}

impl Program {
    fn load() -> Program {
        let mut ebpf = fixture::load_uplink();
        let mut owned: HashMap<_, VipKey, OwnedVip> =
            HashMap::try_from(ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
        owned.insert(VipKey::new(VIP.octets()), OwnedVip::new(VIP_MAC), 0).unwrap();
        Program { ebpf }
    }

    /// Runs one frame; returns the action and the frame as the program left it.
    fn run(&self, input: &[u8]) -> (u32, Vec<u8>) {
        let program: &Xdp = self.ebpf.program(UPLINK_PROGRAM).unwrap().try_into().unwrap();
        let mut out = vec![0u8; input.len() + 256];
        let result = program
            .test_run(TestRunOptions { data_in: Some(input), data_out: Some(&mut out), ..Default::default() })
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(result.data_size_out as usize);
        (result.return_value, out)
    }

    fn reason(&self, reason: Reason) -> u64 {
        fixture::reason_packets(&self.ebpf, reason)
    }

    fn action(&self, action: u32) -> u64 {
        fixture::counted(&self.ebpf, ACTION_STATS, action)
    }

    fn arp_replies(&self, vip: Ipv4Addr) -> u64 {
        let stats: PerCpuHashMap<_, VipKey, VipStats> =
            PerCpuHashMap::try_from(self.ebpf.map(VIP_STATS).unwrap()).unwrap();
        stats.get(&VipKey::new(vip.octets()), 0).map(|v| v.iter().map(|s| s.arp_replies).sum()).unwrap_or(0)
    }
}

fn with_byte(mut frame: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    frame[at] = value;
    frame
}

#[test]
fn arp_request_for_an_owned_vip_becomes_the_reply() {
    let program = Program::load();
    let (action, out) = program.run(&arp_request(CLIENT_MAC, CLIENT_IP, VIP));
    assert_eq!(action, XDP_TX);
    // Addressed to the requester, from the VIP's MAC, naming the VIP (RFC 826).
    assert_eq!(out, arp_frame(2, CLIENT_MAC, VIP_MAC, VIP, CLIENT_MAC, CLIENT_IP));
    assert_eq!(program.reason(Reason::ArpReplied), 1);
    assert_eq!(program.action(XDP_TX), 1);
    assert_eq!(program.arp_replies(VIP), 1);
}

/// A VIP held under VRRP lease slot 10 is answered (ARP and ping) while that lease runs, and
/// neither once it has run out; then the request is dropped, not passed, since in VIP mode
/// `both` the kernel would answer for the agent that is gone.
#[test]
fn an_owned_vip_is_claimed_only_while_its_lease_runs() {
    use aya::maps::Array;
    use lb_agent::dataplane::leases::monotonic_ns;
    use lb_common::maps::VIP_LEASES;
    let mut program = Program::load();
    let mut owned: HashMap<_, VipKey, OwnedVip> =
        HashMap::try_from(program.ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
    owned.insert(VipKey::new(VIP.octets()), OwnedVip::new(VIP_MAC).with_lease(10), 0).unwrap();
    let mut echo = vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0];
    echo.extend_from_slice(b"lease");
    let ping = lb_lab::packet::ipv4_frame(CLIENT_MAC, VIP_MAC, CLIENT_IP, VIP, 64, 1, &echo);
    let arp = arp_request(CLIENT_MAC, CLIENT_IP, VIP);
    let cases =
        [("running", 1_000_000_000, XDP_TX), ("run out", -1, XDP_DROP), ("never written", 0, XDP_DROP)];
    for (what, from_now, verdict) in cases {
        let mut leases: Array<_, u64> = Array::try_from(program.ebpf.map_mut(VIP_LEASES).unwrap()).unwrap();
        let deadline = if from_now == 0 { 0 } else { monotonic_ns().saturating_add_signed(from_now) };
        leases.set(10, deadline, 0).unwrap();
        let before = program.reason(Reason::LeaseExpired);
        assert_eq!(program.run(&arp).0, verdict, "ARP, lease {what}");
        assert_eq!(program.run(&ping).0, verdict, "ping, lease {what}");
        let expired = if verdict == XDP_DROP { 2 } else { 0 };
        assert_eq!(program.reason(Reason::LeaseExpired) - before, expired, "lease {what}");
    }
}

#[test]
fn a_request_with_ethernet_padding_is_answered_and_keeps_its_length() {
    let program = Program::load();
    let mut padded = arp_request(CLIENT_MAC, CLIENT_IP, VIP);
    padded.resize(60, 0);
    let (action, out) = program.run(&padded);
    assert_eq!(action, XDP_TX);
    assert_eq!(out.len(), 60);
    assert_eq!(out[..42], arp_frame(2, CLIENT_MAC, VIP_MAC, VIP, CLIENT_MAC, CLIENT_IP)[..]);
}

/// Frames the program must pass untouched, and the reason it must count for each.
#[test]
fn everything_else_passes_untouched_and_is_counted() {
    let request = arp_request(CLIENT_MAC, CLIENT_IP, VIP);
    let cases: Vec<(&str, Vec<u8>, Reason)> = vec![
        (
            "request for an address we do not own",
            arp_request(CLIENT_MAC, CLIENT_IP, OTHER_IP),
            Reason::ArpNotOwned,
        ),
        ("ARP reply", arp_frame(2, VIP_MAC, CLIENT_MAC, CLIENT_IP, VIP_MAC, VIP), Reason::ArpIgnored),
        ("gratuitous announcement of the VIP", arp_request(CLIENT_MAC, VIP, VIP), Reason::ArpIgnored),
        ("non-IPv4 protocol type", with_byte(request.clone(), 16, 0x86), Reason::ArpIgnored),
        ("Ethernet header only", request[..14].to_vec(), Reason::MalformedArp),
        ("ARP body cut short", request[..41].to_vec(), Reason::MalformedArp),
        ("hardware length 8", with_byte(request.clone(), 18, 8), Reason::MalformedArp),
        ("protocol length 16", with_byte(request.clone(), 19, 16), Reason::MalformedArp),
        (
            "broadcast sender hardware address",
            {
                let mut f = request.clone();
                f[22..28].copy_from_slice(&[0xff; 6]);
                f
            },
            Reason::MalformedArp,
        ),
        ("multicast Ethernet source", with_byte(request.clone(), 6, 0x01), Reason::MalformedArp),
        (
            "an ARP body under the IPv4 EtherType",
            with_byte(with_byte(request.clone(), 12, 0x08), 13, 0x00),
            Reason::MalformedIpv4,
        ),
        (
            "tagged with a VLAN not served",
            with_byte(with_byte(request.clone(), 12, 0x81), 13, 0x00),
            Reason::VlanNotServed,
        ),
    ];
    let program = Program::load();
    for (i, (name, input, reason)) in cases.iter().enumerate() {
        let before = program.reason(*reason);
        let (action, out) = program.run(input);
        assert_eq!(action, XDP_PASS, "{name}");
        assert_eq!(&out, input, "{name}: must pass unmodified");
        assert_eq!(program.reason(*reason), before + 1, "{name}: counts as {reason:?}");
        assert_eq!(program.action(XDP_PASS), i as u64 + 1, "{name}");
    }
    assert_eq!(program.action(XDP_TX), 0);
    assert_eq!(program.arp_replies(VIP), 0);
}

#[test]
fn random_frames_never_abort() {
    // A cheap deterministic generator: every length from 14 to 128, ARP EtherType, random body.
    let program = Program::load();
    let mut noise = lb_lab::packet::Noise::new(0x2545_f491_4f6c_dd1d);
    let mut next = move || noise.byte();
    for len in 14..=128usize {
        for _ in 0..20 {
            let mut frame: Vec<u8> = (0..len).map(|_| next()).collect();
            frame[12] = 0x08;
            frame[13] = 0x06;
            let (action, _) = program.run(&frame);
            assert!(action == XDP_PASS || action == XDP_TX, "len {len}: action {action}");
        }
    }
    assert_eq!(program.action(0), 0, "XDP_ABORTED");
}

/// VRRP advertisements pass; the MAC of each source is learned from them, and one that claims a
/// source from another MAC while the learned one is live is counted and remembered for the
/// agent. Once the learned MAC has gone quiet past three advertised
/// intervals, a new MAC is learned instead.
#[test]
fn a_vrrp_source_heard_from_another_mac_is_counted() {
    use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4};
    use lb_common::maps::{VRRP_SPEAKERS, VrrpSpeaker};
    let program = Program::load();
    let member = Ipv4Addr::new(192, 0, 2, 11);
    let member_mac = [0x02, 0, 0, 0, 0, 0x11];
    let advert = |interval_cs: u16| {
        Advertisement { vrid: 20, priority: 100, max_adver_int_cs: interval_cs, addresses: vec![VIP.into()] }
            .encode(member, VRRP_MULTICAST_V4, ChecksumMode::Rfc)
    };
    let frame = |mac: [u8; 6], interval_cs: u16| {
        lb_lab::packet::ipv4_frame(
            mac,
            lb_lab::packet::multicast_mac(VRRP_MULTICAST_V4),
            member,
            VRRP_MULTICAST_V4,
            255,
            112,
            &advert(interval_cs),
        )
    };
    let speaker = |program: &Program| -> VrrpSpeaker {
        let map: HashMap<_, VipKey, VrrpSpeaker> =
            HashMap::try_from(program.ebpf.map(VRRP_SPEAKERS).unwrap()).unwrap();
        map.get(&VipKey::new(member.octets()), 0).unwrap()
    };

    // Learned from the member's own advertisements (1 s interval: live for 3 s).
    assert_eq!(program.run(&frame(member_mac, 100)).0, XDP_PASS);
    assert_eq!(speaker(&program).mac, member_mac);
    // The same address from the client's MAC: passed, counted, remembered.
    for _ in 0..3 {
        assert_eq!(program.run(&frame(CLIENT_MAC, 100)).0, XDP_PASS);
    }
    let s = speaker(&program);
    assert_eq!((s.mac, s.other_mac, s.other_mac_adverts), (member_mac, CLIENT_MAC, 3));
    // The member goes on: still its MAC.
    program.run(&frame(member_mac, 1));
    // 10 ms interval: live 30 ms. Past that, another MAC is learned, not counted.
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert_eq!(program.run(&frame(CLIENT_MAC, 1)).0, XDP_PASS);
    let s = speaker(&program);
    assert_eq!((s.mac, s.other_mac_adverts), (CLIENT_MAC, 3));
    // Too short to hold a VRRP header: passed untouched for the agent to reject.
    let short =
        lb_lab::packet::ipv4_frame(CLIENT_MAC, [0xff; 6], member, VRRP_MULTICAST_V4, 255, 112, &[0x31]);
    assert_eq!(program.run(&short).0, XDP_PASS);
}

/// With several uplinks, an owned VIP is answered (ARP and ping) only on its own uplink's
/// interface; elsewhere the frame goes to the kernel untouched, counted. A table of (the
/// VIP's uplink slot, the slot of the interface the frame arrives on, the verdict).
#[test]
fn an_owned_vip_is_answered_only_on_its_uplink() {
    use lb_common::maps::{ANY_UPLINK, UPLINKS, Uplink, UplinkKey};
    // The loopback device: an interface every test host has, to arrive on.
    const ARRIVAL: u32 = 1;
    let mut echo = vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0];
    echo.extend_from_slice(b"uplink");
    let ping = lb_lab::packet::ipv4_frame(CLIENT_MAC, VIP_MAC, CLIENT_IP, VIP, 64, 1, &echo);
    let arp = arp_request(CLIENT_MAC, CLIENT_IP, VIP);
    let cases: [(&str, u8, Option<u8>, u32); 4] = [
        ("a single uplink: any interface", ANY_UPLINK, None, XDP_TX),
        ("arrived on its uplink", 2, Some(2), XDP_TX),
        ("arrived on another uplink", 2, Some(1), XDP_PASS),
        ("arrived on an interface that is no uplink", 2, None, XDP_PASS),
    ];
    for (what, vip_slot, arrival_slot, verdict) in cases {
        let mut program = Program::load();
        let mut owned: HashMap<_, VipKey, OwnedVip> =
            HashMap::try_from(program.ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
        owned.insert(VipKey::new(VIP.octets()), OwnedVip::new(VIP_MAC).on_uplink(vip_slot), 0).unwrap();
        if let Some(slot) = arrival_slot {
            let mut uplinks: HashMap<_, UplinkKey, Uplink> =
                HashMap::try_from(program.ebpf.map_mut(UPLINKS).unwrap()).unwrap();
            let uplink = Uplink { source: [192, 0, 2, 10], mac: VIP_MAC, slot, _pad: 0 };
            uplinks.insert(UplinkKey::new(ARRIVAL, 0), uplink, 0).unwrap();
        }
        for (kind, frame) in [("ARP", &arp), ("ping", &ping)] {
            let (action, out) = lb_lab::fixture::run_uplink(&program.ebpf, frame, ARRIVAL);
            assert_eq!(action, verdict, "{kind}, {what}");
            if verdict == XDP_PASS {
                assert_eq!(&out, frame, "{kind}, {what}: passed unmodified");
            }
        }
        let wrong = if verdict == XDP_PASS { 2 } else { 0 };
        assert_eq!(program.reason(Reason::WrongInterface), wrong, "{what}");
    }
    // In VIP mode `both` the kernel would answer the ARP request on the wrong interface: it is
    // dropped there instead.
    let mut program = Program::load();
    let mut owned: HashMap<_, VipKey, OwnedVip> =
        HashMap::try_from(program.ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
    owned.insert(VipKey::new(VIP.octets()), OwnedVip::with_kernel(VIP_MAC).on_uplink(2), 0).unwrap();
    assert_eq!(lb_lab::fixture::run_uplink(&program.ebpf, &arp, ARRIVAL).0, XDP_DROP);
    assert_eq!(program.reason(Reason::WrongInterface), 1);
}
