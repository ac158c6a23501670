//! Rings written through memory (`BPF_F_MMAPABLE` arrays, Linux 5.5).
//!
//! `BPF_MAP_UPDATE_BATCH` still copies and stores a ring slot by slot in the kernel: about
//! 250 µs for 1,021 slots, most of a cold start at 10,000 services. Mapped into the agent, the
//! same ring is a memory copy of a few microseconds.

use std::{
    os::fd::AsFd,
    sync::atomic::{AtomicU32, Ordering},
};

use memmap2::MmapOptions;

/// Writes `ring[i]` into slot `i` of the mmapable ring behind `map` (slot pairs, see
/// [`lb_common::service::RingEntry`], so slots are contiguous `u32`s), which must hold at
/// least `ring.len()` slots. Each slot is one aligned 32-bit store, so a program reading a
/// slot meanwhile sees its old value or its new one, never a mix.
pub fn write(map: &impl AsFd, ring: &[u32]) -> std::io::Result<()> {
    if ring.is_empty() {
        return Ok(());
    }
    let len = size_of_val(ring);
    // SAFETY: the mapping is shared with the kernel's array, which outlives it (we hold the
    // fd); it is only written through atomics below, and the kernel rejects a length beyond
    // the array.
    let mut memory = unsafe { MmapOptions::new().len(len).map_mut(&map.as_fd()) }?;
    let base = memory.as_mut_ptr();
    for (i, &backend) in ring.iter().enumerate() {
        // SAFETY: in bounds (`4 * i + 4 <= len`) and 4-byte aligned (the mapping is page aligned).
        let slot = unsafe { AtomicU32::from_ptr(base.add(4 * i).cast()) };
        slot.store(backend, Ordering::Relaxed);
    }
    Ok(())
}
