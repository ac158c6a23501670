//! The service maps, brought to their contents by difference.
//!
//! - **Cost follows the change.** The maps are mirrored here, so a [`ContentsDelta`] touching one
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
//!
//! Here: the maps' mirror ([`ServiceMaps`]) and applying map contents or a delta. Beside it: `open`
//! (taking the maps, reading pins back), `install` (admitting and installing services),
//! `rings` (Maglev rings' inner maps), `slots` (backend and VIP counter slots), `listings`
//! (local endpoints' services, for their replies).

mod filter;
mod install;
mod listings;
mod open;
mod rings;
mod slots;

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
    endpoint_services::{EndpointKeyOf, EndpointServicesOf},
    maps::PacketCounter,
    service::{
        Addr4, Addr6, Address, BackendOf, Delivery, LocalEndpoint, LocalEndpointKeyOf, MAGLEV_RINGS,
        MAX_SERVICE_NUMBERS, NextHopEntry, RingEntry, SETTINGS, Service, ServiceKeyOf, Settings,
    },
};

use self::rings::{REWRITING, RINGS_PER_BATCH, digest};
use super::batch;
use crate::{
    error::{Error, Result},
    map_contents::{ContentsDelta, MapContents, ServiceContents},
};

type Ring = Array<MapData, RingEntry>;
/// `MAGLEV_RINGS`: ring id → ring.
type Rings = HashOfMaps<MapData, u32, Ring>;

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
    rings: Rings,
    local_endpoints: BpfHashMap<MapData, LocalEndpointKeyOf<A>, LocalEndpoint>,
    /// Each local endpoint's services, for verifying its replies (see [`listings`]).
    endpoint_services: BpfHashMap<MapData, EndpointKeyOf<A>, EndpointServicesOf<A>>,
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
    /// What `endpoint_services` holds, and the services it lists.
    listings: crate::endpoint_listings::EndpointListings<A>,
    /// Rings replaced or removed, still in `MAGLEV_RINGS` (their ids reserved).
    retired: Vec<u32>,
    /// Services that did not fit, waiting for room.
    refused: BTreeMap<ServiceKeyOf<A>, (ServiceContents<A>, Refusal)>,
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
    /// The installed keys' bits, for the program's early read of a flow's line.
    filter: filter::FilterMap,
}

#[derive(Clone, Debug)]
struct Installed<A> {
    entry: Service,
    name: String,
    /// Empty for an entry read back from the pins and not yet adopted by the map contents.
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

    /// Makes the maps hold `contents` whole, retired rings removed.
    pub fn apply(&mut self, contents: &MapContents<A>) -> Result<SyncReport> {
        let report = self.apply_delta(&contents.to_delta())?;
        self.remove_retired_rings()?;
        Ok(report)
    }

    /// Applies a change, touching only the entries it names (for a complete delta, also
    /// removing whatever it does not name).
    pub fn apply_delta(&mut self, delta: &ContentsDelta<A>) -> Result<SyncReport> {
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
                self.note_listings(key);
                self.services.remove(&key).map_err(err(A::MAPS.services))?;
                self.filter.count_out(&key);
                self.free_numbers.push_back(old.entry.number);
                self.retire_ring(old.entry.ring_id);
                self.release(&old.backends, &mut released);
                self.release_vip_slot(key.vip);
                report.services_removed += 1;
            }
        }

        // Then the new and changed services, and those refused earlier, which may fit now.
        let mut wanted: Vec<(ServiceKeyOf<A>, ServiceContents<A>)> = Vec::new();
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
            // Backends read back from the pins that no contents adopted.
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
        self.sync_listings(&mut report)?;
        self.filter.write_if_changed();
        Ok(report)
    }

    fn apply_local_endpoints(&mut self, delta: &ContentsDelta<A>, report: &mut SyncReport) -> Result<()> {
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

    /// Backend slot → backend, for metrics and status.
    pub fn backends(&self) -> &BTreeMap<BackendOf<A>, u32> {
        &self.slots
    }

    /// The VIP filter as the program reads it.
    pub fn vip_filter(&self) -> Result<lb_common::vip_filter::VipFilter> {
        self.filter.read()
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
            (names.endpoint_services, of(self.endpoint_services.map().fd())),
        ]
    }
}

/// A service ready to point at its ring: key, contents, new entry, and the ring when it is new.
type Staged<'a, A> = (ServiceKeyOf<A>, &'a ServiceContents<A>, Service, Option<Ring>);
/// A service whose ring is rewritten in place: key, contents, old entry, new entry, new slots.
type InPlace<'a, A> = (ServiceKeyOf<A>, &'a ServiceContents<A>, Service, Service, Vec<u32>);
