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
    service::{Address, BackendOf, FlowKeyOf, PROTO_TCP, ReplyNatOf, Settings, SnatEntryOf},
    words::Aligned,
};
use network_types::eth::EthHdr;

use super::flow::{self, Picked};
use crate::{
    family::IpFamily,
    maps,
    packet::{self, L4Layout, header},
    route::{self, remember_reply, route_out},
    stats, uplink,
};

/// Full-NAT source-port candidates tried before giving up on a flow.
const SNAT_ATTEMPTS: u32 = 8;

/// An endpoint on this node: DNAT to it and redirect to its interface. The reply is
/// translated back on the uplink's egress (the TC program), verified by the flow's
/// connection-table entry, or from a `REPLY_NAT` entry for a service not listed for its
/// endpoint.
#[inline(always)]
pub(super) fn local<F: IpFamily>(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKeyOf<F::Addr>,
    picked: &Picked<F::Addr>,
    tot_len: u16,
    now: u64,
) -> (u32, Reason) {
    let backend = &picked.backend;
    let hop = match route::cached_lookup::<F>(ctx, picked.id, &flow.src, &backend.addr, tot_len, now) {
        Ok(hop) => hop,
        Err(reason) => return (XDP_PASS, reason),
    };
    // A service listed for its endpoints has its replies checked against the connection
    // table instead (see `lb_common::endpoint_services`): nothing to write or check here.
    if !picked.replies_by_table && must_check_reply(flow.proto, picked.check_due) {
        remember_reply::<F>(backend.addr, backend.port, flow);
    }
    picked.remember::<F>(flow, now);
    // The rewrite's target in the family's room (IPv6's is off the stack), now that the reply
    // entry is written.
    F::with_reply_room(|_, to| {
        *to = ReplyNatOf::new(flow.src, backend.addr, flow.sport, backend.port);
        route_out::<F>(ctx, layout, to, &hop, Reason::ForwardedLocal)
    })
    .unwrap_or((XDP_PASS, F::PASSED))
}

/// How [`full_nat`] finds the flow's source port: a constant at each call, so each program
/// holds only its own steps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PortStep {
    /// The port the flow's entry says it holds, else a new one claimed: IPv4, in one program.
    HeldOrClaimed,
    /// Only the port the flow holds; `None` without one. IPv6's entry program: its frame has
    /// no room for the claim, so an established flow is sent on there and a flow without a
    /// port goes to the claim's stage (see `stages6`).
    Held,
    /// A port claimed (the claim meets a port the flow holds among its candidates too):
    /// IPv6's claim stage.
    Claimed,
}

/// An endpoint on another node, kube-proxy Cluster style: DNAT to it and SNAT to this node,
/// so the reply comes back here to be translated. `None` only for [`PortStep::Held`] when the
/// flow holds no port.
#[inline(always)]
pub(super) fn full_nat<F: IpFamily>(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKeyOf<F::Addr>,
    picked: &Picked<F::Addr>,
    tot_len: u16,
    now: u64,
    step: PortStep,
) -> Option<(u32, Reason)> {
    let Some(settings) = maps::settings().copied() else {
        return Some((XDP_PASS, Reason::NoRoute));
    };
    let backend = picked.backend;
    let node = F::node_addr(&settings);
    let hop = match route::cached_lookup::<F>(
        ctx,
        picked.id,
        &node.unwrap_or(<F::Addr as Address>::ZERO),
        &backend.addr,
        tot_len,
        now,
    ) {
        Ok(hop) => hop,
        Err(reason) => return Some((XDP_PASS, reason)),
    };
    // The address of the uplink the packet leaves by: the endpoint's replies come back there.
    // (IPv6 has no node-wide address: an uplink without one cannot source full NAT.)
    let Some(source) = F::uplink_source(hop.ifindex).or(node.map(Aligned)) else {
        return Some((XDP_PASS, Reason::NoSourceAddress));
    };
    // SAFETY: bounds-checked by `header`; copied out.
    let peer = || Peer {
        mac: header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).src_addr }).unwrap_or_default(),
        vlan: crate::vlan::arrival_vlan(),
        ifindex: ctx.ingress_ifindex() as u32,
    };
    let held = match step {
        PortStep::Claimed => None,
        PortStep::Held | PortStep::HeldOrClaimed => picked.snat_attempt().and_then(|attempt| {
            held_snat_port::<F>(flow, &backend, &source, &settings, attempt, picked.check_due, peer, now)
        }),
    };
    let snat_port = match held {
        Some(port) => port,
        None if step == PortStep::Held => return None,
        None => {
            let Some((port, attempt)) = claim_snat_port::<F>(flow, &backend, &source, &settings, peer(), now)
            else {
                return Some((XDP_DROP, Reason::SnatPortsExhausted));
            };
            // New, or a known flow without a port changed to full NAT: its entry is written
            // whole.
            flow::record::<F>(flow, picked.service, picked.id, Some(attempt), now);
            port
        }
    };
    let to = ReplyNatOf::new(source.0, backend.addr, snat_port, backend.port);
    Some(route_out::<F>(ctx, layout, &to, &hop, Reason::ForwardedFullNat))
}

/// Full NAT's `attempt`th source-port candidate for a flow whose hash is `start`: candidates
/// start at a hash of the flow, so concurrent flows rarely contend and a flow meets its own
/// port first. `None` for an empty range.
#[inline(always)]
fn snat_candidate(start: u32, settings: &Settings, attempt: u32) -> Option<u16> {
    let (min, max) = (settings.snat_port_min, settings.snat_port_max);
    if max < min {
        return None;
    }
    let span = (max - min) as u32 + 1;
    Some((min as u32 + (start.wrapping_add(attempt) % span)) as u16)
}

/// Finds a free source port towards `backend` and records how to translate its replies, or
/// finds the port this flow already holds (its flow entry was evicted; its port never is).
/// The port, and the attempt that found it (what the flow's entry keeps).
#[inline(always)]
fn claim_snat_port<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    backend: &BackendOf<F::Addr>,
    node: &Aligned<F::Addr>,
    settings: &Settings,
    peer: Peer,
    now: u64,
) -> Option<([u8; 2], u8)> {
    let span = u32::from(settings.snat_port_max.checked_sub(settings.snat_port_min)?) + 1;
    let start = flow_hash(flow);
    // The port and its attempt (`port | attempt << 16`), or `NO_PORT`: a plain integer out of
    // the closure, which is a BPF function of its own for IPv6 (an `Option`'s none would leave
    // bytes of the result undefined, and the verifier refuses a register holding whatever was
    // there before).
    const NO_PORT: u32 = u32::MAX;
    let claimed = F::with_snat_room(|key, entry| {
        *entry = snat_entry(flow, peer, now);
        // One key, its port changed per attempt; a bound LLVM cannot see (no range is shorter
        // in practice) keeps the loop a loop: unrolled eight times, IPv6's keys and compares
        // spill past BPF's stack.
        *key = FlowKeyOf::new(backend.addr, node.0, backend.port, [0; 2], flow.proto);
        for attempt in 0..span.min(SNAT_ATTEMPTS) {
            let Some(port) = snat_candidate(start, settings, attempt) else { break };
            key.dport = port.to_be_bytes();
            if F::snat_replies().insert(&*key, &*entry, BPF_NOEXIST as u64).is_ok() {
                return u32::from(port) | attempt << 16;
            }
            // SAFETY: compared at once.
            if unsafe { F::snat_replies().get(&*key) }.is_some_and(|held| held.belongs_to(flow)) {
                return u32::from(port) | attempt << 16;
            }
        }
        NO_PORT
    })
    .unwrap_or(NO_PORT);
    (claimed != NO_PORT).then(|| ((claimed as u16).to_be_bytes(), (claimed >> 16) as u8))
}

/// Where a full-NAT flow's client sent from: the way its replies go back when no route does.
pub(super) struct Peer {
    mac: [u8; 6],
    vlan: u16,
    ifindex: u32,
}

/// `flow`'s reply translation, seen `now`.
#[inline(always)]
fn snat_entry<A: Address>(flow: &FlowKeyOf<A>, peer: Peer, now: u64) -> SnatEntryOf<A> {
    let mut reply = ReplyNatOf::new(flow.dst, flow.src, flow.dport, flow.sport);
    reply.peer_mac = peer.mac;
    reply.peer_vlan = peer.vlan;
    let peer_ifindex = if peer.vlan != 0 { peer.ifindex } else { 0 };
    SnatEntryOf { reply, peer_ifindex, last_seen_ns: now }
}

/// Whether this packet makes sure its local flow's reply entry is there. Under a flood of new
/// flows the reply table's LRU can evict an established flow's entry while its flow entry
/// stays (the flood lab test caught it): the endpoint's next reply then leaves untranslated.
/// For TCP the client answers that with a reset, which ends the connection, so every TCP
/// packet checks (a lookup). Other protocols check with the flow's periodic checks: at most
/// `flow_table::CHECK_TICKS` (about half a second) of replies are lost, and nothing is reset.
#[inline(always)]
fn must_check_reply(proto: u8, check_due: bool) -> bool {
    check_due || proto == PROTO_TCP
}

/// The port a known full-NAT flow holds, from the attempt its entry names: checked in the
/// port table with every packet, so a stale hint (another flow's fingerprint, a port range
/// changed since) never sends a flow out on another flow's port; `None` then, and the flow
/// claims a port again. At each periodic check its port's entry is marked as seen, so the
/// agent keeps it; it is written again if the agent removed it as idle meanwhile and nobody
/// took the port. (Should another flow hold it by then, this flow idled past the timeout and
/// lost it, as a conntrack entry would.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn held_snat_port<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    backend: &BackendOf<F::Addr>,
    node: &Aligned<F::Addr>,
    settings: &Settings,
    attempt: u8,
    check_due: bool,
    peer: impl FnOnce() -> Peer,
    now: u64,
) -> Option<[u8; 2]> {
    if u32::from(attempt) >= SNAT_ATTEMPTS {
        return None;
    }
    let port = snat_candidate(flow_hash(flow), settings, u32::from(attempt))?.to_be_bytes();
    let held = F::with_snat_room(|key, entry| {
        *key = FlowKeyOf::new(backend.addr, node.0, backend.port, port, flow.proto);
        match F::snat_replies().get_ptr_mut(&*key) {
            // SAFETY: a map value, valid while the program runs; a racing write only moves a
            // time.
            Some(held) => unsafe {
                let mine = (*held).belongs_to(flow);
                if mine && check_due {
                    (*held).last_seen_ns = now;
                }
                mine
            },
            None => {
                *entry = snat_entry(flow, peer(), now);
                F::snat_replies().insert(&*key, &*entry, BPF_NOEXIST as u64).is_ok()
            }
        }
    })?;
    held.then_some(port)
}

/// A reply from a full-NAT backend to this node's translated source port: restore the VIP as
/// its source and the client as its destination, and send it to the client.
#[inline(always)]
pub(super) fn translate_reply<F: IpFamily>(
    ctx: &XdpContext,
    layout: L4Layout,
    flow: &FlowKeyOf<F::Addr>,
    tot_len: u16,
) -> Option<u32> {
    let settings = maps::settings()?;
    let port = u16::from_be_bytes(flow.dport);
    if port < settings.snat_port_min || port > settings.snat_port_max {
        return None;
    }
    // To this node's address on the uplink it arrived by (where full NAT sent it from).
    if F::node_addr(settings) != Some(flow.dst)
        && !F::uplink_source(ctx.ingress_ifindex() as u32).is_some_and(|source| source.0.same(&flow.dst))
    {
        return None;
    }
    // SAFETY: copied out at once. REPLY_NAT held full NAT's entries before SNAT_REPLIES did:
    // flows from before an upgrade are found there.
    let (to, peer_ifindex) = match unsafe { F::snat_replies().get(flow) } {
        Some(entry) => (entry.reply, entry.peer_ifindex),
        None => (unsafe { F::reply_nat().get(flow) }.copied()?, 0),
    };
    let bytes = packet::len(ctx);
    if to.peer_vlan != 0 {
        // Back the way the client's packets came, tagged: onto a VLAN without a device no
        // route leads.
        let Some(smac) = uplink::mac(peer_ifindex, to.peer_vlan) else {
            return Some(stats::verdict(Reason::NoNeighbor, bytes, XDP_PASS));
        };
        let hop =
            route::NextHop { ifindex: peer_ifindex, smac, dmac: to.peer_mac, mtu: 0, vlan: to.peer_vlan };
        let (action, reason) = route_out::<F>(ctx, layout, &to, &hop, Reason::ReplyTranslated);
        return Some(stats::verdict(reason, bytes, action));
    }
    // SAFETY: a helper without arguments.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_coarse_ns() };
    let hop = match route::reply_lookup::<F>(ctx, &to.src, &to.dst, tot_len, now) {
        Ok(hop) => hop,
        // Back the way the client's packets came: to the MAC they came from, out of the
        // interface the route to the client takes (with several uplinks, not necessarily the
        // one the reply arrived by).
        Err(Reason::NoNeighbor) if to.peer_mac != [0; 6] => {
            let ingress = ctx.ingress_ifindex() as u32;
            let ifindex = route::egress::<F>(ctx, &to.src, &to.dst, tot_len).unwrap_or(ingress);
            let smac = if ifindex == ingress {
                // SAFETY: bounds-checked by `header`; copied out.
                header::<EthHdr>(ctx, 0).map(|eth| unsafe { (*eth).dst_addr })?
            } else {
                match uplink::mac(ifindex, 0) {
                    Some(mac) => mac,
                    None => return Some(stats::verdict(Reason::NoNeighbor, bytes, XDP_PASS)),
                }
            };
            route::NextHop { ifindex, smac, dmac: to.peer_mac, mtu: 0, vlan: 0 }
        }
        Err(reason) => return Some(stats::verdict(reason, bytes, XDP_PASS)),
    };
    let (action, reason) = route_out::<F>(ctx, layout, &to, &hop, Reason::ReplyTranslated);
    Some(stats::verdict(reason, bytes, action))
}
