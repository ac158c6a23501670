//! The frame's EtherType picks the layer that handles it; anything else goes to the kernel.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use lb_common::counters::Reason;
use network_types::eth::EthHdr;

use crate::{
    l2::arp,
    l3::ipv4,
    packet::{self, ETHERTYPE_IPV4},
    stats,
};

const ETHERTYPE_ARP: u16 = 0x0806;

#[inline(always)]
pub fn handle_frame(ctx: &XdpContext) -> u32 {
    let Some(eth) = packet::header::<EthHdr>(ctx, 0) else {
        return stats::verdict(Reason::MalformedEthernet, packet::len(ctx), XDP_PASS);
    };
    // SAFETY: `header` checked that the Ethernet header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETHERTYPE_ARP => arp::answer_owned(ctx),
        ETHERTYPE_IPV4 => ipv4::handle(ctx),
        _ => stats::verdict(Reason::NotIpv4, packet::len(ctx), XDP_PASS),
    }
}
