//! lb-agent's XDP program. Built for `bpfel-unknown-none` by `cargo xtask build-ebpf`.
//!
//! - `maps`: every map, with the layouts from `lb_common::maps`.
//! - `packet`: bounds-checked access to packet bytes.
//! - `stats`: action and reason counters.
//! - `arp`: answers ARP requests for owned VIPs with `XDP_TX`.
#![no_std]
#![no_main]

mod arp;
mod maps;
mod packet;
mod stats;

use aya_ebpf::{bindings::xdp_action::XDP_PASS, macros::xdp, programs::XdpContext};
use lb_common::counters::Reason;
use network_types::eth::EthHdr;

/// The uplink program. It never returns `XDP_ABORTED`: anything it cannot parse is passed to
/// the kernel untouched and counted.
#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let action = handle_frame(&ctx);
    stats::count_action(action, packet::len(&ctx));
    action
}

/// Passes everything. Attached to the peer of a veth whose other end runs `lb_xdp` in native
/// mode: a veth only delivers `XDP_TX`/redirected frames to a peer that runs NAPI.
#[xdp]
pub fn lb_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

#[inline(always)]
fn handle_frame(ctx: &XdpContext) -> u32 {
    let Some(eth) = packet::header::<EthHdr>(ctx, 0) else {
        stats::count_reason(Reason::MalformedEthernet, packet::len(ctx));
        return XDP_PASS;
    };
    // SAFETY: `header` checked that the Ethernet header lies inside the packet.
    if lb_common::arp::is_arp(unsafe { &*eth }) {
        return arp::answer_owned(ctx);
    }
    stats::count_reason(Reason::NotArp, packet::len(ctx));
    XDP_PASS
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
