//! The owned-VIP map. Userspace computes the difference between what the map holds and what is
//! wanted, and applies only that, so unchanged VIPs are never rewritten under live traffic.

use std::{collections::BTreeMap, net::Ipv4Addr};

use aya::maps::{HashMap, MapData, MapError};
use lb_common::maps::{OWNED_VIPS, OwnedVip, VipKey};

use crate::error::{Error, Result};

/// The VIPs to answer for, with the MAC each answer carries.
pub type OwnedSet = BTreeMap<Ipv4Addr, OwnedVip>;

/// What an update changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<Ipv4Addr>,
    pub changed: Vec<Ipv4Addr>,
    pub removed: Vec<Ipv4Addr>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The pure part: which entries to write and which to delete.
pub fn diff(current: &OwnedSet, desired: &OwnedSet) -> Applied {
    let mut applied = Applied::default();
    for (vip, mac) in desired {
        match current.get(vip) {
            None => applied.added.push(*vip),
            Some(old) if old != mac => applied.changed.push(*vip),
            Some(_) => {}
        }
    }
    applied.removed = current.keys().filter(|v| !desired.contains_key(v)).copied().collect();
    applied
}

pub fn apply(map: &mut HashMap<MapData, VipKey, OwnedVip>, desired: &OwnedSet) -> Result<Applied> {
    let map_err = |source: MapError| Error::BpfMap { map: OWNED_VIPS, source };
    let mut current = OwnedSet::new();
    for entry in map.iter() {
        let (key, value) = entry.map_err(map_err)?;
        current.insert(Ipv4Addr::from(key.addr), value);
    }
    let applied = diff(&current, desired);
    for vip in applied.added.iter().chain(&applied.changed) {
        map.insert(VipKey::new(vip.octets()), desired[vip], 0).map_err(map_err)?;
    }
    for vip in &applied.removed {
        map.remove(&VipKey::new(vip.octets())).map_err(map_err)?;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[(u8, u8)]) -> OwnedSet {
        entries
            .iter()
            .map(|&(ip, mac)| (Ipv4Addr::new(198, 51, 100, ip), OwnedVip::new([2, 0, 0, 0, 0, mac])))
            .collect()
    }

    #[test]
    fn diff_touches_only_what_differs() {
        let current = set(&[(1, 1), (2, 2), (3, 3)]);
        let desired = set(&[(2, 2), (3, 9), (4, 4)]);
        let d = diff(&current, &desired);
        assert_eq!(d.added, vec![Ipv4Addr::new(198, 51, 100, 4)]);
        assert_eq!(d.changed, vec![Ipv4Addr::new(198, 51, 100, 3)]);
        assert_eq!(d.removed, vec![Ipv4Addr::new(198, 51, 100, 1)]);
    }

    #[test]
    fn an_equal_set_changes_nothing() {
        let s = set(&[(1, 1), (2, 2)]);
        assert!(diff(&s, &s).is_empty());
    }
}
