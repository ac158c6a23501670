//! IPv6: validate the fixed header, learn VRRP advertisement sources (see `vrrp`), hand TCP and
//! UDP to the service path and IPv6-in-IPv6 to DSR's decapsulation, answer ICMPv6 echo for
//! owned VIPs (RFC 4443 §4.2), and drop what else reaches a VIP only this node holds.
//! Extension headers and fragments are the kernel's (counted when aimed at an owned VIP).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    maps::Vip6Key,
    ndp::{ECHO_REPLY, ECHO_REQUEST, ICMPV6},
    service::{PROTO_IPV6, PROTO_TCP, PROTO_UDP, PROTO_VRRP},
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use super::icmp::EchoHdr;
use crate::{
    family::{IpFamily, V6},
    maps::{IPV6_SERVICES, OWNED_VIPS6, STATE6},
    owned,
    packet::{self, IPV6_LEN, Ports, header},
    services, stats, uplink, vlan, vrrp,
};

/// Extension headers (RFC 8200 §4.1) and others that can come before TCP/UDP.
const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const ESP: u8 = 50;
const AUTHENTICATION: u8 = 51;
const DESTINATION_OPTIONS: u8 = 60;
const MOBILITY: u8 = 135;

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
    match next_hdr {
        PROTO_VRRP => return vrrp::observe6(ctx, src),
        PROTO_TCP | PROTO_UDP | PROTO_IPV6 => {
            // SAFETY: a tail call replaces this program; it returns only when it fails.
            let _ = unsafe { IPV6_SERVICES.tail_call(ctx, 0) };
            // The agent writes the program at start, before attaching: only a broken load
            // gets here.
            return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
        }
        _ => {}
    }
    // SAFETY: copied out at once.
    let Some(owned) = (unsafe { OWNED_VIPS6.get(&Vip6Key::new(dst)) }).copied() else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    match next_hdr {
        FRAGMENT => return stats::verdict(Reason::Fragment, bytes, XDP_PASS),
        HOP_BY_HOP | ROUTING | ESP | AUTHENTICATION | DESTINATION_OPTIONS | MOBILITY => {
            return stats::verdict(Reason::Ipv6Extension, bytes, XDP_PASS);
        }
        _ => {}
    }
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
            return vlan::answer(ctx, stats::verdict(Reason::IcmpEchoReplied, bytes, XDP_TX));
        }
    }
    if owned.kernel_too() {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    }
    // Only this node's data plane holds the VIP, and no service takes this.
    stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP)
}

/// The IPv6 service path: TCP and UDP to services (and full NAT's replies), and DSR's IPv6 in
/// IPv6. It runs as a program of its own (`lb_xdp6`), tail-called from [`handle`] through
/// `IPV6_SERVICES`: inlined beside IPv4's path, the two paths' stack slots add up past BPF's
/// 512 bytes, and a BPF-to-BPF call would share the caller's 512; a tail call starts afresh.
/// The header was validated by [`handle`].
#[inline(always)]
pub fn serve(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let (Some(ip), Some(ports)) = (header::<Ipv6Hdr>(ctx, EthHdr::LEN), header::<Ports>(ctx, V6::L4_OFFSET))
    else {
        return stats::verdict(Reason::MalformedIpv6, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`.
    let ip = unsafe { &*ip };
    let ip_len = IPV6_LEN as u16 + u16::from_be_bytes(ip.payload_len);
    if ip.next_hdr == PROTO_IPV6 {
        return services::stages6::enter_decapsulation(ctx);
    }
    // The 5-tuple in this CPU's state slot, off the stack, where full NAT's stage finds it too
    // (see `services::stages6`).
    let Some(state) = STATE6.get_ptr_mut(0) else {
        return stats::verdict(Reason::Ipv6Passed, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`; this CPU's slot, used by this packet alone.
    let flow = unsafe {
        packet::flow_key6(ip, &*ports, &mut (*state).flow);
        &(*state).flow
    };
    services::transport::<V6>(ctx, flow, ip_len)
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
