//! Uplinks: which one a frame arrived on, and this node's address on the one it leaves by.
//!
//! A node may serve groups on several interfaces; each owned VIP and service names the uplink
//! slot it is served on, and a frame for it that arrives elsewhere is left to the kernel.

use aya_ebpf::programs::XdpContext;
use lb_common::maps::{ANY_UPLINK, UplinkKey};

use crate::{
    maps::{UPLINKS, VRRP_OWN6},
    vlan,
};

/// Whether a VIP served on uplink `slot` is served for this frame (on the VLAN it came by).
#[inline(always)]
pub fn accepts(ctx: &XdpContext, slot: u8) -> bool {
    slot == ANY_UPLINK || arrived_on(ctx) == Some(slot)
}

/// The slot of the uplink this frame arrived on, if it is one.
#[inline(always)]
fn arrived_on(ctx: &XdpContext) -> Option<u8> {
    if let Some(slot) = vlan::tagged_arrival_slot() {
        return Some(slot);
    }
    // SAFETY: copied out at once.
    unsafe { UPLINKS.get(&UplinkKey::new(ctx.ingress_ifindex() as u32, 0)) }.map(|u| u.slot)
}

/// This node's address on interface `ifindex`, when that is an uplink.
#[inline(always)]
pub fn source(ifindex: u32) -> Option<[u8; 4]> {
    source_on(ifindex, 0)
}

/// This node's IPv4 address on the uplink on interface `ifindex`, VLAN `vlan` (zero for none):
/// also its VRRP source there.
#[inline(always)]
pub fn source_on(ifindex: u32, vlan: u16) -> Option<[u8; 4]> {
    // SAFETY: copied out at once.
    unsafe { UPLINKS.get(&UplinkKey::new(ifindex, vlan)) }.map(|u| u.source)
}

/// This node's IPv6 VRRP address on the uplink a frame arrived by (interface `ifindex`, VLAN
/// `vlan`, zero for none).
#[inline(always)]
pub fn own_vrrp6(ifindex: u32, vlan: u16) -> Option<[u8; 16]> {
    // SAFETY: copied out at once.
    unsafe { VRRP_OWN6.get(&UplinkKey::new(ifindex, vlan)) }.map(|a| a.addr)
}

/// The MAC of interface `ifindex` (on VLAN `vlan`, zero for none), when that is an uplink.
#[inline(always)]
pub fn mac(ifindex: u32, vlan: u16) -> Option<[u8; 6]> {
    // SAFETY: copied out at once.
    unsafe { UPLINKS.get(&UplinkKey::new(ifindex, vlan)) }.map(|u| u.mac)
}
