//! 802.1Q fixtures through BPF_PROG_TEST_RUN: one parent interface serving an untagged group
//! and groups on VLANs 30 and 40. One table of cases for both families, each one frame (tagged
//! as the case says), the verdict, the counter it must bump, and what must come out: the frame
//! untouched, or the exact answer carrying the tag (priority bits too) it arrived with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::Ebpf;
use lb_common::{
    counters::Reason,
    maps::{OwnedVip, VLAN_SLOTS, VlanSlot},
};
use lb_lab::{
    cases::{Case, Expect, case, run_cases, tagged, tagged_with},
    family::{
        FAMILIES, IpFamily, LabFamily, echo, own_vip, resolution_answer, resolution_request, segment_frame,
    },
    fixture::{self, XDP_PASS, XDP_TX},
};

/// The loopback device: an interface every test host has, to arrive on.
const PARENT: u32 = 1;
/// Another parent, never arrived on here.
const OTHER_PARENT: u32 = 999;
const CLIENT_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xcc];
const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const SLOTS: [(u16, u8); 3] = [(0, 1), (30, 2), (40, 3)];
/// VLAN 30 with priority 5, which the answer must keep.
const TCI_30: u16 = 0xa000 | 30;

/// The untagged group's VIP (`last` 1), and VLAN 30's and 40's: 198.51.100.<last>,
/// 2001:db8:6::<last>.
fn vip(f: IpFamily, last: u8) -> IpAddr {
    f.pick(
        Ipv4Addr::new(198, 51, 100, last).into(),
        Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, last.into()).into(),
    )
}

fn load() -> Ebpf {
    let mut ebpf = fixture::load_uplink();
    for (vlan, slot) in SLOTS {
        fixture::add_uplink(&mut ebpf, (PARENT, vlan), slot, fixture::NODE, VIP_MAC);
    }
    // VLAN 30 is found in the array by VLAN id; VLAN 40 only in the uplink map (another parent
    // holds 40 in the array, as where two parents carry one VLAN id); VLAN 50 is in the array
    // for another parent alone, so not served here.
    let mut by_vlan: aya::maps::Array<_, VlanSlot> =
        aya::maps::Array::try_from(ebpf.map_mut(VLAN_SLOTS).unwrap()).unwrap();
    for (vlan, ifindex, slot) in [(30, PARENT, 2), (40, OTHER_PARENT, 9), (50, OTHER_PARENT, 9)] {
        by_vlan.set(vlan, VlanSlot { ifindex, slot, _pad: [0; 3] }, 0).unwrap();
    }
    for f in FAMILIES {
        for (last, slot) in [(1, 1), (30, 2), (40, 3)] {
            own_vip(&mut ebpf, vip(f, last), OwnedVip::new(VIP_MAC).on_uplink(slot));
        }
    }
    ebpf
}

/// One table for both families: a request for a VIP (ARP or Neighbor Solicitation) or an echo
/// to it, tagged as the row says, and the exact answer it must get, tagged as it came, or
/// the frame passed as it came.
fn cases(f: IpFamily) -> Vec<Case> {
    use Expect::{CountedFrame, Passed};
    let client = f.client();
    let answered = f.pick(Reason::ArpReplied, Reason::NdpAdvertised);
    let request = |last: u8| resolution_request(CLIENT_MAC, client, vip(f, last));
    let answer = |last: u8, tci: Option<u16>| {
        let frame = resolution_answer(VIP_MAC, CLIENT_MAC, client, vip(f, last), 0x60);
        CountedFrame(XDP_TX, tci.map_or(frame.clone(), |tci| tagged(&frame, tci)), answered)
    };
    let ping = |last: u8| echo((CLIENT_MAC, VIP_MAC), client, vip(f, last), true, 64);
    let pong = |last: u8, tci: u16| {
        let frame = echo((VIP_MAC, CLIENT_MAC), vip(f, last), client, false, 64);
        CountedFrame(XDP_TX, tagged(&frame, tci), Reason::IcmpEchoReplied)
    };
    let wrong = || Passed(Reason::WrongInterface);
    let mut truncated_tag = request(30)[..12].to_vec();
    truncated_tag.extend_from_slice(&[0x81, 0x00, 0x00]);
    let elsewhere = segment_frame((CLIENT_MAC, VIP_MAC), client, vip(f, 99), 64, 6, (40_000, 80));
    vec![
        case(
            "a request for VLAN 30's VIP on VLAN 30",
            tagged(&request(30), TCI_30),
            answer(30, Some(TCI_30)),
        ),
        case("a request for VLAN 30's VIP on VLAN 40", tagged(&request(30), 40), wrong()),
        case("a request for VLAN 30's VIP untagged", request(30), wrong()),
        case("a request for VLAN 40's VIP on VLAN 40", tagged(&request(40), 40), answer(40, Some(40))),
        case("a request for the untagged VIP untagged", request(1), answer(1, None)),
        case("a request for the untagged VIP on VLAN 30", tagged(&request(1), 30), wrong()),
        case(
            "a request for the untagged VIP priority-tagged (VLAN 0)",
            tagged(&request(1), 0x6000),
            answer(1, Some(0x6000)),
        ),
        case("VLAN 50, served by nobody here", tagged(&request(30), 50), Passed(Reason::VlanNotServed)),
        case(
            "QinQ: 802.1ad outside 802.1Q",
            tagged_with(&tagged(&request(30), 30), 0x88a8, 100),
            Passed(Reason::VlanStacked),
        ),
        case("two 802.1Q tags", tagged(&tagged(&request(30), 30), 30), Passed(Reason::VlanStacked)),
        case("a tag cut short", truncated_tag, Passed(Reason::MalformedEthernet)),
        case("echo to VLAN 30's VIP on VLAN 30", tagged(&ping(30), TCI_30), pong(30, TCI_30)),
        case("echo to VLAN 40's VIP on VLAN 30", tagged(&ping(40), 30), wrong()),
        case("TCP to an address nobody serves", tagged(&elsewhere, 30), Passed(f.passed())),
    ]
}

#[test]
fn each_vlan_answers_its_own_vips_with_its_tag_and_passes_the_rest_as_it_came() {
    let ebpf = load();
    for f in FAMILIES {
        run_cases(&ebpf, PARENT, f.as_str(), cases(f));
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
