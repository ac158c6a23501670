//! Authenticated advertisements' sequences: ours from the wall clock, always increasing; a
//! peer's accepted only when new (anti-replay).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use tracing::debug;

use super::Router;
use crate::vrrp::{auth::FRESHNESS, family::InstanceId};

impl Router {
    /// The sequence for the adverts sent now: the wall clock in microseconds as it was at start
    /// plus the time since, and always past the last one.
    pub(super) fn next_sequence(&mut self, now: Instant) -> u64 {
        self.last_sequence = self.wall_micros(now).max(self.last_sequence + 1);
        self.last_sequence
    }

    /// `now` on the wall clock, in microseconds, as mapped at start (see `wall_clock`).
    pub(super) fn wall_micros(&self, now: Instant) -> u64 {
        let (at, micros) = self.wall_clock;
        micros + now.saturating_duration_since(at).as_micros() as u64
    }

    /// Whether an authenticated advert's sequence is new: past the last accepted from the same
    /// sender for the VRID, or, from a sender not heard yet, signed within [`FRESHNESS`].
    /// Remembered when it is.
    pub(super) fn fresh(&mut self, now: Instant, id: InstanceId, source: IpAddr, sequence: u64) -> bool {
        let clock = self.wall_micros(now);
        let fresh = match self.sequences.get(&(id, source)) {
            Some(&last) => sequence > last,
            None => sequence.saturating_add(FRESHNESS.as_micros() as u64) >= clock,
        };
        if fresh {
            self.sequences.insert((id, source), sequence);
        } else {
            let age = Duration::from_micros(clock.saturating_sub(sequence));
            debug!(instance = %id, %source, ?age, "authenticated advert replayed, or the sender's clock is behind");
        }
        fresh
    }
}
