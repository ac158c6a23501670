//! Service forwarding maps: what the XDP program steers and how.
//!
//! A packet to `(VIP, port, protocol)` finds its [`Service`]; an established flow finds its
//! backend in [`FLOW_TABLE`], a new one through the service's Maglev ring, an array of backend ids
//! computed in userspace. A ring of a new size is a new inner map of [`MAGLEV_RINGS`], filled
//! before its service points at it; a ring of the same size is rewritten in place, slot by
//! slot, and a packet reads one slot, so it sees the old backend or the new one. Ports and addresses are kept in
//! network byte order, exactly as in the packet.

/// `HashMap<ServiceKey, Service>`.
pub const SERVICES: &str = "SERVICES";
/// `Array<Backend>` indexed by backend id.
pub const BACKENDS: &str = "BACKENDS";
/// `HashOfMaps<u32, Array<u32>>`: ring id → Maglev ring of backend ids.
pub const MAGLEV_RINGS: &str = "MAGLEV_RINGS";
/// `Array<flow_table::Bucket>`: client flow → chosen backend, one cache line a lookup (see
/// [`crate::flow_table`]).
pub const FLOW_TABLE: &str = "FLOW_TABLE";
/// `LruHashMap<ConnectionKey, Flow>`: the connection table before [`FLOW_TABLE`]. An agent
/// finding it pinned converts its entries into the new table and unpins it.
pub const FLOWS: &str = "FLOWS";
/// `Array<NextHopEntry>` indexed by backend id: the next hop towards each backend, as the FIB
/// last gave it.
pub const NEXT_HOPS: &str = "NEXT_HOPS";
/// `LruHashMap<FlowKey, ReplyNat>`: reply flow (as it leaves the backend) → rewritten addresses,
/// for local and DSR delivery (and, from before `SNAT_REPLIES`, full NAT's).
pub const REPLY_NAT: &str = "REPLY_NAT";
/// `HashMap<FlowKey, SnatEntry>`: full NAT's reply flow (backend → this node's source port) →
/// rewritten addresses. Not an LRU: a flood of new flows fills it and is then refused source
/// ports, where an LRU would evict an established flow's entry and hand its port to a new flow.
/// The agent removes entries idle past `dataplane.snatIdleTimeout`.
pub const SNAT_REPLIES: &str = "SNAT_REPLIES";
/// Which service keys are installed, as a hint ([`crate::vip_filter`]).
pub const VIP_FILTER: &str = "VIP_FILTER";
/// `HashMap<LocalEndpointKey, LocalEndpoint>`: this node's endpoints, for DSR decapsulation.
pub const LOCAL_ENDPOINTS: &str = "LOCAL_ENDPOINTS";
/// `HashMap<EndpointKey, EndpointServices>`: this node's local-delivery endpoints → the
/// services that deliver to them, for translating their replies (see
/// [`crate::endpoint_services`]).
pub const ENDPOINT_SERVICES: &str = "ENDPOINT_SERVICES";
/// `PerCpuArray<PacketCounter>` indexed by backend id.
pub const BACKEND_STATS: &str = "BACKEND_STATS";
/// `Array<Settings>` with one entry.
pub const SETTINGS: &str = "SETTINGS";

/// The IPv6 maps, of the same shapes over IPv6 addresses ([`ServiceKey6`], [`Backend6`], …).
/// Backend ids index `BACKENDS6` and `BACKEND_STATS6`; rings live in the shared
/// [`MAGLEV_RINGS`] (ids from [`Address::RING_IDS`]); VIP slots index
/// [`crate::maps::VIP_TRAFFIC6`].
pub const SERVICES6: &str = "SERVICES6";
pub const BACKENDS6: &str = "BACKENDS6";
pub const BACKEND_STATS6: &str = "BACKEND_STATS6";
pub const FLOW_TABLE6: &str = "FLOW_TABLE6";
pub const FLOWS6: &str = "FLOWS6";
pub const NEXT_HOPS6: &str = "NEXT_HOPS6";
pub const REPLY_NAT6: &str = "REPLY_NAT6";
pub const SNAT_REPLIES6: &str = "SNAT_REPLIES6";
pub const VIP_FILTER6: &str = "VIP_FILTER6";
pub const LOCAL_ENDPOINTS6: &str = "LOCAL_ENDPOINTS6";
pub const ENDPOINT_SERVICES6: &str = "ENDPOINT_SERVICES6";
/// `HashMap<UplinkKey, Vip6Key>`: this node's IPv6 address on each uplink (as `UPLINKS` keys
/// them): the full-NAT source and the 6in6 outer source for IPv6 traffic leaving by it.
pub const UPLINK_ADDRS6: &str = "UPLINK_ADDRS6";
/// `ProgramArray` of [`IPV6_SERVICE_PROGRAMS`], each at its slot: the uplink program
/// tail-calls the first for IPv6 TCP, UDP and IPv6-in-IPv6, which tail-calls the others.
pub const IPV6_SERVICES: &str = "IPV6_SERVICES";
/// The IPv6 service path's programs, by `IPV6_SERVICES` slot: its entry (local delivery, DSR,
/// full NAT of established flows and full NAT's replies run inside it), full NAT with a port
/// claimed, and DSR's decapsulation (programs of their own, for stacks of their own). Slot 1
/// held earlier builds' local stage: the agent empties it; slot 3 held their DSR stage.
pub const IPV6_SERVICE_PROGRAMS: [(u32, &str); 3] =
    [(0, "lb_xdp6"), (2, "lb_xdp6_full_nat"), (3, "lb_xdp6_decap")];
/// `IPV6_SERVICES`' slots.
pub const IPV6_SERVICE_SLOTS: u32 = 4;

pub const MAX_SERVICES: u32 = 16_384;
/// Service numbers ([`Service::number`]) are 16 bits: no family holds more services.
pub const MAX_SERVICE_NUMBERS: u32 = 1 << 16;
pub const MAX_BACKENDS: u32 = 65_536;
pub const MAX_FLOWS: u32 = 262_144;
pub const MAX_LOCAL_ENDPOINTS: u32 = 65_536;
/// The largest Maglev ring, in slots: a prime, at least 100 × 655 backends. The inner-map
/// template has this size; each service's ring is created with its own (smaller, prime) size.
pub const MAX_RING_SIZE: u32 = 65_537;
/// A ring holds its slots (backend ids) two to an array element: the kernel stores elements
/// 8-byte aligned, so one `u32` per element would waste half of every ring.
pub type RingEntry = [u32; 2];
/// The array elements a ring of `slots` slots takes; slot `s` is `entry[s / 2][s % 2]`.
pub const fn ring_entries(slots: u32) -> u32 {
    slots.div_ceil(2)
}
/// `BPF_F_INNER_MAP` lets inner arrays of one outer map differ in size; `BPF_F_MMAPABLE` lets
/// the agent fill a ring with a memory copy instead of a system call per slot.
pub const INNER_MAP_FLAGS: u32 = BPF_F_INNER_MAP | BPF_F_MMAPABLE;
const BPF_F_INNER_MAP: u32 = 1 << 12;
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Bumped whenever a pinned map's layout changes, so an upgraded agent never reuses maps
/// pinned by an incompatible one; it is part of the pin directory's name.
///
/// - 2: rings are `BPF_F_MMAPABLE` arrays of slot pairs (the inner-map template changed);
///   owned VIPs carry a lease slot.
/// - 3: flows cache their next hop (`Flow` is 32 bytes); traffic per VIP is counted in the
///   `VIP_TRAFFIC` array, at the slot the service entry names.
/// - 4: the connection table is keyed by client and service number ([`ConnectionKeyOf`]) and
///   holds 8-byte entries; next hops are cached per backend (`NEXT_HOPS`). Later, still 4:
///   the one-line connection table ([`FLOW_TABLE`]) is a new map beside the others, and an
///   agent converts the [`FLOWS`] it replaces (so nothing else is re-created).
pub const LAYOUT_VERSION: u32 = 4;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IPIP: u8 = 4;
/// IPv6 in IPv6 (RFC 2473): DSR's encapsulation for IPv6 services.
pub const PROTO_IPV6: u8 = 41;
/// VRRP (RFC 5798 §5.1.1.4).
pub const PROTO_VRRP: u8 = 112;

/// An address exactly as the packet carries it: IPv4's four bytes or IPv6's sixteen. The
/// service types below are generic over it, so both families share one shape (and one piece of
/// code on each side of the map boundary), with maps of their own. They are 4-byte aligned
/// (their sizes are multiples of 4, so no padding comes of it): BPF has no unaligned loads, and
/// a byte-aligned IPv6 key is read a byte at a time, each byte spilled to the stack.
pub trait Address: Copy + Eq + Ord + core::hash::Hash + core::fmt::Debug + 'static {
    /// The unspecified address.
    const ZERO: Self;
    /// The family's first ring id in [`MAGLEV_RINGS`], which both families share: IPv4 rings
    /// take ids below 2^31, IPv6 rings the ids from 2^31 up.
    const RING_IDS: core::ops::Range<u32>;
    /// The family's service maps, by name.
    const MAPS: FamilyMaps;
    /// Mixes the address into the flow hash (see [`crate::hash`]).
    fn mix_into(&self, h: u32) -> u32;
    /// Whether the two are the same address; in BPF a word at a time, so both must lie
    /// 4-aligned, as in a key, a map value or a `#[repr(align(4))]` value (see [`crate::words`]:
    /// the verifier refuses a misaligned one on the stack).
    fn same(&self, other: &Self) -> bool;
    /// The address's words XORed into one: a cheap summary for hints (the VIP filter), never
    /// for a table's buckets, where a client could aim for collisions.
    fn fold(&self) -> u32;
    /// The address of this family, if `ip` is one.
    fn from_ip(ip: core::net::IpAddr) -> Option<Self>;
    fn to_ip(self) -> core::net::IpAddr;
}

/// The names of one family's service maps.
#[derive(Clone, Copy, Debug)]
pub struct FamilyMaps {
    pub services: &'static str,
    pub backends: &'static str,
    pub backend_stats: &'static str,
    pub next_hops: &'static str,
    pub vip_traffic: &'static str,
    pub local_endpoints: &'static str,
    pub endpoint_services: &'static str,
    pub snat_replies: &'static str,
    pub vip_filter: &'static str,
}

impl Address for [u8; 4] {
    const ZERO: Self = [0; 4];
    const RING_IDS: core::ops::Range<u32> = 1..1 << 31;
    const MAPS: FamilyMaps = FamilyMaps {
        services: SERVICES,
        backends: BACKENDS,
        backend_stats: BACKEND_STATS,
        next_hops: NEXT_HOPS,
        vip_traffic: crate::maps::VIP_TRAFFIC,
        local_endpoints: LOCAL_ENDPOINTS,
        endpoint_services: ENDPOINT_SERVICES,
        snat_replies: SNAT_REPLIES,
        vip_filter: VIP_FILTER,
    };
    fn from_ip(ip: core::net::IpAddr) -> Option<Self> {
        match ip {
            core::net::IpAddr::V4(v4) => Some(v4.octets()),
            core::net::IpAddr::V6(_) => None,
        }
    }
    fn to_ip(self) -> core::net::IpAddr {
        core::net::IpAddr::V4(self.into())
    }
    #[inline(always)]
    fn mix_into(&self, h: u32) -> u32 {
        crate::murmur3::mix(h, u32::from_be_bytes(*self))
    }
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        self == other
    }
    #[inline(always)]
    fn fold(&self) -> u32 {
        u32::from_be_bytes(*self)
    }
}

impl Address for [u8; 16] {
    const ZERO: Self = [0; 16];
    const RING_IDS: core::ops::Range<u32> = 1 << 31..u32::MAX;
    const MAPS: FamilyMaps = FamilyMaps {
        services: SERVICES6,
        backends: BACKENDS6,
        backend_stats: BACKEND_STATS6,
        next_hops: NEXT_HOPS6,
        vip_traffic: crate::maps::VIP_TRAFFIC6,
        local_endpoints: LOCAL_ENDPOINTS6,
        endpoint_services: ENDPOINT_SERVICES6,
        snat_replies: SNAT_REPLIES6,
        vip_filter: VIP_FILTER6,
    };
    fn from_ip(ip: core::net::IpAddr) -> Option<Self> {
        match ip {
            core::net::IpAddr::V6(v6) => Some(v6.octets()),
            core::net::IpAddr::V4(_) => None,
        }
    }
    fn to_ip(self) -> core::net::IpAddr {
        core::net::IpAddr::V6(self.into())
    }
    #[inline(always)]
    fn mix_into(&self, h: u32) -> u32 {
        crate::words::be_words(self).into_iter().fold(h, crate::murmur3::mix)
    }
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        crate::words::same(self, other)
    }
    #[inline(always)]
    fn fold(&self) -> u32 {
        let [w0, w1, w2, w3] = crate::words::be_words(self);
        w0 ^ w1 ^ w2 ^ w3
    }
}

/// An IPv4 address in network byte order.
pub type Addr4 = [u8; 4];
/// An IPv6 address in network byte order.
pub type Addr6 = [u8; 16];

#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKeyOf<A> {
    pub vip: A,
    pub port: [u8; 2],
    pub proto: u8,
    pub _pad: u8,
}

/// An IPv4 service: `(VIP, port, protocol)`.
pub type ServiceKey = ServiceKeyOf<Addr4>;
/// An IPv6 service.
pub type ServiceKey6 = ServiceKeyOf<Addr6>;

impl<A> ServiceKeyOf<A> {
    pub const fn new(vip: A, port: u16, proto: u8) -> Self {
        Self { vip, port: port.to_be_bytes(), proto, _pad: 0 }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    /// Key of this service's current ring in [`MAGLEV_RINGS`].
    pub ring_id: u32,
    /// Entries in that ring (prime).
    pub ring_size: u32,
    /// Zero when the service has no usable endpoint: its packets are dropped and counted.
    pub backend_count: u32,
    /// A digest of the ring's content, so a restarted agent can tell whether a pinned ring is
    /// current without reading it back.
    pub ring_digest: u32,
    /// The VIP's counter slot in `VIP_TRAFFIC` (the low 24 bits), shared by every service of
    /// the VIP, and the uplink the VIP is served on (the high 8 bits; see
    /// [`crate::maps::UPLINKS`]): traffic arriving on another uplink is left to the kernel.
    /// [`crate::maps::ANY_UPLINK`] on a single-uplink node. One word, read with one load on
    /// the hot path. (Layout 3 held the slot alone here, below 2^24: its entries read as any
    /// uplink.)
    pub vip_slot_uplink: u32,
    /// The service's number in the connection table's keys ([`ConnectionKeyOf`]), kept while
    /// the service is installed and given to another service only late (as backend slots are).
    pub number: u16,
    /// [`Service::REPLIES_BY_TABLE`], or zero.
    pub flags: u8,
    pub _pad: u8,
}

impl Service {
    /// The service is listed in `ENDPOINT_SERVICES` for each of its local endpoints, so their
    /// replies are translated from the connection table: local delivery writes no `REPLY_NAT`
    /// entry. Clear (as in every entry of an earlier build) it writes one, as before.
    pub const REPLIES_BY_TABLE: u8 = 1;

    /// Whether [`Service::REPLIES_BY_TABLE`] is set.
    #[inline(always)]
    pub const fn replies_by_table(&self) -> bool {
        self.flags & Self::REPLIES_BY_TABLE != 0
    }

    /// The largest VIP slot plus one.
    pub const VIP_SLOTS: u32 = 1 << 24;

    /// The VIP's counter slot.
    #[inline(always)]
    pub const fn vip_slot(&self) -> u32 {
        self.vip_slot_uplink & (Self::VIP_SLOTS - 1)
    }

    /// The uplink the VIP is served on.
    #[inline(always)]
    pub const fn uplink(&self) -> u8 {
        (self.vip_slot_uplink >> 24) as u8
    }

    /// [`Service::vip_slot_uplink`] for `slot` (below [`Service::VIP_SLOTS`]) and `uplink`.
    pub const fn pack_vip_slot(slot: u32, uplink: u8) -> u32 {
        (slot & (Self::VIP_SLOTS - 1)) | ((uplink as u32) << 24)
    }
}

/// How a backend is reached from this node. Zero is no delivery: an unused [`BACKENDS`] slot
/// (arrays start zeroed), which the program never forwards to.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Delivery {
    /// A pod on this node: DNAT, then redirect to its host-side interface.
    Local = 1,
    /// A pod elsewhere, kube-proxy Cluster semantics: DNAT and SNAT to this node's address.
    FullNat = 2,
    /// A pod elsewhere, direct server return: IPIP to the pod, decapsulated on its node.
    Dsr = 3,
}

impl Delivery {
    pub const fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Delivery::Local),
            2 => Some(Delivery::FullNat),
            3 => Some(Delivery::Dsr),
            _ => None,
        }
    }

    pub const fn label(self) -> &'static str {
        match self {
            Delivery::Local => "local",
            Delivery::FullNat => "full_nat",
            Delivery::Dsr => "dsr",
        }
    }
}

#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendOf<A> {
    pub addr: A,
    pub port: [u8; 2],
    /// A [`Delivery`], or zero for an unused slot.
    pub delivery: u8,
    pub _pad: u8,
    /// The endpoint's node address, IPv4 in both families (informational for the program;
    /// metrics and `status`).
    pub node: [u8; 4],
}

/// An IPv4 endpoint, in `BACKENDS`.
pub type Backend = BackendOf<Addr4>;
/// An IPv6 endpoint, in `BACKENDS6`.
pub type Backend6 = BackendOf<Addr6>;

impl<A: Address> BackendOf<A> {
    /// An unused slot.
    pub const EMPTY: Self = Self { addr: A::ZERO, port: [0; 2], delivery: 0, _pad: 0, node: [0; 4] };
}

/// A 5-tuple in the direction the packet travels.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKeyOf<A> {
    pub src: A,
    pub dst: A,
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub proto: u8,
    pub _pad: [u8; 3],
}

pub type FlowKey = FlowKeyOf<Addr4>;
pub type FlowKey6 = FlowKeyOf<Addr6>;

impl<A> FlowKeyOf<A> {
    pub const fn new(src: A, dst: A, sport: [u8; 2], dport: [u8; 2], proto: u8) -> Self {
        Self { src, dst, sport, dport, proto, _pad: [0; 3] }
    }
}

/// A flow as the connection table keys it: its client's address and port, and its service's
/// [`Service::number`] (which stands for the VIP, port and protocol). Eight bytes for IPv4,
/// so that a table element (the kernel's 48-byte header, key and [`Flow`]) is one cache line:
/// with many flows a lookup costs the bucket's line and the element's, not three lines.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionKeyOf<A> {
    pub client: A,
    pub client_port: [u8; 2],
    pub service: u16,
}

pub type ConnectionKey = ConnectionKeyOf<Addr4>;
pub type ConnectionKey6 = ConnectionKeyOf<Addr6>;

impl<A: Copy> ConnectionKeyOf<A> {
    /// `flow`'s key, its destination being the service numbered `service`.
    #[inline(always)]
    pub fn of(flow: &FlowKeyOf<A>, service: u16) -> Self {
        Self { client: flow.src, client_port: flow.sport, service }
    }
}

/// An entry of [`FLOWS`], the kernel-hash connection table before [`FLOW_TABLE`]: read to
/// convert an earlier build's flows, and the value of the bench's kernel-hash yardstick.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub backend: u32,
    /// Full-NAT only: the source port this flow uses towards the backend.
    pub snat_port: [u8; 2],
    /// When the flow last did its periodic checks, in units of 2^24 ns.
    pub checked: u16,
}

/// How long a cached next hop ([`NextHopEntry`]) is used before the FIB is asked again, so a
/// neighbour or route change is followed within that long, never trusted forever.
pub const HOP_REFRESH_NS: u64 = 500_000_000;

/// The next hop towards a backend (its address, or its node's for DSR), as the FIB gave it:
/// shared by every flow to that backend, refreshed after [`HOP_REFRESH_NS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHopEntry {
    /// Zero: nothing cached.
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// The largest IP packet the hop takes (the FIB's MTU); a bigger one is looked up again,
    /// so the FIB reports it.
    pub mtu: u16,
    pub _pad: [u8; 6],
    /// `bpf_ktime_get_coarse_ns` when the hop was looked up.
    pub checked_ns: u64,
}

/// The addresses a packet must carry after translation (also the rewrite target on the
/// forward path).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyNatOf<A> {
    pub src: A,
    pub dst: A,
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    /// Full-NAT: the MAC the client's packets came from, so a reply can go back that way even
    /// when the kernel has no neighbour entry for the client (XDP answered its ARP, so the
    /// kernel never learnt it). Zero when unknown.
    pub peer_mac: [u8; 6],
    /// Full-NAT: the 802.1Q VLAN the client's packets came on (host order), zero untagged. A
    /// tagged client's replies go back the way it came, tagged: no route leads onto a VLAN
    /// without a device.
    pub peer_vlan: u16,
}

/// A full-NAT source port's owner: how its replies are translated, and when its flow last
/// refreshed it (`bpf_ktime_get_coarse_ns`, at the flow's next-hop refreshes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatEntryOf<A> {
    pub reply: ReplyNatOf<A>,
    /// The interface a tagged client's packets arrived by (`reply.peer_vlan`), zero otherwise.
    pub peer_ifindex: u32,
    pub last_seen_ns: u64,
}

pub type ReplyNat = ReplyNatOf<Addr4>;
pub type ReplyNat6 = ReplyNatOf<Addr6>;
pub type SnatEntry = SnatEntryOf<Addr4>;
pub type SnatEntry6 = SnatEntryOf<Addr6>;

impl<A: Address> SnatEntryOf<A> {
    /// Whether this entry is `flow`'s: its replies go back to `flow`'s client from its VIP.
    pub fn belongs_to(&self, flow: &FlowKeyOf<A>) -> bool {
        let r = &self.reply;
        r.src.same(&flow.dst) && r.dst.same(&flow.src) && r.sport == flow.dport && r.dport == flow.sport
    }
}

impl<A> ReplyNatOf<A> {
    pub const fn new(src: A, dst: A, sport: [u8; 2], dport: [u8; 2]) -> Self {
        Self { src, dst, sport, dport, peer_mac: [0; 6], peer_vlan: 0 }
    }
}

impl<A: Address> ReplyNatOf<A> {
    /// `==`, with the addresses compared as [`Address::same`] does (so both must lie
    /// 4-aligned, as a map value or a value of this type does).
    #[inline(always)]
    pub fn same(&self, other: &Self) -> bool {
        self.src.same(&other.src)
            && self.dst.same(&other.dst)
            && self.sport == other.sport
            && self.dport == other.dport
            && self.peer_mac == other.peer_mac
            && self.peer_vlan == other.peer_vlan
    }
}

#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalEndpointKeyOf<A> {
    pub service: ServiceKeyOf<A>,
    pub addr: A,
}

pub type LocalEndpointKey = LocalEndpointKeyOf<Addr4>;
pub type LocalEndpointKey6 = LocalEndpointKeyOf<Addr6>;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalEndpoint {
    pub target_port: [u8; 2],
    pub _pad: [u8; 2],
}

/// Node-wide settings for the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// This node's address on the uplink: the full-NAT source and the IPIP outer source.
    pub node_addr: [u8; 4],
    /// Full-NAT source ports, inclusive, host byte order. Kept outside the kernel's
    /// `ip_local_port_range` so translated flows never collide with local sockets.
    pub snat_port_min: u16,
    pub snat_port_max: u16,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: `#[repr(C)]`, integers and byte arrays only, every padding byte explicit (for
    // both address sizes: the layout test checks them).
    unsafe impl<A: Address> aya::Pod for ServiceKeyOf<A> {}
    unsafe impl aya::Pod for Service {}
    unsafe impl<A: Address> aya::Pod for BackendOf<A> {}
    unsafe impl<A: Address> aya::Pod for FlowKeyOf<A> {}
    unsafe impl aya::Pod for Flow {}
    unsafe impl<A: Address> aya::Pod for ConnectionKeyOf<A> {}
    unsafe impl aya::Pod for NextHopEntry {}
    unsafe impl<A: Address> aya::Pod for ReplyNatOf<A> {}
    unsafe impl<A: Address> aya::Pod for SnatEntryOf<A> {}
    unsafe impl<A: Address> aya::Pod for LocalEndpointKeyOf<A> {}
    unsafe impl aya::Pod for LocalEndpoint {}
    unsafe impl aya::Pod for Settings {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<ServiceKey>(), 8);
        assert_eq!(size_of::<Service>(), 24);
        assert_eq!(size_of::<Backend>(), 12);
        assert_eq!(size_of::<FlowKey>(), 16);
        assert_eq!(size_of::<Flow>(), 8);
        assert_eq!(size_of::<ConnectionKey>(), 8);
        assert_eq!(size_of::<ConnectionKey6>(), 20);
        assert_eq!((size_of::<NextHopEntry>(), core::mem::align_of::<NextHopEntry>()), (32, 8));
        assert_eq!(size_of::<ReplyNat>(), 20);
        assert_eq!((size_of::<SnatEntry>(), core::mem::align_of::<SnatEntry>()), (32, 8));
        assert_eq!(size_of::<LocalEndpointKey>(), 12);
        assert_eq!(size_of::<LocalEndpoint>(), 4);
        assert_eq!(size_of::<Settings>(), 8);
        assert_eq!(size_of::<ServiceKey6>(), 20);
        assert_eq!(size_of::<Backend6>(), 24);
        assert_eq!(size_of::<FlowKey6>(), 40);
        assert_eq!(size_of::<ReplyNat6>(), 44);
        assert_eq!((size_of::<SnatEntry6>(), core::mem::align_of::<SnatEntry6>()), (56, 8));
        assert_eq!(size_of::<LocalEndpointKey6>(), 36);
    }

    #[test]
    fn delivery_round_trips() {
        for d in [Delivery::Local, Delivery::FullNat, Delivery::Dsr] {
            assert_eq!(Delivery::from_u8(d as u8), Some(d));
        }
        assert_eq!(Delivery::from_u8(0), None);
        assert_eq!(Delivery::from_u8(4), None);
    }
}

/// Benchmark instruments in the same object (`bench_*` programs): never used by the agent.
pub mod bench {
    /// `Array<BenchConfig>` with one entry.
    pub const BENCH_CONFIG: &str = "BENCH_CONFIG";
    /// `PerCpuArray<u64>` with one entry: packets seen by `bench_sink`.
    pub const BENCH_COUNT: &str = "BENCH_COUNT";
    /// The stateful yardsticks' connection tables, sized for `MAX_FLOWS` in the object: the
    /// kernel's LRU hash (`bench_dnat_table`) and `flow_table`'s buckets (`bench_dnat_line`).
    /// The agent loads the same object and creates every map in it, so it makes these one entry
    /// each (the LRU hash alone is some 20 MiB of kernel memory, never used by the agent).
    pub const BENCH_TABLES: [&str; 3] = ["BENCH_FLOWS", "BENCH_LINE_TABLE", BENCH_SHARDS];
    /// `ArrayOfMaps` of `flow_table::Shard` arrays (one element each) for `bench_dnat_shard`,
    /// filled by the bench.
    pub const BENCH_SHARDS: &str = "BENCH_SHARDS";

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct BenchConfig {
        /// `bench_gen`: source ports cycle through this many values (1 = one flow).
        pub flows: u32,
        /// `bench_dnat`: the interface to redirect to.
        pub ifindex: u32,
        /// `bench_dnat`: match `vip:port` (UDP), rewrite to `target:target_port`.
        pub vip: [u8; 4],
        pub target: [u8; 4],
        pub port: [u8; 2],
        pub target_port: [u8; 2],
        pub smac: [u8; 6],
        pub dmac: [u8; 6],
    }

    #[cfg(feature = "user")]
    // SAFETY: `#[repr(C)]`, integers and byte arrays, no padding (36 bytes).
    unsafe impl aya::Pod for BenchConfig {}
}
