//! Counters. Per-CPU, so increments need no atomics; userspace sums the CPUs.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    maps::{PerCpuArray, PerCpuHashMap},
};
use lb_common::{
    counters::Reason,
    maps::{PacketCounter, Vip6Key, VipKey, VipStats},
};

use crate::maps::{ACTION_STATS, REASON_STATS, VIP_STATS, VIP_STATS6};

#[inline(always)]
pub fn count_action(action: u32, bytes: usize) {
    add(&ACTION_STATS, action, bytes);
}

#[inline(always)]
pub fn count_reason(reason: Reason, bytes: usize) {
    add(&REASON_STATS, reason as u32, bytes);
}

#[inline(always)]
fn add(array: &PerCpuArray<PacketCounter>, index: u32, bytes: usize) {
    if let Some(counter) = array.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, touched only by this CPU while the program runs.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += bytes as u64;
        }
    }
}

#[inline(always)]
pub fn count_arp_reply(vip: &VipKey) {
    count_answer(&VIP_STATS, vip);
}

#[inline(always)]
pub fn count_neighbor_advertisement(vip: &Vip6Key) {
    count_answer(&VIP_STATS6, vip);
}

/// One more answer (ARP reply, Neighbor Advertisement) for `vip`.
#[inline(always)]
fn count_answer<K>(map: &PerCpuHashMap<K, VipStats>, vip: &K) {
    match map.get_ptr_mut(vip) {
        // SAFETY: this CPU's copy of the value, as above.
        Some(stats) => unsafe { (*stats).arp_replies += 1 },
        None => {
            // First answer for this VIP: create it. Losing a race with another CPU only loses
            // that CPU's first count, and a full map only loses per-VIP detail; the reason
            // counter still counts every answer.
            let _ = map.insert(vip, &VipStats { arp_replies: 1 }, BPF_NOEXIST as u64);
        }
    }
}

/// Counts `reason` and returns `action`, so a path ends in one expression.
#[inline(always)]
pub fn verdict(reason: Reason, bytes: usize, action: u32) -> u32 {
    count_reason(reason, bytes);
    action
}

/// Traffic to a backend, in its family's `BACKEND_STATS`.
#[inline(always)]
pub fn count_backend(stats: &PerCpuArray<PacketCounter>, id: u32, bytes: usize) {
    add(stats, id, bytes);
}

/// Traffic to a VIP's services, at the VIP's slot of its family's `VIP_TRAFFIC` (an array:
/// no hash lookup per packet).
#[inline(always)]
pub fn count_vip_traffic(traffic: &PerCpuArray<PacketCounter>, slot: u32, bytes: usize) {
    add(traffic, slot, bytes);
}
