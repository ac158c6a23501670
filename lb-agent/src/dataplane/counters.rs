//! The XDP program's per-CPU counters, summed across CPUs for metrics and tests.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    maps::{MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
};
use lb_common::{
    counters::{Reason, XDP_ACTION_COUNT},
    maps::{ACTION_STATS, PacketCounter, REASON_STATS, VIP_STATS, VipKey, VipStats},
    service::{BACKEND_STATS, Backend},
};

use crate::error::{Error, Result};

/// Read handles on the counter maps.
pub struct XdpCounters {
    actions: PerCpuArray<MapData, PacketCounter>,
    reasons: PerCpuArray<MapData, PacketCounter>,
    vips: PerCpuHashMap<MapData, VipKey, VipStats>,
    backend_stats: PerCpuArray<MapData, PacketCounter>,
    /// The backend in each slot, as the last service sync left them.
    backends: BTreeMap<Backend, u32>,
}

impl std::fmt::Debug for XdpCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XdpCounters")
    }
}

/// A snapshot, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Indexed by XDP action code.
    pub actions: Vec<PacketCounter>,
    /// Indexed by [`Reason`].
    pub reasons: Vec<PacketCounter>,
    pub vips: BTreeMap<Ipv4Addr, VipStats>,
    pub backends: BTreeMap<Backend, PacketCounter>,
}

impl CounterSnapshot {
    pub fn reason(&self, reason: Reason) -> PacketCounter {
        self.reasons[reason as usize]
    }
}

impl XdpCounters {
    pub(crate) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        Ok(Self {
            actions: PerCpuArray::try_from(super::take_map(ebpf, ACTION_STATS)?)
                .map_err(err(ACTION_STATS))?,
            reasons: PerCpuArray::try_from(super::take_map(ebpf, REASON_STATS)?)
                .map_err(err(REASON_STATS))?,
            vips: PerCpuHashMap::try_from(super::take_map(ebpf, VIP_STATS)?).map_err(err(VIP_STATS))?,
            backend_stats: PerCpuArray::try_from(super::take_map(ebpf, BACKEND_STATS)?)
                .map_err(err(BACKEND_STATS))?,
            backends: BTreeMap::new(),
        })
    }

    /// Records which backend sits in which slot, after a service sync.
    pub fn set_backends(&mut self, backends: BTreeMap<Backend, u32>) {
        self.backends = backends;
    }

    pub fn snapshot(&self) -> Result<CounterSnapshot> {
        let read_array = |array: &PerCpuArray<MapData, PacketCounter>, name, len| {
            (0..len)
                .map(|i| array.get(&i, 0).map(|v| sum_counters(&v)).map_err(err(name)))
                .collect::<Result<Vec<_>>>()
        };
        let mut vips = BTreeMap::new();
        for entry in self.vips.iter() {
            let (key, per_cpu) = entry.map_err(err(VIP_STATS))?;
            let summed = per_cpu.iter().fold(VipStats::default(), |acc, s| VipStats {
                arp_replies: acc.arp_replies + s.arp_replies,
                packets: acc.packets + s.packets,
                bytes: acc.bytes + s.bytes,
            });
            vips.insert(Ipv4Addr::from(key.addr), summed);
        }
        let mut backends = BTreeMap::new();
        for (backend, slot) in &self.backends {
            let values = self.backend_stats.get(slot, 0).map_err(err(BACKEND_STATS))?;
            backends.insert(*backend, sum_counters(&values));
        }
        Ok(CounterSnapshot {
            backends,
            actions: read_array(&self.actions, ACTION_STATS, XDP_ACTION_COUNT)?,
            reasons: read_array(&self.reasons, REASON_STATS, Reason::COUNT)?,
            vips,
        })
    }

    /// Drops per-VIP counters of VIPs no longer configured, so label sets do not grow forever.
    pub fn retain_vips(&mut self, keep: impl Fn(&Ipv4Addr) -> bool) -> Result<()> {
        let stale: Vec<VipKey> =
            self.vips.keys().filter_map(|k| k.ok()).filter(|k| !keep(&Ipv4Addr::from(k.addr))).collect();
        for key in stale {
            self.vips.remove(&key).map_err(err(VIP_STATS))?;
        }
        Ok(())
    }
}

fn sum_counters(values: &PerCpuValues<PacketCounter>) -> PacketCounter {
    values.iter().fold(PacketCounter::default(), |acc, c| PacketCounter {
        packets: acc.packets + c.packets,
        bytes: acc.bytes + c.bytes,
    })
}

fn err(map: &'static str) -> impl Fn(MapError) -> Error {
    move |source| Error::BpfMap { map, source }
}
