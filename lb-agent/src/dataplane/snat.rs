//! Full NAT's source ports (`SNAT_REPLIES`): the program claims a port per flow and marks it
//! seen at each of the flow's next-hop refreshes; nothing evicts it, so a flood of new flows
//! cannot take an established flow's port. Here, entries idle past the timeout are removed,
//! as conntrack lets an idle flow go.

use std::time::Duration;

use aya::maps::{HashMap, IterableMap, MapData};
use lb_common::service::{Addr4, Address, FlowKeyOf, SnatEntryOf};

use super::batch;
use crate::error::{Error, Result};

/// One family's `SNAT_REPLIES` (IPv4's by default).
pub struct SnatTable<A: Address = Addr4> {
    map: HashMap<MapData, FlowKeyOf<A>, SnatEntryOf<A>>,
}

/// What an expiry pass found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expiry {
    /// Entries left: flows holding a port.
    pub kept: usize,
    pub removed: usize,
}

impl<A: Address> SnatTable<A> {
    pub fn take(map: aya::maps::Map) -> Result<Self> {
        let map =
            HashMap::try_from(map).map_err(|source| Error::BpfMap { map: A::MAPS.snat_replies, source })?;
        Ok(Self { map })
    }

    /// The map itself.
    pub fn map_mut(&mut self) -> &mut HashMap<MapData, FlowKeyOf<A>, SnatEntryOf<A>> {
        &mut self.map
    }

    /// Removes the entries not seen for `idle` by `now_ns` (CLOCK_MONOTONIC).
    pub fn expire(&mut self, now_ns: u64, idle: Duration) -> Result<Expiry> {
        let entries: Vec<(FlowKeyOf<A>, SnatEntryOf<A>)> = batch::read_all(self.map.map().fd())
            .map_err(|e| Error::io(format!("reading BPF map {}", A::MAPS.snat_replies), e))?;
        let stale = idle_keys(&entries, now_ns, idle);
        // One by one: a key the program removed or rewrote meanwhile must not fail the rest.
        let mut removed = 0;
        for key in &stale {
            if self.map.remove(key).is_ok() {
                removed += 1;
            }
        }
        Ok(Expiry { kept: entries.len() - removed, removed })
    }
}

/// The keys of `entries` not seen for `idle` by `now_ns`. An entry stamped after `now_ns` (the
/// program's coarse clock runs a little behind or ahead) is not idle.
pub fn idle_keys<A: Address>(
    entries: &[(FlowKeyOf<A>, SnatEntryOf<A>)],
    now_ns: u64,
    idle: Duration,
) -> Vec<FlowKeyOf<A>> {
    let idle = idle.as_nanos() as u64;
    entries.iter().filter(|(_, e)| now_ns.saturating_sub(e.last_seen_ns) > idle).map(|(k, _)| *k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::service::{FlowKey, ReplyNat, SnatEntry};

    #[test]
    fn only_entries_idle_past_the_timeout_go() {
        let entry = |seen: u64| SnatEntry {
            reply: ReplyNat::new([198, 51, 100, 10], [192, 0, 2, 100], [0, 80], [0x9c, 0x40]),
            peer_ifindex: 0,
            last_seen_ns: seen,
        };
        let key =
            |port: u16| FlowKey::new([10, 244, 1, 2], [192, 0, 2, 10], [0x1f, 0x90], port.to_be_bytes(), 6);
        let s = 1_000_000_000u64;
        let entries =
            [(key(61_000), entry(100 * s)), (key(61_001), entry(40 * s)), (key(61_002), entry(131 * s))];
        assert_eq!(idle_keys(&entries, 130 * s, Duration::from_secs(60)), vec![key(61_001)]);
        assert!(idle_keys(&entries, 130 * s, Duration::from_secs(120)).is_empty());
    }
}
