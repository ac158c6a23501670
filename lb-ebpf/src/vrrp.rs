//! VRRP advertisements pass to the agent; on the way, each source's Ethernet MAC is learned
//! (IPv4 and IPv6 sources in maps of their own), and an advertisement that claims a live source
//! from another MAC is counted (VRRPv3 has no authentication, so this is how a spoofed member
//! shows). One that claims this node's own address is always counted: the kernel drops an IPv4
//! one as a martian, and the router discards an IPv6 one as its own advert, before anything
//! could notice it, so only here can it be.

use aya_ebpf::{
    bindings::xdp_action::XDP_PASS, helpers::bpf_ktime_get_ns, maps::LruHashMap, programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    maps::{Vip6Key, VipKey, VrrpSpeaker},
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{
    maps::{self, VRRP_SPEAKERS, VRRP_SPEAKERS6},
    packet::{self, L4_OFFSET, header},
    stats, uplink, vlan,
};

/// The VRRPv3 header's first eight bytes: version and type, VRID, priority, count, then
/// 4 reserved bits and the 12-bit maximum advertisement interval in centiseconds (bytes 4–5),
/// then the checksum.
const VRRP_HEADER: usize = 8;
/// When an advertisement says 0 (malformed), a learned MAC stays live this long.
const DEFAULT_LIVE_NS: u64 = 3_000_000_000;

/// An IPv4 advertisement from `source` (its header at [`L4_OFFSET`], no options). This node's
/// own address is looked for on the uplink it arrived by, VLAN included: on another VLAN of
/// the same parent the address is another link's.
#[inline(always)]
pub fn observe(ctx: &XdpContext, source: [u8; 4]) -> u32 {
    let own = maps::settings().is_some_and(|s| s.node_addr == source)
        || uplink::source_on(ctx.ingress_ifindex() as u32, vlan::arrival_vlan()) == Some(source);
    learn(ctx, &VRRP_SPEAKERS, &VipKey::new(source), own, L4_OFFSET);
    stats::verdict(Reason::Ipv4Passed, packet::len(ctx), XDP_PASS)
}

/// An IPv6 advertisement from `source` (its header right after the fixed IPv6 header). This
/// node's own IPv6 source arriving from the segment is no martian to the kernel, and the
/// router discards it as its own advert: it is looked for here, on the uplink it arrived by
/// (a link-local address means something on its link alone; the agent writes `VRRP_OWN6`).
#[inline(always)]
pub fn observe6(ctx: &XdpContext, source: [u8; 16]) -> u32 {
    let own = uplink::own_vrrp6(ctx.ingress_ifindex() as u32, vlan::arrival_vlan()) == Some(source);
    learn(ctx, &VRRP_SPEAKERS6, &Vip6Key::new(source), own, EthHdr::LEN + Ipv6Hdr::LEN);
    stats::verdict(Reason::Ipv6Passed, packet::len(ctx), XDP_PASS)
}

/// Learns `key`'s MAC from this advertisement (whose VRRP header is at `offset`), or counts it
/// against the live one; `own`: the source is this node's, so any arrival is counted.
#[inline(always)]
fn learn<K>(ctx: &XdpContext, speakers: &LruHashMap<K, VrrpSpeaker>, key: &K, own: bool, offset: usize) {
    let (Some(eth), Some(vrrp)) = (header::<EthHdr>(ctx, 0), header::<[u8; VRRP_HEADER]>(ctx, offset)) else {
        // The agent decodes and drops what is short; nothing to learn here.
        return;
    };
    // SAFETY: bounds-checked by `header`; copied out at once.
    let (mac, interval_cs) =
        unsafe { ((*eth).src_addr, u16::from_be_bytes([(*vrrp)[4] & 0x0f, (*vrrp)[5]])) };
    // Live for three of its advertised intervals, as a backup waits before taking over.
    let live_ns = if interval_cs == 0 { DEFAULT_LIVE_NS } else { u64::from(interval_cs) * 30_000_000 };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if own {
        let counted = match speakers.get_ptr_mut(key) {
            // SAFETY: a valid map value; races between CPUs only blur the counts.
            Some(speaker) => unsafe { &mut *speaker },
            None => {
                let _ = speakers.insert(key, &VrrpSpeaker::default(), 0);
                let Some(speaker) = speakers.get_ptr_mut(key) else { return };
                // SAFETY: as above.
                unsafe { &mut *speaker }
            }
        };
        counted.other_mac = mac;
        counted.other_mac_adverts += 1;
        return;
    }
    match speakers.get_ptr_mut(key) {
        Some(speaker) => {
            // SAFETY: a valid map value; races between CPUs only blur the counts.
            let speaker = unsafe { &mut *speaker };
            if speaker.mac != mac && now < speaker.live_until_ns {
                // Counted here, not as a reason of its own: the agent reports it per member,
                // and the counter arrays keep their shape (a new shape would replace the maps).
                speaker.other_mac = mac;
                speaker.other_mac_adverts += 1;
                return;
            }
            speaker.mac = mac;
            speaker.live_until_ns = now + live_ns;
        }
        None => {
            let speaker = VrrpSpeaker { mac, live_until_ns: now + live_ns, ..VrrpSpeaker::default() };
            let _ = speakers.insert(key, &speaker, 0);
        }
    }
}
