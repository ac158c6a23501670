//! 802.1Q on an uplink's parent interface, without a VLAN device.
//!
//! A frame tagged with a VLAN the agent serves on this interface (an uplink under its VLAN id:
//! in `VLAN_SLOTS` by the id, else in `UPLINKS`) loses its tag here and is handled as any frame, as having arrived on that
//! VLAN's uplink. What the program answers (ARP, NDP, echo, Packet Too Big) goes back with the
//! tag it came with; what it passes to the kernel gets its tag back untouched; what it
//! forwards leaves as the route's egress says. A tag on a VLAN not served here, and a stacked
//! tag (QinQ, 802.1ad), pass to the kernel as they came, counted.
//!
//! Only a tag in the frame is seen: a NIC (or a veth whose sender offloads VLAN insertion)
//! that strips the tag into metadata hides it from XDP.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::bpf_xdp_adjust_head,
    programs::XdpContext,
};
use lb_common::{counters::Reason, maps::UplinkKey};

use crate::{
    maps::{ARRIVAL, UPLINKS, VLAN_SLOTS},
    packet, stats,
};

pub const ETHERTYPE_8021Q: u16 = 0x8100;
pub const ETHERTYPE_8021AD: u16 = 0x88a8;
/// The tag's length in the frame: its EtherType and its TCI.
const TAG_LEN: usize = 4;
/// The TCI's VLAN id bits.
const VID_MASK: u16 = 0x0fff;
/// [`ARRIVAL`]'s flag for a frame that came tagged; the TCI is in its low 16 bits, the VLAN's
/// uplink slot in its top byte (found when the tag came off, so not looked up again).
const TAGGED: u32 = 1 << 16;
const SLOT_SHIFT: u32 = 24;

/// The Ethernet addresses, the tag, and the EtherType it carries.
#[repr(C)]
struct TaggedHeader {
    macs: [u8; 12],
    tpid: [u8; 2],
    tci: [u8; 2],
    inner: [u8; 2],
}

/// The same frame untagged.
#[repr(C)]
struct UntaggedHeader {
    macs: [u8; 12],
    ether_type: [u8; 2],
}

/// Records that the frame arrived untagged. Every frame passes here or through [`untag`]
/// first, so nothing reads an earlier frame's VLAN.
#[inline(always)]
pub fn arrived_untagged() {
    set_arrival(0);
}

/// The VLAN the frame arrived on, zero for none.
#[inline(always)]
pub fn arrival_vlan() -> u16 {
    arrival() as u16 & VID_MASK
}

/// The uplink slot of the VLAN a tagged frame arrived on; `None` for an untagged frame.
#[inline(always)]
pub fn tagged_arrival_slot() -> Option<u8> {
    let arrival = arrival();
    (arrival & TAGGED != 0).then_some((arrival >> SLOT_SHIFT) as u8)
}

/// Takes the tag off a frame whose EtherType is 802.1Q and records its VLAN, when this
/// interface serves it. Otherwise the frame is left as it came and the reason to pass it
/// returned: a stacked tag, a VLAN not served here, a truncated tag.
#[inline(always)]
pub fn untag(ctx: &XdpContext) -> Result<(), Reason> {
    let Some(header) = packet::header::<TaggedHeader>(ctx, 0) else {
        return Err(Reason::MalformedEthernet);
    };
    // SAFETY: bounds-checked by `header`; copied out before the frame moves.
    let (macs, tci, inner) = unsafe { ((*header).macs, u16::from_be_bytes((*header).tci), (*header).inner) };
    let inner_type = u16::from_be_bytes(inner);
    if inner_type == ETHERTYPE_8021Q || inner_type == ETHERTYPE_8021AD {
        return Err(Reason::VlanStacked);
    }
    let Some(slot) = served_slot(ctx.ingress_ifindex() as u32, tci & VID_MASK) else {
        return Err(Reason::VlanNotServed);
    };
    // SAFETY: the helper moves the start of the packet within its buffer; every pointer into
    // the packet is taken again afterwards.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, TAG_LEN as i32) } != 0 {
        return Err(Reason::MalformedEthernet);
    }
    let Some(eth) = packet::header::<UntaggedHeader>(ctx, 0) else {
        return Err(Reason::MalformedEthernet);
    };
    // SAFETY: bounds-checked by `header`; the EtherType is already the inner one.
    unsafe { (*eth).macs = macs };
    set_arrival(TAGGED | u32::from(tci) | u32::from(slot) << SLOT_SHIFT);
    Ok(())
}

/// The uplink slot of VLAN `vid` on interface `ifindex`, if this node serves it there: from
/// the array by VLAN id, else (another parent holds the id there) from the uplink map.
#[inline(always)]
fn served_slot(ifindex: u32, vid: u16) -> Option<u8> {
    if let Some(entry) = VLAN_SLOTS.get(u32::from(vid))
        && entry.ifindex == ifindex
    {
        return Some(entry.slot);
    }
    // SAFETY: copied out at once.
    unsafe { UPLINKS.get(&UplinkKey::new(ifindex, vid)) }.map(|u| u.slot)
}

/// The action for an answer (`XDP_TX` back to the sender): the frame gets back the tag it
/// arrived with, if any.
#[inline(always)]
pub fn answer(ctx: &XdpContext, action: u32) -> u32 {
    if action != XDP_TX || retag(ctx) {
        return action;
    }
    XDP_DROP
}

/// What a program does last with its verdict: a tagged frame passed to the kernel gets its
/// tag back, so the kernel (and packet sockets) see it as it came. Inline, and only a passed
/// frame calls on ([`finish_passed`]): a BPF function call costs about 10 ns on hosts whose
/// returns go through a return thunk (AMD's SRSO mitigation), and every forwarded frame ends
/// here.
#[inline(always)]
pub fn finish(ctx: &XdpContext, action: u32) -> u32 {
    if action != XDP_PASS {
        return action;
    }
    finish_passed(ctx)
}

/// [`finish`] for a passed frame: a BPF function of its own, so that its map key and the
/// retagging stay out of the programs' frames, which only passed frames pay for.
#[inline(never)]
fn finish_passed(ctx: &XdpContext) -> u32 {
    if retag(ctx) { XDP_PASS } else { XDP_DROP }
}

/// Puts the arrival tag back on the frame; true when there was none or it is back on.
#[inline(always)]
fn retag(ctx: &XdpContext) -> bool {
    let arrival = arrival();
    if arrival & TAGGED == 0 {
        return true;
    }
    // Once back on, a second call must not tag the frame twice.
    set_arrival(0);
    tag(ctx, arrival as u16)
}

/// Tags the frame with `tci` (802.1Q); false when the frame has no room or is too short. A
/// BPF function of its own: inlined, its frame would add to `lb_xdp6`'s, whose calls fill the
/// 512-byte stack.
#[inline(never)]
pub fn tag(ctx: &XdpContext, tci: u16) -> bool {
    let Some(eth) = packet::header::<UntaggedHeader>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds-checked by `header`; copied out before the frame moves.
    let macs = unsafe { (*eth).macs };
    // SAFETY: as in `untag`.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(TAG_LEN as i32)) } != 0 {
        return false;
    }
    let Some(header) = packet::header::<TaggedHeader>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds-checked by `header`; `inner` already holds the frame's EtherType.
    unsafe {
        (*header).macs = macs;
        (*header).tpid = ETHERTYPE_8021Q.to_be_bytes();
        (*header).tci = tci.to_be_bytes();
    }
    true
}

/// Inline (see [`finish`]): the DSR paths and full NAT read it for every packet, and so does
/// a service that names its uplink.
#[inline(always)]
fn arrival() -> u32 {
    ARRIVAL.get(0).copied().unwrap_or(0)
}

#[inline(always)]
fn set_arrival(value: u32) {
    if let Some(slot) = ARRIVAL.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; a frame runs on one CPU from `lb_xdp` to its last stage.
        unsafe { *slot = value };
    }
}

/// Whether `ether_type` is a tag's (a frame's EtherType field).
#[inline(always)]
pub fn is_tag(ether_type: u16) -> bool {
    ether_type == ETHERTYPE_8021Q || ether_type == ETHERTYPE_8021AD
}

/// Passes a frame with a tag [`untag`] did not take, counted.
#[inline(always)]
pub fn pass(ctx: &XdpContext, reason: Reason) -> u32 {
    stats::verdict(reason, packet::len(ctx), XDP_PASS)
}
