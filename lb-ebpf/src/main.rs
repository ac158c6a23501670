//! lb-agent's BPF programs. Built for `bpfel-unknown-none` by `cargo xtask build-ebpf`.
//!
//! - `maps`: every map, with the layouts from `lb_common`.
//! - `packet`: bounds-checked access to packet bytes, header offsets.
//! - `stats`: action, reason, VIP and backend counters.
//! - `arp`: answers ARP requests for owned VIPs.
//! - `ipv4`: validates IPv4 and dispatches by protocol.
//! - `forward`: the service path: connection table, Maglev, local and full-NAT delivery.
//! - `dsr`: IPIP encapsulation towards endpoints and decapsulation for local ones.
//! - `icmp`: echo replies for owned VIPs.
//! - `uplink`: which uplink a frame arrived on; this node's address on each.
//! - `vrrp`: learns each advertisement source's MAC and counts impersonations.
//! - `nat`, `fib`: header rewrites with incremental checksums; next hops and transmit.
//! - `reply`: the TC egress program that translates local endpoints' replies.
//! - `bench`: instruments for `cargo xtask bench dataplane`, never attached by the agent.
#![no_std]
#![no_main]

mod arp;
mod bench;
mod dsr;
mod fib;
mod forward;
mod icmp;
mod ipv4;
mod lease;
mod maps;
mod nat;
mod packet;
mod reply;
mod stats;
mod uplink;
mod vrrp;

use aya_ebpf::{
    bindings::{TC_ACT_OK, xdp_action::XDP_PASS},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use lb_common::counters::Reason;
use network_types::eth::EthHdr;
use packet::ETHERTYPE_IPV4;

const ETHERTYPE_ARP: u16 = 0x0806;

/// The uplink program. It never returns `XDP_ABORTED`: anything it cannot parse is passed to
/// the kernel untouched and counted.
#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let bytes = packet::len(&ctx);
    let action = handle_frame(&ctx);
    stats::count_action(action, bytes);
    action
}

/// Passes everything. Attached to the peer of a veth whose other end runs `lb_xdp` in native
/// mode: a veth only delivers `XDP_TX`/redirected frames to a peer that runs NAPI.
#[xdp]
pub fn lb_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

/// The uplink's egress: replies from this node's endpoints get the VIP back as their source.
/// Always lets the packet go.
#[classifier]
pub fn lb_reply(ctx: TcContext) -> i32 {
    let _ = reply::translate(&ctx);
    TC_ACT_OK
}

#[inline(always)]
fn handle_frame(ctx: &XdpContext) -> u32 {
    let Some(eth) = packet::header::<EthHdr>(ctx, 0) else {
        return stats::verdict(Reason::MalformedEthernet, packet::len(ctx), XDP_PASS);
    };
    // SAFETY: `header` checked that the Ethernet header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETHERTYPE_ARP => arp::answer_owned(ctx),
        ETHERTYPE_IPV4 => ipv4::handle(ctx),
        _ => stats::verdict(Reason::NotIpv4, packet::len(ctx), XDP_PASS),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach a panic, so this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
