//! The owned-VIP leases (`VIP_LEASES`): until when the program may claim each VRRP instance's
//! VIPs, in `bpf_ktime_get_ns` time (CLOCK_MONOTONIC). The router decides the deadlines
//! ([`crate::vrrp::router::Claim`]); this writes those that moved.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData, MapError};
use lb_common::maps::{MAX_LEASES, VIP_LEASES};

use crate::error::{Error, Result};

pub struct Leases {
    map: Array<MapData, u64>,
    /// What the map holds, slot → deadline (ns); absent means zero.
    written: BTreeMap<u16, u64>,
}

/// What one update did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Renewed {
    /// Slots whose lease had already run out when it was renewed: the agent was too late
    /// (frozen, or not running) and the program had stopped claiming meanwhile. A release
    /// is not one: a claim that ends by its own bound (a preempted master's grace, a
    /// handover) is released once its time is up, when the program has just stopped.
    pub lapsed: Vec<u16>,
}

impl Leases {
    /// Takes the map and reads back what a previous agent left (its deadlines stay until the
    /// first [`Leases::apply`]).
    pub fn take(map: aya::maps::Map) -> Result<Self> {
        let map_err = |source: MapError| Error::BpfMap { map: VIP_LEASES, source };
        let map: Array<MapData, u64> = Array::try_from(map).map_err(map_err)?;
        let mut written = BTreeMap::new();
        for slot in 0..MAX_LEASES.min(map.len()) {
            let deadline = map.get(&slot, 0).map_err(map_err)?;
            if deadline != 0 {
                written.insert(slot as u16, deadline);
            }
        }
        Ok(Self { map, written })
    }

    /// Makes the map hold `deadlines` (slot → ns) and zero elsewhere, writing only what moved.
    pub fn apply(&mut self, deadlines: &BTreeMap<u16, u64>, now_ns: u64) -> Result<Renewed> {
        let mut renewed = Renewed::default();
        let released: Vec<u16> =
            self.written.keys().filter(|s| !deadlines.contains_key(s)).copied().collect();
        let changes = deadlines.iter().map(|(s, d)| (*s, *d)).chain(released.into_iter().map(|s| (s, 0)));
        for (slot, deadline) in changes {
            if self.set(slot, deadline, now_ns)? {
                renewed.lapsed.push(slot);
            }
        }
        Ok(renewed)
    }

    /// Writes slot `slot`'s deadline (zero: released) if it moved; true when it renews a
    /// lease that had already run out.
    pub fn set(&mut self, slot: u16, deadline: u64, now_ns: u64) -> Result<bool> {
        let old = self.written.get(&slot).copied().unwrap_or(0);
        if old == deadline {
            return Ok(false);
        }
        self.map
            .set(u32::from(slot), deadline, 0)
            .map_err(|source: MapError| Error::BpfMap { map: VIP_LEASES, source })?;
        if deadline == 0 {
            self.written.remove(&slot);
        } else {
            self.written.insert(slot, deadline);
        }
        Ok(renews_a_lapsed_lease(old, deadline, now_ns))
    }

    /// How long slot `slot`'s lease still runs (zero once it ran out), if it holds one.
    pub fn remaining(&self, slot: u16, now_ns: u64) -> Option<Duration> {
        self.written.get(&slot).map(|d| Duration::from_nanos(d.saturating_sub(now_ns)))
    }
}

/// Whether writing `deadline` over `old` (zero: none) at `now_ns` renews a lease that had run
/// out: a release (zero) never does (see [`Renewed::lapsed`]).
fn renews_a_lapsed_lease(old: u64, deadline: u64, now_ns: u64) -> bool {
    deadline != 0 && old != 0 && old <= now_ns
}

/// CLOCK_MONOTONIC in nanoseconds: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes the struct we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `at` on the monotonic clock, given the same moment `now` as an `Instant` and in ns.
pub fn to_monotonic_ns(at: Instant, now: Instant, now_ns: u64) -> u64 {
    match at.checked_duration_since(now) {
        Some(ahead) => now_ns.saturating_add(ahead.as_nanos() as u64),
        None => now_ns.saturating_sub(now.duration_since(at).as_nanos() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_renewal_past_the_old_deadline_is_a_lapse() {
        let now = 1_000;
        // (old, new deadline, lapsed)
        let cases = [
            (0, 2_000, false),     // a first claim
            (1_500, 2_000, false), // renewed in time
            (1_000, 2_000, true),  // renewed just as it ran out
            (900, 2_000, true),    // renewed late
            (900, 0, false),       // released once its time was up (a grace, a handover)
            (1_500, 0, false),     // released early
        ];
        for (old, deadline, lapsed) in cases {
            assert_eq!(renews_a_lapsed_lease(old, deadline, now), lapsed, "{old} → {deadline}");
        }
    }
}
