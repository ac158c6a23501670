//! The service maps, brought to a plan by difference.
//!
//! - **Cost follows the change.** The maps are mirrored here, so a [`PlanDelta`] touching one
//!   service costs a few system calls, whatever the number of services. A ring is written
//!   through a memory mapping ([`ring_memory`]); the backends a sync adds, in one
//!   `BPF_MAP_UPDATE_BATCH`.
//! - **Rings never half seen.** A ring of a new size is a new inner map, filled completely
//!   before the service entry is pointed at it. A ring of the same size is rewritten in place
//!   (no map-of-maps write, whose RCU grace period costs milliseconds): a packet reads a single
//!   slot, each slot is stored atomically, and old backends keep their slots until the rewrite
//!   is done, so a packet meets the old backend or the new one. The entry is marked
//!   (`REWRITING`) for the duration, so a crash in the middle is rewritten by the next agent,
//!   never adopted as finished.
//! - **Late slot reuse.** Freed backend slots queue up behind every never-used one, so a flow
//!   pinned to a removed backend finds an empty slot and is re-balanced, not misdirected.
//! - **Capacity.** A service that does not fit (service entries, backend slots) is refused
//!   and kept aside: the rest is applied, and the refused one is tried again on every later
//!   sync, in key order, as room appears. A refused change leaves the old version in force.
//! - **Restart.** All state is read back from the pinned maps at start. The first (complete)
//!   delta adopts whatever is already right without rewriting it.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
    sync::Arc,
};

use aya::{
    maps::{Array, HashMap as BpfHashMap, HashOfMaps, IterableMap, MapData, MapError, PerCpuArray},
    util::nr_cpus,
};
use lb_common::{
    maps::PacketCounter,
    service::{
        Addr4, Addr6, Address, BackendOf, Delivery, INNER_MAP_FLAGS, LocalEndpoint, LocalEndpointKeyOf,
        MAGLEV_RINGS, MAX_SERVICE_NUMBERS, NextHopEntry, RingEntry, SETTINGS, Service, ServiceKeyOf,
        Settings, ring_entries,
    },
};

use super::{batch, ring_memory};
use crate::{
    error::{Error, Result},
    service_plan::{DataplanePlan, PlanDelta, PlannedService},
};

type Ring = Array<MapData, RingEntry>;

/// How many entries the maps hold, as they were created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub services: u32,
    pub backends: u32,
    pub local_endpoints: u32,
}

/// One family's service maps (IPv4's by default). Both families' rings live in the one
/// `MAGLEV_RINGS`, each in its own range of ids ([`Address::RING_IDS`]).
pub struct ServiceMaps<A: Address = Addr4> {
    services: BpfHashMap<MapData, ServiceKeyOf<A>, Service>,
    backends: Array<MapData, BackendOf<A>>,
    backend_stats: PerCpuArray<MapData, PacketCounter>,
    /// The program's next-hop cache by backend slot, written here only to empty a slot's
    /// before another backend takes it.
    next_hops: Array<MapData, NextHopEntry>,
    rings: HashOfMaps<MapData, u32, Ring>,
    local_endpoints: BpfHashMap<MapData, LocalEndpointKeyOf<A>, LocalEndpoint>,
    /// Node-wide, written through IPv4's maps.
    settings: Option<Array<MapData, Settings>>,
    limits: Limits,
    /// A second handle on `MAGLEV_RINGS`, for batch writes (aya's type does not lend its fd).
    /// A second handle on MAGLEV_RINGS for batch writes (a dup of its fd: getting one by id
    /// would need CAP_SYS_ADMIN, which the DaemonSet does not give).
    rings_fd: std::os::fd::OwnedFd,
    /// Kernel memory of the outer ring map itself.
    rings_outer_bytes: u64,
    cpus: usize,
    /// What `SERVICES` holds, with the backends each entry references.
    installed: HashMap<ServiceKeyOf<A>, Installed<A>>,
    /// Backend → slot, as `BACKENDS` holds them.
    slots: BTreeMap<BackendOf<A>, u32>,
    /// How many installed services reference each backend.
    refs: HashMap<BackendOf<A>, u32>,
    /// Unused slots, the longest unused first.
    free: VecDeque<u32>,
    /// Unused service numbers ([`Service::number`]), the longest unused first: a number goes
    /// to another service only after every other free one, so the connection table's entries
    /// of a removed service are long gone (or their backends' slots emptied) by then.
    free_numbers: VecDeque<u16>,
    ring_ids: HashSet<u32>,
    next_ring: u32,
    /// Kernel memory of one ring, by ring size (measured once per size).
    ring_bytes: HashMap<u32, u64>,
    local: HashMap<LocalEndpointKeyOf<A>, LocalEndpoint>,
    /// Rings replaced or removed, still in `MAGLEV_RINGS` (their ids reserved).
    retired: Vec<u32>,
    /// Services that did not fit, waiting for room.
    refused: BTreeMap<ServiceKeyOf<A>, (PlannedService<A>, Refusal)>,
    /// Endpoint addresses of the backends added and removed since last taken (one per
    /// backend), for the next-hop resolver.
    address_changes: (Vec<IpAddr>, Vec<IpAddr>),
    /// Traffic per VIP, written here only to zero a slot before a VIP takes it.
    vip_traffic: PerCpuArray<MapData, PacketCounter>,
    /// Each VIP's `VIP_TRAFFIC` slot and how many installed services use it.
    vip_slots: HashMap<A, (u32, u32)>,
    /// Unused `VIP_TRAFFIC` slots.
    free_vip_slots: VecDeque<u32>,
    /// A slot was taken in this sync: free it at the end if no service of its VIP got in.
    vip_slots_unused: bool,
    /// The uplink slot each VIP is served on; absent: any.
    vip_uplinks: Arc<HashMap<IpAddr, u8>>,
    /// Full NAT's source ports.
    snat: super::snat::SnatTable<A>,
}

#[derive(Clone, Debug)]
struct Installed<A> {
    entry: Service,
    name: String,
    /// Empty for an entry read back from the pins and not yet adopted by a plan.
    backends: Vec<BackendOf<A>>,
}

/// Why a service is not in the maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The full map: `services`, `backends` or `localEndpoints` (as in `dataplane.capacity`).
    pub what: &'static str,
    pub limit: u32,
    /// Where that limit is set: `capacity` (IPv4's maps) or `capacity6`.
    pub block: &'static str,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the data plane holds at most {} {} (dataplane.{}.{})",
            self.limit, self.what, self.block, self.what
        )
    }
}

/// A service (one VIP, port and protocol) left out of the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedService {
    /// `VIP:port/protocol` (see [`entry`]).
    pub entry: String,
    pub name: String,
    pub refusal: Refusal,
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
    /// Services refused by this sync (new or still waiting).
    pub refused: Vec<RefusedService>,
}

impl SyncReport {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Adds another family's report to this one.
    pub fn add(&mut self, other: SyncReport) {
        self.services_added += other.services_added;
        self.services_changed += other.services_changed;
        self.services_removed += other.services_removed;
        self.rings_written += other.rings_written;
        self.backends_added += other.backends_added;
        self.backends_removed += other.backends_removed;
        self.local_endpoints_changed += other.local_endpoints_changed;
        self.refused.extend(other.refused);
    }
}

fn err(map: &'static str) -> impl Fn(MapError) -> Error {
    move |source| Error::BpfMap { map, source }
}

fn batch_err(map: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::io(format!("batch update of BPF map {map}"), e)
}

/// Both families' service maps.
pub struct ServiceMapsByFamily {
    pub v4: ServiceMaps<Addr4>,
    pub v6: ServiceMaps<Addr6>,
}

impl ServiceMapsByFamily {
    /// See [`ServiceMaps::take`].
    pub fn take(ebpf: &mut aya::Ebpf, pin_dir: Option<&std::path::Path>) -> Result<Self> {
        let v4 = ServiceMaps::take(ebpf, pin_dir, None)?;
        let v6 = ServiceMaps::take(ebpf, pin_dir, Some(v4.rings_handle()?))?;
        Ok(Self { v4, v6 })
    }
}

/// Where family `A`'s map sizes are set (`dataplane.capacity`, `dataplane.capacity6`).
fn capacity_block<A: Address>() -> &'static str {
    if A::ZERO.to_ip().is_ipv4() { "capacity" } else { "capacity6" }
}

/// `198.51.100.10:80/TCP`, `[2001:db8::10]:80/TCP`.
pub fn entry<A: Address>(key: &ServiceKeyOf<A>) -> String {
    let proto = match key.proto {
        lb_common::service::PROTO_UDP => "UDP",
        _ => "TCP",
    };
    format!("{}/{proto}", std::net::SocketAddr::new(key.vip.to_ip(), u16::from_be_bytes(key.port)))
}

impl<A: Address> ServiceMaps<A> {
    /// Takes the family's service maps from `ebpf`. The agent shares the backend counters with
    /// the metrics reader, so it passes `pin_dir` and this side opens its own handle through
    /// the pin; without one (fixture tests) the map itself is taken. `MAGLEV_RINGS` is
    /// shared: the first family takes it, the second gets a handle from it (`rings`, see
    /// [`ServiceMaps::rings_handle`]). The first also writes the node-wide settings.
    pub fn take(
        ebpf: &mut aya::Ebpf,
        pin_dir: Option<&std::path::Path>,
        rings: Option<aya::maps::Map>,
    ) -> Result<Self> {
        let names = A::MAPS;
        let mut shared = |name| match pin_dir {
            Some(dir) => {
                let data = MapData::from_pin(dir.join(name)).map_err(err(name))?;
                aya::maps::Map::from_map_data(data).map_err(err(name))
            }
            None => super::take_map(ebpf, name),
        };
        let stats = shared(names.backend_stats)?;
        let vip_traffic =
            PerCpuArray::try_from(shared(names.vip_traffic)?).map_err(err(names.vip_traffic))?;
        let mut take = |name| super::take_map(ebpf, name);
        let services: BpfHashMap<MapData, ServiceKeyOf<A>, Service> =
            BpfHashMap::try_from(take(names.services)?).map_err(err(names.services))?;
        let local_endpoints: BpfHashMap<MapData, LocalEndpointKeyOf<A>, LocalEndpoint> =
            BpfHashMap::try_from(take(names.local_endpoints)?).map_err(err(names.local_endpoints))?;
        let backends: Array<MapData, BackendOf<A>> =
            Array::try_from(take(names.backends)?).map_err(err(names.backends))?;
        let next_hops = Array::try_from(take(names.next_hops)?).map_err(err(names.next_hops))?;
        let snat = super::snat::SnatTable::take(take(names.snat_replies)?)?;
        let max_entries = |map: &MapData, name| map.info().map(|i| i.max_entries()).map_err(err(name));
        let limits = Limits {
            services: max_entries(services.map(), names.services)?,
            backends: backends.len(),
            local_endpoints: max_entries(local_endpoints.map(), names.local_endpoints)?,
        };
        let first = rings.is_none();
        let rings = match rings {
            Some(rings) => rings,
            None => take(MAGLEV_RINGS)?,
        };
        let settings =
            if first { Some(Array::try_from(take(SETTINGS)?).map_err(err(SETTINGS))?) } else { None };
        let aya::maps::Map::HashOfMaps(data) = &rings else {
            return Err(Error::BpfMap {
                map: MAGLEV_RINGS,
                source: MapError::InvalidMapType { map_type: 0 },
            });
        };
        let rings_outer_bytes = batch::memlock(data.fd()).unwrap_or(0);
        let rings_fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io("duplicating the fd of BPF map MAGLEV_RINGS", e))?;
        let mut maps = Self {
            services,
            backends,
            backend_stats: PerCpuArray::try_from(stats).map_err(err(names.backend_stats))?,
            next_hops,
            rings: HashOfMaps::try_from(rings).map_err(err(MAGLEV_RINGS))?,
            local_endpoints,
            settings,
            limits,
            rings_fd,
            rings_outer_bytes,
            cpus: nr_cpus().map_err(|(path, e)| Error::io(format!("reading {path}"), e))?,
            installed: HashMap::new(),
            slots: BTreeMap::new(),
            refs: HashMap::new(),
            free: VecDeque::new(),
            free_numbers: VecDeque::new(),
            ring_ids: HashSet::new(),
            next_ring: A::RING_IDS.start,
            ring_bytes: HashMap::new(),
            local: HashMap::new(),
            retired: Vec::new(),
            refused: BTreeMap::new(),
            address_changes: Default::default(),
            vip_traffic,
            vip_slots: HashMap::new(),
            free_vip_slots: VecDeque::new(),
            vip_slots_unused: false,
            vip_uplinks: Arc::default(),
            snat,
        };
        maps.read_back()?;
        Ok(maps)
    }

    /// Rebuilds the mirror from the maps, and drops rings no service points at (left by an
    /// agent that stopped between writing a ring and switching to it).
    fn read_back(&mut self) -> Result<()> {
        let slots = batch::read_array(&self.backends)
            .map_err(|e| Error::io(format!("reading BPF map {}", A::MAPS.backends), e))?;
        let mut last_used = None;
        for (slot, backend) in slots.into_iter().enumerate() {
            if Delivery::from_u8(backend.delivery).is_some() {
                self.address_changes.0.push(backend.addr.to_ip());
                self.slots.insert(backend, slot as u32);
                last_used = Some(slot as u32);
            }
        }
        // Continue round-robin after the last slot in use.
        let used: HashSet<u32> = self.slots.values().copied().collect();
        let start = last_used.map_or(0, |s| s + 1);
        self.free = (start..self.limits.backends).chain(0..start).filter(|s| !used.contains(s)).collect();

        for entry in self.services.iter() {
            let (key, entry) = entry.map_err(err(A::MAPS.services))?;
            self.vip_slots.entry(key.vip).or_insert((entry.vip_slot(), 0)).1 += 1;
            self.installed.insert(key, Installed { entry, name: String::new(), backends: Vec::new() });
        }
        let used: HashSet<u32> = self.vip_slots.values().map(|(slot, _)| *slot).collect();
        self.free_vip_slots = (0..self.vip_traffic.len()).filter(|s| !used.contains(s)).collect();
        // Continue after the highest number in use, as for backend slots.
        let used: HashSet<u16> = self.installed.values().map(|s| s.entry.number).collect();
        let start = used.iter().max().map_or(0, |&n| u32::from(n) + 1);
        self.free_numbers = (start..MAX_SERVICE_NUMBERS)
            .chain(0..start)
            .map(|n| n as u16)
            .filter(|n| !used.contains(n))
            .collect();
        self.ring_ids = self.installed.values().map(|s| s.entry.ring_id).filter(|&id| id != 0).collect();
        self.next_ring = self.ring_ids.iter().max().map_or(A::RING_IDS.start, |m| m + 1);
        // The other family's rings are its own business.
        let stale: Vec<u32> = self
            .rings
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| A::RING_IDS.contains(k) && !self.ring_ids.contains(k))
            .collect();
        for ring in stale {
            self.rings.remove(&ring).map_err(err(MAGLEV_RINGS))?;
        }
        for entry in self.local_endpoints.iter() {
            let (key, value) = entry.map_err(err(A::MAPS.local_endpoints))?;
            self.local.insert(key, value);
        }
        Ok(())
    }

    /// Serves each VIP on its uplink from now on: installed services whose uplink slot moved
    /// are rewritten (only the slot changes), later ones are installed with theirs. Returns
    /// how many entries were rewritten.
    pub fn set_vip_uplinks(&mut self, uplinks: Arc<HashMap<IpAddr, u8>>) -> Result<usize> {
        if Arc::ptr_eq(&uplinks, &self.vip_uplinks) {
            return Ok(0);
        }
        self.vip_uplinks = uplinks;
        let moved: Vec<(ServiceKeyOf<A>, Service)> = self
            .installed
            .iter()
            .filter(|(key, i)| i.entry.uplink() != self.uplink_of(key.vip))
            .map(|(key, i)| {
                let packed = Service::pack_vip_slot(i.entry.vip_slot(), self.uplink_of(key.vip));
                (*key, Service { vip_slot_uplink: packed, ..i.entry })
            })
            .collect();
        let count = moved.len();
        self.rewrite_entries(moved)?;
        Ok(count)
    }

    /// Writes installed services' new entries in one batch, and into the mirror, so a sync that
    /// fails after this rewrites them next time.
    fn rewrite_entries(&mut self, entries: Vec<(ServiceKeyOf<A>, Service)>) -> Result<()> {
        let (keys, entries): (Vec<ServiceKeyOf<A>>, Vec<Service>) = entries.into_iter().unzip();
        batch::update(self.services.map().fd(), &keys, &entries).map_err(batch_err(A::MAPS.services))?;
        for (key, entry) in keys.iter().zip(entries) {
            if let Some(installed) = self.installed.get_mut(key) {
                installed.entry = entry;
            }
        }
        Ok(())
    }

    fn uplink_of(&self, vip: A) -> u8 {
        self.vip_uplinks.get(&vip.to_ip()).copied().unwrap_or(lb_common::maps::ANY_UPLINK)
    }

    /// Writes the node-wide settings (through the family that took `SETTINGS`).
    pub fn set_settings(&mut self, settings: Settings) -> Result<()> {
        if let Some(map) = &mut self.settings
            && map.get(&0, 0).ok() != Some(settings)
        {
            map.set(0, settings, 0).map_err(err(SETTINGS))?;
        }
        Ok(())
    }

    /// A second handle on `MAGLEV_RINGS`, for the other family's [`ServiceMaps::take`].
    pub fn rings_handle(&self) -> Result<aya::maps::Map> {
        let fd = self
            .rings_fd
            .try_clone()
            .map_err(|e| Error::io("duplicating the fd of BPF map MAGLEV_RINGS", e))?;
        let data = MapData::from_fd(fd).map_err(err(MAGLEV_RINGS))?;
        Ok(aya::maps::Map::HashOfMaps(data))
    }

    /// Makes the maps hold `plan` whole, retired rings removed.
    pub fn apply(&mut self, plan: &DataplanePlan<A>) -> Result<SyncReport> {
        let report = self.apply_delta(&plan.to_delta())?;
        self.remove_retired_rings()?;
        Ok(report)
    }

    /// Applies a change, touching only the entries it names (for a complete delta, also
    /// removing whatever it does not name).
    pub fn apply_delta(&mut self, delta: &PlanDelta<A>) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        let mut released = Vec::new();

        // Removals first: they make room.
        let mut removals: Vec<ServiceKeyOf<A>> =
            delta.services.iter().filter(|(_, s)| s.is_none()).map(|(k, _)| *k).collect();
        if delta.complete {
            removals.extend(self.installed.keys().filter(|k| !delta.services.contains_key(k)));
            removals.extend(self.refused.keys().filter(|k| !delta.services.contains_key(k)));
        }
        for key in removals {
            self.refused.remove(&key);
            if let Some(old) = self.installed.remove(&key) {
                self.services.remove(&key).map_err(err(A::MAPS.services))?;
                self.free_numbers.push_back(old.entry.number);
                self.retire_ring(old.entry.ring_id);
                self.release(&old.backends, &mut released);
                self.release_vip_slot(key.vip);
                report.services_removed += 1;
            }
        }

        // Then the new and changed services, and those refused earlier, which may fit now.
        let mut wanted: Vec<(ServiceKeyOf<A>, PlannedService<A>)> = Vec::new();
        for (key, planned) in &delta.services {
            if let Some(planned) = planned {
                self.refused.remove(key);
                wanted.push((*key, planned.clone()));
            }
        }
        wanted.extend(std::mem::take(&mut self.refused).into_iter().map(|(k, (s, _))| (k, s)));
        let admitted = self.admit(wanted, &mut report)?;
        self.install(&admitted, &mut released, &mut report)?;

        if delta.complete {
            // Backends read back from the pins that no plan adopted.
            released.extend(self.slots.keys().filter(|b| !self.refs.contains_key(b)).copied());
        }
        self.free_slots(released, &mut report)?;
        self.free_vip_slots();
        report.refused = self
            .refused
            .iter()
            .map(|(key, (s, refusal))| RefusedService {
                entry: entry(key),
                name: s.name.clone(),
                refusal: *refusal,
            })
            .collect();
        self.apply_local_endpoints(delta, &mut report)?;
        Ok(report)
    }

    /// Gives slots to the services' new backends, in order, refusing a service that does not
    /// fit; writes the new backends in one batch. Returns the admitted services.
    fn admit(
        &mut self,
        wanted: Vec<(ServiceKeyOf<A>, PlannedService<A>)>,
        report: &mut SyncReport,
    ) -> Result<Vec<(ServiceKeyOf<A>, PlannedService<A>)>> {
        let mut admitted = Vec::with_capacity(wanted.len());
        let mut added: Vec<(u32, BackendOf<A>)> = Vec::new();
        let mut entries = self.installed.len();
        for (key, planned) in wanted {
            let is_new = !self.installed.contains_key(&key);
            let missing: BTreeSet<BackendOf<A>> =
                planned.backends.iter().filter(|b| !self.slots.contains_key(b)).copied().collect();
            let refusal = if is_new && entries >= self.limits.services as usize {
                Some(Refusal { what: "services", limit: self.limits.services, block: capacity_block::<A>() })
            } else if missing.len() > self.free.len() {
                Some(Refusal { what: "backends", limit: self.limits.backends, block: capacity_block::<A>() })
            } else {
                None
            };
            if let Some(refusal) = refusal {
                self.refused.insert(key, (planned, refusal));
                continue;
            }
            for backend in missing {
                let slot = self.free.pop_front().expect("counted above");
                self.slots.insert(backend, slot);
                added.push((slot, backend));
            }
            for backend in &planned.backends {
                *self.refs.entry(*backend).or_default() += 1;
            }
            entries += usize::from(is_new);
            admitted.push((key, planned));
        }
        if !added.is_empty() {
            // A reused slot starts its counters from zero; both land before any ring uses it.
            let (slots, backends): (Vec<u32>, Vec<BackendOf<A>>) = added.iter().copied().unzip();
            batch::zero_per_cpu::<PacketCounter>(self.backend_stats.map().fd(), &slots, self.cpus)
                .map_err(batch_err(A::MAPS.backend_stats))?;
            // And no next hop: a hop cached for the slot's previous backend is not this one's.
            let no_hops = vec![NextHopEntry::default(); slots.len()];
            batch::update(self.next_hops.map().fd(), &slots, &no_hops)
                .map_err(batch_err(A::MAPS.next_hops))?;
            batch::update(self.backends.map().fd(), &slots, &backends)
                .map_err(batch_err(A::MAPS.backends))?;
            report.backends_added += added.len();
            self.address_changes.0.extend(backends.iter().map(|b| b.addr.to_ip()));
        }
        Ok(admitted)
    }

    /// Points each admitted service at its ring. Every write to a map of maps makes the kernel
    /// wait for an RCU grace period (milliseconds), so:
    /// - a changed ring of the same size is rewritten in place, through its memory mapping,
    ///   its entry marked `REWRITING` meanwhile: a packet reads one slot of its service's ring,
    ///   so it sees that slot's old backend or its new one, and the new backends are in
    ///   `BACKENDS` before the ring names them;
    /// - new rings (new services, or a new size) are created and filled first, registered in
    ///   one batch, and only then do the service entries switch over, in one more.
    ///
    /// The backends are already referenced (see [`Self::admit`]). New rings are open files until
    /// registered, so they go in batches of [`RINGS_PER_BATCH`], well inside `RLIMIT_NOFILE`.
    fn install(
        &mut self,
        admitted: &[(ServiceKeyOf<A>, PlannedService<A>)],
        released: &mut Vec<BackendOf<A>>,
        report: &mut SyncReport,
    ) -> Result<()> {
        for chunk in admitted.chunks(RINGS_PER_BATCH) {
            self.install_batch(chunk, released, report)?;
        }
        Ok(())
    }

    fn install_batch(
        &mut self,
        admitted: &[(ServiceKeyOf<A>, PlannedService<A>)],
        released: &mut Vec<BackendOf<A>>,
        report: &mut SyncReport,
    ) -> Result<()> {
        let mut staged: Vec<Staged<'_, A>> = Vec::new();
        let mut in_place: Vec<InPlace<'_, A>> = Vec::new();
        // New services take the first free numbers, which leave the free list only once their
        // entries are written: a batch that fails keeps them free, or a sync failing again and
        // again would use them all up.
        let mut numbers_taken = 0;
        for (key, planned) in admitted {
            // Slots by backend index first: one map lookup per backend, not per ring slot.
            let slot_of: Vec<u32> = planned.backends.iter().map(|b| self.slots[b]).collect();
            let ring: Vec<u32> = planned.ring.iter().map(|&i| slot_of[i as usize]).collect();
            let number = match self.installed.get(key) {
                Some(old) => old.entry.number,
                // `admit` refuses services past `limits.services`, at most 2^16 (the config
                // says so), so a number is always free here.
                None => {
                    let number = self
                        .free_numbers
                        .get(numbers_taken)
                        .copied()
                        .ok_or(Error::Capacity { what: "service numbers", limit: MAX_SERVICE_NUMBERS })?;
                    numbers_taken += 1;
                    number
                }
            };
            let entry = Service {
                number,
                _pad: [0; 2],
                ring_id: 0,
                ring_size: ring.len() as u32,
                backend_count: planned.backends.len() as u32,
                ring_digest: digest(&ring),
                vip_slot_uplink: Service::pack_vip_slot(self.vip_slot(key.vip)?, self.uplink_of(key.vip)),
            };
            if let Some(old) = self.installed.get(key).cloned()
                && old.entry == (Service { ring_id: old.entry.ring_id, ..entry })
            {
                // Already right (unchanged, or pinned by the previous agent): keep it.
                self.release(&old.backends, released);
                let backends = planned.backends.clone();
                self.installed
                    .insert(*key, Installed { entry: old.entry, name: planned.name.clone(), backends });
                continue;
            }
            let same_size = self
                .installed
                .get(key)
                .map(|old| old.entry)
                .filter(|old| old.ring_id != 0 && old.ring_size == entry.ring_size && !ring.is_empty());
            match same_size {
                Some(old) => in_place.push((*key, planned, old, entry, ring)),
                None => {
                    let array = if ring.is_empty() { None } else { Some(self.create_ring(&ring)?) };
                    report.rings_written += usize::from(array.is_some());
                    staged.push((*key, planned, entry, array));
                }
            }
        }

        // Rings of an unchanged size are rewritten in place. Their entries say so first
        // (`REWRITING`), so that a crash in the middle is never mistaken for a finished ring.
        let marks: Vec<(ServiceKeyOf<A>, Service)> = in_place
            .iter()
            .map(|(key, _, old, _, _)| (*key, Service { ring_digest: REWRITING, ..*old }))
            .collect();
        self.rewrite_entries(marks)?;
        for (key, planned, old, entry, ring) in in_place {
            report.rings_written += 1;
            if self.rewrite_ring(old.ring_id, &ring) {
                staged.push((key, planned, Service { ring_id: old.ring_id, ..entry }, None));
            } else {
                staged.push((key, planned, entry, Some(self.create_ring(&ring)?)));
            }
        }

        let mut ids = Vec::new();
        let mut fds = Vec::new();
        for (_, _, entry, array) in &mut staged {
            if let Some(array) = array {
                entry.ring_id = self.ring_id();
                ids.push(entry.ring_id);
                fds.push(array.map().fd().as_fd().as_raw_fd() as u32);
            }
        }
        if let Err(e) = batch::update(&self.rings_fd, &ids, &fds) {
            // Kernels without batch writes to maps of maps: one write per ring.
            tracing::debug!(error = %e, "batch write to MAGLEV_RINGS refused; writing ring by ring");
            for (_, _, entry, array) in &staged {
                if let Some(array) = array {
                    self.rings.insert(entry.ring_id, array, 0).map_err(err(MAGLEV_RINGS))?;
                }
            }
        }
        let keys: Vec<ServiceKeyOf<A>> = staged.iter().map(|(k, ..)| *k).collect();
        let entries: Vec<Service> = staged.iter().map(|(_, _, e, _)| *e).collect();
        batch::update(self.services.map().fd(), &keys, &entries).map_err(batch_err(A::MAPS.services))?;
        self.free_numbers.drain(..numbers_taken);

        for (key, planned, entry, _) in staged {
            let new = Installed { entry, name: planned.name.clone(), backends: planned.backends.clone() };
            match self.installed.insert(key, new) {
                Some(old) => {
                    report.services_changed += 1;
                    if old.entry.ring_id != entry.ring_id {
                        self.retire_ring(old.entry.ring_id);
                    }
                    self.release(&old.backends, released);
                }
                None => {
                    report.services_added += 1;
                    if let Some((_, services)) = self.vip_slots.get_mut(&key.vip) {
                        *services += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// The VIP's `VIP_TRAFFIC` slot: its own while any of its services is installed, else a
    /// free one, zeroed (its counters start from nothing) before any service entry names it.
    fn vip_slot(&mut self, vip: A) -> Result<u32> {
        if let Some((slot, _)) = self.vip_slots.get(&vip) {
            return Ok(*slot);
        }
        // The map has a slot per service entry (`map_sizes`), so this cannot run out while
        // services fit; should it, the sync fails and is retried, as for any map error.
        let slot = self
            .free_vip_slots
            .pop_front()
            .ok_or(Error::Capacity { what: "VIPs", limit: self.vip_traffic.len() })?;
        batch::zero_per_cpu::<PacketCounter>(self.vip_traffic.map().fd(), &[slot], self.cpus)
            .map_err(batch_err(A::MAPS.vip_traffic))?;
        // Counted once its first service is installed; freed at the end of the sync if none is.
        self.vip_slots.insert(vip, (slot, 0));
        self.vip_slots_unused = true;
        Ok(slot)
    }

    /// One service of the VIP fewer; the last one frees the slot at once, for a VIP that
    /// arrives in the same sync.
    fn release_vip_slot(&mut self, vip: A) {
        if let Some((slot, services)) = self.vip_slots.get_mut(&vip) {
            *services = services.saturating_sub(1);
            if *services == 0 {
                self.free_vip_slots.push_back(*slot);
                self.vip_slots.remove(&vip);
            }
        }
    }

    /// Returns the slots taken in this sync by VIPs none of whose services got in.
    fn free_vip_slots(&mut self) {
        if !std::mem::take(&mut self.vip_slots_unused) {
            return;
        }
        let free = &mut self.free_vip_slots;
        self.vip_slots.retain(|_, (slot, services)| {
            if *services == 0 {
                free.push_back(*slot);
            }
            *services > 0
        });
    }

    /// Each VIP's `VIP_TRAFFIC` slot, for the counters.
    pub fn vip_slots(&self) -> BTreeMap<IpAddr, u32> {
        self.vip_slots.iter().map(|(vip, (slot, _))| (vip.to_ip(), *slot)).collect()
    }

    /// Drops one reference to each backend; those nobody references go to `released`.
    fn release(&mut self, backends: &[BackendOf<A>], released: &mut Vec<BackendOf<A>>) {
        for backend in backends {
            if let Some(count) = self.refs.get_mut(backend) {
                *count -= 1;
                if *count == 0 {
                    self.refs.remove(backend);
                    released.push(*backend);
                }
            }
        }
    }

    /// Empties the slots of released backends that no ring references any more.
    fn free_slots(&mut self, released: Vec<BackendOf<A>>, report: &mut SyncReport) -> Result<()> {
        let mut freed = Vec::new();
        for backend in released {
            if self.refs.contains_key(&backend) {
                continue; // taken up again by another service in this sync
            }
            if let Some(slot) = self.slots.remove(&backend) {
                self.address_changes.1.push(backend.addr.to_ip());
                freed.push(slot);
            }
        }
        if freed.is_empty() {
            return Ok(());
        }
        let empties = vec![BackendOf::<A>::EMPTY; freed.len()];
        batch::update(self.backends.map().fd(), &freed, &empties).map_err(batch_err(A::MAPS.backends))?;
        report.backends_removed += freed.len();
        self.free.extend(freed);
        Ok(())
    }

    fn apply_local_endpoints(&mut self, delta: &PlanDelta<A>, report: &mut SyncReport) -> Result<()> {
        let mut changes: Vec<(LocalEndpointKeyOf<A>, Option<LocalEndpoint>)> =
            delta.local_endpoints.iter().map(|(k, v)| (*k, *v)).collect();
        if delta.complete {
            changes.extend(
                self.local.keys().filter(|k| !delta.local_endpoints.contains_key(k)).map(|k| (*k, None)),
            );
        }
        // Removals first, so a full map makes room before it is added to.
        changes.sort_by_key(|(_, v)| v.is_some());
        for (key, value) in changes {
            match value {
                None => {
                    if self.local.remove(&key).is_some() {
                        self.local_endpoints.remove(&key).map_err(err(A::MAPS.local_endpoints))?;
                        report.local_endpoints_changed += 1;
                    }
                }
                Some(value) if self.local.get(&key) == Some(&value) => {}
                Some(value) => {
                    if !self.local.contains_key(&key)
                        && self.local.len() >= self.limits.local_endpoints as usize
                    {
                        let refusal = Refusal {
                            what: "localEndpoints",
                            limit: self.limits.local_endpoints,
                            block: capacity_block::<A>(),
                        };
                        let name =
                            self.installed.get(&key.service).map(|s| s.name.clone()).unwrap_or_default();
                        report.refused.push(RefusedService { entry: entry(&key.service), name, refusal });
                        continue;
                    }
                    self.local_endpoints.insert(key, value, 0).map_err(err(A::MAPS.local_endpoints))?;
                    self.local.insert(key, value);
                    report.local_endpoints_changed += 1;
                }
            }
        }
        Ok(())
    }

    /// Overwrites registered ring `id` with `ring` (of its size); false when that ring cannot
    /// be opened or mapped (the caller then makes a new one).
    fn rewrite_ring(&self, id: u32, ring: &[u32]) -> bool {
        let Ok(inner) = self.rings.get(&id, 0) else { return false };
        match ring_memory::write(inner.map().fd(), ring) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(ring = id, error = %e, "rewriting a ring in place failed; writing a new one");
                false
            }
        }
    }

    /// Creates a ring's inner map and fills it.
    fn create_ring(&mut self, ring: &[u32]) -> Result<Ring> {
        let array =
            Ring::create(ring_entries(ring.len() as u32), INNER_MAP_FLAGS).map_err(err(MAGLEV_RINGS))?;
        ring_memory::write(array.map().fd(), ring).map_err(batch_err(MAGLEV_RINGS))?;
        self.ring_bytes
            .entry(ring.len() as u32)
            .or_insert_with(|| batch::memlock(array.map().fd()).unwrap_or(ring.len() as u64 * 4));
        Ok(array)
    }

    /// A ring id no ring uses (retired ones included, until they are removed).
    fn ring_id(&mut self) -> u32 {
        let ids = A::RING_IDS;
        let within = |id: u32| if ids.contains(&id) { id } else { ids.start };
        let mut id = within(self.next_ring);
        while self.ring_ids.contains(&id) {
            id = within(id.wrapping_add(1));
        }
        self.next_ring = within(id.wrapping_add(1));
        self.ring_ids.insert(id);
        id
    }

    /// A ring no service points at any more, removed by [`Self::remove_retired_rings`].
    fn retire_ring(&mut self, id: u32) {
        if id != 0 {
            self.retired.push(id);
        }
    }

    /// Removes the retired rings from `MAGLEV_RINGS`, in one batch: the agent calls it once the
    /// maps already serve the new plan, so the grace period it waits for is off that path.
    pub fn remove_retired_rings(&mut self) -> Result<()> {
        let retired = std::mem::take(&mut self.retired);
        if batch::delete(&self.rings_fd, &retired).is_err() {
            for id in &retired {
                match self.rings.remove(id) {
                    Ok(()) | Err(MapError::KeyNotFound) => {}
                    Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(err(MAGLEV_RINGS)(e)),
                }
            }
        }
        for id in retired {
            self.ring_ids.remove(&id);
        }
        Ok(())
    }

    /// Backend slot → backend, for metrics and status.
    pub fn backends(&self) -> &BTreeMap<BackendOf<A>, u32> {
        &self.slots
    }

    /// Endpoint addresses added and removed (one per backend) since the last call.
    pub fn take_address_changes(&mut self) -> (Vec<IpAddr>, Vec<IpAddr>) {
        std::mem::take(&mut self.address_changes)
    }

    /// How many service numbers are free.
    pub fn free_service_numbers(&self) -> usize {
        self.free_numbers.len()
    }

    /// The entry installed for `key`.
    pub fn installed(&self, key: &ServiceKeyOf<A>) -> Option<Service> {
        self.installed.get(key).map(|i| i.entry)
    }

    /// The program's next-hop cache, by backend slot.
    pub fn next_hops(&mut self) -> &mut Array<MapData, NextHopEntry> {
        &mut self.next_hops
    }

    /// Full NAT's source ports (see [`super::snat`]).
    pub fn snat(&mut self) -> &mut super::snat::SnatTable<A> {
        &mut self.snat
    }

    /// Removes full-NAT source ports idle for `idle` (see [`super::snat`]).
    pub fn expire_snat(&mut self, now_ns: u64, idle: std::time::Duration) -> Result<super::snat::Expiry> {
        self.snat.expire(now_ns, idle)
    }

    /// Service entries in the maps.
    pub fn service_count(&self) -> usize {
        self.installed.len()
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Kernel memory of the service maps, in bytes, by map; the rings (one inner map per
    /// service entry) are summed under `MAGLEV_RINGS`, with the outer map.
    pub fn memory(&self) -> Vec<(&'static str, u64)> {
        let rings: u64 = self
            .installed
            .values()
            .filter(|s| s.entry.ring_id != 0)
            .map(|s| {
                self.ring_bytes.get(&s.entry.ring_size).copied().unwrap_or(u64::from(s.entry.ring_size) * 4)
            })
            .sum();
        let of = |map: &aya::maps::MapFd| batch::memlock(map).unwrap_or(0);
        let names = A::MAPS;
        vec![
            (names.services, of(self.services.map().fd())),
            (names.backends, of(self.backends.map().fd())),
            (names.backend_stats, of(self.backend_stats.map().fd())),
            (names.next_hops, of(self.next_hops.map().fd())),
            // The outer map once, with the first family's rings.
            (MAGLEV_RINGS, if self.settings.is_some() { self.rings_outer_bytes } else { 0 } + rings),
            (names.local_endpoints, of(self.local_endpoints.map().fd())),
        ]
    }
}

/// A service ready to point at its ring: key, plan, new entry, and the ring when it is new.
type Staged<'a, A> = (ServiceKeyOf<A>, &'a PlannedService<A>, Service, Option<Ring>);
/// A service whose ring is rewritten in place: key, plan, old entry, new entry, new slots.
type InPlace<'a, A> = (ServiceKeyOf<A>, &'a PlannedService<A>, Service, Service, Vec<u32>);

/// New rings registered per map-of-maps write: each write costs one RCU grace period, each
/// ring an open file until then.
const RINGS_PER_BATCH: usize = 1024;

/// FNV-1a over the ring's slots: equal digests mean the pinned ring is already right.
/// FNV-1a of the ring's slots, never [`REWRITING`].
fn digest(ring: &[u32]) -> u32 {
    let mut h = 0x811c_9dc5u32;
    for byte in ring.iter().flat_map(|s| s.to_le_bytes()) {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(REWRITING + 1)
}

/// The digest of a service entry whose ring is being rewritten in place: no plan matches it,
/// so an agent killed in the middle leaves entries that the next one rewrites, never adopts.
const REWRITING: u32 = 0;
