//! Routers outside a group that advertise one of its VRIDs: dropped, remembered (boundedly)
//! for status, and logged at a bounded rate.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use tracing::warn;

use super::Router;
use crate::vrrp::family::InstanceId;

/// At most one log line per foreign router and VRID in this long.
pub const FOREIGN_LOG_EVERY: Duration = Duration::from_secs(60);
/// Foreign routers remembered at most.
pub(super) const FOREIGN_MAX: usize = 256;

/// A router outside the group that advertises one of its VRIDs.
pub(super) struct ForeignRouter {
    group: String,
    logged: Option<Instant>,
    /// Advertisements since the last log line.
    unlogged: u64,
}

impl ForeignRouter {
    /// Counts one more advertisement; `Some(unlogged since the last line)` when a line is due.
    pub(super) fn log_now(&mut self, now: Instant) -> Option<u64> {
        if self.logged.is_some_and(|at| now < at + FOREIGN_LOG_EVERY) {
            self.unlogged += 1;
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

impl Router {
    /// A router outside the group advertises one of our VRIDs: logged once per
    /// [`FOREIGN_LOG_EVERY`] per (VRID, source), with how many went unlogged, and remembered
    /// for [`Router::foreign_routers`].
    pub(super) fn foreign_advert(&mut self, now: Instant, group: String, id: InstanceId, source: IpAddr) {
        if self.foreign.len() >= FOREIGN_MAX && !self.foreign.contains_key(&(id, source)) {
            return; // spoofed sources must not grow memory; the drop counter still counts them
        }
        let seen =
            self.foreign.entry((id, source)).or_insert(ForeignRouter { group, logged: None, unlogged: 0 });
        if let Some(since_last_log) = seen.log_now(now) {
            warn!(
                group = %seen.group,
                instance = %id,
                %source,
                since_last_log,
                "a router outside the group advertises this VRID; its advertisements are dropped (add the VRID \
                 to the group's excludedVrids, or find who sends them)"
            );
        }
    }

    /// Routers outside their group heard advertising one of its VRIDs: (group, instance,
    /// source).
    pub fn foreign_routers(&self) -> impl Iterator<Item = (&str, InstanceId, IpAddr)> + '_ {
        self.foreign.iter().map(|((id, source), f)| (f.group.as_str(), *id, *source))
    }
}
