//! Admitting and installing planned services: backends given slots, rings built or rewritten in
//! place, then the service entries that name them, in batches.

use super::*;

impl<A: Address> ServiceMaps<A> {
    /// Gives slots to the services' new backends, in order, refusing a service that does not
    /// fit; writes the new backends in one batch. Returns the admitted services.
    pub(super) fn admit(
        &mut self,
        wanted: Vec<(ServiceKeyOf<A>, ServiceContents<A>)>,
        report: &mut SyncReport,
    ) -> Result<Vec<(ServiceKeyOf<A>, ServiceContents<A>)>> {
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
    pub(super) fn install(
        &mut self,
        admitted: &[(ServiceKeyOf<A>, ServiceContents<A>)],
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
        admitted: &[(ServiceKeyOf<A>, ServiceContents<A>)],
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
                flags: self.flags_for(*key, number, &planned.backends),
                _pad: 0,
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
                self.note_listings(*key);
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

        self.rewrite_in_place(in_place, &mut staged, report)?;

        self.register_rings(&mut staged)?;
        let keys: Vec<ServiceKeyOf<A>> = staged.iter().map(|(k, ..)| *k).collect();
        let entries: Vec<Service> = staged.iter().map(|(_, _, e, _)| *e).collect();
        batch::update(self.services.map().fd(), &keys, &entries).map_err(batch_err(A::MAPS.services))?;
        self.free_numbers.drain(..numbers_taken);

        self.record_installed(staged, released, report);
        Ok(())
    }

    /// Rings of an unchanged size are rewritten in place, and staged with their entries (a
    /// ring that cannot be rewritten is made anew). Their entries say so first (`REWRITING`),
    /// so that a crash in the middle is never mistaken for a finished ring.
    fn rewrite_in_place<'p>(
        &mut self,
        in_place: Vec<InPlace<'p, A>>,
        staged: &mut Vec<Staged<'p, A>>,
        report: &mut SyncReport,
    ) -> Result<()> {
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
        Ok(())
    }

    /// The mirror follows the entries just written: replaced rings retired, replaced backends
    /// released, a VIP's services counted.
    fn record_installed(
        &mut self,
        staged: Vec<Staged<'_, A>>,
        released: &mut Vec<BackendOf<A>>,
        report: &mut SyncReport,
    ) {
        for (key, planned, entry, _) in staged {
            let new = Installed { entry, name: planned.name.clone(), backends: planned.backends.clone() };
            let replaced = self.installed.insert(key, new);
            self.note_listings(key);
            match replaced {
                Some(old) => {
                    report.services_changed += 1;
                    if old.entry.ring_id != entry.ring_id {
                        self.retire_ring(old.entry.ring_id);
                    }
                    self.release(&old.backends, released);
                }
                None => {
                    report.services_added += 1;
                    self.filter.count_in(&key);
                    if let Some((_, services)) = self.vip_slots.get_mut(&key.vip) {
                        *services += 1;
                    }
                }
            }
        }
    }

    /// Gives each new ring of `staged` an id and registers them all in `MAGLEV_RINGS`, in one
    /// batch where the kernel takes it.
    fn register_rings(&mut self, staged: &mut [Staged<'_, A>]) -> Result<()> {
        let mut ids = Vec::new();
        let mut fds = Vec::new();
        for (_, _, entry, array) in staged.iter_mut() {
            if let Some(array) = array {
                entry.ring_id = self.ring_id();
                ids.push(entry.ring_id);
                fds.push(array.map().fd().as_fd().as_raw_fd() as u32);
            }
        }
        if let Err(e) = batch::update(&self.rings_fd, &ids, &fds) {
            // Kernels without batch writes to maps of maps: one write per ring.
            tracing::debug!(error = %e, "batch write to MAGLEV_RINGS refused; writing ring by ring");
            for (_, _, entry, array) in staged.iter() {
                if let Some(array) = array {
                    self.rings.insert(entry.ring_id, array, 0).map_err(err(MAGLEV_RINGS))?;
                }
            }
        }
        Ok(())
    }
}
