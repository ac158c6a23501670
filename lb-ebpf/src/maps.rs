//! The program's maps. Names must match `lb_common::maps`, which the agent uses to find them.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
};
use lb_common::{
    counters::{Reason, XDP_ACTION_COUNT},
    maps::{MAX_VIPS, OwnedVip, PacketCounter, VipKey, VipStats},
};

#[map]
pub static OWNED_VIPS: HashMap<VipKey, OwnedVip> = HashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static VIP_STATS: PerCpuHashMap<VipKey, VipStats> = PerCpuHashMap::with_max_entries(MAX_VIPS, 0);

#[map]
pub static ACTION_STATS: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(XDP_ACTION_COUNT, 0);

#[map]
pub static REASON_STATS: PerCpuArray<PacketCounter> = PerCpuArray::with_max_entries(Reason::COUNT, 0);
