//! IPv6's stages, sized to BPF's 512-byte stack. IPv6's keys, backends and reply targets are
//! each several times IPv4's; inlined together into one program with everything IPv6 does,
//! they pass it.
//! - Local delivery, DSR and full NAT's replies are inlined into `lb_xdp6` (tail-called by
//!   `lb_xdp`), whose large values live in this CPU's `STATE6` slot rather than on the stack.
//!   So the common path takes one tail call and no BPF function call (a call costs about 10 ns
//!   where returns go through a return thunk, see `vlan::finish`).
//! - So is full NAT for a flow that holds a source port (every packet of an established
//!   flow: the port checked in the port table, the packet sent on).
//! - Claiming a port does not fit beside them: a flow without one (a new flow, or one whose
//!   port another flow took) goes to a program of its own (`lb_xdp6_full_nat`), tail-called
//!   through `IPV6_SERVICES` ([`FULL_NAT`]; slot 0 is `lb_xdp6`), which starts a fresh stack.
//!   What `lb_xdp6` decided (the 5-tuple, the backend) reaches it in `STATE6`: a packet runs
//!   on one CPU from `lb_xdp6` to the end of its stage.
//! - So is DSR's receiving end, the decapsulation of IPv6 in IPv6 (`lb_xdp6_decap`,
//!   [`DECAPSULATE`]): its key and inner 5-tuple on `lb_xdp6`'s stack would leave no room for
//!   the delivery paths inline.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    programs::XdpContext,
};
use lb_common::{counters::Reason, service::Addr6};

use super::{flow::Picked, nat};
use crate::{
    family::{IpFamily, V6},
    maps::{IPV6_SERVICES, STATE6},
    packet::{self, l4_layout},
    stats,
};

/// The slot of full NAT with a port claimed (see `lb_common::service::IPV6_SERVICE_PROGRAMS`).
pub const FULL_NAT: u32 = 2;
/// DSR decapsulation's slot.
pub const DECAPSULATE: u32 = 3;

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

/// Tail-calls the decapsulation stage (IPv6 in IPv6 for a local endpoint); returns only if
/// that fails (the agent fills the slots before it attaches anything: a broken load), passing
/// the packet. Its key and inner 5-tuple on the stack would make `lb_xdp6`'s frame, which
/// every IPv6 path pays, too large for the delivery paths to be inlined into it.
#[inline(always)]
pub fn enter_decapsulation(ctx: &XdpContext) -> u32 {
    // SAFETY: a tail call replaces this program; it returns only when it fails.
    let _ = unsafe { IPV6_SERVICES.tail_call(ctx, DECAPSULATE) };
    stats::verdict(Reason::Ipv6Passed, packet::len(ctx), XDP_PASS)
}

/// Runs full NAT with a port claimed on the state `lb_xdp6` left, and counts what `lb_xdp6`
/// would have counted after it (the backend, the reason; the caller counts the action).
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
    let (action, reason) =
        nat::full_nat::<V6>(ctx, layout, flow, &picked, state.ip_len, now, nat::PortStep::Claimed)
            .unwrap_or((XDP_PASS, Reason::NoRoute));
    // Sent on to the backend (a Packet Too Big goes back to the client instead).
    if action != XDP_PASS && action != XDP_DROP && reason != Reason::TooBig {
        stats::count_backend(V6::backend_stats(), picked.id, bytes);
    }
    stats::verdict(reason, bytes, action)
}
