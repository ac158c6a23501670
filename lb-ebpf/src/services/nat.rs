//! Delivery by translation: DNAT to an endpoint on this node, full NAT (DNAT and SNAT to this
//! node) to one elsewhere, and full NAT's replies translated back.

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST,
        xdp_action::{XDP_DROP, XDP_PASS},
    },
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    hash::flow_hash,
    service::{Backend, Flow, FlowKey, PROTO_TCP, ReplyNat, Settings, SnatEntry},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::flow::Picked;
use crate::{
    maps::{self, FLOWS, REPLY_NAT, SNAT_REPLIES},
    packet::{self, ETH_LEN, L4Layout, header},
    route::{self, remember_reply, route_out},
    stats, uplink,
};

/// Full-NAT source-port candidates tried before giving up on a flow.
const SNAT_ATTEMPTS: u32 = 8;

/// An endpoint on this node: DNAT to it and redirect to its interface. The reply is
/// translated back on the uplink's egress (the TC program), from the `REPLY_NAT` entry.
#[inline(always)]
pub(super) fn local(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKey,
    picked: &mut Picked,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let backend = picked.backend;
    let (hop, refreshed) =
        match route::cached_lookup(ctx, picked.entry(), flow.src, backend.addr, tot_len, now) {
            Ok(hop) => hop,
            Err(reason) => return (XDP_PASS, reason),
        };
    if must_check_reply(flow, refreshed) {
        remember_reply(backend.addr, backend.port, flow);
    }
    picked.remember(flow, [0; 2], &hop, now);
    let to = ReplyNat::new(flow.src, backend.addr, flow.sport, backend.port);
    route_out(ctx, layout, &to, &hop, Reason::ForwardedLocal)
}

/// An endpoint on another node, kube-proxy Cluster style: DNAT to it and SNAT to this node,
/// so the reply comes back here to be translated.
#[inline(always)]
pub(super) fn full_nat(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKey,
    picked: &mut Picked,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let Some(settings) = maps::settings().copied() else {
        return (XDP_PASS, Reason::NoRoute);
    };
    let backend = picked.backend;
    let (hop, refreshed) =
        match route::cached_lookup(ctx, picked.entry(), settings.node_addr, backend.addr, tot_len, now) {
            Ok(hop) => hop,
            Err(reason) => return (XDP_PASS, reason),
        };
    // The address of the uplink the packet leaves by: the endpoint's replies come back there.
    let source = uplink::source(hop.ifindex).unwrap_or(settings.node_addr);
    // SAFETY: bounds-checked by `header`; copied out.
    let peer_mac = || header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).src_addr }).unwrap_or_default();
    let snat_port = match picked.snat_port() {
        Some(port) => {
            if refreshed {
                keep_snat_reply(flow, &backend, source, port, peer_mac, now);
            }
            port
        }
        None => {
            let Some(port) = claim_snat_port(flow, &backend, source, &settings, peer_mac(), now) else {
                return (XDP_DROP, Reason::SnatPortsExhausted);
            };
            // A known flow without a port changed to full NAT: its entry is rewritten whole.
            let mut entry = Flow { backend: picked.id, snat_port: port, ..Flow::default() };
            route::cache(&mut entry, &hop, now);
            let _ = FLOWS.insert(flow, &entry, 0);
            port
        }
    };
    let to = ReplyNat::new(source, backend.addr, snat_port, backend.port);
    route_out(ctx, layout, &to, &hop, Reason::ForwardedFullNat)
}

/// Finds a free source port towards `backend` and records how to translate its replies, or
/// finds the port this flow already holds (its flow entry was evicted; its port never is).
/// Candidates start at a hash of the flow, so concurrent flows rarely contend and a flow
/// meets its own port first.
#[inline(always)]
fn claim_snat_port(
    flow: &FlowKey,
    backend: &Backend,
    node: [u8; 4],
    settings: &Settings,
    peer_mac: [u8; 6],
    now: u64,
) -> Option<[u8; 2]> {
    let (min, max) = (settings.snat_port_min, settings.snat_port_max);
    if max < min {
        return None;
    }
    let span = (max - min) as u32 + 1;
    let start = flow_hash(flow);
    let entry = snat_entry(flow, peer_mac, now);
    for attempt in 0..SNAT_ATTEMPTS {
        let port = (min as u32 + (start.wrapping_add(attempt) % span)) as u16;
        let key = FlowKey::new(backend.addr, node, backend.port, port.to_be_bytes(), flow.proto);
        if SNAT_REPLIES.insert(&key, &entry, BPF_NOEXIST as u64).is_ok() {
            return Some(port.to_be_bytes());
        }
        // SAFETY: compared at once.
        if unsafe { SNAT_REPLIES.get(&key) }.is_some_and(|held| held.belongs_to(flow)) {
            return Some(port.to_be_bytes());
        }
    }
    None
}

/// `flow`'s reply translation, seen `now`.
#[inline(always)]
fn snat_entry(flow: &FlowKey, peer_mac: [u8; 6], now: u64) -> SnatEntry {
    let mut reply = ReplyNat::new(flow.dst, flow.src, flow.dport, flow.sport);
    reply.peer_mac = peer_mac;
    SnatEntry { reply, _pad: [0; 4], last_seen_ns: now }
}

/// Whether this packet makes sure its local flow's reply entry is there. Under a flood of new
/// flows the reply table's LRU can evict an established flow's entry while its flow entry
/// stays (the flood lab test caught it): the endpoint's next reply then leaves untranslated.
/// For TCP the client answers that with a reset, which ends the connection, so every TCP
/// packet checks (a lookup). Other protocols check when the flow's next hop is refreshed: at
/// most `HOP_REFRESH_NS` of replies are lost, and nothing is reset.
#[inline(always)]
fn must_check_reply(flow: &FlowKey, refreshed: bool) -> bool {
    refreshed || flow.proto == PROTO_TCP
}

/// At each next-hop refresh of a full-NAT flow: marks its port's entry as seen, so the agent
/// keeps it; writes it again if the agent removed it as idle meanwhile and nobody took the port.
/// (Should another flow hold it by then, this flow idled past the timeout and lost it, as a
/// conntrack entry would.)
#[inline(always)]
fn keep_snat_reply(
    flow: &FlowKey,
    backend: &Backend,
    node: [u8; 4],
    port: [u8; 2],
    peer_mac: impl FnOnce() -> [u8; 6],
    now: u64,
) {
    let key = FlowKey::new(backend.addr, node, backend.port, port, flow.proto);
    match SNAT_REPLIES.get_ptr_mut(&key) {
        // SAFETY: a map value, valid while the program runs; a racing write only moves a time.
        Some(held) => unsafe {
            if (*held).belongs_to(flow) {
                (*held).last_seen_ns = now;
            }
        },
        None => {
            let _ = SNAT_REPLIES.insert(&key, &snat_entry(flow, peer_mac(), now), BPF_NOEXIST as u64);
        }
    }
}

/// A reply from a full-NAT backend to this node's translated source port: restore the VIP as
/// its source and the client as its destination, and send it to the client.
#[inline(always)]
pub(super) fn translate_reply(ctx: &XdpContext, layout: L4Layout, flow: &FlowKey) -> Option<u32> {
    let settings = maps::settings()?;
    let port = u16::from_be_bytes(flow.dport);
    if port < settings.snat_port_min || port > settings.snat_port_max {
        return None;
    }
    // To this node's address on the uplink it arrived by (where full NAT sent it from).
    if flow.dst != settings.node_addr && uplink::source(ctx.ingress_ifindex() as u32) != Some(flow.dst) {
        return None;
    }
    // SAFETY: copied out at once. REPLY_NAT held full NAT's entries before SNAT_REPLIES did:
    // flows from before an upgrade are found there.
    let to = match unsafe { SNAT_REPLIES.get(flow) } {
        Some(entry) => entry.reply,
        None => unsafe { REPLY_NAT.get(flow) }.copied()?,
    };
    let bytes = packet::len(ctx);
    let tot_len = header::<Ipv4Hdr>(ctx, ETH_LEN).map(|ip| unsafe { u16::from_be_bytes((*ip).tot_len) })?;
    let hop = match route::lookup(ctx, to.src, to.dst, tot_len) {
        Ok(hop) => hop,
        // Back the way the client's packets came: to the MAC they came from, out of the
        // interface the route to the client takes (with several uplinks, not necessarily the
        // one the reply arrived by).
        Err(Reason::NoNeighbor) if to.peer_mac != [0; 6] => {
            let ingress = ctx.ingress_ifindex() as u32;
            let ifindex = route::egress(ctx, to.src, to.dst, tot_len).unwrap_or(ingress);
            let smac = if ifindex == ingress {
                // SAFETY: bounds-checked by `header`; copied out.
                header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).dst_addr })?
            } else {
                match uplink::mac(ifindex) {
                    Some(mac) => mac,
                    None => return Some(stats::verdict(Reason::NoNeighbor, bytes, XDP_PASS)),
                }
            };
            route::NextHop { ifindex, smac, dmac: to.peer_mac, mtu: 0 }
        }
        Err(reason) => return Some(stats::verdict(reason, bytes, XDP_PASS)),
    };
    let (action, reason) = route_out(ctx, layout, &to, &hop, Reason::ReplyTranslated);
    Some(stats::verdict(reason, bytes, action))
}
