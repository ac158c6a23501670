//! The service path: a packet to `(VIP, port, protocol)` goes to a backend, picked by the
//! connection table or else by the service's Maglev ring, and delivered in that backend's mode.
//! Written once over [`IpFamily`]: IPv4 and IPv6 each have their own maps.
//!
//! - `flow`: the connection table and the Maglev pick.
//! - `nat`: delivery by translation: local DNAT, full NAT, and full NAT's replies.
//! - `encap`: delivery by IPIP (DSR, IPv4), both ends; `encap6`: by IPv6-in-IPv6.

pub mod encap4;
pub mod encap6;
pub mod flow;
pub mod nat;
pub mod stages6;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    programs::XdpContext,
};
use flow::Picked;
use lb_common::{
    counters::Reason,
    service::{Addr4, Addr6, Delivery, FlowKey, FlowKey6, FlowKeyOf, Service, ServiceKeyOf},
};

use crate::{
    family::{IpFamily, V4, V6},
    packet::{self, L4Layout, l4_layout},
    stats, uplink,
};

/// A family's delivery paths. IPv4's are inlined into `lb_xdp`, IPv6's into `lb_xdp6`, but for
/// its full NAT's port claim, a program of its own, tail-called ([`stages6`]): an IPv6 key,
/// backend and reply target are each several times IPv4's, and inlined together the paths
/// pass BPF's 512 bytes of stack.
pub trait Deliver: IpFamily {
    /// Direct server return: wraps the packet for a backend on another node.
    fn encapsulate(
        ctx: &XdpContext,
        flow: &FlowKeyOf<Self::Addr>,
        picked: &Picked<Self::Addr>,
        ip_len: u16,
        now: u64,
    ) -> (u32, Reason);

    /// Full NAT: DNAT to an endpoint on another node, SNAT to this node.
    #[inline(always)]
    fn full_nat(
        ctx: &XdpContext,
        layout: L4Layout,
        flow: &FlowKeyOf<Self::Addr>,
        picked: &Picked<Self::Addr>,
        ip_len: u16,
        now: u64,
    ) -> (u32, Reason) {
        // `HeldOrClaimed` always finds a port or an answer.
        nat::full_nat::<Self>(ctx, layout, flow, picked, ip_len, now, nat::PortStep::HeldOrClaimed)
            .unwrap_or((XDP_PASS, Reason::NoRoute))
    }
}

impl Deliver for V4 {
    #[inline(always)]
    fn encapsulate(
        ctx: &XdpContext,
        flow: &FlowKey,
        picked: &Picked<Addr4>,
        ip_len: u16,
        now: u64,
    ) -> (u32, Reason) {
        encap4::encapsulate(ctx, flow, picked, ip_len, now)
    }
}

impl Deliver for V6 {
    #[inline(always)]
    fn encapsulate(
        ctx: &XdpContext,
        flow: &FlowKey6,
        picked: &Picked<Addr6>,
        ip_len: u16,
        now: u64,
    ) -> (u32, Reason) {
        encap6::encapsulate(ctx, flow, picked, ip_len, now)
    }

    /// An established flow is sent on here; one without a port yet goes to the claim's stage.
    #[inline(always)]
    fn full_nat(
        ctx: &XdpContext,
        layout: L4Layout,
        flow: &FlowKey6,
        picked: &Picked<Addr6>,
        ip_len: u16,
        now: u64,
    ) -> (u32, Reason) {
        if picked.snat_attempt().is_some()
            && let Some(sent) =
                nat::full_nat::<Self>(ctx, layout, flow, picked, ip_len, now, nat::PortStep::Held)
        {
            return sent;
        }
        stages6::enter(ctx, picked, ip_len, stages6::FULL_NAT)
    }
}

/// TCP or UDP right after the IP header (no IPv4 options or fragments, no IPv6 extension
/// headers: checked by the caller), as `flow`. `ip_len` is the IP packet's length, header
/// included.
#[inline(always)]
pub fn transport<F: Deliver>(ctx: &XdpContext, flow: &FlowKeyOf<F::Addr>, ip_len: u16) -> u32 {
    let bytes = packet::len(ctx);
    let Some(layout) = l4_layout(flow.proto) else {
        return stats::verdict(F::PASSED, bytes, XDP_PASS);
    };
    let truncated = F::L4_OFFSET + layout.min_len > bytes;
    let line = flow::fetch_early::<F>(flow);
    let service_key = ServiceKeyOf { vip: flow.dst, port: flow.dport, proto: flow.proto, _pad: 0 };
    // SAFETY: the value is copied out before the map can change under it.
    if let Some(service) = unsafe { F::services().get(&service_key) }.copied() {
        if !uplink::accepts(ctx, service.uplink()) {
            return stats::verdict(Reason::WrongInterface, bytes, XDP_PASS);
        }
        if truncated {
            return stats::verdict(Reason::MalformedL4, bytes, XDP_DROP);
        }
        stats::count_vip_traffic(F::vip_traffic(), service.vip_slot(), bytes);
        return to_service::<F>(ctx, layout, flow, line, &service, ip_len);
    }
    if !truncated && let Some(action) = nat::translate_reply::<F>(ctx, layout, flow, ip_len) {
        return action;
    }
    if F::is_owned_exclusively(ctx, flow.dst) {
        return stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP);
    }
    stats::verdict(F::PASSED, bytes, XDP_PASS)
}

#[inline(always)]
fn to_service<F: Deliver>(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKeyOf<F::Addr>,
    line: Option<flow::MapBucket>,
    service: &Service,
    ip_len: u16,
) -> u32 {
    let bytes = packet::len(ctx);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let Some(picked) = flow::pick_backend::<F>(flow, line, service, now) else {
        return stats::verdict(Reason::NoBackend, bytes, XDP_DROP);
    };
    let Some(hop_limit) = F::hop_limit(ctx) else {
        return XDP_PASS;
    };
    if hop_limit <= 1 {
        return stats::verdict(Reason::TtlExpired, bytes, XDP_PASS);
    }
    let (action, reason) = match Delivery::from_u8(picked.backend.delivery) {
        Some(Delivery::Local) => nat::local::<F>(ctx, layout, flow, &picked, ip_len, now),
        Some(Delivery::FullNat) => F::full_nat(ctx, layout, flow, &picked, ip_len, now),
        Some(Delivery::Dsr) => F::encapsulate(ctx, flow, &picked, ip_len, now),
        None => (XDP_DROP, Reason::NoBackend),
    };
    if action != XDP_PASS && action != XDP_DROP {
        stats::count_backend(F::backend_stats(), picked.id, bytes);
    }
    stats::verdict(reason, bytes, action)
}
