//! Why the XDP program did what it did: indices into the `REASON_STATS` per-CPU array.
//!
//! The action counters are indexed by the kernel's own XDP action codes; these reasons say which
//! path a packet took, so an operator can tell a malformed flood from ordinary pass-through.

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Shorter than an Ethernet header.
    MalformedEthernet = 0,
    /// An Ethernet/IPv4 ARP frame that is truncated, has impossible address lengths, or comes
    /// from a multicast/broadcast sender.
    MalformedArp = 1,
    /// ARP request for an owned VIP, answered with `XDP_TX`.
    ArpReplied = 2,
    /// ARP request for an address this node does not own: left to the kernel.
    ArpNotOwned = 3,
    /// ARP that is not a request we answer: replies, gratuitous announcements, other
    /// hardware or protocol types.
    ArpIgnored = 4,
    /// Neither ARP, IPv4 nor IPv6 (VLAN-tagged, other EtherTypes): left to the kernel.
    NotIp = 5,
    /// IPv4 that is truncated, not version 4, has a header length under 20 bytes or a total
    /// length that disagrees with the frame: left to the kernel, which drops it.
    MalformedIpv4 = 6,
    /// IPv4 not addressed to a service, an owned VIP or a translated flow: left to the kernel.
    Ipv4Passed = 7,
    /// To a service, but with IP options: left to the kernel rather than parsed.
    IpOptions = 8,
    /// To a service, but a fragment, whose ports cannot be read: left to the kernel.
    Fragment = 9,
    /// To a service, but the TCP/UDP header is truncated: dropped.
    MalformedL4 = 10,
    /// Translated to an endpoint on this node and redirected to it.
    ForwardedLocal = 11,
    /// Translated (destination and source) to an endpoint on another node.
    ForwardedFullNat = 12,
    /// Encapsulated (IPIP) to an endpoint on another node, which replies directly.
    ForwardedDsr = 13,
    /// An IPIP packet from a load-balancing node, decapsulated for a local endpoint.
    DsrDecapsulated = 14,
    /// A full-NAT reply from an endpoint, translated back and sent to the client.
    ReplyTranslated = 15,
    /// ICMP or ICMPv6 echo request to an owned VIP, answered.
    IcmpEchoReplied = 16,
    /// To an owned VIP, but no service on that port and protocol: dropped.
    UnexposedPort = 17,
    /// To a service with no usable endpoint: dropped.
    NoBackend = 18,
    /// TTL would reach zero: left to the kernel, which sends ICMP time exceeded.
    TtlExpired = 19,
    /// No free full-NAT source port towards the chosen backend: dropped.
    SnatPortsExhausted = 20,
    /// The next hop's MAC is not resolved yet: left to the kernel, untranslated.
    NoNeighbor = 21,
    /// The route lookup failed (no route, forwarding disabled, unreachable): left to the kernel.
    NoRoute = 22,
    /// Encapsulation would exceed the uplink MTU: dropped (IPv4), or answered with ICMPv6
    /// Packet Too Big (IPv6).
    TooBig = 23,
    /// IPIP to a local endpoint whose inner packet is malformed or for no known service: dropped.
    BadDecapsulation = 24,
    /// ARP or ICMP echo for an owned VIP whose lease has run out (its agent is dead or
    /// frozen): dropped, so that only the new master claims the VIP.
    LeaseExpired = 25,
    /// To an owned VIP or a service, but on another interface than the VIP's group's: left
    /// to the kernel, as for an address this node does not serve there (an ARP request for a
    /// VIP the kernel holds too is dropped instead, or the kernel would answer it there).
    WrongInterface = 26,
    /// Neighbor Solicitation for an owned IPv6 VIP, answered with an advertisement.
    NdpAdvertised = 27,
    /// Neighbor Solicitation for an address this node does not own: left to the kernel.
    NdpNotOwned = 28,
    /// Neighbor Solicitation that fails RFC 4861 §7.1.1 (hop limit, code, length, options,
    /// checksum, target, sender): never answered, left to the kernel (which drops it).
    MalformedNdp = 29,
    /// IPv6 that is truncated, not version 6, or whose payload length disagrees with the
    /// frame: left to the kernel, which drops it.
    MalformedIpv6 = 30,
    /// IPv6 not addressed to an owned VIP, or not a message answered here: left to the kernel.
    Ipv6Passed = 31,
    /// To an IPv6 service, but with extension headers before TCP/UDP (hop-by-hop, routing,
    /// destination options…): left to the kernel rather than parsed. IPv6 fragments count as
    /// `fragment`.
    Ipv6Extension = 32,
    /// Full NAT or 6in6 towards an IPv6 endpoint out of an uplink where this node has no IPv6
    /// address to send from: left to the kernel, untranslated.
    NoSourceAddress = 33,
    /// Tagged with a VLAN this interface serves no group on: left to the kernel as it came.
    VlanNotServed = 34,
    /// Stacked tags (QinQ) or an 802.1ad service tag: left to the kernel as it came.
    VlanStacked = 35,
}

impl Reason {
    pub const COUNT: u32 = 36;
    pub const ALL: [Reason; Self::COUNT as usize] = [
        Reason::MalformedEthernet,
        Reason::MalformedArp,
        Reason::ArpReplied,
        Reason::ArpNotOwned,
        Reason::ArpIgnored,
        Reason::NotIp,
        Reason::MalformedIpv4,
        Reason::Ipv4Passed,
        Reason::IpOptions,
        Reason::Fragment,
        Reason::MalformedL4,
        Reason::ForwardedLocal,
        Reason::ForwardedFullNat,
        Reason::ForwardedDsr,
        Reason::DsrDecapsulated,
        Reason::ReplyTranslated,
        Reason::IcmpEchoReplied,
        Reason::UnexposedPort,
        Reason::NoBackend,
        Reason::TtlExpired,
        Reason::SnatPortsExhausted,
        Reason::NoNeighbor,
        Reason::NoRoute,
        Reason::TooBig,
        Reason::BadDecapsulation,
        Reason::LeaseExpired,
        Reason::WrongInterface,
        Reason::NdpAdvertised,
        Reason::NdpNotOwned,
        Reason::MalformedNdp,
        Reason::MalformedIpv6,
        Reason::Ipv6Passed,
        Reason::Ipv6Extension,
        Reason::NoSourceAddress,
        Reason::VlanNotServed,
        Reason::VlanStacked,
    ];

    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            Reason::MalformedEthernet => "malformed_ethernet",
            Reason::MalformedArp => "malformed_arp",
            Reason::ArpReplied => "arp_replied",
            Reason::ArpNotOwned => "arp_not_owned",
            Reason::ArpIgnored => "arp_ignored",
            Reason::NotIp => "not_ip",
            Reason::MalformedIpv4 => "malformed_ipv4",
            Reason::Ipv4Passed => "ipv4_passed",
            Reason::IpOptions => "ip_options",
            Reason::Fragment => "fragment",
            Reason::MalformedL4 => "malformed_l4",
            Reason::ForwardedLocal => "forwarded_local",
            Reason::ForwardedFullNat => "forwarded_full_nat",
            Reason::ForwardedDsr => "forwarded_dsr",
            Reason::DsrDecapsulated => "dsr_decapsulated",
            Reason::ReplyTranslated => "reply_translated",
            Reason::IcmpEchoReplied => "icmp_echo_replied",
            Reason::UnexposedPort => "unexposed_port",
            Reason::NoBackend => "no_backend",
            Reason::TtlExpired => "ttl_expired",
            Reason::SnatPortsExhausted => "snat_ports_exhausted",
            Reason::NoNeighbor => "no_neighbor",
            Reason::NoRoute => "no_route",
            Reason::TooBig => "too_big",
            Reason::BadDecapsulation => "bad_decapsulation",
            Reason::LeaseExpired => "lease_expired",
            Reason::WrongInterface => "wrong_interface",
            Reason::NdpAdvertised => "ndp_advertised",
            Reason::NdpNotOwned => "ndp_not_owned",
            Reason::MalformedNdp => "malformed_ndp",
            Reason::MalformedIpv6 => "malformed_ipv6",
            Reason::Ipv6Passed => "ipv6_passed",
            Reason::Ipv6Extension => "ipv6_extension",
            Reason::NoSourceAddress => "no_source_address",
            Reason::VlanNotServed => "vlan_not_served",
            Reason::VlanStacked => "vlan_stacked",
        }
    }
}

/// The kernel's XDP action codes (`enum xdp_action`), which index `ACTION_STATS`.
pub const XDP_ACTION_COUNT: u32 = 5;

/// The metric label for an XDP action code.
pub const fn action_label(action: u32) -> &'static str {
    match action {
        0 => "aborted",
        1 => "drop",
        2 => "pass",
        3 => "tx",
        4 => "redirect",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_at_its_index() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
