//! Direct server return for IPv6 services: IPv6 in IPv6 (RFC 2473), both ends in XDP (this
//! kernel has no ip6_tunnel module, and a node should not need one). The same design as IPIP
//! (`encap`): the client's packet travels unchanged inside an outer header addressed to the
//! endpoint; the endpoint's node unwraps it, translates VIP:port to the endpoint and remembers
//! how to translate the reply, which leaves for the client directly.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_xdp_adjust_head,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{Addr6, FlowKey6, LocalEndpointKey6, PROTO_IPV6, ReplyNat6, ServiceKey6},
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use super::flow::Picked;
use crate::{
    family::{Family, V6},
    packet::{self, ETH_LEN, ETHERTYPE_IPV6, IPV6_LEN, Ports, header, l4_layout},
    route::{self, remember_reply, route_out},
    stats,
};

/// The outer header's hop limit (RFC 2473 §6.3: the tunnel entry point's own default).
const OUTER_HOP_LIMIT: u8 = 64;

/// Wraps the packet for the picked backend and sends it towards the backend's node.
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    flow: &FlowKey6,
    picked: &mut Picked<Addr6>,
    ip_len: u16,
    now: u64,
) -> (u32, Reason) {
    let outer_len = ip_len as u32 + IPV6_LEN as u32;
    if outer_len > u16::MAX as u32 {
        return (XDP_DROP, Reason::TooBig);
    }
    let backend = picked.backend;
    let hop =
        match route::cached_lookup::<V6>(ctx, picked.entry(), [0; 16], backend.addr, outer_len as u16, now) {
            Ok((hop, _)) => hop,
            Err(Reason::TooBig) => return (XDP_DROP, Reason::TooBig),
            Err(reason) => return (XDP_PASS, reason),
        };
    let Some(source) = V6::uplink_source(hop.ifindex) else {
        return (XDP_PASS, Reason::NoSourceAddress);
    };
    picked.remember::<V6>(flow, [0; 2], &hop, now);
    let Some(inner) = header::<Ipv6Hdr>(ctx, ETH_LEN) else {
        return (XDP_DROP, Reason::MalformedIpv6);
    };
    // SAFETY: bounds-checked by `header`; the last use before the head moves.
    let inner = unsafe { &mut *inner };
    if inner.hop_limit <= 1 {
        return (XDP_PASS, Reason::TtlExpired);
    }
    inner.hop_limit -= 1;
    // The inner traffic class and flow label, so the path treats and hashes the tunnel
    // as it would the flow.
    let vcf = inner.vcf;

    // SAFETY: helper call; every packet pointer is re-derived below.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(IPV6_LEN as i32)) } != 0 {
        return (XDP_PASS, Reason::NoRoute);
    }
    let (Some(eth), Some(outer)) = (header::<EthHdr>(ctx, 0), header::<Ipv6Hdr>(ctx, ETH_LEN)) else {
        return (XDP_DROP, Reason::MalformedEthernet);
    };
    // SAFETY: bounds-checked by `header`.
    let (eth, outer) = unsafe { (&mut *eth, &mut *outer) };
    eth.ether_type = ETHERTYPE_IPV6.to_be();
    outer.vcf = vcf;
    outer.payload_len = ip_len.to_be_bytes();
    outer.next_hdr = PROTO_IPV6;
    outer.hop_limit = OUTER_HOP_LIMIT;
    outer.src_addr = source;
    outer.dst_addr = backend.addr;
    match route::send(ctx, &hop) {
        Some(action) => (action, Reason::ForwardedDsr),
        None => (XDP_DROP, Reason::MalformedEthernet),
    }
}

/// IPv6-in-IPv6 whose outer destination is one of this node's endpoints and whose inner packet
/// is for that endpoint's service: unwrap, translate to the endpoint, deliver. Other
/// encapsulated IPv6 is the kernel's business.
#[inline(always)]
pub fn decapsulate(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    const INNER: usize = ETH_LEN + IPV6_LEN;
    const INNER_L4: usize = INNER + IPV6_LEN;
    let (Some(outer), Some(inner)) = (header::<Ipv6Hdr>(ctx, ETH_LEN), header::<Ipv6Hdr>(ctx, INNER)) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`.
    let (outer, inner) = unsafe { (&*outer, &*inner) };
    let inner_len = IPV6_LEN + u16::from_be_bytes(inner.payload_len) as usize;
    let Some(layout) = l4_layout(inner.next_hdr) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    if inner.vcf[0] >> 4 != 6 || inner_len + INNER > bytes || INNER_L4 + layout.min_len > bytes {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    }
    let Some(ports) = header::<Ports>(ctx, INNER_L4) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`.
    let mut flow = FlowKey6::new([0; 16], [0; 16], [0; 2], [0; 2], 0);
    packet::flow_key6(inner, unsafe { &*ports }, &mut flow);
    let mut key = LocalEndpointKey6 {
        service: ServiceKey6 { vip: flow.dst, port: flow.dport, proto: flow.proto, _pad: 0 },
        addr: [0; 16],
    };
    // SAFETY: 16 bytes, distinct objects (copied, not held as a value: see `flow_key`).
    unsafe { core::ptr::copy_nonoverlapping(outer.dst_addr.as_ptr(), key.addr.as_mut_ptr(), 16) };
    let endpoint = &key.addr;
    // SAFETY: copied out at once.
    let Some(target) = (unsafe { V6::local_endpoints().get(&key) }).copied() else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    if inner.hop_limit <= 1 {
        return stats::verdict(Reason::TtlExpired, bytes, XDP_PASS);
    }
    let hop = match route::lookup::<V6>(ctx, flow.src, *endpoint, inner_len as u16) {
        Ok(hop) => hop,
        Err(reason) => return stats::verdict(reason, bytes, XDP_PASS),
    };
    remember_reply::<V6>(*endpoint, target.target_port, &flow);

    // Move the Ethernet header forward over the outer IPv6 header, then drop the gap (the MACs
    // are written by `route_out`).
    let Some(new_eth) = header::<EthHdr>(ctx, IPV6_LEN) else {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_DROP);
    };
    // SAFETY: bounds-checked; overwrites outer-header bytes already read.
    unsafe { (*new_eth).ether_type = ETHERTYPE_IPV6.to_be() };
    // SAFETY: helper call; packet pointers are re-derived afterwards.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, IPV6_LEN as i32) } != 0 {
        return stats::verdict(Reason::BadDecapsulation, bytes, XDP_DROP);
    }
    let to = ReplyNat6::new(flow.src, *endpoint, flow.sport, target.target_port);
    let (action, reason) = route_out::<V6>(ctx, layout, &to, &hop, Reason::DsrDecapsulated);
    stats::verdict(reason, bytes, action)
}
