//! The service maps, brought to a [`DataplanePlan`] by difference.
//!
//! Unchanged services, backends and endpoints are never rewritten. A service whose ring
//! changes gets a new ring, filled completely before the service entry is pointed at it, so a
//! packet sees the old ring or the new one, never a mix. Backend slots are handed out
//! round-robin, so a slot freed now is reused as late as possible, and a flow pinned to a
//! removed backend finds an empty slot and is re-balanced rather than misdirected.
//!
//! All state is read back from the (pinned) maps at start, so a restarted agent continues
//! where the last one stopped.

use std::collections::{BTreeMap, BTreeSet};

use aya::{
    maps::{Array, HashMap, HashOfMaps, MapData, MapError, PerCpuArray, PerCpuValues},
    util::nr_cpus,
};
use lb_common::{
    maps::PacketCounter,
    service::{
        BACKEND_STATS, BACKENDS, Backend, Delivery, INNER_MAP_FLAGS, LOCAL_ENDPOINTS, LocalEndpoint,
        LocalEndpointKey, MAGLEV_RINGS, MAX_BACKENDS, SERVICES, SETTINGS, Service, ServiceKey, Settings,
    },
};

use crate::{
    error::{Error, Result},
    service_plan::DataplanePlan,
};

type Ring = Array<MapData, u32>;

pub struct ServiceMaps {
    services: HashMap<MapData, ServiceKey, Service>,
    backends: Array<MapData, Backend>,
    backend_stats: PerCpuArray<MapData, PacketCounter>,
    rings: HashOfMaps<MapData, u32, Ring>,
    local_endpoints: HashMap<MapData, LocalEndpointKey, LocalEndpoint>,
    settings: Array<MapData, Settings>,
    /// Backend → slot, as the `BACKENDS` map holds them.
    slots: BTreeMap<Backend, u32>,
    next_slot: u32,
    next_ring: u32,
}

/// What one sync changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub services_added: usize,
    pub services_changed: usize,
    pub services_removed: usize,
    pub rings_written: usize,
    pub backends_added: usize,
    pub backends_removed: usize,
    pub local_endpoints_changed: usize,
}

impl SyncReport {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn err(map: &'static str) -> impl Fn(MapError) -> Error {
    move |source| Error::BpfMap { map, source }
}

impl ServiceMaps {
    /// Takes the service maps from `ebpf`. The agent shares the backend counters with the
    /// metrics reader, so it passes `pin_dir` and this side opens its own handle through the
    /// pin; without one (fixture tests) the map itself is taken.
    pub fn take(ebpf: &mut aya::Ebpf, pin_dir: Option<&std::path::Path>) -> Result<Self> {
        let stats = match pin_dir {
            Some(dir) => {
                let data = MapData::from_pin(dir.join(BACKEND_STATS)).map_err(err(BACKEND_STATS))?;
                aya::maps::Map::from_map_data(data).map_err(err(BACKEND_STATS))?
            }
            None => super::take_map(ebpf, BACKEND_STATS)?,
        };
        let mut take = |name| super::take_map(ebpf, name);
        let mut maps = Self {
            services: HashMap::try_from(take(SERVICES)?).map_err(err(SERVICES))?,
            backends: Array::try_from(take(BACKENDS)?).map_err(err(BACKENDS))?,
            backend_stats: PerCpuArray::try_from(stats).map_err(err(BACKEND_STATS))?,
            rings: HashOfMaps::try_from(take(MAGLEV_RINGS)?).map_err(err(MAGLEV_RINGS))?,
            local_endpoints: HashMap::try_from(take(LOCAL_ENDPOINTS)?).map_err(err(LOCAL_ENDPOINTS))?,
            settings: Array::try_from(take(SETTINGS)?).map_err(err(SETTINGS))?,
            slots: BTreeMap::new(),
            next_slot: 0,
            next_ring: 1,
        };
        maps.read_back()?;
        Ok(maps)
    }

    /// Rebuilds the slot table from `BACKENDS`, and drops rings no service points at (left by
    /// an agent that stopped between writing a ring and switching to it).
    fn read_back(&mut self) -> Result<()> {
        for (slot, backend) in self.backends.iter().enumerate() {
            let backend = backend.map_err(err(BACKENDS))?;
            if Delivery::from_u8(backend.delivery).is_some() {
                self.slots.insert(backend, slot as u32);
                self.next_slot = slot as u32 + 1;
            }
        }
        let in_use: BTreeSet<u32> = self.current_services()?.values().map(|s| s.ring_id).collect();
        self.next_ring = in_use.iter().max().map_or(1, |m| m + 1);
        let stale: Vec<u32> =
            self.rings.keys().filter_map(|k| k.ok()).filter(|k| !in_use.contains(k)).collect();
        for ring in stale {
            self.rings.remove(&ring).map_err(err(MAGLEV_RINGS))?;
        }
        Ok(())
    }

    fn current_services(&self) -> Result<BTreeMap<ServiceKey, Service>> {
        self.services.iter().map(|e| e.map_err(err(SERVICES))).collect()
    }

    pub fn set_settings(&mut self, settings: Settings) -> Result<()> {
        if self.settings.get(&0, 0).ok() != Some(settings) {
            self.settings.set(0, settings, 0).map_err(err(SETTINGS))?;
        }
        Ok(())
    }

    /// Makes the maps hold `plan`, changing only what differs.
    pub fn apply(&mut self, plan: &DataplanePlan) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        let wanted = plan.backends();
        for backend in &wanted {
            if !self.slots.contains_key(backend) {
                self.add_backend(*backend)?;
                report.backends_added += 1;
            }
        }

        let current = self.current_services()?;
        for (key, planned) in &plan.services {
            let ring: Vec<u32> =
                planned.ring.iter().map(|&i| self.slots[&planned.backends[i as usize]]).collect();
            let digest = digest(&ring);
            let entry = |ring_id| Service {
                ring_id,
                ring_size: ring.len() as u32,
                backend_count: planned.backends.len() as u32,
                ring_digest: digest,
            };
            let old = current.get(key);
            if let Some(old) = old
                && *old == entry(old.ring_id)
            {
                continue;
            }
            let ring_id = if ring.is_empty() { 0 } else { self.write_ring(&ring, &current)? };
            report.rings_written += usize::from(!ring.is_empty());
            self.services.insert(key, entry(ring_id), 0).map_err(err(SERVICES))?;
            match old {
                Some(old) => {
                    report.services_changed += 1;
                    self.drop_ring(old.ring_id)?;
                }
                None => report.services_added += 1,
            }
        }
        for (key, old) in &current {
            if !plan.services.contains_key(key) {
                self.services.remove(key).map_err(err(SERVICES))?;
                self.drop_ring(old.ring_id)?;
                report.services_removed += 1;
            }
        }

        // Only now, with no ring pointing at them, free the backends nobody wants.
        let unwanted: Vec<Backend> = self.slots.keys().filter(|b| !wanted.contains(b)).copied().collect();
        for backend in unwanted {
            let slot = self.slots.remove(&backend).expect("listed from slots");
            self.backends.set(slot, EMPTY_BACKEND, 0).map_err(err(BACKENDS))?;
            report.backends_removed += 1;
        }

        let current: BTreeMap<LocalEndpointKey, LocalEndpoint> =
            self.local_endpoints.iter().map(|e| e.map_err(err(LOCAL_ENDPOINTS))).collect::<Result<_>>()?;
        for (key, value) in &plan.local_endpoints {
            if current.get(key) != Some(value) {
                self.local_endpoints.insert(key, value, 0).map_err(err(LOCAL_ENDPOINTS))?;
                report.local_endpoints_changed += 1;
            }
        }
        for key in current.keys().filter(|k| !plan.local_endpoints.contains_key(k)) {
            self.local_endpoints.remove(key).map_err(err(LOCAL_ENDPOINTS))?;
            report.local_endpoints_changed += 1;
        }
        Ok(report)
    }

    fn add_backend(&mut self, backend: Backend) -> Result<()> {
        let used: BTreeSet<u32> = self.slots.values().copied().collect();
        let slot = (0..MAX_BACKENDS)
            .map(|i| (self.next_slot + i) % MAX_BACKENDS)
            .find(|s| !used.contains(s))
            .ok_or(Error::Capacity { what: "backends", limit: MAX_BACKENDS })?;
        // A reused slot starts its counters from zero.
        let zeros = PerCpuValues::try_from(vec![PacketCounter::default(); cpus()?])
            .map_err(|e| Error::io("sizing per-CPU counters", e))?;
        self.backend_stats.set(slot, zeros, 0).map_err(err(BACKEND_STATS))?;
        self.backends.set(slot, backend, 0).map_err(err(BACKENDS))?;
        self.slots.insert(backend, slot);
        self.next_slot = (slot + 1) % MAX_BACKENDS;
        Ok(())
    }

    /// Creates, fills and registers a ring; returns its id.
    fn write_ring(&mut self, ring: &[u32], current: &BTreeMap<ServiceKey, Service>) -> Result<u32> {
        // Ids in use are exactly the current services' (unreferenced rings were removed at
        // start, and a replaced ring is removed right after the switch).
        let in_use: BTreeSet<u32> = current.values().map(|s| s.ring_id).collect();
        let mut id = self.next_ring.max(1);
        while in_use.contains(&id) {
            id = id.wrapping_add(1).max(1);
        }
        self.next_ring = id.wrapping_add(1).max(1);
        let mut array = Ring::create(ring.len() as u32, INNER_MAP_FLAGS).map_err(err(MAGLEV_RINGS))?;
        for (slot, backend) in ring.iter().enumerate() {
            array.set(slot as u32, backend, 0).map_err(err(MAGLEV_RINGS))?;
        }
        self.rings.insert(id, &array, 0).map_err(err(MAGLEV_RINGS))?;
        Ok(id)
    }

    fn drop_ring(&mut self, id: u32) -> Result<()> {
        match self.rings.remove(&id) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(err(MAGLEV_RINGS)(e)),
        }
    }

    /// Backend slot → backend, for metrics and status.
    pub fn backends(&self) -> &BTreeMap<Backend, u32> {
        &self.slots
    }
}

const EMPTY_BACKEND: Backend = Backend { addr: [0; 4], port: [0; 2], delivery: 0, _pad: 0, node: [0; 4] };

fn cpus() -> Result<usize> {
    nr_cpus().map_err(|(path, e)| Error::io(format!("reading {path}"), e))
}

/// FNV-1a over the ring's slots: equal digests mean the pinned ring is already right.
fn digest(ring: &[u32]) -> u32 {
    let mut h = 0x811c_9dc5u32;
    for byte in ring.iter().flat_map(|s| s.to_le_bytes()) {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}
