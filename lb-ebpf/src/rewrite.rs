//! Header rewrites with incremental checksum updates (RFC 1624), for option-less IPv4 or
//! extension-less IPv6 at `ETH_LEN`, and the TCP/UDP header after it.

use aya_ebpf::programs::XdpContext;
use lb_common::{
    csum,
    service::{ReplyNat, ReplyNat6},
};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::packet::{
    ETH_LEN, IPV6_LEN, L4_OFFSET, L4Layout, Ports, TCP_CHECK_OFFSET, UDP_CHECK_OFFSET, copy_address_pair,
    header,
};

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

/// As [`rewrite`] for IPv6. No header checksum; the TCP/UDP checksum covers the addresses
/// through the pseudo-header, and a UDP checksum is mandatory (RFC 8200 §8.1), so a computed
/// zero is sent as `0xffff`. `false` if the headers are not all inside the packet.
#[inline(always)]
pub fn rewrite6(ctx: &XdpContext, is_udp: bool, to: &ReplyNat6) -> bool {
    const L4: usize = ETH_LEN + IPV6_LEN;
    let check_offset = if is_udp { UDP_CHECK_OFFSET } else { TCP_CHECK_OFFSET };
    let (Some(ip), Some(ports), Some(check)) = (
        header::<Ipv6Hdr>(ctx, ETH_LEN),
        header::<Ports>(ctx, L4),
        header::<[u8; 2]>(ctx, L4 + check_offset),
    ) else {
        return false;
    };
    // SAFETY: each pointer was bounds-checked above; the three regions do not overlap.
    unsafe { rewrite6_headers(&mut *ip, &mut *ports, &mut *check, is_udp, to) }
}

/// [`rewrite6`]'s work on headers already bounds-checked. Inline: as a BPF function of its own
/// (which kept its frame out of its callers') it cost IPv6's local delivery 20 ns a packet on
/// a host whose returns go through a return thunk (see `vlan::finish`), and its callers' frames
/// now hold it.
#[inline(always)]
fn rewrite6_headers(
    ip: &mut Ipv6Hdr,
    ports: &mut Ports,
    check: &mut [u8; 2],
    is_udp: bool,
    to: &ReplyNat6,
) -> bool {
    // Both address pairs lie side by side (source then destination, in the header and in
    // `to`), so one sum covers the two. It adds the words as they lie in memory, so that part
    // runs in memory order (`ne`), and the result is then read as the big-endian value the
    // port updates work on (RFC 1071 §2(B): a one's-complement sum of byte-swapped words is the
    // byte-swapped sum).
    let old = u16::from_ne_bytes(*check);
    let addresses = addresses_diff(ip, to, !old as u32);
    let mut l4 = u16::from_be_bytes((!csum::fold(addresses)).to_ne_bytes());
    l4 = csum::replace16(l4, u16::from_be_bytes(ports.sport), u16::from_be_bytes(to.sport));
    l4 = csum::replace16(l4, u16::from_be_bytes(ports.dport), u16::from_be_bytes(to.dport));
    if is_udp && l4 == 0 {
        l4 = 0xffff;
    }
    // SAFETY: both pairs are 32 bytes side by side (asserted below); `to`'s is 4-aligned.
    unsafe { copy_address_pair(address_pair(to), (ip as *mut Ipv6Hdr).cast::<u8>().wrapping_add(SRC)) };
    ports.sport = to.sport;
    ports.dport = to.dport;
    *check = l4.to_be_bytes();
    true
}

/// The header's two addresses, source then destination, and `to`'s: 32 bytes each.
const ADDRESS_PAIR: usize = 32;
/// Where the header's pair starts.
const SRC: usize = core::mem::offset_of!(Ipv6Hdr, src_addr);
const _: () = {
    use core::mem::{align_of, offset_of};
    assert!(offset_of!(Ipv6Hdr, dst_addr) == SRC + 16);
    assert!(offset_of!(ReplyNat6, dst) == offset_of!(ReplyNat6, src) + 16);
    assert!(align_of::<ReplyNat6>() >= 4 && offset_of!(ReplyNat6, src) % 4 == 0);
};

/// `to`'s address pair.
#[inline(always)]
fn address_pair(to: &ReplyNat6) -> *const u8 {
    (to as *const ReplyNat6).cast::<u8>().wrapping_add(core::mem::offset_of!(ReplyNat6, src))
}

/// `seed` plus the one's-complement difference from `ip`'s address pair to `to`'s, folded to
/// 32 bits (RFC 1071 §2(B): the sum of each old word's complement and each new word).
/// Written out rather than by the kernel's `bpf_csum_diff` (as Katran does), which copies both
/// pairs into a scratch buffer and sums them there, behind a helper call: eight word loads a
/// side and a 64-bit sum, in one block so that LLVM neither vectorises it (a sum in Rust over
/// the addresses' bytes became stack-hungry vector code) nor holds the words apart on the
/// stack (measured in the book's benchmarks, "Addresses a word at a time").
#[inline(always)]
fn addresses_diff(ip: &Ipv6Hdr, to: &ReplyNat6, seed: u32) -> u32 {
    let old = (ip as *const Ipv6Hdr).cast::<u8>().wrapping_add(SRC);
    let new = address_pair(to);
    // Each old word's complement is `0xffff_ffff - word`: the constants are added up front, so
    // the block only subtracts old words and adds new ones (it cannot go below zero).
    let mut sum = u64::from(seed) + (ADDRESS_PAIR as u64 / 4) * 0xffff_ffff;
    // SAFETY: both pairs are 32 readable bytes (the layout asserted above): the header's in
    // the packet, where loads may be unaligned (see `packet::copy_address`), and `to`'s
    // 4-aligned.
    unsafe {
        core::arch::asm!(
            "{w} = *(u32 *)({old} + 0)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 0)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 4)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 4)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 8)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 8)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 12)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 12)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 16)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 16)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 20)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 20)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 24)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 24)",
            "{sum} += {w}",
            "{w} = *(u32 *)({old} + 28)",
            "{sum} -= {w}",
            "{w} = *(u32 *)({new} + 28)",
            "{sum} += {w}",
            sum = inout(reg) sum,
            w = out(reg) _,
            old = in(reg) old,
            new = in(reg) new,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    // 64 bits to 32 with the carries wrapped around, twice: the first fold may carry again.
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum as u32
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
