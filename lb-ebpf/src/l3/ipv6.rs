//! IPv6: validate the fixed header, learn VRRP advertisement sources (see `vrrp`), answer
//! ICMPv6 echo for owned VIPs (RFC 4443 §4.2), and
//! drop what else reaches a VIP only this node holds. Nothing is forwarded over IPv6 yet: the
//! kernel gets every other packet.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    maps::Vip6Key,
    ndp::{ECHO_REPLY, ECHO_REQUEST, ICMPV6},
    service::PROTO_VRRP,
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use super::icmp::EchoHdr;
use crate::{
    maps::OWNED_VIPS6,
    owned,
    packet::{self, header},
    stats, uplink, vrrp,
};

const REPLY_HOP_LIMIT: u8 = 64;

#[inline(always)]
pub fn handle(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let Some(ip) = header::<Ipv6Hdr>(ctx, EthHdr::LEN) else {
        return stats::verdict(Reason::MalformedIpv6, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`; copied out.
    let (version, payload_len, next_hdr, src, dst) = unsafe {
        (
            (*ip).vcf[0] >> 4,
            u16::from_be_bytes((*ip).payload_len),
            (*ip).next_hdr,
            (*ip).src_addr,
            (*ip).dst_addr,
        )
    };
    if version != 6 || bytes < EthHdr::LEN + Ipv6Hdr::LEN + usize::from(payload_len) {
        return stats::verdict(Reason::MalformedIpv6, bytes, XDP_PASS);
    }
    if next_hdr == PROTO_VRRP {
        return vrrp::observe6(ctx, src);
    }
    // SAFETY: copied out at once.
    let Some(owned) = (unsafe { OWNED_VIPS6.get(&Vip6Key::new(dst)) }).copied() else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    if !uplink::accepts(ctx, owned.uplink) {
        return stats::verdict(Reason::WrongInterface, bytes, XDP_PASS);
    }
    if next_hdr == ICMPV6 {
        let echo = header::<EchoHdr>(ctx, EthHdr::LEN + Ipv6Hdr::LEN);
        // SAFETY: bounds-checked by `header`.
        if let Some(icmp) = echo
            && unsafe { (*icmp).kind == ECHO_REQUEST && (*icmp).code == 0 }
        {
            if !owned::live(&owned) {
                return stats::verdict(Reason::LeaseExpired, bytes, XDP_DROP);
            }
            // SAFETY: `ip` and `icmp` bounds-checked above and disjoint; `eth` below.
            unsafe { answer_echo(ctx, &mut *ip, &mut *icmp) };
            return stats::verdict(Reason::IcmpEchoReplied, bytes, XDP_TX);
        }
    }
    if owned.kernel_too() {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    }
    // Only this node's data plane holds the VIP, and it serves nothing else over IPv6 yet.
    stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP)
}

/// Turns an echo request into its reply in place. Swapping the addresses leaves the
/// pseudo-header's sum alone, so only the type's change is patched into the checksum; the hop
/// limit is not covered by it.
#[inline(always)]
fn answer_echo(ctx: &XdpContext, ip: &mut Ipv6Hdr, icmp: &mut EchoHdr) {
    icmp.answer(ECHO_REQUEST, ECHO_REPLY);
    core::mem::swap(&mut ip.src_addr, &mut ip.dst_addr);
    ip.hop_limit = REPLY_HOP_LIMIT;
    if let Some(eth) = header::<EthHdr>(ctx, 0) {
        // SAFETY: bounds-checked by `header`; disjoint from the IPv6 header.
        unsafe { core::mem::swap(&mut (*eth).src_addr, &mut (*eth).dst_addr) };
    }
}
