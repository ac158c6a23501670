//! Taking the service maps from the loaded object, and reading back what pinned maps already
//! hold, so that an agent restarted over them adopts their entries instead of rewriting them.

use super::*;

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
            None => super::super::take_map(ebpf, name),
        };
        let stats = shared(names.backend_stats)?;
        let vip_traffic =
            PerCpuArray::try_from(shared(names.vip_traffic)?).map_err(err(names.vip_traffic))?;
        let mut take = |name| super::super::take_map(ebpf, name);
        let services: BpfHashMap<MapData, ServiceKeyOf<A>, Service> =
            BpfHashMap::try_from(take(names.services)?).map_err(err(names.services))?;
        let local_endpoints: BpfHashMap<MapData, LocalEndpointKeyOf<A>, LocalEndpoint> =
            BpfHashMap::try_from(take(names.local_endpoints)?).map_err(err(names.local_endpoints))?;
        let endpoint_services: BpfHashMap<MapData, EndpointKeyOf<A>, EndpointServicesOf<A>> =
            BpfHashMap::try_from(take(names.endpoint_services)?).map_err(err(names.endpoint_services))?;
        let backends: Array<MapData, BackendOf<A>> =
            Array::try_from(take(names.backends)?).map_err(err(names.backends))?;
        let next_hops = Array::try_from(take(names.next_hops)?).map_err(err(names.next_hops))?;
        let snat = super::super::snat::SnatTable::take(take(names.snat_replies)?)?;
        let filter = filter::FilterMap::take(take(names.vip_filter)?, names.vip_filter)?;
        let limits = Limits {
            services: max_entries_of(services.map(), names.services)?,
            backends: backends.len(),
            local_endpoints: max_entries_of(local_endpoints.map(), names.local_endpoints)?,
        };
        let first = rings.is_none();
        let rings = match rings {
            Some(rings) => rings,
            None => take(MAGLEV_RINGS)?,
        };
        let settings =
            if first { Some(Array::try_from(take(SETTINGS)?).map_err(err(SETTINGS))?) } else { None };
        let (rings, rings_fd, rings_outer_bytes) = outer_rings(rings)?;
        let mut maps = Self {
            services,
            backends,
            backend_stats: PerCpuArray::try_from(stats).map_err(err(names.backend_stats))?,
            next_hops,
            rings,
            local_endpoints,
            endpoint_services,
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
            listings: crate::endpoint_listings::EndpointListings::new(0, HashMap::new()),
            retired: Vec::new(),
            refused: BTreeMap::new(),
            address_changes: Default::default(),
            vip_traffic,
            vip_slots: HashMap::new(),
            free_vip_slots: VecDeque::new(),
            vip_slots_unused: false,
            vip_uplinks: Arc::default(),
            snat,
            filter,
        };
        maps.read_back()?;
        Ok(maps)
    }

    /// Rebuilds the mirror from the maps, and drops rings no service points at (left by an
    /// agent that stopped between writing a ring and switching to it).
    pub(super) fn read_back(&mut self) -> Result<()> {
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
            self.filter.count_in(&key);
            self.installed.insert(key, Installed { entry, name: String::new(), backends: Vec::new() });
        }
        self.filter.write_if_changed();
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
        let mut listed = HashMap::new();
        for entry in self.endpoint_services.iter() {
            let (key, value) = entry.map_err(err(A::MAPS.endpoint_services))?;
            listed.insert(key, value);
        }
        let capacity = max_entries_of(self.endpoint_services.map(), A::MAPS.endpoint_services)?;
        self.listings = crate::endpoint_listings::EndpointListings::new(capacity as usize, listed);
        Ok(())
    }
}

fn max_entries_of(map: &MapData, name: &'static str) -> Result<u32> {
    map.info().map(|i| i.max_entries()).map_err(err(name))
}

/// `MAGLEV_RINGS` as the mirror holds it: the map, a second fd for ring writes, and the outer
/// map's own memory.
fn outer_rings(rings: aya::maps::Map) -> Result<(Rings, std::os::fd::OwnedFd, u64)> {
    let aya::maps::Map::HashOfMaps(data) = &rings else {
        return Err(Error::BpfMap { map: MAGLEV_RINGS, source: MapError::InvalidMapType { map_type: 0 } });
    };
    let outer_bytes = batch::memlock(data.fd()).unwrap_or(0);
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("duplicating the fd of BPF map MAGLEV_RINGS", e))?;
    Ok((HashOfMaps::try_from(rings).map_err(err(MAGLEV_RINGS))?, fd, outer_bytes))
}
