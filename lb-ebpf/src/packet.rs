//! Bounds-checked views into the packet, in the shape the verifier accepts, and the fixed
//! offsets of the headers the service path handles (IPv4 without options).

use aya_ebpf::programs::XdpContext;
use lb_common::service::FlowKey6;
use network_types::ip::Ipv6Hdr;

pub const ETH_LEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const IPV4_LEN: usize = 20;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IPv6's fixed header.
pub const IPV6_LEN: usize = 40;
/// Where TCP/UDP starts in an option-less IPv4 frame.
pub const L4_OFFSET: usize = ETH_LEN + IPV4_LEN;
pub const TCP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
pub const TCP_CHECK_OFFSET: usize = 16;
pub const UDP_CHECK_OFFSET: usize = 6;
/// IPv4's MF flag and fragment offset: a packet with any of them set is a fragment.
pub const FRAGMENT_MASK: u16 = 0x3fff;

/// A pointer to a `T` at `offset`, or `None` when the packet is too short to hold it.
#[inline(always)]
pub fn header<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// The frame's length in bytes.
#[inline(always)]
pub fn len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

/// The first four bytes of TCP and UDP.
#[repr(C)]
pub struct Ports {
    pub sport: [u8; 2],
    pub dport: [u8; 2],
}

/// TCP's and UDP's checksum offsets and minimum lengths.
#[derive(Clone, Copy)]
pub struct L4Layout {
    pub check_offset: usize,
    pub min_len: usize,
    pub is_udp: bool,
}

#[inline(always)]
pub fn l4_layout(proto: u8) -> Option<L4Layout> {
    match proto {
        lb_common::service::PROTO_TCP => {
            Some(L4Layout { check_offset: TCP_CHECK_OFFSET, min_len: TCP_LEN, is_udp: false })
        }
        lb_common::service::PROTO_UDP => {
            Some(L4Layout { check_offset: UDP_CHECK_OFFSET, min_len: UDP_LEN, is_udp: true })
        }
        _ => None,
    }
}

/// The packet's 5-tuple, its addresses copied a word at a time straight into the (aligned)
/// key (see [`copy_address_pair`]).
#[inline(always)]
pub fn flow_key6(ip: &Ipv6Hdr, ports: &Ports, flow: &mut FlowKey6) {
    let from = (ip as *const Ipv6Hdr).cast::<u8>().wrapping_add(core::mem::offset_of!(Ipv6Hdr, src_addr));
    // SAFETY: `ip` covers the whole 40-byte header, so the 32 bytes of addresses from
    // `src_addr` lie inside it; the key's are 4-aligned (asserted below).
    unsafe { copy_address_pair(from, (flow as *mut FlowKey6).cast::<u8>()) };
    flow.sport = ports.sport;
    flow.dport = ports.dport;
    flow.proto = ip.next_hdr;
    flow._pad = [0; 3];
}

/// Copies an IPv6 address pair (source then destination, 32 bytes) between the packet and a
/// 4-aligned value (see [`copy_address`]).
///
/// # Safety
/// As [`copy_address`]'s, for 32 bytes.
#[inline(always)]
pub unsafe fn copy_address_pair(from: *const u8, to: *mut u8) {
    // SAFETY: as the caller promised.
    unsafe {
        copy_address(from, to);
        copy_address(from.wrapping_add(16), to.wrapping_add(16));
    }
}

/// Copies an IPv6 address between the packet and a 4-aligned value, a word at a time. In Rust
/// a copy to or from the packet, whose addresses must be taken as unaligned, is sixteen byte
/// loads and stores; and words LLVM can see it keeps as values, each spilled to a stack slot of
/// its own. So the copy is one opaque block of four word loads and stores. The packet's side
/// may be unaligned, which the kernel allows for packet memory where unaligned access is
/// efficient (see `lb_common::words`).
///
/// # Safety
/// `from` points to 16 bytes the program may read and `to` to 16 it may write, and the side
/// that is not the packet's is 4-aligned.
#[inline(always)]
pub unsafe fn copy_address(from: *const u8, to: *mut u8) {
    // SAFETY: as the caller promised.
    unsafe {
        core::arch::asm!(
            "{w} = *(u32 *)({from} + 0)",
            "*(u32 *)({to} + 0) = {w}",
            "{w} = *(u32 *)({from} + 4)",
            "*(u32 *)({to} + 4) = {w}",
            "{w} = *(u32 *)({from} + 8)",
            "*(u32 *)({to} + 8) = {w}",
            "{w} = *(u32 *)({from} + 12)",
            "*(u32 *)({to} + 12) = {w}",
            from = in(reg) from,
            to = in(reg) to,
            w = out(reg) _,
            options(nostack, preserves_flags),
        );
    }
}

const _: () = {
    use core::mem::{align_of, offset_of};
    assert!(align_of::<FlowKey6>() >= 4 && offset_of!(FlowKey6, src) == 0 && offset_of!(FlowKey6, dst) == 16);
    assert!(offset_of!(Ipv6Hdr, dst_addr) == offset_of!(Ipv6Hdr, src_addr) + 16);
};
