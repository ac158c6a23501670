//! Fixture tables as data: a case is an input frame and what the program must do with it (the
//! action, the exact frame out, the counter), run through BPF_PROG_TEST_RUN. Tables are built
//! per family from `family`'s addresses and builders, so one table serves both; and a table
//! runs over each [`UplinkKind`], which says how the client's side looks, so a new kind of
//! uplink is a variant, not new cases.

use aya::Ebpf;
use lb_common::counters::Reason;

use crate::{
    family::checksums_ok,
    fixture::{XDP_DROP, XDP_PASS, reason_packets, run_uplink},
};

/// What a case must do.
#[derive(Debug)]
pub enum Expect {
    /// This action and exactly this frame, its IPv4 header's and TCP/UDP checksums right where
    /// it has them (the exact comparison covers the rest).
    Frame(u32, Vec<u8>),
    /// This action and exactly this frame, counted under this reason.
    CountedFrame(u32, Vec<u8>, Reason),
    /// Passed to the kernel untouched, counted under this reason.
    Passed(Reason),
    /// Dropped, counted under this reason.
    Dropped(Reason),
}

#[derive(Debug)]
pub struct Case {
    pub name: &'static str,
    pub input: Vec<u8>,
    pub expect: Expect,
    pub facing: Facing,
}

/// Which of a case's frames travel on the client's side of the uplink, where an
/// [`UplinkKind`] shapes them: both (a request and its answer), the input alone (a packet
/// forwarded on, or dropped, or passed), the output alone (a reply on its way back to the
/// client), or neither (node to node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Facing {
    #[default]
    Both,
    Input,
    Output,
    Neither,
}

/// A case whose frames both face the client (see [`Case::facing`] to say otherwise).
pub fn case(name: &'static str, input: Vec<u8>, expect: Expect) -> Case {
    Case { name, input, expect, facing: Facing::Both }
}

impl Case {
    pub fn facing(self, facing: Facing) -> Case {
        Case { facing, ..self }
    }
}

/// How the client's side of an uplink looks to the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UplinkKind {
    /// Plain Ethernet.
    Untagged,
    /// An 802.1Q VLAN of the interface (the program's tag handling): client-facing frames
    /// carry this tag, in and out; a passed frame goes to the kernel as it came.
    Vlan(u16),
}

impl UplinkKind {
    pub fn label(self) -> String {
        match self {
            UplinkKind::Untagged => "untagged".into(),
            UplinkKind::Vlan(id) => format!("VLAN {id}"),
        }
    }

    /// `case` as it looks on this kind of uplink.
    pub fn shape(self, case: Case) -> Case {
        let UplinkKind::Vlan(id) = self else { return case };
        let tag_if = |on: bool, frame: Vec<u8>| if on { tagged(&frame, id) } else { frame };
        let input = matches!(case.facing, Facing::Both | Facing::Input);
        let output = matches!(case.facing, Facing::Both | Facing::Output);
        let expect = match case.expect {
            Expect::Frame(action, frame) => Expect::Frame(action, tag_if(output, frame)),
            Expect::CountedFrame(action, frame, reason) => {
                Expect::CountedFrame(action, tag_if(output, frame), reason)
            }
            other => other,
        };
        Case { input: tag_if(input, case.input), expect, ..case }
    }
}

/// `frame` with an 802.1Q tag (`tci`) after its Ethernet addresses.
pub fn tagged(frame: &[u8], tci: u16) -> Vec<u8> {
    tagged_with(frame, 0x8100, tci)
}

/// `frame` with a tag of type `tpid` (802.1Q's 0x8100, 802.1ad's 0x88a8) after its addresses.
pub fn tagged_with(frame: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&tpid.to_be_bytes());
    out.extend_from_slice(&tci.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// Runs `cases` in order through the uplink program of `ebpf`, as received on `ifindex`; a
/// failure names `label` (the family) and the case.
pub fn run_cases(ebpf: &Ebpf, ifindex: u32, label: &str, cases: Vec<Case>) {
    for Case { name, input, expect, .. } in cases {
        let name = format!("{label}: {name}");
        let counted = match &expect {
            Expect::CountedFrame(_, _, reason) | Expect::Passed(reason) | Expect::Dropped(reason) => {
                Some(*reason)
            }
            Expect::Frame(..) => None,
        };
        let before = counted.map(|reason| reason_packets(ebpf, reason));
        let (action, out) = run_uplink(ebpf, &input, ifindex);
        match expect {
            Expect::Frame(want, frame) | Expect::CountedFrame(want, frame, _) => {
                assert_eq!(action, want, "{name}: action");
                assert_eq!(out, frame, "{name}: frame\n got      {out:02x?}\n expected {frame:02x?}");
                assert!(checksums_ok(&out), "{name}: checksums of {out:02x?}");
            }
            Expect::Passed(_) => assert_eq!((action, &out), (XDP_PASS, &input), "{name}: passed untouched"),
            Expect::Dropped(_) => assert_eq!(action, XDP_DROP, "{name}: action"),
        }
        if let (Some(reason), Some(before)) = (counted, before) {
            assert_eq!(reason_packets(ebpf, reason), before + 1, "{name}: counted as {}", reason.label());
        }
    }
}
