//! The frame's EtherType (and, for IPv6, whether it is a Neighbor Solicitation) picks the layer
//! that handles it; anything else goes to the kernel. A served VLAN's tag is taken off first
//! (see `vlan`).

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use lb_common::counters::Reason;
use network_types::eth::EthHdr;

use crate::{
    l2::{arp, ndp},
    l3::{ipv4, ipv6},
    packet::{self, ETHERTYPE_IPV4},
    stats, vlan,
};

const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;

#[inline(always)]
pub fn handle_frame(ctx: &XdpContext) -> u32 {
    let Some(eth) = packet::header::<EthHdr>(ctx, 0) else {
        return stats::verdict(Reason::MalformedEthernet, packet::len(ctx), XDP_PASS);
    };
    // SAFETY: `header` checked that the Ethernet header lies inside the packet.
    let mut ether_type = u16::from_be(unsafe { (*eth).ether_type });
    if vlan::is_tag(ether_type) {
        if ether_type == vlan::ETHERTYPE_8021AD {
            return vlan::pass(ctx, Reason::VlanStacked);
        }
        if let Err(reason) = vlan::untag(ctx) {
            return vlan::pass(ctx, reason);
        }
        let Some(eth) = packet::header::<EthHdr>(ctx, 0) else {
            return stats::verdict(Reason::MalformedEthernet, packet::len(ctx), XDP_PASS);
        };
        // SAFETY: bounds-checked by `header`.
        ether_type = u16::from_be(unsafe { (*eth).ether_type });
    } else {
        vlan::arrived_untagged();
    }
    match ether_type {
        ETHERTYPE_ARP => arp::answer_owned(ctx),
        ETHERTYPE_IPV4 => ipv4::handle(ctx),
        // Neighbor Discovery rides on ICMPv6 but is the link layer's business, as ARP is.
        ETHERTYPE_IPV6 if ndp::is_solicitation(ctx) => ndp::answer_owned(ctx),
        ETHERTYPE_IPV6 => ipv6::handle(ctx),
        _ => stats::verdict(Reason::NotIp, packet::len(ctx), XDP_PASS),
    }
}
