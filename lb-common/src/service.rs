//! Service forwarding maps: what the XDP program steers and how.
//!
//! A packet to `(VIP, port, protocol)` finds its [`Service`]; an established flow finds its
//! backend in [`FLOWS`], a new one through the service's Maglev ring, an array of backend ids
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
/// `LruHashMap<FlowKey, Flow>`: client flow → chosen backend.
pub const FLOWS: &str = "FLOWS";
/// `LruHashMap<FlowKey, ReplyNat>`: reply flow (as it leaves the backend) → rewritten addresses,
/// for local and DSR delivery (and, from before `SNAT_REPLIES`, full NAT's).
pub const REPLY_NAT: &str = "REPLY_NAT";
/// `HashMap<FlowKey, SnatEntry>`: full NAT's reply flow (backend → this node's source port) →
/// rewritten addresses. Not an LRU: a flood of new flows fills it and is then refused source
/// ports, where an LRU would evict an established flow's entry and hand its port to a new flow.
/// The agent removes entries idle past `dataplane.snatIdleTimeout`.
pub const SNAT_REPLIES: &str = "SNAT_REPLIES";
/// `HashMap<LocalEndpointKey, LocalEndpoint>`: this node's endpoints, for DSR decapsulation.
pub const LOCAL_ENDPOINTS: &str = "LOCAL_ENDPOINTS";
/// `PerCpuArray<PacketCounter>` indexed by backend id.
pub const BACKEND_STATS: &str = "BACKEND_STATS";
/// `Array<Settings>` with one entry.
pub const SETTINGS: &str = "SETTINGS";

pub const MAX_SERVICES: u32 = 16_384;
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
pub const LAYOUT_VERSION: u32 = 3;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IPIP: u8 = 4;
/// VRRP (RFC 5798 §5.1.1.4).
pub const PROTO_VRRP: u8 = 112;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub vip: [u8; 4],
    pub port: [u8; 2],
    pub proto: u8,
    pub _pad: u8,
}

impl ServiceKey {
    pub const fn new(vip: [u8; 4], port: u16, proto: u8) -> Self {
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
}

impl Service {
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

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: [u8; 4],
    pub port: [u8; 2],
    /// A [`Delivery`], or zero for an unused slot.
    pub delivery: u8,
    pub _pad: u8,
    /// The endpoint's node address (informational for the program; metrics and `status`).
    pub node: [u8; 4],
}

/// A 5-tuple in the direction the packet travels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub proto: u8,
    pub _pad: [u8; 3],
}

impl FlowKey {
    pub const fn new(src: [u8; 4], dst: [u8; 4], sport: [u8; 2], dport: [u8; 2], proto: u8) -> Self {
        Self { src, dst, sport, dport, proto, _pad: [0; 3] }
    }
}

/// A flow's backend, and the next hop towards it as the FIB gave it: established flows skip
/// `bpf_fib_lookup` until [`HOP_REFRESH_NS`] has passed, so a neighbour or route change is
/// followed within that long, never trusted forever.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub backend: u32,
    /// Full-NAT only: the source port this flow uses towards the backend.
    pub snat_port: [u8; 2],
    /// The largest IP packet the hop takes (the FIB's MTU); a bigger one is looked up again,
    /// so the FIB reports it.
    pub hop_mtu: u16,
    pub hop_smac: [u8; 6],
    pub hop_dmac: [u8; 6],
    /// Zero: no hop cached.
    pub hop_ifindex: u32,
    /// `bpf_ktime_get_coarse_ns` when the hop was looked up.
    pub hop_checked_ns: u64,
}

/// How long a flow's cached next hop is used before the FIB is asked again.
pub const HOP_REFRESH_NS: u64 = 500_000_000;

/// The addresses a packet must carry after translation (also the rewrite target on the
/// forward path).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyNat {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    /// Full-NAT: the MAC the client's packets came from, so a reply can go back that way even
    /// when the kernel has no neighbour entry for the client (XDP answered its ARP, so the
    /// kernel never learnt it). Zero when unknown.
    pub peer_mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// A full-NAT source port's owner: how its replies are translated, and when its flow last
/// refreshed it (`bpf_ktime_get_coarse_ns`, at the flow's next-hop refreshes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatEntry {
    pub reply: ReplyNat,
    pub _pad: [u8; 4],
    pub last_seen_ns: u64,
}

impl SnatEntry {
    /// Whether this entry is `flow`'s: its replies go back to `flow`'s client from its VIP.
    pub fn belongs_to(&self, flow: &FlowKey) -> bool {
        let r = &self.reply;
        r.src == flow.dst && r.dst == flow.src && r.sport == flow.dport && r.dport == flow.sport
    }
}

impl ReplyNat {
    pub const fn new(src: [u8; 4], dst: [u8; 4], sport: [u8; 2], dport: [u8; 2]) -> Self {
        Self { src, dst, sport, dport, peer_mac: [0; 6], _pad: [0; 2] }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalEndpointKey {
    pub service: ServiceKey,
    pub addr: [u8; 4],
}

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
    // SAFETY: `#[repr(C)]`, integers and byte arrays only, every padding byte explicit.
    unsafe impl aya::Pod for ServiceKey {}
    unsafe impl aya::Pod for Service {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for Flow {}
    unsafe impl aya::Pod for ReplyNat {}
    unsafe impl aya::Pod for SnatEntry {}
    unsafe impl aya::Pod for LocalEndpointKey {}
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
        assert_eq!(size_of::<Service>(), 20);
        assert_eq!(size_of::<Backend>(), 12);
        assert_eq!(size_of::<FlowKey>(), 16);
        assert_eq!(size_of::<Flow>(), 32);
        assert_eq!(size_of::<ReplyNat>(), 20);
        assert_eq!((size_of::<SnatEntry>(), core::mem::align_of::<SnatEntry>()), (32, 8));
        assert_eq!(size_of::<LocalEndpointKey>(), 12);
        assert_eq!(size_of::<LocalEndpoint>(), 4);
        assert_eq!(size_of::<Settings>(), 8);
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
