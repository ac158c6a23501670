//! The XDP program's per-CPU counters, summed across CPUs for metrics and tests.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use aya::{
    Ebpf, Pod,
    maps::{MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
};
use lb_common::{
    counters::{Reason, XDP_ACTION_COUNT},
    maps::{
        ACTION_STATS, PacketCounter, REASON_STATS, VIP_STATS, VIP_STATS6, VIP_TRAFFIC, VIP_TRAFFIC6, Vip6Key,
        VipKey, VipStats,
    },
    service::{Address, BACKEND_STATS, BACKEND_STATS6, BackendOf},
};

use crate::error::{Error, Result};

/// Read handles on the counter maps.
pub struct XdpCounters {
    actions: PerCpuArray<MapData, PacketCounter>,
    reasons: PerCpuArray<MapData, PacketCounter>,
    vips: PerCpuHashMap<MapData, VipKey, VipStats>,
    vips6: PerCpuHashMap<MapData, Vip6Key, VipStats>,
    vip_traffic: PerCpuArray<MapData, PacketCounter>,
    vip_traffic6: PerCpuArray<MapData, PacketCounter>,
    backend_stats: PerCpuArray<MapData, PacketCounter>,
    backend_stats6: PerCpuArray<MapData, PacketCounter>,
    /// The backend in each slot of its family's `BACKEND_STATS`, as the last service sync left
    /// them.
    backends: BTreeMap<BackendId, u32>,
    /// Each VIP's slot in its family's `VIP_TRAFFIC`, as the last service sync left them.
    vip_slots: BTreeMap<IpAddr, u32>,
}

/// A backend as metrics and `status` name it, of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BackendId {
    /// The endpoint's address and port (its identity for Maglev too).
    pub endpoint: SocketAddr,
    /// A `Delivery`.
    pub delivery: u8,
}

impl BackendId {
    pub fn of<A: Address>(backend: &BackendOf<A>) -> Self {
        let endpoint = SocketAddr::new(backend.addr.to_ip(), u16::from_be_bytes(backend.port));
        Self { endpoint, delivery: backend.delivery }
    }
}

/// A VIP's counters, summed over CPUs: its ARP replies (Neighbor Advertisements for an IPv6
/// VIP) and the traffic to its services.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipCounters {
    pub arp_replies: u64,
    pub packets: u64,
    pub bytes: u64,
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
    pub vips: BTreeMap<IpAddr, VipCounters>,
    pub backends: BTreeMap<BackendId, PacketCounter>,
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
            vips6: PerCpuHashMap::try_from(super::take_map(ebpf, VIP_STATS6)?).map_err(err(VIP_STATS6))?,
            vip_traffic: PerCpuArray::try_from(super::take_map(ebpf, VIP_TRAFFIC)?)
                .map_err(err(VIP_TRAFFIC))?,
            vip_traffic6: PerCpuArray::try_from(super::take_map(ebpf, VIP_TRAFFIC6)?)
                .map_err(err(VIP_TRAFFIC6))?,
            backend_stats: PerCpuArray::try_from(super::take_map(ebpf, BACKEND_STATS)?)
                .map_err(err(BACKEND_STATS))?,
            backend_stats6: PerCpuArray::try_from(super::take_map(ebpf, BACKEND_STATS6)?)
                .map_err(err(BACKEND_STATS6))?,
            backends: BTreeMap::new(),
            vip_slots: BTreeMap::new(),
        })
    }

    /// Records which VIP of family `A` counts in which `VIP_TRAFFIC` slot, after a service
    /// sync.
    pub fn set_vip_slots<A: Address>(&mut self, slots: BTreeMap<IpAddr, u32>) {
        let ipv4 = A::ZERO.to_ip().is_ipv4();
        self.vip_slots.retain(|vip, _| vip.is_ipv4() != ipv4);
        self.vip_slots.extend(slots);
    }

    /// Records which backend of family `A` sits in which slot, after a service sync.
    pub fn set_backends<A: Address>(&mut self, backends: &BTreeMap<BackendOf<A>, u32>) {
        let ipv4 = A::ZERO.to_ip().is_ipv4();
        self.backends.retain(|b, _| b.endpoint.is_ipv4() != ipv4);
        self.backends.extend(backends.iter().map(|(b, slot)| (BackendId::of(b), *slot)));
    }

    pub fn snapshot(&self) -> Result<CounterSnapshot> {
        let read_array = |array: &PerCpuArray<MapData, PacketCounter>, name, len| {
            (0..len)
                .map(|i| array.get(&i, 0).map(|v| sum_counters(&v)).map_err(err(name)))
                .collect::<Result<Vec<_>>>()
        };
        let mut vips: BTreeMap<IpAddr, VipCounters> = BTreeMap::new();
        let answers4 = answers(&self.vips, VIP_STATS, |k| Ipv4Addr::from(k.addr).into())?;
        let answers6 = answers(&self.vips6, VIP_STATS6, |k| Ipv6Addr::from(k.addr).into())?;
        for (vip, count) in answers4.into_iter().chain(answers6) {
            vips.entry(vip).or_default().arp_replies = count;
        }
        for (vip, slot) in &self.vip_slots {
            let (array, name) = match vip {
                IpAddr::V4(_) => (&self.vip_traffic, VIP_TRAFFIC),
                IpAddr::V6(_) => (&self.vip_traffic6, VIP_TRAFFIC6),
            };
            let traffic = sum_counters(&array.get(slot, 0).map_err(err(name))?);
            let counters = vips.entry(*vip).or_default();
            (counters.packets, counters.bytes) = (traffic.packets, traffic.bytes);
        }
        let mut backends = BTreeMap::new();
        for (backend, slot) in &self.backends {
            let (array, name) = match backend.endpoint {
                SocketAddr::V4(_) => (&self.backend_stats, BACKEND_STATS),
                SocketAddr::V6(_) => (&self.backend_stats6, BACKEND_STATS6),
            };
            backends.insert(*backend, sum_counters(&array.get(slot, 0).map_err(err(name))?));
        }
        Ok(CounterSnapshot {
            backends,
            actions: read_array(&self.actions, ACTION_STATS, XDP_ACTION_COUNT)?,
            reasons: read_array(&self.reasons, REASON_STATS, Reason::COUNT)?,
            vips,
        })
    }

    /// Drops per-VIP counters of VIPs no longer configured, so label sets do not grow forever.
    pub fn retain_vips(&mut self, keep: impl Fn(&IpAddr) -> bool) -> Result<()> {
        remove_unkept(&mut self.vips, VIP_STATS, |k| keep(&Ipv4Addr::from(k.addr).into()))?;
        remove_unkept(&mut self.vips6, VIP_STATS6, |k| keep(&Ipv6Addr::from(k.addr).into()))
    }
}

/// Each VIP's answers in a per-VIP map (`VIP_STATS`, `VIP_STATS6`), summed over CPUs.
fn answers<K: Pod>(
    map: &PerCpuHashMap<MapData, K, VipStats>,
    name: &'static str,
    address: impl Fn(&K) -> IpAddr,
) -> Result<Vec<(IpAddr, u64)>> {
    map.iter()
        .map(|entry| {
            let (key, per_cpu) = entry.map_err(err(name))?;
            Ok((address(&key), per_cpu.iter().map(|s| s.arp_replies).sum()))
        })
        .collect()
}

/// Removes the entries of a per-VIP map whose VIP is not to be kept.
fn remove_unkept<K: Pod>(
    map: &mut PerCpuHashMap<MapData, K, VipStats>,
    name: &'static str,
    keep: impl Fn(&K) -> bool,
) -> Result<()> {
    let stale: Vec<K> = map.keys().filter_map(|k| k.ok()).filter(|k| !keep(k)).collect();
    for key in stale {
        map.remove(&key).map_err(err(name))?;
    }
    Ok(())
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
