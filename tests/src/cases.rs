//! Fixture tables as data: a case is an input frame and what the program must do with it (the
//! action, the exact frame out, the counter), run through BPF_PROG_TEST_RUN. Tables are built
//! per family from `family`'s addresses and builders, so one table serves both.

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
}

pub fn case(name: &'static str, input: Vec<u8>, expect: Expect) -> Case {
    Case { name, input, expect }
}

/// Runs `cases` in order through the uplink program of `ebpf`, as received on `ifindex`; a
/// failure names `label` (the family) and the case.
pub fn run_cases(ebpf: &Ebpf, ifindex: u32, label: &str, cases: Vec<Case>) {
    for Case { name, input, expect } in cases {
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
