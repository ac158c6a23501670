//! Routing: next hops from the kernel's FIB and neighbour table, sending the frame there after
//! its rewrite, and remembering how a delivered flow's replies are translated back.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{Address, FlowKeyOf, HOP_REFRESH_NS, NextHopEntry, ReplyNatOf},
};
use network_types::eth::EthHdr;

use crate::{
    family::IpFamily,
    maps::REPLY_HOP_SLOTS,
    packet::{L4Layout, header},
};

/// Where a frame goes next.
pub struct NextHop {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// The largest IP packet the route takes; zero where unknown (not cached then).
    pub mtu: u16,
    /// The 802.1Q VLAN the frame leaves on, zero for none (the FIB's hops are untagged).
    pub vlan: u16,
}

/// The next hop from `src` to `dst`, backend `backend`'s address (or its node's), for a packet
/// of `len` IP bytes: the backend's cached one while it is fresh and the packet fits, else the
/// FIB's, which is then cached. The hop depends on the destination, so every flow to the
/// backend shares it, and a busy backend's is looked up once per [`HOP_REFRESH_NS`], not once
/// per flow. (A route chosen by source, policy routing on client addresses, is cached as the
/// first packet after a refresh found it.)
#[inline(always)]
pub fn cached_lookup<F: IpFamily>(
    ctx: &XdpContext,
    backend: u32,
    src: &F::Addr,
    dst: &F::Addr,
    len: u16,
    now: u64,
) -> Result<NextHop, Reason> {
    let cached = F::next_hops().get_ptr_mut(backend);
    // SAFETY: a map value, copied out at once.
    if let Some(hop) = cached.and_then(|c| fresh(unsafe { &*c }, len, now)) {
        return Ok(hop);
    }
    let hop = lookup::<F>(ctx, src, dst, len)?;
    if let Some(c) = cached
        && hop.mtu != 0
    {
        // SAFETY: a map value; see `maps::NEXT_HOPS` on concurrent writers.
        unsafe { *c = entry(&hop, now) };
    }
    Ok(hop)
}

/// The next hop for full NAT's reply from `src` (the VIP) back to `client`, for a packet of
/// `len` IP bytes: this CPU's cached one for the client while it is fresh, arrived by the same
/// interface and the packet fits, else the FIB's, which then takes the client's slot. IPv6's
/// FIB lookup costs several times IPv4's (it searches the local table, then the main one), and
/// a reply's destination is a client, not one of a few backends, so [`cached_lookup`]'s cache
/// cannot hold it. The cache is per CPU, so it needs no locks and no entry is ever half
/// written; a slot names the client and interface it is for, so a client whose address shares
/// a slot with another's only misses, and is looked up in the FIB as without a cache. As with
/// [`cached_lookup`], a route chosen by source (the VIP) is cached as the first reply after a
/// refresh found it.
#[inline(always)]
pub fn reply_lookup<F: IpFamily>(
    ctx: &XdpContext,
    src: &F::Addr,
    client: &F::Addr,
    len: u16,
    now: u64,
) -> Result<NextHop, Reason> {
    let ingress = ctx.ingress_ifindex() as u32;
    let slot = client.fold().wrapping_mul(0x9e37_79b9) >> (32 - REPLY_HOP_SLOTS.trailing_zeros());
    let cached = F::reply_hops().get_ptr_mut(slot);
    if let Some(c) = cached {
        // SAFETY: this CPU's map value, copied out at once.
        let c = unsafe { &*c };
        if c.client.same(client)
            && c.ingress == ingress
            && let Some(hop) = fresh(&c.hop, len, now)
        {
            return Ok(hop);
        }
    }
    let hop = lookup::<F>(ctx, src, client, len)?;
    if let Some(c) = cached
        && hop.mtu != 0
    {
        // SAFETY: this CPU's map value: no other program writes it meanwhile.
        unsafe {
            (*c).hop = entry(&hop, now);
            (*c).client = *client;
            (*c).ingress = ingress;
        }
    }
    Ok(hop)
}

/// A cached hop, if it was looked up less than [`HOP_REFRESH_NS`] ago and a packet of `len`
/// IP bytes fits it.
#[inline(always)]
fn fresh(c: &NextHopEntry, len: u16, now: u64) -> Option<NextHop> {
    (c.ifindex != 0 && now.wrapping_sub(c.checked_ns) < HOP_REFRESH_NS && len <= c.mtu).then_some(NextHop {
        ifindex: c.ifindex,
        smac: c.smac,
        dmac: c.dmac,
        mtu: c.mtu,
        vlan: 0,
    })
}

/// `hop` as cached, looked up `now`.
#[inline(always)]
fn entry(hop: &NextHop, now: u64) -> NextHopEntry {
    NextHopEntry {
        ifindex: hop.ifindex,
        smac: hop.smac,
        dmac: hop.dmac,
        mtu: hop.mtu,
        _pad: [0; 6],
        checked_ns: now,
    }
}

/// Looks up the route from `src` to `dst` for a packet of `tot_len` IP bytes. Errors name the
/// reason the caller counts; the caller has not rewritten anything yet, so it can still pass
/// the packet untouched.
#[inline(always)]
pub fn lookup<F: IpFamily>(
    ctx: &XdpContext,
    src: &F::Addr,
    dst: &F::Addr,
    tot_len: u16,
) -> Result<NextHop, Reason> {
    F::with_fib_params(|params| {
        params.ifindex = ctx.ingress_ifindex() as u32;
        params.__bindgen_anon_1.tot_len = tot_len;
        F::fib_addresses(params, *src, *dst);
        // SAFETY: `params` is a valid, writable struct of the size passed.
        let rc = unsafe {
            fib_lookup(ctx.ctx as *mut _, params, core::mem::size_of::<bpf_fib_lookup>() as i32, 0)
        };
        match rc as u32 {
            BPF_FIB_LKUP_RET_SUCCESS => Ok(NextHop {
                ifindex: params.ifindex,
                smac: params.smac,
                dmac: params.dmac,
                // SAFETY: on success the kernel wrote the route's MTU over `tot_len` (a u16
                // either way).
                mtu: unsafe { params.__bindgen_anon_1.mtu_result },
                vlan: 0,
            }),
            BPF_FIB_LKUP_RET_NO_NEIGH => Err(Reason::NoNeighbor),
            BPF_FIB_LKUP_RET_FRAG_NEEDED => Err(Reason::TooBig),
            _ => Err(Reason::NoRoute),
        }
    })
    .unwrap_or(Err(Reason::NoRoute))
}

/// The interface the route from `src` to `dst` leaves by, whether or not its next hop's MAC
/// is known (the kernel names the device before it looks for the neighbour). It repeats
/// `lookup`'s set-up on purpose: sharing it through a helper measured 10-20 ns slower on the
/// local path in single BPF_PROG_TEST_RUN timings (near that harness's 10 ns resolution, but
/// in every run), though neither function runs there per packet.
#[inline(always)]
pub fn egress<F: IpFamily>(ctx: &XdpContext, src: &F::Addr, dst: &F::Addr, tot_len: u16) -> Option<u32> {
    F::with_fib_params(|params| {
        params.ifindex = ctx.ingress_ifindex() as u32;
        params.__bindgen_anon_1.tot_len = tot_len;
        F::fib_addresses(params, *src, *dst);
        // SAFETY: `params` is a valid, writable struct of the size passed.
        let rc = unsafe {
            fib_lookup(ctx.ctx as *mut _, params, core::mem::size_of::<bpf_fib_lookup>() as i32, 0)
        };
        matches!(rc as u32, BPF_FIB_LKUP_RET_SUCCESS | BPF_FIB_LKUP_RET_NO_NEIGH).then_some(params.ifindex)
    })
    .flatten()
}

/// Rewrites the Ethernet addresses for `hop` (and tags the frame for its VLAN) and transmits:
/// back out of the uplink with `XDP_TX`, or to another interface with a redirect.
#[inline(always)]
pub fn send(ctx: &XdpContext, hop: &NextHop) -> Option<u32> {
    let eth = header::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds-checked by `header`.
    let eth = unsafe { &mut *eth };
    eth.dst_addr = hop.dmac;
    eth.src_addr = hop.smac;
    if hop.vlan != 0 && !crate::vlan::tag(ctx, hop.vlan) {
        return None;
    }
    if hop.ifindex == ctx.ingress_ifindex() as u32 {
        return Some(XDP_TX);
    }
    // SAFETY: a helper call with plain integer arguments.
    Some(unsafe { bpf_redirect(hop.ifindex, 0) } as u32)
}

/// Records how the backend's replies to `flow` are translated back (local and DSR delivery:
/// only the source changes, back to the VIP and service port). Key and value are built in the
/// family's room for them (IPv6's is off the stack).
#[inline(always)]
pub fn remember_reply<F: IpFamily>(backend_addr: F::Addr, backend_port: [u8; 2], flow: &FlowKeyOf<F::Addr>) {
    let _ = F::with_reply_room(|key, reply| {
        *key = FlowKeyOf::new(backend_addr, flow.src, backend_port, flow.sport, flow.proto);
        *reply = ReplyNatOf::new(flow.dst, flow.src, flow.dport, flow.sport);
        // A lookup is much cheaper than an LRU update, and most packets belong to flows whose
        // entry is already right; the lookup also keeps that entry recent.
        // SAFETY: compared at once.
        if unsafe { F::reply_nat().get(&*key) }.is_some_and(|current| current.same(reply)) {
            return;
        }
        let _ = F::reply_nat().insert(&*key, &*reply, 0);
    });
}

/// Rewrites the packet to `to`, decrements the TTL (hop limit) and sends it to `hop`.
#[inline(always)]
pub fn route_out<F: IpFamily>(
    ctx: &XdpContext,
    layout: L4Layout,
    to: &ReplyNatOf<F::Addr>,
    hop: &NextHop,
    reason: Reason,
) -> (u32, Reason) {
    if F::rewrite(ctx, layout, to).is_none() {
        return (XDP_DROP, Reason::MalformedL4);
    }
    match F::decrement_hop_limit(ctx) {
        None => return (XDP_DROP, F::MALFORMED),
        Some(false) => return (XDP_PASS, Reason::TtlExpired),
        Some(true) => {}
    }
    match send(ctx, hop) {
        Some(action) => (action, reason),
        None => (XDP_DROP, Reason::MalformedEthernet),
    }
}
