//! lb-agent's BPF programs. Built for `bpfel-unknown-none` by `cargo xtask build-ebpf`.
//!
//! Imports go one way, down this list (a layer uses those below it, never one above):
//! - `eth`: the frame's EtherType picks the layer that handles it.
//! - `l2`: ARP and Neighbor Discovery answered for owned VIPs.
//! - `l3`: IPv4 and IPv6 validated and dispatched by protocol; ICMP and ICMPv6 echo answered.
//! - `services`: the service path, once for both families: `flow` (connection table, Maglev),
//!   `nat` (local DNAT, full NAT and its replies), `encap` (IPIP for DSR, both ends), `encap6`
//!   (IPv6 in IPv6).
//! - `vrrp`: learns each advertisement source's MAC and counts impersonations.
//! - `route`: next hops (FIB, neighbours), sending, and the memory of how replies are
//!   translated back.
//! - `family`: what differs between IPv4 and IPv6 for the two layers above (maps, header
//!   fields, FIB parameters, rewrites).
//! - `rewrite`: header rewrites with incremental checksums.
//! - `owned`: owned VIPs and their leases; `uplink`: which uplink a frame came by, and this
//!   node's address on each; `vlan`: a served VLAN's tag taken off on arrival, put back on
//!   answers and on what is passed to the kernel.
//! - `packet`, `stats`, `maps`: bounds-checked access, counters, the maps.
//! - `reply`: the TC egress program that translates local endpoints' replies.
//! - `bench`: instruments for `cargo xtask bench dataplane`, never attached by the agent;
//!   `lab`: the lab switch's VLAN access ports and the hashes' conformance program, for the
//!   tests alone.
#![no_std]
#![no_main]
// Inline assembly for word loads from the packet (`packet::flow_key6`).
#![feature(asm_experimental_arch)]

mod bench;
mod eth;
mod family;
mod l2;
mod l3;
mod lab;
mod maps;
mod owned;
mod packet;
mod reply;
mod rewrite;
mod route;
mod services;
mod stats;
mod uplink;
mod vlan;
mod vrrp;

use aya_ebpf::{
    bindings::{TC_ACT_OK, xdp_action::XDP_PASS},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// The uplink program. It never returns `XDP_ABORTED`: anything it cannot parse is passed to
/// the kernel untouched and counted.
///
/// `inline(always)` reaches the body the `xdp` macro wraps: left to LLVM, a body this large
/// stays a function of its own, and every frame would pay a BPF call (about 10 ns where
/// returns go through a return thunk, see `vlan::finish`).
#[xdp]
#[inline(always)]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let bytes = packet::len(&ctx);
    conclude(&ctx, bytes, eth::handle_frame(&ctx))
}

/// The IPv6 service path, tail-called by `lb_xdp` for IPv6 TCP, UDP and IPv6-in-IPv6 (see
/// `l3::ipv6::serve`); never attached itself. It counts its own action: `lb_xdp` does not
/// resume after a tail call.
#[xdp]
pub fn lb_xdp6(ctx: XdpContext) -> u32 {
    let bytes = packet::len(&ctx);
    conclude(&ctx, bytes, l3::ipv6::serve(&ctx))
}

/// IPv6 full NAT for a flow that holds no source port yet: the port claimed. Tail-called by
/// `lb_xdp6` (see `services::stages6`), which sends established flows on itself.
#[xdp]
pub fn lb_xdp6_full_nat(ctx: XdpContext) -> u32 {
    let bytes = packet::len(&ctx);
    conclude(&ctx, bytes, services::stages6::run_full_nat(&ctx))
}

/// IPv6 in IPv6 unwrapped for a local endpoint (DSR's receiving end), tail-called by `lb_xdp6`
/// (see `services::stages6`).
#[xdp]
pub fn lb_xdp6_decap(ctx: XdpContext) -> u32 {
    let bytes = packet::len(&ctx);
    conclude(&ctx, bytes, services::encap6::decapsulate(&ctx))
}

/// What every program does last with its action: a passed tagged frame gets its tag back (see
/// `vlan::finish`), and the action is counted with the frame's length as it arrived (`bytes`).
#[inline(always)]
fn conclude(ctx: &XdpContext, bytes: usize, action: u32) -> u32 {
    let action = vlan::finish(ctx, action);
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach a panic, so this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
