//! Katran's balancer as the DSR benchmark sets it up ([`lb_lab::katran`]), through
//! BPF_PROG_TEST_RUN: what `cargo xtask bench dataplane --dsr` compares lb-agent with must be
//! Katran forwarding, not Katran dropping or passing. A packet to the VIP leaves by `XDP_TX`,
//! wrapped in IPIP to the real, towards the gateway's MAC, and its flow is in the per-CPU
//! connection table; traffic to another port is not Katran's.

use std::net::Ipv4Addr;

use lb_lab::{
    fixture::{CLIENT, CLIENT_MAC, NODE_MAC, PEER_MAC, VIP, XDP_PASS, XDP_TX, run_xdp},
    katran,
    packet::{checksum, ipv4_frame, transport},
};

const REAL: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const ETH: usize = 14;
const IPV4: usize = 20;

fn udp_frame(sport: u16, dport: u16) -> Vec<u8> {
    let segment = transport(17, CLIENT, VIP, sport, dport, &[0u8; 22]);
    ipv4_frame(CLIENT_MAC, NODE_MAC, CLIENT, VIP, 64, 17, &segment)
}

/// One run: the verdict and the frame as the program left it.
fn run(katran: &mut katran::Katran, frame: &[u8]) -> (u32, Vec<u8>) {
    run_xdp(katran.program(), frame, 0)
}

#[test]
fn katran_as_the_bench_sets_it_wraps_vip_traffic_in_ipip_to_the_real() {
    let mut katran = katran::load(&katran::object(), VIP, 80, REAL, PEER_MAC, 1024);
    let frame = udp_frame(1024, 80);
    let (action, out) = run(&mut katran, &frame);
    assert_eq!(action, XDP_TX, "Katran transmits a packet to its VIP");
    assert_eq!(out.len(), frame.len() + IPV4, "one IPv4 header added");
    assert_eq!(out[..6], PEER_MAC, "towards the gateway's MAC");
    assert_eq!(out[12..14], [0x08, 0x00], "IPv4");
    let outer = &out[ETH..ETH + IPV4];
    assert_eq!(outer[9], 4, "IPIP");
    assert_eq!(outer[16..20], REAL.octets(), "to the real");
    assert_eq!(u16::from_be_bytes([outer[2], outer[3]]) as usize, frame.len() - ETH + IPV4, "total length");
    assert_eq!(checksum(outer), 0, "a valid outer header checksum");
    assert_eq!(out[ETH + IPV4..], frame[ETH..], "the client's packet inside, unchanged");
    assert_eq!(katran.connections(), 1, "the flow is in the per-CPU connection table");

    // The flow again: the same real, from the table; a second flow gets an entry of its own.
    assert_eq!(run(&mut katran, &frame), (action, out));
    assert_eq!(run(&mut katran, &udp_frame(1025, 80)).0, XDP_TX);
    assert_eq!(katran.connections(), 2);
}

#[test]
fn katran_leaves_traffic_to_other_ports_alone() {
    let mut katran = katran::load(&katran::object(), VIP, 80, REAL, PEER_MAC, 1024);
    let frame = udp_frame(1024, 81);
    assert_eq!(run(&mut katran, &frame), (XDP_PASS, frame), "not a VIP:port of Katran's");
    assert_eq!(katran.connections(), 0);
}
