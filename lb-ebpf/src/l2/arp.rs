//! ARP responder: owned VIPs are answered from XDP, everything else goes to the kernel.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    programs::XdpContext,
};
use lb_common::{
    arp::{ArpClass, EthArp, classify, rewrite_request_into_reply},
    counters::Reason,
    maps::VipKey,
};

use crate::{maps::OWNED_VIPS, owned, packet, stats, uplink, vlan};

/// Called for frames whose EtherType is ARP.
#[inline(always)]
pub fn answer_owned(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let Some(frame) = packet::header::<EthArp>(ctx, 0) else {
        stats::count_reason(Reason::MalformedArp, bytes);
        return XDP_PASS;
    };
    // SAFETY: `header` checked that all 42 bytes lie inside the packet, and nothing else
    // holds a reference into it.
    let frame = unsafe { &mut *frame };
    let target = match classify(frame) {
        ArpClass::Request { target } => VipKey::new(target),
        ArpClass::Ignored => {
            stats::count_reason(Reason::ArpIgnored, bytes);
            return XDP_PASS;
        }
        ArpClass::Malformed => {
            stats::count_reason(Reason::MalformedArp, bytes);
            return XDP_PASS;
        }
    };
    // SAFETY: the value is copied out before anything else can touch the map entry.
    let Some(owned) = (unsafe { OWNED_VIPS.get(&target) }).copied() else {
        stats::count_reason(Reason::ArpNotOwned, bytes);
        return XDP_PASS;
    };
    if owned.is_routed() {
        // The fabric routes it here; on the segment it is nobody's to claim.
        stats::count_reason(Reason::ArpNotOwned, bytes);
        return XDP_PASS;
    }
    if !uplink::accepts(ctx, owned.uplink) {
        stats::count_reason(Reason::WrongInterface, bytes);
        // In VIP mode `both` the kernel holds the address and would answer on any interface
        // (Linux's weak host model): the VIP would be bound to the wrong segment.
        return if owned.kernel_too() { XDP_DROP } else { XDP_PASS };
    }
    if !owned::live(&owned) {
        // Dropped, not passed: in VIP mode `both` the kernel still holds the address.
        stats::count_reason(Reason::LeaseExpired, bytes);
        return XDP_DROP;
    }
    rewrite_request_into_reply(frame, owned.mac);
    stats::count_arp_reply(&target);
    stats::count_reason(Reason::ArpReplied, bytes);
    vlan::answer(ctx, XDP_TX)
}
