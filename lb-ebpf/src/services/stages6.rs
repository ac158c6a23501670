//! IPv6's delivery paths, sized to BPF's 512-byte stack. IPv6's keys, backends and reply
//! targets are each several times IPv4's; inlined together into `lb_xdp6` the paths pass it.
//! - Local delivery and DSR are BPF functions inside `lb_xdp6` ([`local`], [`dsr`]): a
//!   function's frame adds to its caller's only along its own call chain, and these fit once
//!   their large values live in this CPU's `STATE6` slot rather than on the stack. The common
//!   path needs no tail call beyond the one into `lb_xdp6`.
//! - Full NAT's frame does not fit beside `lb_xdp6`'s: it is a program of its own
//!   (`lb_xdp6_full_nat`), tail-called through `IPV6_SERVICES` ([`FULL_NAT`]; slot 0 is
//!   `lb_xdp6`), which starts a fresh stack. What `lb_xdp6` decided (the 5-tuple, the backend)
//!   reaches it in `STATE6`: a packet runs on one CPU from `lb_xdp6` to the end of its stage.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{Addr6, FlowKey6},
};

use super::{encap6, flow::Picked, nat};
use crate::{
    family::{IpFamily, V6},
    maps::{IPV6_SERVICES, STATE6},
    packet::{self, l4_layout},
    stats,
};

/// Full NAT's `IPV6_SERVICES` slot (see `lb_common::service::IPV6_SERVICE_PROGRAMS`).
pub const FULL_NAT: u32 = 2;

/// [`translate_reply`]: not a reply of ours.
pub const NOT_A_REPLY: u64 = u64::MAX;

/// Hands the picked backend to stage `slot` and tail-calls it; returns only if that fails
/// (the agent fills the slots before it attaches anything: a broken load), passing the packet.
#[inline(always)]
pub fn enter(ctx: &XdpContext, picked: &Picked<Addr6>, ip_len: u16, slot: u32) -> (u32, Reason) {
    if let Some(state) = STATE6.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, used by this packet alone.
        unsafe {
            (*state).backend = picked.backend;
            (*state).id = picked.id;
            (*state).ip_len = ip_len;
            (*state).service = picked.service;
            (*state).snat_attempt = picked.snat_attempt;
            (*state).known = u8::from(picked.known);
            (*state).check_due = u8::from(picked.check_due);
            let _ = IPV6_SERVICES.tail_call(ctx, slot);
        }
    }
    (XDP_PASS, Reason::Ipv6Passed)
}

/// Runs the full-NAT stage on the state `lb_xdp6` left, and counts what `lb_xdp6` would have
/// counted after it (the backend, the reason; the caller counts the action).
#[inline(always)]
pub fn run_full_nat(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let Some(state) = STATE6.get_ptr_mut(0) else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    // SAFETY: this CPU's slot, written by `lb_xdp6` for this packet.
    let state = unsafe { &*state };
    let flow = &state.flow;
    let Some(layout) = l4_layout(flow.proto) else {
        return stats::verdict(Reason::MalformedL4, bytes, XDP_DROP);
    };
    let picked = Picked {
        id: state.id,
        backend: state.backend,
        service: state.service,
        known: state.known != 0,
        snat_attempt: state.snat_attempt,
        check_due: state.check_due != 0,
        // Full NAT's stage: replies come back through `SNAT_REPLIES`, never `REPLY_NAT`.
        replies_by_table: false,
    };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let (action, reason) = nat::full_nat::<V6>(ctx, layout, flow, &picked, state.ip_len, now);
    // Sent on to the backend (a Packet Too Big goes back to the client instead).
    if action != XDP_PASS && action != XDP_DROP && reason != Reason::TooBig {
        stats::count_backend(V6::backend_stats(), picked.id, bytes);
    }
    stats::verdict(reason, bytes, action)
}

/// Local delivery inside `lb_xdp6`, in a BPF function of its own: its frame adds to
/// `lb_xdp6`'s only along this call, so the common path needs no tail call. The action in the
/// low half, the reason in the high (plain integers across a BPF call).
#[inline(never)]
pub fn local(ctx: &XdpContext, flow: &FlowKey6, picked: &Picked<Addr6>, ip_len: u16, now: u64) -> u64 {
    let (action, reason) = match l4_layout(flow.proto) {
        Some(layout) => nat::local::<V6>(ctx, layout, flow, picked, ip_len, now),
        None => (XDP_DROP, Reason::MalformedL4),
    };
    u64::from(action) | (reason as u64) << 32
}

/// DSR (IPv6 in IPv6) inside `lb_xdp6`, as [`local`].
#[inline(never)]
pub fn dsr(ctx: &XdpContext, flow: &FlowKey6, picked: &Picked<Addr6>, ip_len: u16, now: u64) -> u64 {
    let (action, reason) = encap6::encapsulate(ctx, flow, picked, ip_len, now);
    u64::from(action) | (reason as u64) << 32
}

/// [`local`]'s and [`dsr`]'s result, unpacked.
#[inline(always)]
pub fn unpack(packed: u64) -> (u32, Reason) {
    let reason = Reason::ALL.get((packed >> 32) as usize).copied().unwrap_or(Reason::Ipv6Passed);
    (packed as u32, reason)
}

/// Full NAT's replies, in a BPF function of its own inside `lb_xdp6` (its frame is only
/// added to `lb_xdp6`'s). The action, or [`NOT_A_REPLY`].
#[inline(never)]
pub fn translate_reply(ctx: &XdpContext, flow: &FlowKey6, ip_len: u16) -> u64 {
    let Some(layout) = l4_layout(flow.proto) else { return NOT_A_REPLY };
    nat::translate_reply::<V6>(ctx, layout, flow, ip_len).map_or(NOT_A_REPLY, u64::from)
}
