//! BPF map names, keys and values.
//!
//! Map names are the symbol names in the BPF object; the agent looks maps up by these constants
//! so a rename cannot silently split the two sides.

/// `HashMap<VipKey, OwnedVip>`: the IPv4 VIPs this node currently answers for.
pub const OWNED_VIPS: &str = "OWNED_VIPS";
/// `HashMap<Vip6Key, OwnedVip>`: the IPv6 VIPs this node currently answers for (NDP, echo).
pub const OWNED_VIPS6: &str = "OWNED_VIPS6";
/// `Array<u64>` indexed by lease slot: until when (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) the
/// VIPs holding that lease may be claimed. See [`OwnedVip::lease`].
pub const VIP_LEASES: &str = "VIP_LEASES";
/// `PerCpuHashMap<VipKey, VipStats>`: per-VIP ARP counters, kept while the VIP is configured.
pub const VIP_STATS: &str = "VIP_STATS";
/// `PerCpuHashMap<Vip6Key, VipStats>`: per-VIP Neighbor Advertisements (counted in
/// `arp_replies`), kept while the IPv6 VIP is configured.
pub const VIP_STATS6: &str = "VIP_STATS6";
/// `PerCpuArray<PacketCounter>` indexed by a VIP's slot (`Service::vip_slot`, the same for all
/// of a VIP's services): packets and bytes to the VIP's services. An array, so the hot path
/// counts without a hash lookup; the agent maps slots back to VIPs.
pub const VIP_TRAFFIC: &str = "VIP_TRAFFIC";
/// The same for IPv6 VIPs, indexed by their services' slots.
pub const VIP_TRAFFIC6: &str = "VIP_TRAFFIC6";
/// `PerCpuArray<PacketCounter>` indexed by the XDP action code (`XDP_ABORTED` = 0 … `XDP_REDIRECT` = 4).
pub const ACTION_STATS: &str = "ACTION_STATS";
/// `PerCpuArray<PacketCounter>` indexed by [`crate::counters::Reason`].
pub const REASON_STATS: &str = "REASON_STATS";

/// `HashMap<UplinkKey, Uplink>`: the interfaces the program serves VIPs on, as a frame arrives
/// (the attach point's ifindex and its 802.1Q tag) and as the FIB names an egress (the
/// device's own ifindex, untagged): the uplink's slot and this node's address there.
pub const UPLINKS: &str = "UPLINKS";

/// Capacity of [`UPLINKS`]: two keys per uplink (arrival and egress) and room for many.
pub const MAX_UPLINK_KEYS: u32 = 512;

/// `Array<VlanSlot>` indexed by 802.1Q VLAN id: the uplink a VLAN's tagged frames arrive on,
/// for one parent per VLAN id (the lowest ifindex where several share one; the others are
/// found in [`UPLINKS`]). An array lookup costs the tagged path less than the hash's.
pub const VLAN_SLOTS: &str = "VLAN_SLOTS";

/// `HashMap<UplinkKey, Vip6Key>`: this node's IPv6 VRRP address (its link-local, the group's
/// `address6`) on each uplink, keyed by arrival as [`UPLINKS`] is. An advertisement arriving
/// there with it comes from another host: unlike IPv4's, an IPv6 source of our own is no
/// martian the kernel drops, and the router discards it as its own advert, so only XDP can
/// count it. Per link, since a link-local address means something on its link alone.
pub const VRRP_OWN6: &str = "VRRP_OWN6";

/// [`VLAN_SLOTS`]'s size: every 12-bit VLAN id.
pub const VLAN_IDS: u32 = 4096;

/// A VLAN's uplink on one parent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VlanSlot {
    /// The parent's ifindex; zero: no uplink (no interface has ifindex 0).
    pub ifindex: u32,
    pub slot: u8,
    pub _pad: [u8; 3],
}

/// The uplink slot of an owned VIP or a service that is served on whatever interface the
/// program runs on: written on a node with a single uplink, where the check would only cost.
pub const ANY_UPLINK: u8 = 0;

/// `LruHashMap<VipKey, VrrpSpeaker>`: each IPv4 source of VRRP advertisements on the uplink,
/// with the MAC they came from.
pub const VRRP_SPEAKERS: &str = "VRRP_SPEAKERS";

/// `LruHashMap<Vip6Key, VrrpSpeaker>`: the same for IPv6 sources (members' link-local
/// addresses, usually).
pub const VRRP_SPEAKERS6: &str = "VRRP_SPEAKERS6";

/// Capacity of [`VRRP_SPEAKERS`] (and [`VRRP_SPEAKERS6`]): spoofed sources only evict the
/// least recently heard.
pub const MAX_VRRP_SPEAKERS: u32 = 1024;

/// Capacity of [`OWNED_VIPS`], [`VIP_STATS`] and [`VIP_TRAFFIC`]. A group holds at most 10,000 VIPs; this leaves
/// room for several groups on one uplink.
pub const MAX_VIPS: u32 = 65_536;

/// Capacity of [`VIP_LEASES`]: slot 0 is "no lease", slots 1–255 the IPv4 VRIDs; the rest is
/// room for the IPv6 VRIDs (256 + VRID).
pub const MAX_LEASES: u32 = 512;

/// An IPv4 address in network byte order, exactly as it appears in the packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VipKey {
    pub addr: [u8; 4],
}

impl VipKey {
    pub const fn new(addr: [u8; 4]) -> Self {
        Self { addr }
    }
}

/// An IPv6 address, exactly as it appears in the packet; 4-aligned, so the XDP program reads
/// it a word at a time (see [`crate::words`]).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip6Key {
    pub addr: [u8; 16],
}

impl Vip6Key {
    pub const fn new(addr: [u8; 16]) -> Self {
        Self { addr }
    }
}

/// What the XDP program needs to answer for an owned VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnedVip {
    /// The MAC that ARP replies carry: the uplink's, or a virtual MAC.
    pub mac: [u8; 6],
    /// [`OwnedVip::KERNEL_TOO`], [`OwnedVip::ROUTED`], or zero.
    pub flags: u8,
    /// The uplink slot the VIP is answered on ([`UPLINKS`]); [`ANY_UPLINK`] answers on any
    /// interface the program runs on (layout 3 wrote zero padding here, which reads so).
    pub uplink: u8,
    /// The [`VIP_LEASES`] slot whose deadline bounds this claim (the VRRP instance's), or
    /// [`OwnedVip::NO_LEASE`] for a VIP owned without VRRP. Past the deadline the program
    /// stops answering ARP and ping for the VIP (a dead or frozen agent gives it up) but
    /// keeps forwarding to it, for clients whose ARP cache still points here.
    pub lease: u16,
}

impl OwnedVip {
    /// The kernel also holds the address (VIP mode `both`): traffic to ports no service
    /// exposes goes to the kernel's own sockets instead of being dropped.
    pub const KERNEL_TOO: u8 = 1;

    /// Routed here by the fabric (BGP): served, never answered for by ARP or NDP, which would
    /// make every node that serves it claim it on the segment at once.
    pub const ROUTED: u8 = 2;

    /// Claimed for as long as the entry exists.
    pub const NO_LEASE: u16 = 0;

    pub const fn new(mac: [u8; 6]) -> Self {
        Self { mac, flags: 0, uplink: ANY_UPLINK, lease: Self::NO_LEASE }
    }

    pub const fn with_kernel(mac: [u8; 6]) -> Self {
        Self { mac, flags: Self::KERNEL_TOO, uplink: ANY_UPLINK, lease: Self::NO_LEASE }
    }

    /// The same claim, answered only on uplink slot `uplink`.
    pub const fn on_uplink(self, uplink: u8) -> Self {
        Self { uplink, ..self }
    }

    /// The same claim, bounded by lease slot `lease`.
    pub const fn with_lease(self, lease: u16) -> Self {
        Self { lease, ..self }
    }

    /// The same claim, routed rather than answered for (see [`OwnedVip::ROUTED`]).
    pub const fn routed(self) -> Self {
        Self { flags: self.flags | Self::ROUTED, ..self }
    }

    pub const fn kernel_too(&self) -> bool {
        self.flags & Self::KERNEL_TOO != 0
    }

    pub const fn is_routed(&self) -> bool {
        self.flags & Self::ROUTED != 0
    }
}

/// Where a frame arrived, or which device the FIB chose for one to leave by.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UplinkKey {
    pub ifindex: u32,
    /// The 802.1Q VLAN id the frame carried on `ifindex` (host byte order), zero untagged.
    pub vlan: u16,
    pub _pad: u16,
}

impl UplinkKey {
    pub const fn new(ifindex: u32, vlan: u16) -> Self {
        Self { ifindex, vlan, _pad: 0 }
    }
}

/// An uplink as the program needs it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uplink {
    /// This node's address there: the full-NAT source and the IPIP outer source for traffic
    /// leaving by it, and the address whose VRRP advertisements are this node's own.
    pub source: [u8; 4],
    /// The interface's MAC: the source of frames sent out of it without a FIB answer.
    pub mac: [u8; 6],
    /// The slot owned VIPs and services name (never [`ANY_UPLINK`]).
    pub slot: u8,
    pub _pad: u8,
}

/// Per-VIP counters of the ARP path, or for an IPv6 VIP of Neighbor Discovery (one copy per
/// CPU; userspace sums them). Traffic to the VIP's services is in [`VIP_TRAFFIC`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipStats {
    pub arp_replies: u64,
}

/// Packets and bytes, one copy per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketCounter {
    pub packets: u64,
    pub bytes: u64,
}

/// A source of VRRP advertisements as the XDP program saw it. Its MAC is learned from its
/// advertisements and stays learned while it is live (three of its advertised intervals);
/// advertisements with its address from another MAC meanwhile are counted, the last such MAC
/// kept, for the agent to report.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VrrpSpeaker {
    pub mac: [u8; 6],
    /// The last other MAC heard with this address while `mac` was live.
    pub other_mac: [u8; 6],
    pub _pad: [u8; 4],
    /// Until when (`bpf_ktime_get_ns`) `mac` is this address's.
    pub live_until_ns: u64,
    /// Advertisements with this address from another MAC while `mac` was live.
    pub other_mac_adverts: u64,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all are `#[repr(C)]`, made only of integers and byte arrays, with every
    // padding byte spelled out, so any bit pattern is valid and none is uninitialised.
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for Vip6Key {}
    unsafe impl aya::Pod for OwnedVip {}
    unsafe impl aya::Pod for VipStats {}
    unsafe impl aya::Pod for PacketCounter {}
    unsafe impl aya::Pod for VrrpSpeaker {}
    unsafe impl aya::Pod for UplinkKey {}
    unsafe impl aya::Pod for Uplink {}
    unsafe impl aya::Pod for VlanSlot {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<VipKey>(), 4);
        assert_eq!(size_of::<Vip6Key>(), 16);
        assert_eq!(size_of::<OwnedVip>(), 10);
        assert_eq!(align_of::<OwnedVip>(), 2);
        assert_eq!(size_of::<VipStats>(), 8);
        assert_eq!(size_of::<PacketCounter>(), 16);
        assert_eq!(size_of::<VrrpSpeaker>(), 32);
        assert_eq!(align_of::<VrrpSpeaker>(), 8);
        assert_eq!(size_of::<UplinkKey>(), 8);
        assert_eq!(size_of::<Uplink>(), 12);
        assert_eq!(size_of::<VlanSlot>(), 8);
    }
}
