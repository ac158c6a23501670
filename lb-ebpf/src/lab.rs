//! Lab instruments, loaded only by the tests; the agent never attaches them.
//!
//! A VLAN-aware switch without the 802.1Q module: on a bridge's access port, `lab_access_in`
//! (TC ingress) tags what the host sends with the port's VLAN and `lab_access_out` (TC egress)
//! takes the tag off what goes to the host, dropping frames of other VLANs (untagged ones too,
//! on a VLAN's port; tagged ones on an untagged port, `LAB_ACCESS_VLAN` zero). The nodes'
//! ports are trunks and run neither. `lab_vlan_device_in`/`_out` stand in for a host's VLAN
//! device (a veth pair whose end holds the host's address on the VLAN), where the module that
//! would make one is missing. The tag pushes and pops are core networking helpers.
//!
//! `lab_hashes6` (XDP) writes the service path's hashes of an IPv6 packet into it, for the
//! tests to hold against the agent's.

use aya_ebpf::{
    Global,
    bindings::{
        TC_ACT_OK, TC_ACT_SHOT,
        xdp_action::{XDP_PASS, XDP_TX},
    },
    helpers::{bpf_redirect, bpf_skb_vlan_pop, bpf_skb_vlan_push},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use lb_common::{
    flow_table,
    hash::flow_hash,
    service::{Address, ConnectionKeyOf, FlowKey6},
    vip_filter,
};
use network_types::ip::Ipv6Hdr;

use crate::packet::{self, ETH_LEN, IPV6_LEN, Ports, UDP_LEN, header};

/// The access port's VLAN, set at load; zero for an untagged port.
#[unsafe(no_mangle)]
static LAB_ACCESS_VLAN: Global<u16> = Global::new(0);

const ETHERTYPE_8021Q: u16 = 0x8100;

#[classifier]
pub fn lab_access_in(ctx: TcContext) -> i32 {
    let vlan = LAB_ACCESS_VLAN.load();
    if vlan == 0 {
        return TC_ACT_OK;
    }
    // SAFETY: a helper on the program's own packet.
    if unsafe { bpf_skb_vlan_push(ctx.skb.skb, ETHERTYPE_8021Q.to_be(), vlan) } != 0 {
        return TC_ACT_SHOT;
    }
    TC_ACT_OK
}

#[classifier]
pub fn lab_access_out(ctx: TcContext) -> i32 {
    let vlan = LAB_ACCESS_VLAN.load();
    // SAFETY: fields of the program's own context. A bridge holds a received frame's tag in
    // the packet's metadata, never in the frame.
    let tag = unsafe { ((*ctx.skb.skb).vlan_present != 0).then(|| (*ctx.skb.skb).vlan_tci as u16 & 0x0fff) };
    match tag {
        None if vlan == 0 => TC_ACT_OK,
        // SAFETY: a helper on the program's own packet.
        Some(tag) if tag == vlan && unsafe { bpf_skb_vlan_pop(ctx.skb.skb) } == 0 => TC_ACT_OK,
        _ => TC_ACT_SHOT,
    }
}

/// Where a lab VLAN device's frames go, set at load: the parent's ifindex on the device's
/// side, the device peer's on the parent's.
#[unsafe(no_mangle)]
static LAB_REDIRECT: Global<u32> = Global::new(0);

/// A host's VLAN device without the module, part one, on the parent's TC ingress: a frame of
/// `LAB_ACCESS_VLAN` (its tag in the metadata, where the kernel put it on receive) goes on
/// untagged to the device (through its peer, `LAB_REDIRECT`). Runs after XDP, so the agent's
/// program sees every frame first.
#[classifier]
pub fn lab_vlan_device_in(ctx: TcContext) -> i32 {
    let vlan = LAB_ACCESS_VLAN.load();
    // SAFETY: fields of the program's own context.
    let tag = unsafe { ((*ctx.skb.skb).vlan_present != 0).then(|| (*ctx.skb.skb).vlan_tci as u16 & 0x0fff) };
    if tag != Some(vlan) {
        return TC_ACT_OK;
    }
    // SAFETY: helpers on the program's own packet.
    unsafe {
        if bpf_skb_vlan_pop(ctx.skb.skb) != 0 {
            return TC_ACT_SHOT;
        }
        bpf_redirect(LAB_REDIRECT.load(), 0) as i32
    }
}

/// Part two, on the device peer's TC ingress: what the host sends on the device leaves the
/// parent (`LAB_REDIRECT`) tagged with `LAB_ACCESS_VLAN`.
#[classifier]
pub fn lab_vlan_device_out(ctx: TcContext) -> i32 {
    // SAFETY: helpers on the program's own packet.
    unsafe {
        if bpf_skb_vlan_push(ctx.skb.skb, ETHERTYPE_8021Q.to_be(), LAB_ACCESS_VLAN.load()) != 0 {
            return TC_ACT_SHOT;
        }
        bpf_redirect(LAB_REDIRECT.load(), 0) as i32
    }
}

/// [`lab_hashes6`]'s connection-table seed and service number, set at load.
#[unsafe(no_mangle)]
static LAB_HASH_SEED: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static LAB_HASH_SERVICE: Global<u16> = Global::new(0);

/// The hashes [`lab_hashes6`] writes.
pub const LAB_HASHES: usize = 5;

/// The service path's hashes of an IPv6 UDP packet, for the tests to hold against the agent's:
/// the XDP program reads an address a word at a time (`lb_common::words`, `packet::flow_key6`),
/// the agent byte by byte, and a table's entries are found from both sides. Written big-endian
/// over the first [`LAB_HASHES`] words of the payload, in this order: the VIP filter's bit, the
/// connection table's bucket hash and fingerprint (service [`LAB_HASH_SERVICE`], seed
/// [`LAB_HASH_SEED`], both set at load), the Maglev flow hash, the destination's fold; then
/// `XDP_TX`. Anything shorter passes.
#[xdp]
pub fn lab_hashes6(ctx: XdpContext) -> u32 {
    const PAYLOAD: usize = ETH_LEN + IPV6_LEN + UDP_LEN;
    let (Some(ip), Some(ports), Some(out)) = (
        header::<Ipv6Hdr>(&ctx, ETH_LEN),
        header::<Ports>(&ctx, ETH_LEN + IPV6_LEN),
        header::<[u8; 4 * LAB_HASHES]>(&ctx, PAYLOAD),
    ) else {
        return XDP_PASS;
    };
    let mut flow = FlowKey6::new([0; 16], [0; 16], [0; 2], [0; 2], 0);
    // SAFETY: bounds-checked by `header`.
    unsafe { packet::flow_key6(&*ip, &*ports, &mut flow) };
    let (seed, service) = (LAB_HASH_SEED.load(), LAB_HASH_SERVICE.load());
    let key = ConnectionKeyOf::of(&flow, service);
    let hashes: [u32; LAB_HASHES] = [
        vip_filter::bit_of(&flow.dst, flow.dport, flow.proto),
        flow_table::bucket_hash(&key.client, key.client_port, seed),
        flow_table::fingerprint(&key, seed).get(),
        flow_hash(&flow),
        flow.dst.fold(),
    ];
    // SAFETY: bounds-checked by `header`.
    let out = unsafe { &mut *out };
    for (i, hash) in hashes.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&hash.to_be_bytes());
    }
    XDP_TX
}
