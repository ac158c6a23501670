//! The programs' maps. Names must match `lb_common::maps` and `lb_common::service`, which the
//! agent uses to find them.

use aya_ebpf::{
    Global,
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps::{Array as BtfArray, HashOfMaps},
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, ProgramArray},
};
use lb_common::{
    counters::{Reason, XDP_ACTION_COUNT},
    endpoint_services::{EndpointKeyOf, EndpointServicesOf},
    flow_table::{Bucket, DEFAULT_KEYING, Keying},
    maps::{
        MAX_LEASES, MAX_UPLINK_KEYS, MAX_VIPS, MAX_VRRP_SPEAKERS, OwnedVip, PacketCounter, Uplink, UplinkKey,
        VLAN_IDS, Vip6Key, VipKey, VipStats, VlanSlot, VrrpSpeaker,
    },
    service::{
        Addr4, Addr6, Backend, Backend6, FlowKey, FlowKey6, INNER_MAP_FLAGS, IPV6_SERVICE_SLOTS,
        LocalEndpoint, LocalEndpointKey, LocalEndpointKey6, MAX_BACKENDS, MAX_FLOWS, MAX_LOCAL_ENDPOINTS,
        MAX_RING_SIZE, MAX_SERVICES, NextHopEntry, ReplyNat, ReplyNat6, RingEntry, Service, ServiceKey,
        ServiceKey6, Settings, SnatEntry, SnatEntry6, ring_entries,
    },
    vip_filter::VipFilter,
};

#[map]
pub static OWNED_VIPS: HashMap<VipKey, OwnedVip> = HashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static OWNED_VIPS6: HashMap<Vip6Key, OwnedVip> = HashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static VIP_LEASES: Array<u64> = Array::with_max_entries(MAX_LEASES, 0);

#[map]
pub static VIP_STATS: PerCpuHashMap<VipKey, VipStats> = PerCpuHashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static VIP_STATS6: PerCpuHashMap<Vip6Key, VipStats> = PerCpuHashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static VIP_TRAFFIC: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(MAX_VIPS, 0);

#[map]
pub static ACTION_STATS: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(XDP_ACTION_COUNT, 0);

#[map]
pub static REASON_STATS: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(Reason::COUNT, 0);

#[map]
pub static SERVICES: HashMap<ServiceKey, Service> = HashMap::with_max_entries(MAX_SERVICES, 0);

#[map]
pub static BACKENDS: Array<Backend> = Array::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static BACKEND_STATS: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(MAX_BACKENDS, 0);

/// The connection table ([`lb_common::flow_table`]): buckets for `dataplane.capacity.flows`
/// flows, then the header. Mappable, so the kernel allocates its values page-aligned and each
/// 64-byte bucket is one cache line (an ordinary array's values start 8-byte aligned, and a
/// bucket would straddle two).
#[map]
pub static FLOW_TABLE: Array<Bucket> =
    Array::with_max_entries(DEFAULT_KEYING.entries(), BPF_F_MMAPABLE as u32);

/// How `FLOW_TABLE` is keyed: set by the agent at load, from the table's header when it is
/// pinned already (read-only: the verifier sees constants).
#[unsafe(no_mangle)]
pub static FLOW_KEYING: Global<Keying> = Global::new(DEFAULT_KEYING);

/// Shared by all CPUs (a per-CPU copy would multiply it by the CPUs). Two CPUs refreshing one
/// entry write the same hop; a packet reading an entry while a neighbour change is written
/// can see part of each, and goes to neither: that packet is lost, as it would have been at
/// the old hop.
#[map]
pub static NEXT_HOPS: Array<NextHopEntry> = Array::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static REPLY_NAT: LruHashMap<FlowKey, ReplyNat> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

/// Not an LRU on purpose (see `lb_common::service::SNAT_REPLIES`); `BPF_F_NO_PREALLOC` off, so
/// an insert never allocates in the packet path.
#[map]
pub static SNAT_REPLIES: HashMap<FlowKey, SnatEntry> = HashMap::with_max_entries(MAX_FLOWS, 0);

#[map]
pub static LOCAL_ENDPOINTS: HashMap<LocalEndpointKey, LocalEndpoint> =
    HashMap::with_max_entries(MAX_LOCAL_ENDPOINTS, 0);

/// Written by the agent; read by the TC egress program (see `lb_common::endpoint_services`).
/// Not preallocated: a node has far fewer endpoints than its service entries have, and only the
/// agent writes, so no allocation happens in a packet's path.
#[map]
pub static ENDPOINT_SERVICES: HashMap<EndpointKeyOf<Addr4>, EndpointServicesOf<Addr4>> =
    HashMap::with_max_entries(MAX_LOCAL_ENDPOINTS, BPF_F_NO_PREALLOC);

#[map]
pub static VRRP_SPEAKERS: LruHashMap<VipKey, VrrpSpeaker> =
    LruHashMap::with_max_entries(MAX_VRRP_SPEAKERS, 0);

#[map]
pub static VRRP_SPEAKERS6: LruHashMap<Vip6Key, VrrpSpeaker> =
    LruHashMap::with_max_entries(MAX_VRRP_SPEAKERS, 0);

#[map]
pub static UPLINKS: HashMap<UplinkKey, Uplink> = HashMap::with_max_entries(MAX_UPLINK_KEYS, 0);

// IPv6's service maps: the same shapes over IPv6 addresses (see `lb_common::service`).

#[map]
pub static SERVICES6: HashMap<ServiceKey6, Service> = HashMap::with_max_entries(MAX_SERVICES, 0);

#[map]
pub static BACKENDS6: Array<Backend6> = Array::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static BACKEND_STATS6: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static VIP_TRAFFIC6: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(MAX_VIPS, 0);

#[map]
pub static FLOW_TABLE6: Array<Bucket> =
    Array::with_max_entries(DEFAULT_KEYING.entries(), BPF_F_MMAPABLE as u32);

#[unsafe(no_mangle)]
pub static FLOW_KEYING6: Global<Keying> = Global::new(DEFAULT_KEYING);

/// Which service keys are installed, a bit each: whether to fetch a flow's line before the
/// service lookup ([`lb_common::vip_filter`]).
#[map]
pub static VIP_FILTER: Array<VipFilter> = Array::with_max_entries(1, 0);

#[map]
pub static VIP_FILTER6: Array<VipFilter> = Array::with_max_entries(1, 0);

#[map]
pub static NEXT_HOPS6: Array<NextHopEntry> = Array::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static REPLY_NAT6: LruHashMap<FlowKey6, ReplyNat6> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

#[map]
pub static SNAT_REPLIES6: HashMap<FlowKey6, SnatEntry6> = HashMap::with_max_entries(MAX_FLOWS, 0);

#[map]
pub static LOCAL_ENDPOINTS6: HashMap<LocalEndpointKey6, LocalEndpoint> =
    HashMap::with_max_entries(MAX_LOCAL_ENDPOINTS, 0);

#[map]
pub static ENDPOINT_SERVICES6: HashMap<EndpointKeyOf<Addr6>, EndpointServicesOf<Addr6>> =
    HashMap::with_max_entries(MAX_LOCAL_ENDPOINTS, BPF_F_NO_PREALLOC);

/// Full NAT's replies' next hops back to their clients, cached per CPU in slots picked by the
/// client's address (see `route::reply_lookup`); not pinned: a cache, empty after a load.
#[map]
pub static REPLY_HOPS: PerCpuArray<ReplyHop<Addr4>> = PerCpuArray::with_max_entries(REPLY_HOP_SLOTS, 0);

#[map]
pub static REPLY_HOPS6: PerCpuArray<ReplyHop<Addr6>> = PerCpuArray::with_max_entries(REPLY_HOP_SLOTS, 0);

/// [`REPLY_HOPS`]' slots per CPU: a power of two.
pub const REPLY_HOP_SLOTS: u32 = 1_024;

/// A cached next hop back to `client`, for replies that arrived by `ingress` (the FIB's
/// lookup starts from that interface, so its table and its answer depend on it).
#[repr(C)]
pub struct ReplyHop<A> {
    pub hop: NextHopEntry,
    pub client: A,
    pub ingress: u32,
}

/// Scratch space for IPv6's FIB lookups (see `family::V6`), one per CPU; not pinned.
#[map]
pub static FIB_SCRATCH: PerCpuArray<aya_ebpf::bindings::bpf_fib_lookup> = PerCpuArray::with_max_entries(1, 0);

/// Each VLAN's uplink on one parent, by VLAN id (see `lb_common::maps::VLAN_SLOTS`); not pinned.
#[map]
pub static VLAN_SLOTS: Array<VlanSlot> = Array::with_max_entries(VLAN_IDS, 0);

/// The VLAN the frame being handled arrived on (see `vlan`): per CPU, since a frame runs on
/// one CPU from `lb_xdp` through its tail calls.
#[map]
pub static ARRIVAL: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// What `lb_xdp6` hands its stages (see `services::stages6`), one per CPU; not pinned.
#[map]
pub static STATE6: PerCpuArray<State6> = PerCpuArray::with_max_entries(1, 0);

/// The IPv6 service path's programs: `lb_xdp6` (see `l3::ipv6::serve`) and its stages (see
/// `services::stages6`).
#[map]
pub static IPV6_SERVICES: ProgramArray = ProgramArray::with_max_entries(IPV6_SERVICE_SLOTS, 0);

#[map]
pub static UPLINK_ADDRS6: HashMap<UplinkKey, Vip6Key> = HashMap::with_max_entries(MAX_UPLINK_KEYS, 0);

/// This node's VRRP address (its link-local) on each uplink, by arrival (see
/// `lb_common::maps::VRRP_OWN6`); not pinned: the agent writes it at every start.
#[map]
pub static VRRP_OWN6: HashMap<UplinkKey, Vip6Key> = HashMap::with_max_entries(MAX_UPLINK_KEYS, 0);

#[map]
pub static SETTINGS: Array<Settings> = Array::with_max_entries(1, 0);

/// The node-wide settings the agent wrote (`SETTINGS` holds one).
#[inline(always)]
pub fn settings() -> Option<&'static Settings> {
    SETTINGS.get(0)
}

/// The inner-map template: each service's ring is its own array of slot pairs, sized for a
/// prime number of slots fitting its backend count (`BPF_F_INNER_MAP` lets sizes differ).
pub type Ring = BtfArray<RingEntry, { ring_entries(MAX_RING_SIZE) as usize }, { INNER_MAP_FLAGS as usize }>;

#[btf_map]
pub static MAGLEV_RINGS: HashOfMaps<u32, Ring, { MAX_SERVICES as usize }> = HashOfMaps::new();

/// The IPv6 path's per-CPU state: what `lb_xdp6` hands its stages (see `services::stages6`),
/// and room for what would not fit on their stacks.
#[repr(C)]
pub struct State6 {
    pub flow: FlowKey6,
    pub backend: Backend6,
    pub id: u32,
    /// The IP packet's length, header included.
    pub ip_len: u16,
    /// The rest of the flow's `services::flow::Picked`.
    pub service: u16,
    pub snat_attempt: u8,
    pub _pad: u8,
    pub known: u8,
    pub check_due: u8,
    /// Full NAT's room to build a source-port candidate in (see `nat::claim_snat_port`).
    pub snat_key: FlowKey6,
    pub snat_entry: SnatEntry6,
}
