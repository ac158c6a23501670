//! The owned-VIP maps, one per family. Userspace computes the difference between what the maps
//! hold and what is wanted, and applies only that, so unchanged VIPs are never rewritten under
//! live traffic. What the maps hold is read back once (a previous agent's pins) and then
//! remembered, so an ownership change costs the entries it changes, not a walk of the map.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::maps::{HashMap, MapData, MapError};
use lb_common::maps::{OWNED_VIPS, OWNED_VIPS6, OwnedVip, Vip6Key, VipKey};

use crate::error::{Error, Result};

/// The VIPs to answer for, with the MAC each answer carries.
pub type OwnedSet = BTreeMap<IpAddr, OwnedVip>;

/// Both families' owned-VIP maps.
pub struct OwnedMaps {
    pub v4: HashMap<MapData, VipKey, OwnedVip>,
    pub v6: HashMap<MapData, Vip6Key, OwnedVip>,
    /// What the maps hold, as last read or written; `None`: unknown (never read, or a write
    /// failed half-way), so the next apply reads them back.
    pub held: Option<OwnedSet>,
}

/// What an update changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<IpAddr>,
    pub changed: Vec<IpAddr>,
    pub removed: Vec<IpAddr>,
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

pub fn apply(maps: &mut OwnedMaps, desired: &OwnedSet) -> Result<Applied> {
    let current = match maps.held.take() {
        Some(held) => held,
        None => read(maps)?,
    };
    let applied = diff(&current, desired);
    write(maps, desired, &applied)?;
    // Only once every write went through: after a failure the maps are read back next time.
    maps.held = Some(desired.clone());
    Ok(applied)
}

/// What the maps hold now.
fn read(maps: &OwnedMaps) -> Result<OwnedSet> {
    let err4 = |source: MapError| Error::BpfMap { map: OWNED_VIPS, source };
    let err6 = |source: MapError| Error::BpfMap { map: OWNED_VIPS6, source };
    let mut current = OwnedSet::new();
    for entry in maps.v4.iter() {
        let (key, value) = entry.map_err(err4)?;
        current.insert(Ipv4Addr::from(key.addr).into(), value);
    }
    for entry in maps.v6.iter() {
        let (key, value) = entry.map_err(err6)?;
        current.insert(Ipv6Addr::from(key.addr).into(), value);
    }
    Ok(current)
}

fn write(maps: &mut OwnedMaps, desired: &OwnedSet, applied: &Applied) -> Result<()> {
    let err4 = |source: MapError| Error::BpfMap { map: OWNED_VIPS, source };
    let err6 = |source: MapError| Error::BpfMap { map: OWNED_VIPS6, source };
    for vip in applied.added.iter().chain(&applied.changed) {
        match vip {
            IpAddr::V4(v4) => maps.v4.insert(VipKey::new(v4.octets()), desired[vip], 0).map_err(err4)?,
            IpAddr::V6(v6) => maps.v6.insert(Vip6Key::new(v6.octets()), desired[vip], 0).map_err(err6)?,
        }
    }
    for vip in &applied.removed {
        match vip {
            IpAddr::V4(v4) => maps.v4.remove(&VipKey::new(v4.octets())).map_err(err4)?,
            IpAddr::V6(v6) => maps.v6.remove(&Vip6Key::new(v6.octets())).map_err(err6)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[(u8, u8)]) -> OwnedSet {
        entries
            .iter()
            .map(|&(ip, mac)| (Ipv4Addr::new(198, 51, 100, ip).into(), OwnedVip::new([2, 0, 0, 0, 0, mac])))
            .collect()
    }

    #[test]
    fn diff_touches_only_what_differs() {
        let current = set(&[(1, 1), (2, 2), (3, 3)]);
        let desired = set(&[(2, 2), (3, 9), (4, 4)]);
        let d = diff(&current, &desired);
        let vip = |last: u8| IpAddr::V4(Ipv4Addr::new(198, 51, 100, last));
        assert_eq!((d.added, d.changed, d.removed), (vec![vip(4)], vec![vip(3)], vec![vip(1)]));
    }

    #[test]
    fn an_equal_set_changes_nothing() {
        let s = set(&[(1, 1), (2, 2)]);
        assert!(diff(&s, &s).is_empty());
    }
}
