//! The address families the service path serves. What differs between IPv4 and IPv6 (header
//! shapes, maps, routing parameters, rewrites) sits behind [`IpFamily`], so `services` and
//! `route` are written once and compiled once per family.

use aya_ebpf::{
    Global,
    bindings::bpf_fib_lookup,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    endpoint_services::{EndpointKeyOf, EndpointServicesOf},
    flow_table::{Bucket, Keying},
    maps::{PacketCounter, UplinkKey},
    service::{
        Addr4, Addr6, Address, BackendOf, FlowKeyOf, LocalEndpoint, LocalEndpointKeyOf, NextHopEntry,
        ReplyNatOf, Service, ServiceKeyOf, Settings, SnatEntryOf,
    },
    vip_filter::VipFilter,
    words::Aligned,
};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::{
    maps, owned,
    packet::{ETH_LEN, IPV6_LEN, L4Layout, header},
    rewrite, uplink,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

pub trait IpFamily: Sized {
    type Addr: Address;
    /// Where TCP/UDP starts: after an option-less IPv4 header, or an IPv6 header without
    /// extension headers (packets with either are left to the kernel).
    const L4_OFFSET: usize;
    /// Not for us: left to the kernel.
    const PASSED: Reason;
    /// The IP header is not what it claims.
    const MALFORMED: Reason;

    fn services() -> &'static HashMap<ServiceKeyOf<Self::Addr>, Service>;
    fn backends() -> &'static Array<BackendOf<Self::Addr>>;
    fn backend_stats() -> &'static PerCpuArray<PacketCounter>;
    fn vip_traffic() -> &'static PerCpuArray<PacketCounter>;
    fn flow_table() -> &'static Array<Bucket>;
    fn flow_keying() -> &'static Global<Keying>;
    fn vip_filter() -> &'static Array<VipFilter>;
    fn next_hops() -> &'static Array<NextHopEntry>;
    fn reply_hops() -> &'static PerCpuArray<maps::ReplyHop<Self::Addr>>;
    fn reply_nat() -> &'static LruHashMap<FlowKeyOf<Self::Addr>, ReplyNatOf<Self::Addr>>;
    fn snat_replies() -> &'static HashMap<FlowKeyOf<Self::Addr>, SnatEntryOf<Self::Addr>>;
    fn local_endpoints() -> &'static HashMap<LocalEndpointKeyOf<Self::Addr>, LocalEndpoint>;
    fn endpoint_services() -> &'static HashMap<EndpointKeyOf<Self::Addr>, EndpointServicesOf<Self::Addr>>;

    /// The node-wide address of this family, where there is one (IPv4's `Settings`).
    fn node_addr(settings: &Settings) -> Option<Self::Addr>;
    /// This node's address on interface `ifindex`, when that is an uplink with one.
    fn uplink_source(ifindex: u32) -> Option<Aligned<Self::Addr>>;
    /// See [`owned::is_owned_exclusively`].
    fn is_owned_exclusively(ctx: &XdpContext, addr: Self::Addr) -> bool;
    /// Runs `f` with a zeroed FIB parameter block: on the stack for IPv4; for IPv6 in a per-CPU
    /// scratch map, its frames being tight (`None` if that cannot be had).
    fn with_fib_params<R>(f: impl FnOnce(&mut bpf_fib_lookup) -> R) -> Option<R>;
    /// Runs `f` with room to build a full-NAT port's key and entry in: on the stack for IPv4,
    /// in this CPU's [`maps::State6`] for IPv6 (`None` if that cannot be had).
    fn with_snat_room<R>(
        f: impl FnOnce(&mut FlowKeyOf<Self::Addr>, &mut SnatEntryOf<Self::Addr>) -> R,
    ) -> Option<R>;
    /// Runs `f` with room to build a reply translation's key and value in: on the stack for
    /// IPv4, in this CPU's [`maps::State6`] for IPv6, inline (`None` if that cannot be had).
    fn with_reply_room<R>(
        f: impl FnOnce(&mut FlowKeyOf<Self::Addr>, &mut ReplyNatOf<Self::Addr>) -> R,
    ) -> Option<R>;
    /// Fills the family and addresses of a FIB lookup.
    fn fib_addresses(params: &mut bpf_fib_lookup, src: Self::Addr, dst: Self::Addr);
    /// The TTL or hop limit of the packet's IP header at [`ETH_LEN`].
    fn hop_limit(ctx: &XdpContext) -> Option<u8>;
    /// Decrements it (RFC 1812 §5.3.1, RFC 8200 §3); `Some(false)` when it would reach zero.
    fn decrement_hop_limit(ctx: &XdpContext) -> Option<bool>;
    /// Sets the addresses and ports to `to`, patching the checksums.
    fn rewrite(ctx: &XdpContext, layout: L4Layout, to: &ReplyNatOf<Self::Addr>) -> Option<()>;
}

pub struct V4;
pub struct V6;

impl IpFamily for V4 {
    type Addr = Addr4;
    const L4_OFFSET: usize = crate::packet::L4_OFFSET;
    const PASSED: Reason = Reason::Ipv4Passed;
    const MALFORMED: Reason = Reason::MalformedIpv4;

    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<Addr4>, Service> {
        &maps::SERVICES
    }
    #[inline(always)]
    fn backends() -> &'static Array<BackendOf<Addr4>> {
        &maps::BACKENDS
    }
    #[inline(always)]
    fn backend_stats() -> &'static PerCpuArray<PacketCounter> {
        &maps::BACKEND_STATS
    }
    #[inline(always)]
    fn vip_traffic() -> &'static PerCpuArray<PacketCounter> {
        &maps::VIP_TRAFFIC
    }
    #[inline(always)]
    fn flow_table() -> &'static Array<Bucket> {
        &maps::FLOW_TABLE
    }
    #[inline(always)]
    fn flow_keying() -> &'static Global<Keying> {
        &maps::FLOW_KEYING
    }
    #[inline(always)]
    fn vip_filter() -> &'static Array<VipFilter> {
        &maps::VIP_FILTER
    }
    #[inline(always)]
    fn next_hops() -> &'static Array<NextHopEntry> {
        &maps::NEXT_HOPS
    }
    #[inline(always)]
    fn reply_hops() -> &'static PerCpuArray<maps::ReplyHop<Addr4>> {
        &maps::REPLY_HOPS
    }
    #[inline(always)]
    fn reply_nat() -> &'static LruHashMap<FlowKeyOf<Addr4>, ReplyNatOf<Addr4>> {
        &maps::REPLY_NAT
    }
    #[inline(always)]
    fn snat_replies() -> &'static HashMap<FlowKeyOf<Addr4>, SnatEntryOf<Addr4>> {
        &maps::SNAT_REPLIES
    }
    #[inline(always)]
    fn local_endpoints() -> &'static HashMap<LocalEndpointKeyOf<Addr4>, LocalEndpoint> {
        &maps::LOCAL_ENDPOINTS
    }
    #[inline(always)]
    fn endpoint_services() -> &'static HashMap<EndpointKeyOf<Addr4>, EndpointServicesOf<Addr4>> {
        &maps::ENDPOINT_SERVICES
    }

    #[inline(always)]
    fn node_addr(settings: &Settings) -> Option<Addr4> {
        Some(settings.node_addr)
    }
    #[inline(always)]
    fn uplink_source(ifindex: u32) -> Option<Aligned<Addr4>> {
        uplink::source(ifindex).map(Aligned)
    }
    #[inline(always)]
    fn is_owned_exclusively(ctx: &XdpContext, addr: Addr4) -> bool {
        owned::is_owned_exclusively(ctx, addr)
    }
    #[inline(always)]
    fn with_fib_params<R>(f: impl FnOnce(&mut bpf_fib_lookup) -> R) -> Option<R> {
        // SAFETY: a plain C struct for which all-zero is a valid value.
        let mut params: bpf_fib_lookup = unsafe { core::mem::zeroed() };
        Some(f(&mut params))
    }
    #[inline(always)]
    fn with_snat_room<R>(f: impl FnOnce(&mut FlowKeyOf<Addr4>, &mut SnatEntryOf<Addr4>) -> R) -> Option<R> {
        let mut key = FlowKeyOf::new([0; 4], [0; 4], [0; 2], [0; 2], 0);
        let mut entry = SnatEntryOf {
            reply: ReplyNatOf::new([0; 4], [0; 4], [0; 2], [0; 2]),
            peer_ifindex: 0,
            last_seen_ns: 0,
        };
        Some(f(&mut key, &mut entry))
    }
    #[inline(always)]
    fn with_reply_room<R>(f: impl FnOnce(&mut FlowKeyOf<Addr4>, &mut ReplyNatOf<Addr4>) -> R) -> Option<R> {
        let mut key = FlowKeyOf::new([0; 4], [0; 4], [0; 2], [0; 2], 0);
        let mut reply = ReplyNatOf::new([0; 4], [0; 4], [0; 2], [0; 2]);
        Some(f(&mut key, &mut reply))
    }
    #[inline(always)]
    fn fib_addresses(params: &mut bpf_fib_lookup, src: Addr4, dst: Addr4) {
        params.family = AF_INET;
        params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
        params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    }
    #[inline(always)]
    fn hop_limit(ctx: &XdpContext) -> Option<u8> {
        // SAFETY: bounds-checked by `header`.
        header::<Ipv4Hdr>(ctx, ETH_LEN).map(|ip| unsafe { (*ip).ttl })
    }
    #[inline(always)]
    fn decrement_hop_limit(ctx: &XdpContext) -> Option<bool> {
        let ip = header::<Ipv4Hdr>(ctx, ETH_LEN)?;
        // SAFETY: bounds-checked by `header`.
        Some(rewrite::decrement_ttl(unsafe { &mut *ip }))
    }
    #[inline(always)]
    fn rewrite(ctx: &XdpContext, layout: L4Layout, to: &ReplyNatOf<Addr4>) -> Option<()> {
        rewrite::rewrite(ctx, layout, to)
    }
}

impl IpFamily for V6 {
    type Addr = Addr6;
    const L4_OFFSET: usize = ETH_LEN + IPV6_LEN;
    const PASSED: Reason = Reason::Ipv6Passed;
    const MALFORMED: Reason = Reason::MalformedIpv6;

    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<Addr6>, Service> {
        &maps::SERVICES6
    }
    #[inline(always)]
    fn backends() -> &'static Array<BackendOf<Addr6>> {
        &maps::BACKENDS6
    }
    #[inline(always)]
    fn backend_stats() -> &'static PerCpuArray<PacketCounter> {
        &maps::BACKEND_STATS6
    }
    #[inline(always)]
    fn vip_traffic() -> &'static PerCpuArray<PacketCounter> {
        &maps::VIP_TRAFFIC6
    }
    #[inline(always)]
    fn flow_table() -> &'static Array<Bucket> {
        &maps::FLOW_TABLE6
    }
    #[inline(always)]
    fn flow_keying() -> &'static Global<Keying> {
        &maps::FLOW_KEYING6
    }
    #[inline(always)]
    fn vip_filter() -> &'static Array<VipFilter> {
        &maps::VIP_FILTER6
    }
    #[inline(always)]
    fn next_hops() -> &'static Array<NextHopEntry> {
        &maps::NEXT_HOPS6
    }
    #[inline(always)]
    fn reply_hops() -> &'static PerCpuArray<maps::ReplyHop<Addr6>> {
        &maps::REPLY_HOPS6
    }
    #[inline(always)]
    fn reply_nat() -> &'static LruHashMap<FlowKeyOf<Addr6>, ReplyNatOf<Addr6>> {
        &maps::REPLY_NAT6
    }
    #[inline(always)]
    fn snat_replies() -> &'static HashMap<FlowKeyOf<Addr6>, SnatEntryOf<Addr6>> {
        &maps::SNAT_REPLIES6
    }
    #[inline(always)]
    fn local_endpoints() -> &'static HashMap<LocalEndpointKeyOf<Addr6>, LocalEndpoint> {
        &maps::LOCAL_ENDPOINTS6
    }
    #[inline(always)]
    fn endpoint_services() -> &'static HashMap<EndpointKeyOf<Addr6>, EndpointServicesOf<Addr6>> {
        &maps::ENDPOINT_SERVICES6
    }

    #[inline(always)]
    fn node_addr(_settings: &Settings) -> Option<Addr6> {
        None
    }
    #[inline(always)]
    fn uplink_source(ifindex: u32) -> Option<Aligned<Addr6>> {
        // SAFETY: copied out at once.
        unsafe { maps::UPLINK_ADDRS6.get(&UplinkKey::new(ifindex, 0)) }.map(|a| Aligned(a.addr))
    }
    #[inline(always)]
    fn is_owned_exclusively(ctx: &XdpContext, addr: Addr6) -> bool {
        owned::is_owned_exclusively6(ctx, addr)
    }
    #[inline(always)]
    fn with_fib_params<R>(f: impl FnOnce(&mut bpf_fib_lookup) -> R) -> Option<R> {
        let params = maps::FIB_SCRATCH.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot, used by one lookup at a time; all-zero is a valid value.
        unsafe {
            *params = core::mem::zeroed();
            Some(f(&mut *params))
        }
    }
    #[inline(always)]
    fn with_snat_room<R>(f: impl FnOnce(&mut FlowKeyOf<Addr6>, &mut SnatEntryOf<Addr6>) -> R) -> Option<R> {
        let state = maps::STATE6.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot; these two fields are used by one claim at a time.
        unsafe { Some(f(&mut (*state).snat_key, &mut (*state).snat_entry)) }
    }
    /// The same fields as [`IpFamily::with_snat_room`]'s (a packet never uses both at once),
    /// but inline: its caller's frame is small.
    #[inline(always)]
    fn with_reply_room<R>(f: impl FnOnce(&mut FlowKeyOf<Addr6>, &mut ReplyNatOf<Addr6>) -> R) -> Option<R> {
        let state = maps::STATE6.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot; these fields are used by one translation at a time.
        unsafe { Some(f(&mut (*state).snat_key, &mut (*state).snat_entry.reply)) }
    }
    #[inline(always)]
    fn fib_addresses(params: &mut bpf_fib_lookup, src: Addr6, dst: Addr6) {
        params.family = AF_INET6;
        // SAFETY: `[u8; 16]` and `[u32; 4]` have the same size, any bits valid.
        params.__bindgen_anon_3.ipv6_src = unsafe { core::mem::transmute::<Addr6, [u32; 4]>(src) };
        params.__bindgen_anon_4.ipv6_dst = unsafe { core::mem::transmute::<Addr6, [u32; 4]>(dst) };
    }
    #[inline(always)]
    fn hop_limit(ctx: &XdpContext) -> Option<u8> {
        // SAFETY: bounds-checked by `header`.
        header::<Ipv6Hdr>(ctx, ETH_LEN).map(|ip| unsafe { (*ip).hop_limit })
    }
    #[inline(always)]
    fn decrement_hop_limit(ctx: &XdpContext) -> Option<bool> {
        let ip = header::<Ipv6Hdr>(ctx, ETH_LEN)?;
        // SAFETY: bounds-checked by `header`. No header checksum to patch in IPv6.
        unsafe {
            if (*ip).hop_limit <= 1 {
                return Some(false);
            }
            (*ip).hop_limit -= 1;
        }
        Some(true)
    }
    #[inline(always)]
    fn rewrite(ctx: &XdpContext, layout: L4Layout, to: &ReplyNatOf<Addr6>) -> Option<()> {
        rewrite::rewrite6(ctx, layout.is_udp, to).then_some(())
    }
}
