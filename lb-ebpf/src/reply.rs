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
    helpers::bpf_ktime_get_coarse_ns,
    programs::TcContext,
};
use lb_common::{
    counters::Reason,
    endpoint_services::{self, EndpointKeyOf},
    service::{FlowKeyOf, PROTO_TCP, PROTO_UDP, ReplyNatOf},
};

use crate::{
    family::{IpFamily, V4, V6},
    packet::{ETH_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, FRAGMENT_MASK, IPV6_LEN, L4_OFFSET as L4},
    services::flow,
    stats,
};

const IP_CHECK: usize = ETH_LEN + 10;
const IP_SRC: usize = ETH_LEN + 12;
const IP_DST: usize = ETH_LEN + 16;
const IP6_NEXT: usize = ETH_LEN + 6;
const IP6_SRC: usize = ETH_LEN + 8;
const IP6_DST: usize = ETH_LEN + 24;
const L4_6: usize = ETH_LEN + IPV6_LEN;

/// Translates the packet if it is the reply of a flow this node translated. Any error just
/// leaves the packet as it is.
#[inline(always)]
pub fn translate(ctx: &TcContext) -> Result<(), i64> {
    let ethertype = ctx.load::<[u8; 2]>(12)?;
    if ethertype == ETHERTYPE_IPV6.to_be_bytes() {
        return translate6(ctx);
    }
    if ethertype != ETHERTYPE_IPV4.to_be_bytes() || ctx.load::<u8>(ETH_LEN)? != 0x45 {
        return Ok(());
    }
    if u16::from_be_bytes(ctx.load::<[u8; 2]>(ETH_LEN + 6)?) & FRAGMENT_MASK != 0 {
        return Ok(());
    }
    let proto = ctx.load::<u8>(ETH_LEN + 9)?;
    let (check_at, mangled) = match proto {
        PROTO_TCP => (L4 + 16, 0),
        PROTO_UDP => (L4 + 6, BPF_F_MARK_MANGLED_0 as u64),
        _ => return Ok(()),
    };
    let src = ctx.load::<[u8; 4]>(IP_SRC)?;
    let dst = ctx.load::<[u8; 4]>(IP_DST)?;
    let ports = ctx.load::<[u8; 4]>(L4)?;
    let Some(to) = translation::<V4>(src, dst, ports, proto) else { return Ok(()) };
    let word = |b: [u8; 4]| u32::from_ne_bytes(b) as u64;
    let half = |b: [u8; 2]| u16::from_ne_bytes(b) as u64;
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
    let (sport, dport) = ([ports[0], ports[1]], [ports[2], ports[3]]);
    if to.sport != sport {
        ctx.l4_csum_replace(check_at, half(sport), half(to.sport), mangled | 2)?;
        ctx.store(L4, &to.sport, 0)?;
    }
    if to.dport != dport {
        ctx.l4_csum_replace(check_at, half(dport), half(to.dport), mangled | 2)?;
        ctx.store(L4 + 2, &to.dport, 0)?;
    }
    stats::count_reason(Reason::ReplyTranslated, ctx.len() as usize);
    Ok(())
}

/// Writes `new` over the IPv6 address `old` at `at`, its change entering the TCP/UDP checksum
/// at `check_at` a word at a time. Inline: as the closure it was, called twice, it stayed a
/// BPF function, and a call costs about 10 ns where returns go through a return thunk.
#[inline(always)]
fn replace_address6(
    ctx: &TcContext,
    check_at: usize,
    pseudo: u64,
    at: usize,
    old: &[u8; 16],
    new: &[u8; 16],
) -> Result<(), i64> {
    for i in 0..4 {
        let word =
            |b: &[u8; 16]| u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as u64;
        ctx.l4_csum_replace(check_at, word(old), word(new), pseudo)?;
    }
    ctx.store(at, new, 0)
}

/// As [`translate`] for IPv6 without extension headers: no header checksum; the addresses'
/// change enters the TCP/UDP checksum through the pseudo-header, a word at a time.
#[inline(always)]
fn translate6(ctx: &TcContext) -> Result<(), i64> {
    let proto = ctx.load::<u8>(IP6_NEXT)?;
    let check_at = match proto {
        PROTO_TCP => L4_6 + 16,
        PROTO_UDP => L4_6 + 6,
        _ => return Ok(()),
    };
    // A computed zero UDP checksum is sent as 0xffff (zero is not allowed over IPv6).
    let mangled = if proto == PROTO_UDP { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
    let src = ctx.load::<[u8; 16]>(IP6_SRC)?;
    let dst = ctx.load::<[u8; 16]>(IP6_DST)?;
    let ports = ctx.load::<[u8; 4]>(L4_6)?;
    let Some(to) = translation::<V6>(src, dst, ports, proto) else { return Ok(()) };
    let pseudo = BPF_F_PSEUDO_HDR as u64 | mangled | 4;
    if to.src != src {
        replace_address6(ctx, check_at, pseudo, IP6_SRC, &src, &to.src)?;
    }
    if to.dst != dst {
        replace_address6(ctx, check_at, pseudo, IP6_DST, &dst, &to.dst)?;
    }
    let half = |b: [u8; 2]| u16::from_ne_bytes(b) as u64;
    let (sport, dport) = ([ports[0], ports[1]], [ports[2], ports[3]]);
    if to.sport != sport {
        ctx.l4_csum_replace(check_at, half(sport), half(to.sport), mangled | 2)?;
        ctx.store(L4_6, &to.sport, 0)?;
    }
    if to.dport != dport {
        ctx.l4_csum_replace(check_at, half(dport), half(to.dport), mangled | 2)?;
        ctx.store(L4_6 + 2, &to.dport, 0)?;
    }
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
