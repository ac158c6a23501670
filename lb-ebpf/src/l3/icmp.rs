//! ICMP echo to an owned VIP is answered here (RFC 792), so a VIP answers ping on whichever
//! node owns it, even when the address is not configured on any interface.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    programs::XdpContext,
};
use lb_common::{counters::Reason, csum, maps::VipKey};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    maps::OWNED_VIPS,
    owned,
    packet::{self, ETH_LEN, L4_OFFSET, header},
    stats, uplink, vlan,
};

const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;
const REPLY_TTL: u8 = 64;

/// An echo message's header (RFC 792; ICMPv6's is the same, RFC 4443 §4.1): type, code,
/// checksum, then the identifier and sequence a reply keeps.
#[repr(C)]
pub(super) struct EchoHdr {
    pub kind: u8,
    pub code: u8,
    check: [u8; 2],
    rest: [u8; 4],
}

impl EchoHdr {
    /// Turns a `request` into its `reply` in place: only the type changes in the message, so
    /// its checksum is patched for that word alone.
    #[inline(always)]
    pub(super) fn answer(&mut self, request: u8, reply: u8) {
        self.kind = reply;
        let (old, new) = (u16::from_be_bytes([request, 0]), u16::from_be_bytes([reply, 0]));
        self.check = csum::replace16(u16::from_be_bytes(self.check), old, new).to_be_bytes();
    }
}

#[inline(always)]
pub fn answer_echo(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let (Some(eth), Some(ip), Some(icmp)) =
        (header::<EthHdr>(ctx, 0), header::<Ipv4Hdr>(ctx, ETH_LEN), header::<EchoHdr>(ctx, L4_OFFSET))
    else {
        return stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS);
    };
    // SAFETY: all three bounds-checked by `header`; they do not overlap.
    let (eth, ip, icmp) = unsafe { (&mut *eth, &mut *ip, &mut *icmp) };
    if icmp.kind != ECHO_REQUEST || icmp.code != 0 {
        return stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS);
    }
    // SAFETY: copied out at once.
    let Some(owned) = (unsafe { OWNED_VIPS.get(&VipKey::new(ip.dst_addr)) }).copied() else {
        return stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS);
    };
    if !uplink::accepts(ctx, owned.uplink) {
        return stats::verdict(Reason::WrongInterface, bytes, XDP_PASS);
    }
    if !owned::live(&owned) {
        // Not passed: in VIP mode `both` the kernel would answer for the agent that is gone.
        return stats::verdict(Reason::LeaseExpired, bytes, XDP_DROP);
    }
    // Only the type changes inside the ICMP message; swapping addresses leaves the IP
    // checksum alone, and the TTL reset is patched in.
    icmp.answer(ECHO_REQUEST, ECHO_REPLY);
    core::mem::swap(&mut ip.src_addr, &mut ip.dst_addr);
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.ttl = REPLY_TTL;
    ip.check = csum::replace16(u16::from_be_bytes(ip.check), old, u16::from_be_bytes([ip.ttl, ip.proto]))
        .to_be_bytes();
    core::mem::swap(&mut eth.src_addr, &mut eth.dst_addr);
    vlan::answer(ctx, stats::verdict(Reason::IcmpEchoReplied, bytes, XDP_TX))
}
