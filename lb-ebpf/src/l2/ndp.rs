//! Neighbor Discovery responder: solicitations for owned IPv6 VIPs are answered from XDP
//! (RFC 4861 §7.2.4), everything else goes to the kernel. The checks and the rewrite are
//! `lb_common::ndp`'s, shared with the host tests.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::bpf_xdp_adjust_tail,
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    maps::Vip6Key,
    ndp::{
        EthNd, ICMPV6, LinkLayerOption, NEIGHBOR_SOLICITATION, NdClass, classify,
        rewrite_solicitation_into_advertisement,
    },
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{maps::OWNED_VIPS6, owned, packet, stats, uplink, vlan};

/// Where the ICMPv6 type of an extension-less IPv6 frame is.
const ICMPV6_TYPE_OFFSET: usize = EthHdr::LEN + Ipv6Hdr::LEN;

/// True for an IPv6 frame (EtherType already checked) that carries a Neighbor Solicitation
/// right after the fixed header.
#[inline(always)]
pub fn is_solicitation(ctx: &XdpContext) -> bool {
    let (Some(ip), Some(kind)) =
        (packet::header::<Ipv6Hdr>(ctx, EthHdr::LEN), packet::header::<u8>(ctx, ICMPV6_TYPE_OFFSET))
    else {
        return false;
    };
    // SAFETY: both bounds-checked by `header`.
    unsafe { (*ip).next_hdr == ICMPV6 && *kind == NEIGHBOR_SOLICITATION }
}

/// Called for frames [`is_solicitation`] accepts.
#[inline(always)]
pub fn answer_owned(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let Some(ip) = packet::header::<Ipv6Hdr>(ctx, EthHdr::LEN) else {
        return stats::verdict(Reason::MalformedIpv6, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`.
    let icmp_len = u16::from_be_bytes(unsafe { (*ip).payload_len });
    if bytes < EthHdr::LEN + Ipv6Hdr::LEN + usize::from(icmp_len) {
        return stats::verdict(Reason::MalformedIpv6, bytes, XDP_PASS);
    }
    let Some(frame) = packet::header::<EthNd>(ctx, 0) else {
        return stats::verdict(Reason::MalformedNdp, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`; nothing else holds a reference into the packet.
    let frame = unsafe { &mut *frame };
    // One option at most: the source link-layer address. Longer solicitations (a nonce, for
    // enhanced DAD) are the kernel's.
    let option = match icmp_len {
        24 => None,
        32 => match packet::header::<LinkLayerOption>(ctx, EthNd::OPTION_OFFSET) {
            // SAFETY: bounds-checked by `header`; copied out.
            Some(option) => Some(unsafe { *option }),
            None => return stats::verdict(Reason::MalformedNdp, bytes, XDP_PASS),
        },
        // Options come in units of 8 bytes: anything else cuts one short.
        _ if icmp_len < 24 || (icmp_len - 24) % 8 != 0 => {
            return stats::verdict(Reason::MalformedNdp, bytes, XDP_PASS);
        }
        _ => return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS),
    };
    let target = match classify(frame, option.as_ref(), icmp_len) {
        NdClass::Solicitation { target, .. } => Vip6Key::new(target),
        NdClass::Malformed(_) => return stats::verdict(Reason::MalformedNdp, bytes, XDP_PASS),
    };
    // SAFETY: copied out before anything else can touch the map entry.
    let Some(owned) = (unsafe { OWNED_VIPS6.get(&target) }).copied() else {
        return stats::verdict(Reason::NdpNotOwned, bytes, XDP_PASS);
    };
    if owned.is_routed() {
        // As for ARP: routed here by the fabric, nobody's to claim on the segment.
        return stats::verdict(Reason::NdpNotOwned, bytes, XDP_PASS);
    }
    if !uplink::accepts(ctx, owned.uplink) {
        // As for ARP: in VIP mode `both` the kernel would answer on any interface.
        let action = if owned.kernel_too() { XDP_DROP } else { XDP_PASS };
        return stats::verdict(Reason::WrongInterface, bytes, action);
    }
    if !owned::live(&owned) {
        return stats::verdict(Reason::LeaseExpired, bytes, XDP_DROP);
    }
    // The advertisement is always 86 bytes: one option, the target's link-layer address.
    let delta = EthNd::ADVERTISEMENT_LEN as i32 - bytes as i32;
    // SAFETY: the helper checks the new length against the frame's buffer.
    if delta != 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    }
    let (Some(frame), Some(option)) =
        (packet::header::<EthNd>(ctx, 0), packet::header::<LinkLayerOption>(ctx, EthNd::OPTION_OFFSET))
    else {
        return stats::verdict(Reason::MalformedNdp, bytes, XDP_DROP);
    };
    // SAFETY: both bounds-checked again after the resize; they do not overlap.
    unsafe { rewrite_solicitation_into_advertisement(&mut *frame, &mut *option, owned.mac) };
    stats::count_neighbor_advertisement(&target);
    vlan::answer(ctx, stats::verdict(Reason::NdpAdvertised, bytes, XDP_TX))
}
