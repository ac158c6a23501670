//! Direct server return over IPIP (RFC 2003), both ends in XDP: this kernel has no ipip module,
//! and a node should not need one.
//!
//! The load-balancing node wraps the client's packet, unchanged, in an outer header addressed
//! to the chosen endpoint; the endpoint's node routes it (pod CIDRs are routable, host-gw
//! style), unwraps it, translates VIP:port to the endpoint, and remembers how to translate the
//! reply, which then leaves for the client directly with the VIP as its source.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_xdp_adjust_head,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    csum,
    service::{FlowKey, LocalEndpointKey, PROTO_IPIP, ReplyNat, ServiceKey},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::flow::Picked;
use crate::{
    family::{IpFamily, V4},
    maps,
    packet::{self, ETH_LEN, ETHERTYPE_IPV4, FRAGMENT_MASK, IPV4_LEN, Ports, header, l4_layout},
    rewrite,
    route::{self, remember_reply, route_out},
    stats, uplink,
};

/// Don't Fragment: the outer header is never fragmented (RFC 6864 §4.1 then lets its
/// Identification be zero).
const DONT_FRAGMENT: [u8; 2] = [0x40, 0x00];
const OUTER_TTL: u8 = 64;

/// Wraps the packet for the picked backend and sends it towards the backend's node.
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    flow: &FlowKey,
    picked: &Picked<[u8; 4]>,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let Some(settings) = maps::settings().copied() else {
        return (XDP_PASS, Reason::NoRoute);
    };
    let outer_len = tot_len as u32 + IPV4_LEN as u32;
    if outer_len > u16::MAX as u32 {
        return (XDP_DROP, Reason::TooBig);
    }
    let backend = picked.backend;
    let hop = match route::cached_lookup::<V4>(
        ctx,
        picked.id,
        &settings.node_addr,
        &backend.addr,
        outer_len as u16,
        now,
    ) {
        Ok(hop) => hop,
        Err(Reason::TooBig) => return (XDP_DROP, Reason::TooBig),
        Err(reason) => return (XDP_PASS, reason),
    };
    picked.remember::<V4>(flow, now);
    let source = uplink::source(hop.ifindex).unwrap_or(settings.node_addr);
    let Some(inner) = header::<Ipv4Hdr>(ctx, ETH_LEN) else {
        return (XDP_DROP, Reason::MalformedIpv4);
    };
    // SAFETY: bounds-checked by `header`; the last use before the head moves.
    let inner = unsafe { &mut *inner };
    if !rewrite::decrement_ttl(inner) {
        return (XDP_PASS, Reason::TtlExpired);
    }
    let tos = inner.tos;

    // SAFETY: helper call; every packet pointer is re-derived below.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(IPV4_LEN as i32)) } != 0 {
        return (XDP_PASS, Reason::NoRoute);
    }
    let (Some(eth), Some(outer)) = (header::<EthHdr>(ctx, 0), header::<Ipv4Hdr>(ctx, ETH_LEN)) else {
        return (XDP_DROP, Reason::MalformedEthernet);
    };
    // SAFETY: bounds-checked by `header`.
    let (eth, outer) = unsafe { (&mut *eth, &mut *outer) };
    eth.dst_addr = hop.dmac;
    eth.src_addr = hop.smac;
    eth.ether_type = ETHERTYPE_IPV4.to_be();
    let mut header_bytes = [0u8; IPV4_LEN];
    header_bytes[0] = 0x45;
    header_bytes[1] = tos;
    header_bytes[2..4].copy_from_slice(&(outer_len as u16).to_be_bytes());
    header_bytes[6..8].copy_from_slice(&DONT_FRAGMENT);
    header_bytes[8] = OUTER_TTL;
    header_bytes[9] = PROTO_IPIP;
    header_bytes[12..16].copy_from_slice(&source);
    header_bytes[16..20].copy_from_slice(&backend.addr);
    let check = csum::ipv4_header(&header_bytes);
    header_bytes[10..12].copy_from_slice(&check.to_be_bytes());
    // SAFETY: `Ipv4Hdr` is 20 bytes of plain data, `repr(C)`, alignment 1.
    *outer = unsafe { core::mem::transmute::<[u8; IPV4_LEN], Ipv4Hdr>(header_bytes) };
    match route::send(ctx, &hop) {
        Some(action) => (action, Reason::ForwardedDsr),
        None => (XDP_DROP, Reason::MalformedEthernet),
    }
}

/// IPIP whose outer destination is one of this node's endpoints and whose inner packet is for
/// that endpoint's service: unwrap, translate to the endpoint, deliver. Other IPIP is the
/// kernel's business.
#[inline(always)]
pub fn decapsulate(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    const INNER: usize = ETH_LEN + IPV4_LEN;
    const INNER_L4: usize = INNER + IPV4_LEN;
    let (Some(outer), Some(inner)) = (header::<Ipv4Hdr>(ctx, ETH_LEN), header::<Ipv4Hdr>(ctx, INNER)) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`; copied out.
    let (endpoint, inner) = unsafe { ((*outer).dst_addr, &*inner) };
    let inner_len = u16::from_be_bytes(inner.tot_len);
    let Some(layout) = l4_layout(inner.proto) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    if inner.vihl != 0x45
        || u16::from_be_bytes(inner.frags) & FRAGMENT_MASK != 0
        || inner_len as usize + INNER > bytes
        || INNER_L4 + layout.min_len > bytes
    {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    }
    let Some(ports) = header::<Ports>(ctx, INNER_L4) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`.
    let (sport, dport) = unsafe { ((*ports).sport, (*ports).dport) };
    let flow = FlowKey::new(inner.src_addr, inner.dst_addr, sport, dport, inner.proto);
    let key = LocalEndpointKey {
        service: ServiceKey { vip: flow.dst, port: dport, proto: flow.proto, _pad: 0 },
        addr: endpoint,
    };
    // SAFETY: copied out at once.
    let Some(target) = (unsafe { V4::local_endpoints().get(&key) }).copied() else {
        return stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS);
    };
    if inner.ttl <= 1 {
        return stats::verdict(Reason::TtlExpired, bytes, XDP_PASS);
    }
    let hop = match route::lookup::<V4>(ctx, &flow.src, &endpoint, inner_len) {
        Ok(hop) => hop,
        Err(reason) => return stats::verdict(reason, bytes, XDP_PASS),
    };
    remember_reply::<V4>(endpoint, target.target_port, &flow);

    // Move the Ethernet header forward over the outer IP header, then drop the gap.
    let Some(new_eth) = header::<EthHdr>(ctx, IPV4_LEN) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_DROP);
    };
    // SAFETY: bounds-checked; overwrites outer-header bytes already read.
    unsafe { (*new_eth).ether_type = ETHERTYPE_IPV4.to_be() };
    // SAFETY: helper call; packet pointers are re-derived afterwards.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, IPV4_LEN as i32) } != 0 {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_DROP);
    }
    let to = ReplyNat::new(flow.src, endpoint, flow.sport, target.target_port);
    let (action, reason) = route_out::<V4>(ctx, layout, &to, &hop, Reason::DsrDecapsulated);
    stats::verdict(reason, bytes, action)
}
