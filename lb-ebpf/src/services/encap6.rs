//! Direct server return for IPv6 services: IPv6 in IPv6 (RFC 2473), both ends in XDP (this
//! kernel has no ip6_tunnel module, and a node should not need one). The same design as IPIP
//! (`encap`): the client's packet travels unchanged inside an outer header addressed to the
//! endpoint; the endpoint's node unwraps it, translates VIP:port to the endpoint and remembers
//! how to translate the reply, which leaves for the client directly.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{Addr6, FlowKey6, LocalEndpointKey6, PROTO_IPV6, ReplyNat6, ServiceKey6},
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use super::flow::Picked;
use crate::{
    family::{IpFamily, V6},
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
    picked: &Picked<Addr6>,
    ip_len: u16,
    now: u64,
) -> (u32, Reason) {
    let outer_len = ip_len as u32 + IPV6_LEN as u32;
    if outer_len > u16::MAX as u32 {
        return (XDP_DROP, Reason::TooBig);
    }
    let backend = picked.backend;
    let hop = match route::cached_lookup::<V6>(ctx, picked.id, &[0; 16], &backend.addr, outer_len as u16, now)
    {
        Ok(hop) => hop,
        Err(Reason::TooBig) => {
            // The route's MTU, from a lookup small enough to pass (RFC 8201: the client
            // then sends what fits the tunnel).
            return match route::lookup::<V6>(ctx, &[0; 16], &backend.addr, IPV6_LEN as u16) {
                Ok(hop) => packet_too_big(ctx, hop.mtu),
                Err(_) => (XDP_DROP, Reason::TooBig),
            };
        }
        Err(reason) => return (XDP_PASS, reason),
    };
    let Some(source) = V6::uplink_source(hop.ifindex) else {
        return (XDP_PASS, Reason::NoSourceAddress);
    };
    picked.remember::<V6>(flow, now);
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
    outer.src_addr = source.0;
    outer.dst_addr = backend.addr;
    match route::send(ctx, &hop) {
        Some(action) => (action, Reason::ForwardedDsr),
        None => (XDP_DROP, Reason::MalformedEthernet),
    }
}

/// The most of the invoking packet a Packet Too Big carries: the message may not exceed the
/// minimum IPv6 MTU (RFC 4443 §3.2), 1280 bytes, less its IPv6 and ICMPv6 headers.
const INVOKING_BYTES: usize = 1280 - IPV6_LEN - PTB_LEN;
/// ICMPv6 Packet Too Big's header: type 2, code 0, checksum, MTU.
const PTB_LEN: usize = 8;
const PACKET_TOO_BIG: u8 = 2;
const ICMPV6: u8 = 58;

/// Answers a packet too big for the tunnel (its route's MTU `route_mtu`, less the outer
/// header) with ICMPv6 Packet Too Big (RFC 4443 §3.2), from the VIP it was sent to, carrying
/// its first 1232 bytes: IPv6 routers do not fragment, and a client that hears nothing keeps
/// sending what cannot pass. The packet must be longer than that (it is: it did not fit an
/// MTU of at least 1280 with 40 bytes more).
#[inline(always)]
fn packet_too_big(ctx: &XdpContext, route_mtu: u16) -> (u32, Reason) {
    let frame = packet::len(ctx);
    if frame < ETH_LEN + INVOKING_BYTES || route_mtu < 1280 + IPV6_LEN as u16 {
        return (XDP_DROP, Reason::TooBig);
    }
    let Some(ip) = header::<Ipv6Hdr>(ctx, ETH_LEN) else {
        return (XDP_DROP, Reason::TooBig);
    };
    // SAFETY: bounds-checked by `header`; copied out before the frame changes.
    let (client, vip, eth_src, eth_dst) = unsafe {
        let eth = &*(ctx.data() as *const EthHdr);
        ((*ip).src_addr, (*ip).dst_addr, eth.src_addr, eth.dst_addr)
    };
    // Keep the invoking packet's first bytes, then make room for the new headers.
    let cut = (frame - ETH_LEN - INVOKING_BYTES) as i32;
    // SAFETY: helper calls; packet pointers are re-derived afterwards.
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, -cut) } != 0
        || unsafe { bpf_xdp_adjust_head(ctx.ctx, -((IPV6_LEN + PTB_LEN) as i32)) } != 0
    {
        return (XDP_DROP, Reason::TooBig);
    }
    const MESSAGE: usize = ETH_LEN + IPV6_LEN;
    let (Some(eth), Some(outer), Some(icmp)) = (
        header::<EthHdr>(ctx, 0),
        header::<Ipv6Hdr>(ctx, ETH_LEN),
        header::<[u8; PTB_LEN + INVOKING_BYTES]>(ctx, MESSAGE),
    ) else {
        return (XDP_DROP, Reason::TooBig);
    };
    // SAFETY: bounds-checked by `header`; the three do not overlap.
    let (eth, outer, icmp) = unsafe { (&mut *eth, &mut *outer, &mut *icmp) };
    eth.dst_addr = eth_src;
    eth.src_addr = eth_dst;
    eth.ether_type = ETHERTYPE_IPV6.to_be();
    outer.vcf = [0x60, 0, 0, 0];
    outer.payload_len = ((PTB_LEN + INVOKING_BYTES) as u16).to_be_bytes();
    outer.next_hdr = ICMPV6;
    outer.hop_limit = OUTER_HOP_LIMIT;
    outer.src_addr = vip;
    outer.dst_addr = client;
    icmp[0] = PACKET_TOO_BIG;
    icmp[1] = 0;
    icmp[2] = 0;
    icmp[3] = 0;
    icmp[4..8].copy_from_slice(&u32::from(route_mtu - IPV6_LEN as u16).to_be_bytes());
    // The checksum over the pseudo-header and the whole message, by the kernel's helper in
    // chunks it takes (at most 512 bytes each), in memory order (see `rewrite::rewrite6`).
    let mut sum = (u32::from(ICMPV6) + (PTB_LEN + INVOKING_BYTES) as u32).to_be() as u64;
    for address in [&outer.src_addr, &outer.dst_addr] {
        // SAFETY: 16 readable bytes.
        sum = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, address.as_ptr() as *mut u32, 16, sum as u32) }
            as u64;
    }
    for (at, len) in [(0, 512), (512, 512), (1024, PTB_LEN + INVOKING_BYTES - 1024)] {
        // SAFETY: within the message, bounds-checked above.
        sum = unsafe {
            bpf_csum_diff(core::ptr::null_mut(), 0, icmp[at..].as_ptr() as *mut u32, len as u32, sum as u32)
        } as u64;
    }
    let check = !lb_common::csum::fold(sum as u32);
    icmp[2..4].copy_from_slice(&check.to_ne_bytes());
    (crate::vlan::answer(ctx, XDP_TX), Reason::TooBig)
}

/// IPv6-in-IPv6 whose outer destination is one of this node's endpoints and whose inner packet
/// is for that endpoint's service: unwrap, translate to the endpoint, deliver. Other
/// encapsulated IPv6 is the kernel's business. Runs as a stage of its own, `lb_xdp6_decap`
/// (see `services::stages6`).
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
    // SAFETY: 16 bytes, distinct objects (copied, not held as a value: see `flow_key6`; one
    // address, off the service path's hashes, so left to Rust's byte copy).
    unsafe { core::ptr::copy_nonoverlapping(outer.dst_addr.as_ptr(), key.addr.as_mut_ptr(), 16) };
    let endpoint = &key.addr;
    // SAFETY: copied out at once.
    let Some(target) = (unsafe { V6::local_endpoints().get(&key) }).copied() else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    if inner.hop_limit <= 1 {
        return stats::verdict(Reason::TtlExpired, bytes, XDP_PASS);
    }
    let hop = match route::lookup::<V6>(ctx, &flow.src, endpoint, inner_len as u16) {
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
