//! The service path: a packet to `(VIP, port, protocol)` goes to a backend, picked by the
//! connection table or else by the service's Maglev ring, and delivered in that backend's mode.
//!
//! - `flow`: the connection table and the Maglev pick.
//! - `nat`: delivery by translation: local DNAT, full NAT, and full NAT's replies.
//! - `encap`: delivery by IPIP (DSR), both ends.

pub mod encap;
pub mod flow;
pub mod nat;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_coarse_ns,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{Delivery, FlowKey, Service, ServiceKey},
};
use network_types::ip::Ipv4Hdr;

use crate::{
    maps::SERVICES,
    owned,
    packet::{self, ETH_LEN, L4_OFFSET, L4Layout, Ports, header, l4_layout},
    stats, uplink,
};

/// TCP or UDP in option-less, unfragmented IPv4 (checked by the caller).
#[inline(always)]
pub fn transport(ctx: &XdpContext, proto: u8, tot_len: u16) -> u32 {
    let bytes = packet::len(ctx);
    let Some(layout) = l4_layout(proto) else {
        return stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS);
    };
    let (Some(ip), Some(ports)) = (header::<Ipv4Hdr>(ctx, ETH_LEN), header::<Ports>(ctx, L4_OFFSET)) else {
        return stats::verdict(Reason::MalformedIpv4, bytes, XDP_PASS);
    };
    // SAFETY: both bounds-checked by `header`; copied out.
    let (src, dst, sport, dport) =
        unsafe { ((*ip).src_addr, (*ip).dst_addr, (*ports).sport, (*ports).dport) };
    let truncated = L4_OFFSET + layout.min_len > bytes;
    let flow = FlowKey::new(src, dst, sport, dport, proto);

    let service_key = ServiceKey { vip: dst, port: dport, proto, _pad: 0 };
    // SAFETY: the value is copied out before the map can change under it.
    if let Some(service) = unsafe { SERVICES.get(&service_key) }.copied() {
        if !uplink::accepts(ctx, service.uplink()) {
            return stats::verdict(Reason::WrongInterface, bytes, XDP_PASS);
        }
        if truncated {
            return stats::verdict(Reason::MalformedL4, bytes, XDP_DROP);
        }
        stats::count_vip_traffic(service.vip_slot(), bytes);
        return to_service(ctx, layout, &flow, &service, tot_len);
    }
    if !truncated && let Some(action) = nat::translate_reply(ctx, layout, &flow) {
        return action;
    }
    if owned::is_owned_exclusively(ctx, dst) {
        return stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP);
    }
    stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS)
}

#[inline(always)]
fn to_service(ctx: &XdpContext, layout: L4Layout, flow: &FlowKey, service: &Service, tot_len: u16) -> u32 {
    let bytes = packet::len(ctx);
    let Some(mut picked) = flow::pick_backend(flow, service) else {
        return stats::verdict(Reason::NoBackend, bytes, XDP_DROP);
    };
    let Some(ttl) = header::<Ipv4Hdr>(ctx, ETH_LEN).map(|ip| unsafe { (*ip).ttl }) else {
        return XDP_PASS;
    };
    if ttl <= 1 {
        return stats::verdict(Reason::TtlExpired, bytes, XDP_PASS);
    }
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let (action, reason) = match Delivery::from_u8(picked.backend.delivery) {
        Some(Delivery::Local) => nat::local(ctx, layout, flow, &mut picked, tot_len, now),
        Some(Delivery::FullNat) => nat::full_nat(ctx, layout, flow, &mut picked, tot_len, now),
        Some(Delivery::Dsr) => encap::encapsulate(ctx, flow, &mut picked, tot_len, now),
        None => (XDP_DROP, Reason::NoBackend),
    };
    if action != XDP_PASS && action != XDP_DROP {
        stats::count_backend(picked.id, bytes);
    }
    stats::verdict(reason, bytes, action)
}
