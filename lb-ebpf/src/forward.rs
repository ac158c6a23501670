//! The service path: a packet to `(VIP, port, protocol)` goes to a backend, picked by the
//! connection table or else by the service's Maglev ring, and delivered in that backend's mode.

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST,
        xdp_action::{XDP_DROP, XDP_PASS},
    },
    helpers::bpf_ktime_get_coarse_ns,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    hash::flow_hash,
    service::{Backend, Delivery, Flow, FlowKey, PROTO_TCP, ReplyNat, Service, ServiceKey, Settings},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    dsr, fib, ipv4,
    maps::{BACKENDS, FLOWS, MAGLEV_RINGS, REPLY_NAT, SERVICES, SETTINGS},
    nat,
    packet::{self, ETH_LEN, L4_OFFSET, L4Layout, Ports, header, l4_layout},
    stats, uplink,
};

/// Full-NAT source-port candidates tried before giving up on a flow.
const SNAT_ATTEMPTS: u32 = 8;

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
        if !uplink::accepts(ctx, service.uplink) {
            return stats::verdict(Reason::WrongInterface, bytes, XDP_PASS);
        }
        if truncated {
            return stats::verdict(Reason::MalformedL4, bytes, XDP_DROP);
        }
        stats::count_vip_traffic(service.vip_slot(), bytes);
        return to_service(ctx, layout, &flow, &service, tot_len);
    }
    if !truncated && let Some(action) = translate_reply(ctx, layout, &flow) {
        return action;
    }
    if ipv4::is_owned_exclusively(ctx, dst) {
        return stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP);
    }
    stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS)
}

#[inline(always)]
fn to_service(ctx: &XdpContext, layout: L4Layout, flow: &FlowKey, service: &Service, tot_len: u16) -> u32 {
    let bytes = packet::len(ctx);
    let Some(mut picked) = pick_backend(flow, service) else {
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
        Some(Delivery::Local) => local(ctx, layout, flow, &mut picked, tot_len, now),
        Some(Delivery::FullNat) => full_nat(ctx, layout, flow, &mut picked, tot_len, now),
        Some(Delivery::Dsr) => dsr::encapsulate(ctx, flow, &mut picked, tot_len, now),
        None => (XDP_DROP, Reason::NoBackend),
    };
    if action != XDP_PASS && action != XDP_DROP {
        stats::count_backend(picked.id, bytes);
    }
    stats::verdict(reason, bytes, action)
}

/// The backend a packet goes to, and its flow's entry when the flow had one.
pub struct Picked {
    pub id: u32,
    pub backend: Backend,
    /// The flow's entry in [`FLOWS`] (its cached next hop is refreshed in place); none for a
    /// new flow, which [`Picked::remember`] then records.
    entry: Option<*mut Flow>,
}

impl Picked {
    /// The flow's entry, for [`fib::cached_lookup`].
    #[inline(always)]
    pub fn entry(&mut self) -> Option<&mut Flow> {
        // SAFETY: a map value, valid while the program runs; LRU eviction only recycles it
        // after an RCU grace period.
        self.entry.map(|f| unsafe { &mut *f })
    }

    /// Records a new flow with its backend, SNAT port and next hop; a known flow has its entry.
    #[inline(always)]
    pub fn remember(&self, flow: &FlowKey, snat_port: [u8; 2], hop: &fib::NextHop, now: u64) {
        if self.entry.is_some() {
            return;
        }
        let mut entry = Flow { backend: self.id, snat_port, ..Flow::default() };
        fib::cache(&mut entry, hop, now);
        let _ = FLOWS.insert(flow, &entry, 0);
    }

    fn snat_port(&self) -> Option<[u8; 2]> {
        // SAFETY: as in `entry`; copied out.
        self.entry.map(|f| unsafe { (*f).snat_port }).filter(|port| *port != [0, 0])
    }
}

/// The flow's backend: the one it already has if that still exists, else the Maglev choice.
#[inline(always)]
fn pick_backend(flow: &FlowKey, service: &Service) -> Option<Picked> {
    if let Some(entry) = FLOWS.get_ptr_mut(flow) {
        // SAFETY: a map value, read at once.
        let id = unsafe { (*entry).backend };
        if let Some(backend) = BACKENDS.get(id).copied()
            && Delivery::from_u8(backend.delivery).is_some()
        {
            return Some(Picked { id, backend, entry: Some(entry) });
        }
    }
    if service.backend_count == 0 || service.ring_size == 0 {
        return None;
    }
    let slot = flow_hash(flow) % service.ring_size;
    // SAFETY: copied out at once; the agent rewrites a slot with one atomic store.
    let pair = unsafe { MAGLEV_RINGS.get_value(&service.ring_id, &(slot / 2)) }.copied()?;
    // Shifted, not indexed: LLVM turns an index into the stack copy into pointer arithmetic
    // (`fp | 4`) that the verifier refuses.
    let packed = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
    let id = (packed >> ((slot & 1) * 32)) as u32;
    let backend = BACKENDS.get(id).copied()?;
    Delivery::from_u8(backend.delivery)?;
    Some(Picked { id, backend, entry: None })
}

/// An endpoint on this node: DNAT to it and redirect to its interface. The reply is
/// translated back on the uplink's egress (the TC program), from the `REPLY_NAT` entry.
#[inline(always)]
fn local(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKey,
    picked: &mut Picked,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let backend = picked.backend;
    let (hop, refreshed) = match fib::cached_lookup(ctx, picked.entry(), flow.src, backend.addr, tot_len, now)
    {
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
fn full_nat(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKey,
    picked: &mut Picked,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let Some(settings) = SETTINGS.get(0).copied() else {
        return (XDP_PASS, Reason::NoRoute);
    };
    let backend = picked.backend;
    let (hop, refreshed) =
        match fib::cached_lookup(ctx, picked.entry(), settings.node_addr, backend.addr, tot_len, now) {
            Ok(hop) => hop,
            Err(reason) => return (XDP_PASS, reason),
        };
    // The address of the uplink the packet leaves by: the endpoint's replies come back there.
    let source = uplink::source(hop.ifindex).unwrap_or(settings.node_addr);
    // SAFETY: bounds-checked by `header`; copied out.
    let peer_mac = || header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).src_addr }).unwrap_or_default();
    let snat_port = match picked.snat_port() {
        Some(port) => {
            if must_check_reply(flow, refreshed) {
                keep_snat_reply(flow, &backend, source, port, peer_mac);
            }
            port
        }
        None => {
            let Some(port) = claim_snat_port(flow, &backend, source, &settings, peer_mac()) else {
                return (XDP_DROP, Reason::SnatPortsExhausted);
            };
            // A known flow without a port changed to full NAT: its entry is rewritten whole.
            let mut entry = Flow { backend: picked.id, snat_port: port, ..Flow::default() };
            fib::cache(&mut entry, &hop, now);
            let _ = FLOWS.insert(flow, &entry, 0);
            port
        }
    };
    let to = ReplyNat::new(source, backend.addr, snat_port, backend.port);
    route_out(ctx, layout, &to, &hop, Reason::ForwardedFullNat)
}

/// Finds a free source port towards `backend` and records how to translate its replies.
/// Candidates start at a hash of the flow, so concurrent flows rarely contend.
#[inline(always)]
fn claim_snat_port(
    flow: &FlowKey,
    backend: &Backend,
    node: [u8; 4],
    settings: &Settings,
    peer_mac: [u8; 6],
) -> Option<[u8; 2]> {
    let (min, max) = (settings.snat_port_min, settings.snat_port_max);
    if max < min {
        return None;
    }
    let span = (max - min) as u32 + 1;
    let start = flow_hash(flow);
    let mut reply = ReplyNat::new(flow.dst, flow.src, flow.dport, flow.sport);
    reply.peer_mac = peer_mac;
    for attempt in 0..SNAT_ATTEMPTS {
        let port = (min as u32 + (start.wrapping_add(attempt) % span)) as u16;
        let key = FlowKey::new(backend.addr, node, backend.port, port.to_be_bytes(), flow.proto);
        if REPLY_NAT.insert(&key, &reply, BPF_NOEXIST as u64).is_ok() {
            return Some(port.to_be_bytes());
        }
    }
    None
}

/// Whether this packet makes sure its flow's reply entry is there. Under a flood of new flows
/// the reply table's LRU can evict an established flow's entry while its flow entry stays (the
/// flood lab test caught it): the backend's next reply then leaves untranslated. For TCP the
/// client answers that with a reset, which ends the connection, so every TCP packet checks
/// (a lookup). Other protocols check when the flow's next hop is refreshed: at most
/// `HOP_REFRESH_NS` of replies are lost, and nothing is reset.
#[inline(always)]
fn must_check_reply(flow: &FlowKey, refreshed: bool) -> bool {
    refreshed || flow.proto == PROTO_TCP
}

/// Writes a known full-NAT flow's reply entry again if it was evicted. Only if the port is
/// still free: should another flow have claimed it meanwhile, this one's replies are lost, as
/// they were from the eviction on (kube-proxy's conntrack never evicts an established flow; an
/// LRU can, under a flood bigger than the table).
#[inline(always)]
fn keep_snat_reply(
    flow: &FlowKey,
    backend: &Backend,
    node: [u8; 4],
    port: [u8; 2],
    peer_mac: impl FnOnce() -> [u8; 6],
) {
    let key = FlowKey::new(backend.addr, node, backend.port, port, flow.proto);
    // SAFETY: only tested for presence.
    if unsafe { REPLY_NAT.get(&key) }.is_some() {
        return;
    }
    let mut reply = ReplyNat::new(flow.dst, flow.src, flow.dport, flow.sport);
    reply.peer_mac = peer_mac();
    let _ = REPLY_NAT.insert(&key, &reply, BPF_NOEXIST as u64);
}

/// Records how the backend's replies to `flow` are translated back (local and DSR delivery:
/// only the source changes, back to the VIP and service port).
#[inline(always)]
pub fn remember_reply(backend_addr: [u8; 4], backend_port: [u8; 2], flow: &FlowKey) {
    let key = FlowKey::new(backend_addr, flow.src, backend_port, flow.sport, flow.proto);
    let reply = ReplyNat::new(flow.dst, flow.src, flow.dport, flow.sport);
    // A lookup is much cheaper than an LRU update, and most packets belong to flows whose
    // entry is already right; the lookup also keeps that entry recent.
    // SAFETY: compared at once.
    if unsafe { REPLY_NAT.get(&key) }.is_some_and(|current| *current == reply) {
        return;
    }
    let _ = REPLY_NAT.insert(&key, &reply, 0);
}

/// Rewrites the packet to `to`, decrements the TTL and sends it to `hop`.
#[inline(always)]
pub fn route_out(
    ctx: &XdpContext,
    layout: L4Layout,
    to: &ReplyNat,
    hop: &fib::NextHop,
    reason: Reason,
) -> (u32, Reason) {
    if nat::rewrite(ctx, layout, to).is_none() {
        return (XDP_DROP, Reason::MalformedL4);
    }
    let Some(ip) = header::<Ipv4Hdr>(ctx, ETH_LEN) else {
        return (XDP_DROP, Reason::MalformedIpv4);
    };
    // SAFETY: bounds-checked by `header`.
    if !nat::decrement_ttl(unsafe { &mut *ip }) {
        return (XDP_PASS, Reason::TtlExpired);
    }
    match fib::send(ctx, hop) {
        Some(action) => (action, reason),
        None => (XDP_DROP, Reason::MalformedEthernet),
    }
}

/// A reply from a full-NAT backend to this node's translated source port: restore the VIP as
/// its source and the client as its destination, and send it to the client.
#[inline(always)]
fn translate_reply(ctx: &XdpContext, layout: L4Layout, flow: &FlowKey) -> Option<u32> {
    let settings = SETTINGS.get(0)?;
    let port = u16::from_be_bytes(flow.dport);
    if port < settings.snat_port_min || port > settings.snat_port_max {
        return None;
    }
    // To this node's address on the uplink it arrived by (where full NAT sent it from).
    if flow.dst != settings.node_addr && uplink::source(ctx.ingress_ifindex() as u32) != Some(flow.dst) {
        return None;
    }
    // SAFETY: copied out at once.
    let to = unsafe { REPLY_NAT.get(flow) }.copied()?;
    let bytes = packet::len(ctx);
    let tot_len = header::<Ipv4Hdr>(ctx, ETH_LEN).map(|ip| unsafe { u16::from_be_bytes((*ip).tot_len) })?;
    let hop = match fib::lookup(ctx, to.src, to.dst, tot_len) {
        Ok(hop) => hop,
        // Back the way the client's packets came: to the MAC they came from, out of the
        // interface the route to the client takes (with several uplinks, not necessarily the
        // one the reply arrived by).
        Err(Reason::NoNeighbor) if to.peer_mac != [0; 6] => {
            let ingress = ctx.ingress_ifindex() as u32;
            let ifindex = fib::egress(ctx, to.src, to.dst, tot_len).unwrap_or(ingress);
            let smac = if ifindex == ingress {
                // SAFETY: bounds-checked by `header`; copied out.
                header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).dst_addr })?
            } else {
                match uplink::mac(ifindex) {
                    Some(mac) => mac,
                    None => return Some(stats::verdict(Reason::NoNeighbor, bytes, XDP_PASS)),
                }
            };
            fib::NextHop { ifindex, smac, dmac: to.peer_mac, mtu: 0 }
        }
        Err(reason) => return Some(stats::verdict(reason, bytes, XDP_PASS)),
    };
    let (action, reason) = route_out(ctx, layout, &to, &hop, Reason::ReplyTranslated);
    Some(stats::verdict(reason, bytes, action))
}
