//! Header rewrites with incremental checksum updates (RFC 1624), for option-less IPv4 at
//! `ETH_LEN` and TCP/UDP at `L4_OFFSET`.

use aya_ebpf::programs::XdpContext;
use lb_common::{csum, service::ReplyNat};
use network_types::ip::Ipv4Hdr;

use crate::packet::{ETH_LEN, L4_OFFSET, L4Layout, Ports, header};

/// Sets the packet's addresses and ports to `to`, patching the IPv4 and TCP/UDP checksums.
/// `None` if the headers are not all inside the packet (the caller checked, so never in
/// practice; the verifier needs the checks here).
#[inline(always)]
pub fn rewrite(ctx: &XdpContext, layout: L4Layout, to: &ReplyNat) -> Option<()> {
    let ip = header::<Ipv4Hdr>(ctx, ETH_LEN)?;
    let ports = header::<Ports>(ctx, L4_OFFSET)?;
    let check = header::<[u8; 2]>(ctx, L4_OFFSET + layout.check_offset)?;
    // SAFETY: each pointer was bounds-checked above; the three regions do not overlap.
    let (ip, ports, check) = unsafe { (&mut *ip, &mut *ports, &mut *check) };

    let mut ip_check = u16::from_be_bytes(ip.check);
    ip_check = csum::replace32(ip_check, ip.src_addr, to.src);
    ip_check = csum::replace32(ip_check, ip.dst_addr, to.dst);

    let mut l4 = u16::from_be_bytes(*check);
    let (sport, dport) = (u16::from_be_bytes(ports.sport), u16::from_be_bytes(ports.dport));
    let (new_sport, new_dport) = (u16::from_be_bytes(to.sport), u16::from_be_bytes(to.dport));
    if layout.is_udp {
        l4 = csum::udp_replace32(l4, ip.src_addr, to.src);
        l4 = csum::udp_replace32(l4, ip.dst_addr, to.dst);
        l4 = csum::udp_replace16(l4, sport, new_sport);
        l4 = csum::udp_replace16(l4, dport, new_dport);
    } else {
        l4 = csum::replace32(l4, ip.src_addr, to.src);
        l4 = csum::replace32(l4, ip.dst_addr, to.dst);
        l4 = csum::replace16(l4, sport, new_sport);
        l4 = csum::replace16(l4, dport, new_dport);
    }

    ip.src_addr = to.src;
    ip.dst_addr = to.dst;
    ip.check = ip_check.to_be_bytes();
    ports.sport = to.sport;
    ports.dport = to.dport;
    *check = l4.to_be_bytes();
    Some(())
}

/// Decrements the TTL of a packet being routed (RFC 1812 §5.3.1). `false` when it would reach
/// zero: the caller leaves such packets to the kernel, which answers ICMP time exceeded.
#[inline(always)]
pub fn decrement_ttl(ip: &mut Ipv4Hdr) -> bool {
    if ip.ttl <= 1 {
        return false;
    }
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.ttl -= 1;
    let new = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.check = csum::replace16(u16::from_be_bytes(ip.check), old, new).to_be_bytes();
    true
}
