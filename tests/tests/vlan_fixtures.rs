//! 802.1Q fixtures through BPF_PROG_TEST_RUN: one parent interface serving an untagged group
//! and groups on VLANs 30 and 40. A table of cases, each one frame (tagged as the case says),
//! the verdict, the counter it must bump, and what must come out: the frame untouched, or an
//! answer carrying the tag (priority bits too) it arrived with.

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::{Ebpf, maps::HashMap};
use lb_common::{
    counters::Reason,
    maps::{
        OWNED_VIPS, OWNED_VIPS6, OwnedVip, UPLINKS, Uplink, UplinkKey, VLAN_SLOTS, Vip6Key, VipKey, VlanSlot,
    },
};
use lb_lab::{
    fixture::{self, XDP_PASS, XDP_TX},
    packet::{
        arp_replies, arp_request, icmpv6, ipv4_frame, ipv6_frame, neighbor_advertisements,
        neighbor_solicitation, transport6,
    },
};

/// The loopback device: an interface every test host has, to arrive on.
const PARENT: u32 = 1;
/// Another parent, never arrived on here.
const OTHER_PARENT: u32 = 999;
const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 30, 0, 0, 0, 0x100);
/// The untagged group's VIP, and the VLANs' (slots 1, 2 and 3).
const VIP_UNTAGGED: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const VIP_30: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 30);
const VIP_40: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 40);
const VIP6_30: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 30, 0, 0, 0, 0x10);
const OTHER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 30, 0, 0, 0, 0x99);
const SLOTS: [(u16, u8); 3] = [(0, 1), (30, 2), (40, 3)];
/// VLAN 30 with priority 5, which the answer must keep.
const TCI_30: u16 = 0xa000 | 30;

/// What must come out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Out {
    /// The frame exactly as it came in.
    Untouched,
    /// An answer tagged with this TCI (none: untagged).
    Answer(Option<u16>),
}

/// (kind, what, the frame, the verdict, the reason counted, what comes out).
type Case = (&'static str, &'static str, Vec<u8>, u32, Reason, Out);

fn load() -> Ebpf {
    let mut ebpf = fixture::load_uplink();
    let mut uplinks: HashMap<_, UplinkKey, Uplink> =
        HashMap::try_from(ebpf.map_mut(UPLINKS).unwrap()).unwrap();
    for (vlan, slot) in SLOTS {
        let uplink = Uplink { source: [192, 0, 2, 10], mac: VIP_MAC, slot, _pad: 0 };
        uplinks.insert(UplinkKey::new(PARENT, vlan), uplink, 0).unwrap();
    }
    // VLAN 30 is found in the array by VLAN id; VLAN 40 only in the uplink map (another parent
    // holds 40 in the array, as where two parents carry one VLAN id); VLAN 50 is in the array
    // for another parent alone, so not served here.
    let mut by_vlan: aya::maps::Array<_, VlanSlot> =
        aya::maps::Array::try_from(ebpf.map_mut(VLAN_SLOTS).unwrap()).unwrap();
    for (vlan, ifindex, slot) in [(30, PARENT, 2), (40, OTHER_PARENT, 9), (50, OTHER_PARENT, 9)] {
        by_vlan.set(vlan, VlanSlot { ifindex, slot, _pad: [0; 3] }, 0).unwrap();
    }
    let mut owned: HashMap<_, VipKey, OwnedVip> =
        HashMap::try_from(ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
    for (vip, slot) in [(VIP_UNTAGGED, 1), (VIP_30, 2), (VIP_40, 3)] {
        owned.insert(VipKey::new(vip.octets()), OwnedVip::new(VIP_MAC).on_uplink(slot), 0).unwrap();
    }
    let mut owned6: HashMap<_, Vip6Key, OwnedVip> =
        HashMap::try_from(ebpf.map_mut(OWNED_VIPS6).unwrap()).unwrap();
    owned6.insert(Vip6Key::new(VIP6_30.octets()), OwnedVip::new(VIP_MAC).on_uplink(2), 0).unwrap();
    ebpf
}

/// `frame` with an 802.1Q tag (`tci`) after its Ethernet addresses.
fn tagged(frame: &[u8], tci: u16) -> Vec<u8> {
    tagged_with(frame, 0x8100, tci)
}

fn tagged_with(frame: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&tpid.to_be_bytes());
    out.extend_from_slice(&tci.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// `frame`'s 802.1Q TCI and the frame without the tag, or `None` and the frame when untagged.
fn untagged(frame: &[u8]) -> (Option<u16>, Vec<u8>) {
    if frame[12..14] != [0x81, 0x00] {
        return (None, frame.to_vec());
    }
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&frame[16..]);
    (Some(u16::from_be_bytes([frame[14], frame[15]])), out)
}

fn ping(dst: Ipv4Addr) -> Vec<u8> {
    let mut echo = vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0];
    echo.extend_from_slice(b"vlan");
    ipv4_frame(CLIENT_MAC, VIP_MAC, CLIENT, dst, 64, 1, &echo)
}

fn ping6(dst: Ipv6Addr) -> Vec<u8> {
    ipv6_frame(CLIENT_MAC, VIP_MAC, CLIENT6, dst, 64, 58, &icmpv6(128, 0, &[0, 1, 0, 1], CLIENT6, dst))
}

/// Whether `answer` (untagged) answers `kind` for `vip`: the ARP reply's sender, the
/// advertisement's target, the echo reply's source.
fn answers(kind: &str, answer: &[u8], vip: &str) -> bool {
    match kind {
        "ARP" => arp_replies(&[answer.to_vec()]).iter().any(|r| r.0 == VIP_MAC && r.1.to_string() == vip),
        "NS" => neighbor_advertisements(&[answer.to_vec()]).iter().any(|a| a.3.to_string() == vip),
        "ping" => {
            answer[12..14] == [8, 0]
                && answer[34] == 0
                && lb_lab::packet::ipv4_at(answer, 26).to_string() == vip
        }
        "ping6" => {
            answer[12..14] == [0x86, 0xdd]
                && answer[54] == 129
                && answer[22..38] == vip.parse::<Ipv6Addr>().unwrap().octets()
        }
        _ => unreachable!("{kind}"),
    }
}

#[test]
fn each_vlan_answers_its_own_vips_with_its_tag_and_passes_the_rest_as_it_came() {
    let arp = |vip| arp_request(CLIENT_MAC, CLIENT, vip);
    let ns = neighbor_solicitation(CLIENT_MAC, CLIENT6, VIP6_30);
    let tcp6_elsewhere = ipv6_frame(
        CLIENT_MAC,
        VIP_MAC,
        CLIENT6,
        OTHER6,
        64,
        6,
        &transport6(6, CLIENT6, OTHER6, 40000, 80, b"x"),
    );
    let mut truncated_tag = arp(VIP_30)[..12].to_vec();
    truncated_tag.extend_from_slice(&[0x81, 0x00, 0x00]);
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("ARP", "VLAN 30's VIP on VLAN 30", tagged(&arp(VIP_30), TCI_30), XDP_TX, Reason::ArpReplied, Out::Answer(Some(TCI_30))),
        ("ARP", "VLAN 30's VIP on VLAN 40", tagged(&arp(VIP_30), 40), XDP_PASS, Reason::WrongInterface, Out::Untouched),
        ("ARP", "VLAN 30's VIP untagged", arp(VIP_30), XDP_PASS, Reason::WrongInterface, Out::Untouched),
        ("ARP", "VLAN 40's VIP on VLAN 40", tagged(&arp(VIP_40), 40), XDP_TX, Reason::ArpReplied, Out::Answer(Some(40))),
        ("ARP", "the untagged VIP untagged", arp(VIP_UNTAGGED), XDP_TX, Reason::ArpReplied, Out::Answer(None)),
        ("ARP", "the untagged VIP on VLAN 30", tagged(&arp(VIP_UNTAGGED), 30), XDP_PASS, Reason::WrongInterface, Out::Untouched),
        ("ARP", "the untagged VIP priority-tagged (VLAN 0)", tagged(&arp(VIP_UNTAGGED), 0x6000), XDP_TX, Reason::ArpReplied, Out::Answer(Some(0x6000))),
        ("ARP", "VLAN 50, served by nobody here", tagged(&arp(VIP_30), 50), XDP_PASS, Reason::VlanNotServed, Out::Untouched),
        ("ARP", "QinQ: 802.1ad outside 802.1Q", tagged_with(&tagged(&arp(VIP_30), 30), 0x88a8, 100), XDP_PASS, Reason::VlanStacked, Out::Untouched),
        ("ARP", "two 802.1Q tags", tagged(&tagged(&arp(VIP_30), 30), 30), XDP_PASS, Reason::VlanStacked, Out::Untouched),
        ("ARP", "a tag cut short", truncated_tag, XDP_PASS, Reason::MalformedEthernet, Out::Untouched),
        ("ping", "VLAN 30's VIP on VLAN 30", tagged(&ping(VIP_30), TCI_30), XDP_TX, Reason::IcmpEchoReplied, Out::Answer(Some(TCI_30))),
        ("ping", "VLAN 40's VIP on VLAN 30", tagged(&ping(VIP_40), 30), XDP_PASS, Reason::WrongInterface, Out::Untouched),
        ("NS", "VLAN 30's VIP on VLAN 30", tagged(&ns, TCI_30), XDP_TX, Reason::NdpAdvertised, Out::Answer(Some(TCI_30))),
        ("NS", "VLAN 30's VIP on VLAN 40", tagged(&ns, 40), XDP_PASS, Reason::WrongInterface, Out::Untouched),
        ("ping6", "VLAN 30's VIP on VLAN 30", tagged(&ping6(VIP6_30), 30), XDP_TX, Reason::IcmpEchoReplied, Out::Answer(Some(30))),
        ("TCP6", "to an address nobody serves, through the IPv6 program", tagged(&tcp6_elsewhere, 30), XDP_PASS, Reason::Ipv6Passed, Out::Untouched),
    ];
    let ebpf = load();
    for (kind, what, input, verdict, reason, out) in cases {
        let name = format!("{kind}, {what}");
        let before = fixture::reason_packets(&ebpf, reason);
        let (action, output) = fixture::run_uplink(&ebpf, &input, PARENT);
        assert_eq!(action, verdict, "{name}");
        assert_eq!(
            fixture::reason_packets(&ebpf, reason),
            before + 1,
            "{name}: counted as {}",
            reason.label()
        );
        match out {
            Out::Untouched => assert_eq!(output, input, "{name}: passed as it came"),
            Out::Answer(tci) => {
                let (got_tci, answer) = untagged(&output);
                assert_eq!(got_tci, tci, "{name}: the answer's tag");
                let vip = match kind {
                    "NS" | "ping6" => VIP6_30.to_string(),
                    _ => lb_lab::packet::ipv4_at(&untagged(&input).1, if kind == "ARP" { 38 } else { 30 })
                        .to_string(),
                };
                assert!(answers(kind, &answer, &vip), "{name}: an answer for {vip}: {answer:02x?}");
            }
        }
    }
}

#[test]
fn random_tagged_frames_never_abort_and_pass_as_they_came() {
    let ebpf = load();
    let mut noise = lb_lab::packet::Noise::new(0x9e37_79b9_7f4a_7c15);
    for len in 14..160 {
        let mut frame: Vec<u8> = (0..len).map(|_| noise.byte()).collect();
        frame[12] = 0x81;
        frame[13] = 0x00;
        // A served VLAN half the time, so the untagged layers see the noise too.
        if len % 2 == 0 && len >= 16 {
            frame[14] = 0;
            frame[15] = 30;
        }
        let (action, out) = fixture::run_uplink(&ebpf, &frame, PARENT);
        assert_ne!(action, 0, "length {len}: aborted");
        if action == XDP_PASS {
            assert_eq!(out, frame, "length {len}: passed as it came");
        }
    }
}
