//! The service maps' slots: backends' and VIPs' places in `BACKENDS` and `VIP_TRAFFIC`, taken
//! while something names them and freed after.

use std::{collections::BTreeMap, net::IpAddr};

use aya::maps::IterableMap;

use lb_common::{
    maps::PacketCounter,
    service::{Address, BackendOf},
};

use super::{super::batch, ServiceMaps, SyncReport, batch_err};
use crate::error::{Error, Result};

impl<A: Address> ServiceMaps<A> {
    /// The VIP's `VIP_TRAFFIC` slot: its own while any of its services is installed, else a
    /// free one, zeroed (its counters start from nothing) before any service entry names it.
    pub(super) fn vip_slot(&mut self, vip: A) -> Result<u32> {
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
    pub(super) fn release_vip_slot(&mut self, vip: A) {
        if let Some((slot, services)) = self.vip_slots.get_mut(&vip) {
            *services = services.saturating_sub(1);
            if *services == 0 {
                self.free_vip_slots.push_back(*slot);
                self.vip_slots.remove(&vip);
            }
        }
    }

    /// Returns the slots taken in this sync by VIPs none of whose services got in.
    pub(super) fn free_vip_slots(&mut self) {
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
    pub(super) fn release(&mut self, backends: &[BackendOf<A>], released: &mut Vec<BackendOf<A>>) {
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
    pub(super) fn free_slots(&mut self, released: Vec<BackendOf<A>>, report: &mut SyncReport) -> Result<()> {
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
}
