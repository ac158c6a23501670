//! The service maps' Maglev rings: each an inner map of `MAGLEV_RINGS`, registered under an
//! id, rewritten in place when its size allows, retired once no service entry names it.

use aya::maps::{IterableMap, MapError};
use lb_common::service::{Address, INNER_MAP_FLAGS, MAGLEV_RINGS, ring_entries};

use super::{
    super::{batch, ring_memory},
    Ring, ServiceMaps, batch_err, err,
};
use crate::error::Result;

impl<A: Address> ServiceMaps<A> {
    /// Overwrites registered ring `id` with `ring` (of its size); false when that ring cannot
    /// be opened or mapped (the caller then makes a new one).
    pub(super) fn rewrite_ring(&self, id: u32, ring: &[u32]) -> bool {
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
    pub(super) fn create_ring(&mut self, ring: &[u32]) -> Result<Ring> {
        let array =
            Ring::create(ring_entries(ring.len() as u32), INNER_MAP_FLAGS).map_err(err(MAGLEV_RINGS))?;
        ring_memory::write(array.map().fd(), ring).map_err(batch_err(MAGLEV_RINGS))?;
        self.ring_bytes
            .entry(ring.len() as u32)
            .or_insert_with(|| batch::memlock(array.map().fd()).unwrap_or(ring.len() as u64 * 4));
        Ok(array)
    }

    /// A ring id no ring uses (retired ones included, until they are removed).
    pub(super) fn ring_id(&mut self) -> u32 {
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
    pub(super) fn retire_ring(&mut self, id: u32) {
        if id != 0 {
            self.retired.push(id);
        }
    }

    /// Removes the retired rings from `MAGLEV_RINGS`, in one batch: the agent calls it once the
    /// maps already serve the new contents, so the grace period it waits for is off that path.
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
}

/// New rings registered per map-of-maps write: each write costs one RCU grace period, each
/// ring an open file until then.
pub(super) const RINGS_PER_BATCH: usize = 1024;

/// FNV-1a of the ring's slots, never [`REWRITING`]: equal digests mean the pinned ring is
/// already right.
pub(super) fn digest(ring: &[u32]) -> u32 {
    let mut h = 0x811c_9dc5u32;
    for byte in ring.iter().flat_map(|s| s.to_le_bytes()) {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(REWRITING + 1)
}

/// The digest of a service entry whose ring is being rewritten in place: no contents match it,
/// so an agent killed in the middle leaves entries that the next one rewrites, never adopts.
pub(super) const REWRITING: u32 = 0;
