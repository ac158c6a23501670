//! The uplink's TC egress program: replies from endpoints on this node (local delivery, and
//! DSR after decapsulation) leave with the VIP and service port as their source. A local
//! delivery's reply is verified by its flow's connection-table entry (see
//! `lb_common::endpoint_services`); DSR's, and those of services not listed for their endpoint,
//! are looked up in `REPLY_NAT`.
//!
//! TC rather than XDP because these packets are sent by the kernel, not received; the
//! checksum helpers also cope with checksums the kernel left for offload (CHECKSUM_PARTIAL).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_csum_diff, bpf_ktime_get_coarse_ns},
    programs::TcContext,
};
use lb_common::{
    counters::Reason,
    endpoint_services::{self, EndpointKeyOf},
    service::{FlowKeyOf, PROTO_TCP, PROTO_UDP, ReplyNatOf},
};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use crate::{
    family::{IpFamily, V4, V6},
    packet::{ETH_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, FRAGMENT_MASK, IPV6_LEN, L4_OFFSET as L4},
    services::flow,
    stats,
};

const IP_CHECK: usize = ETH_LEN + 10;
const IP_SRC: usize = ETH_LEN + 12;
const IP_DST: usize = ETH_LEN + 16;
const IP6_SRC: usize = ETH_LEN + 8;
const L4_6: usize = ETH_LEN + IPV6_LEN;

/// Translates the packet if it is the reply of a flow this node translated. Any error just
/// leaves the packet as it is.
///
/// Every packet leaving by the uplink passes here, so the headers are read in place (plain
/// loads; `TcContext::load` is a helper call a field, and a call costs about 10 ns where
/// returns go through a return thunk), and a reply's rewrite takes as few helper calls as its
/// checksums allow. Writes still go through `bpf_skb_store_bytes`: a program that writes the
/// packet directly gets a prologue that unclones every cloned skb it sees (all of TCP's), a
/// copy for packets that are not replies too.
#[inline(always)]
pub fn translate(ctx: &TcContext) -> Result<(), i64> {
    let ethertype: [u8; 2] = in_place(ctx, 12)?;
    if ethertype == ETHERTYPE_IPV6.to_be_bytes() {
        return translate6(ctx);
    }
    if ethertype != ETHERTYPE_IPV4.to_be_bytes() {
        return Ok(());
    }
    let ip: Ipv4Hdr = in_place(ctx, ETH_LEN)?;
    if ip.vihl != 0x45 || u16::from_be_bytes(ip.frags) & FRAGMENT_MASK != 0 {
        return Ok(());
    }
    let (check_at, mangled) = match ip.proto {
        PROTO_TCP => (L4 + 16, 0),
        PROTO_UDP => (L4 + 6, BPF_F_MARK_MANGLED_0 as u64),
        _ => return Ok(()),
    };
    let ports: [u8; 4] = in_place(ctx, L4)?;
    let (src, dst) = (ip.src_addr, ip.dst_addr);
    let Some(to) = translation::<V4>(src, dst, ports, ip.proto) else { return Ok(()) };
    let word = |b: [u8; 4]| u32::from_ne_bytes(b) as u64;
    let pseudo = BPF_F_PSEUDO_HDR as u64 | mangled;
    if to.src != src {
        ctx.l4_csum_replace(check_at, word(src), word(to.src), pseudo | 4)?;
        ctx.l3_csum_replace(IP_CHECK, word(src), word(to.src), 4)?;
        ctx.store(IP_SRC, &to.src, 0)?;
    }
    if to.dst != dst {
        ctx.l4_csum_replace(check_at, word(dst), word(to.dst), pseudo | 4)?;
        ctx.l3_csum_replace(IP_CHECK, word(dst), word(to.dst), 4)?;
        ctx.store(IP_DST, &to.dst, 0)?;
    }
    replace_ports(ctx, check_at, mangled, L4, ports, &to)?;
    stats::count_reason(Reason::ReplyTranslated, ctx.len() as usize);
    Ok(())
}

/// `T` at `offset`, read in place: the headers of what leaves are in the skb's linear part
/// (pulled there if they are not, which unclones the skb, as a write would).
#[inline(always)]
fn in_place<T: Copy>(ctx: &TcContext, offset: usize) -> Result<T, i64> {
    let end = offset + core::mem::size_of::<T>();
    if ctx.data() + end > ctx.data_end() {
        ctx.pull_data(end as u32)?;
    }
    let at = ctx.data() + offset;
    if at + core::mem::size_of::<T>() > ctx.data_end() {
        return Err(0);
    }
    // SAFETY: inside the packet's linear part, checked above; copied out.
    Ok(unsafe { core::ptr::read_unaligned(at as *const T) })
}

/// Writes the ports of `to` over `ports` at `at` if they differ, their change entering the
/// checksum at `check_at` in one update (the ports are one 4-byte word).
#[inline(always)]
fn replace_ports<A>(
    ctx: &TcContext,
    check_at: usize,
    mangled: u64,
    at: usize,
    ports: [u8; 4],
    to: &ReplyNatOf<A>,
) -> Result<(), i64> {
    let new = [to.sport[0], to.sport[1], to.dport[0], to.dport[1]];
    if new == ports {
        return Ok(());
    }
    let word = |b: [u8; 4]| u32::from_ne_bytes(b) as u64;
    ctx.l4_csum_replace(check_at, word(ports), word(new), mangled | 4)?;
    ctx.store(at, &new, 0)
}

/// As [`translate`] for IPv6 without extension headers: no header checksum; the change of
/// both addresses (the pseudo-header's) is summed by one `bpf_csum_diff` and enters the
/// TCP/UDP checksum in one update, where a word at a time took eight.
#[inline(always)]
fn translate6(ctx: &TcContext) -> Result<(), i64> {
    let mut ip: Ipv6Hdr = in_place(ctx, ETH_LEN)?;
    let check_at = match ip.next_hdr {
        PROTO_TCP => L4_6 + 16,
        PROTO_UDP => L4_6 + 6,
        _ => return Ok(()),
    };
    // A computed zero UDP checksum is sent as 0xffff (zero is not allowed over IPv6).
    let mangled = if ip.next_hdr == PROTO_UDP { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
    let ports: [u8; 4] = in_place(ctx, L4_6)?;
    let (src, dst) = (ip.src_addr, ip.dst_addr);
    let Some(to) = translation::<V6>(src, dst, ports, ip.next_hdr) else { return Ok(()) };
    if to.src != src || to.dst != dst {
        let old = (&raw mut ip).cast::<u8>().wrapping_add(core::mem::offset_of!(Ipv6Hdr, src_addr));
        let mut new = [to.src, to.dst];
        // SAFETY: 32 bytes on this stack each (the header's two addresses are adjacent), read
        // by the helper.
        let diff = unsafe { bpf_csum_diff(old.cast(), 32, new.as_mut_ptr().cast(), 32, 0) };
        if diff < 0 {
            return Err(diff);
        }
        // Size 0: `to` is a sum of the change (`from` must be 0).
        ctx.l4_csum_replace(check_at, 0, diff as u32 as u64, BPF_F_PSEUDO_HDR as u64 | mangled)?;
        ctx.store(IP6_SRC, &new, 0)?;
    }
    replace_ports(ctx, check_at, mangled, L4_6, ports, &to)?;
    stats::count_reason(Reason::ReplyTranslated, ctx.len() as usize);
    Ok(())
}

/// The translation this node owes the reply from `src` to `dst`: verified by the connection
/// table (a listed local endpoint), or else the flow's `REPLY_NAT` entry.
#[inline(always)]
fn translation<F: IpFamily>(
    src: F::Addr,
    dst: F::Addr,
    ports: [u8; 4],
    proto: u8,
) -> Option<ReplyNatOf<F::Addr>> {
    verified_by_table::<F>(src, dst, ports, proto).or_else(|| {
        let key = FlowKeyOf::new(src, dst, [ports[0], ports[1]], [ports[2], ports[3]], proto);
        // SAFETY: copied out at once.
        unsafe { F::reply_nat().get(&key) }.copied()
    })
}

/// The translation of a reply from `src` (a local endpoint) to `dst`, if one of the endpoint's
/// services has a flow from that client and port whose connection-table entry names the
/// endpoint: its source becomes that service's VIP and port.
#[inline(always)]
fn verified_by_table<F: IpFamily>(
    src: F::Addr,
    dst: F::Addr,
    ports: [u8; 4],
    proto: u8,
) -> Option<ReplyNatOf<F::Addr>> {
    let endpoint = EndpointKeyOf::new(src, [ports[0], ports[1]], proto);
    // SAFETY: read in place at once; the agent replaces a value with one write.
    let services = unsafe { F::endpoint_services().get(&endpoint) }?;
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let client_port = [ports[2], ports[3]];
    let names = |key: &_, backend| flow::names_backend::<F>(key, backend, now);
    let service = endpoint_services::verified(services, dst, client_port, names)?;
    Some(ReplyNatOf::new(service.vip, dst, service.vip_port, client_port))
}
