//! The uplink map: each uplink's slot and this node's address there, as the program looks
//! them up by arrival interface and by the FIB's egress. Slots are handed out here and kept
//! while an uplink stays, so a reload never renumbers the VIPs of an untouched group.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{Array, HashMap, MapData, MapError};
use lb_common::{
    maps::{ANY_UPLINK, UPLINKS, Uplink, UplinkKey, VLAN_SLOTS, VRRP_OWN6, Vip6Key, VlanSlot},
    service::UPLINK_ADDRS6,
};

use crate::error::{Error, Result};

/// What the uplink map must hold.
pub type UplinkSet = BTreeMap<UplinkKey, Uplink>;

/// This node's IPv6 address on each uplink that has one (`UPLINK_ADDRS6`, and its VRRP
/// address in `VRRP_OWN6`).
pub type Uplink6Set = BTreeMap<UplinkKey, Vip6Key>;

/// Slots by interface name: stable while an interface stays an uplink, the lowest free one
/// for a new uplink.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots(BTreeMap<String, u8>);

impl Slots {
    /// Keeps the slots of `names` already here, gives the others the lowest free ones and
    /// forgets the rest. At most 255 uplinks (slot 0 is [`ANY_UPLINK`]).
    pub fn assign<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let names: BTreeSet<&str> = names.into_iter().collect();
        self.0.retain(|name, _| names.contains(name.as_str()));
        for name in names {
            if self.0.contains_key(name) {
                continue;
            }
            let taken: BTreeSet<u8> = self.0.values().copied().collect();
            if let Some(free) = (1..=u8::MAX).find(|s| !taken.contains(s)) {
                self.0.insert(name.to_owned(), free);
            }
        }
    }

    /// The slot owned VIPs and services on `name` carry: [`ANY_UPLINK`] while there is only
    /// one uplink (the check would only cost), and for an interface that is no uplink.
    pub fn for_vips(&self, name: &str) -> u8 {
        if self.0.len() <= 1 { ANY_UPLINK } else { self.0.get(name).copied().unwrap_or(ANY_UPLINK) }
    }

    /// The slot written for `name` in the uplink map (never [`ANY_UPLINK`]).
    pub fn get(&self, name: &str) -> Option<u8> {
        self.0.get(name).copied()
    }
}

pub struct UplinkMap {
    map: HashMap<MapData, UplinkKey, Uplink>,
    addresses6: HashMap<MapData, UplinkKey, Vip6Key>,
    own6: HashMap<MapData, UplinkKey, Vip6Key>,
    vlan_slots: Array<MapData, VlanSlot>,
    /// What `vlan_slots` holds (by VLAN id; the rest is zero, as the map was created).
    vlan_slots_written: BTreeMap<u16, VlanSlot>,
}

impl UplinkMap {
    /// Takes its maps (the uplink map, the IPv6 addresses, this node's IPv6 VRRP addresses, the
    /// VLAN-id array) out of `ebpf`.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self> {
        let map = HashMap::try_from(super::take_map(ebpf, UPLINKS)?)
            .map_err(|source| Error::BpfMap { map: UPLINKS, source })?;
        let addresses6 = HashMap::try_from(super::take_map(ebpf, UPLINK_ADDRS6)?)
            .map_err(|source| Error::BpfMap { map: UPLINK_ADDRS6, source })?;
        let own6 = HashMap::try_from(super::take_map(ebpf, VRRP_OWN6)?)
            .map_err(|source| Error::BpfMap { map: VRRP_OWN6, source })?;
        let vlan_slots = Array::try_from(super::take_map(ebpf, VLAN_SLOTS)?)
            .map_err(|source| Error::BpfMap { map: VLAN_SLOTS, source })?;
        Ok(Self { map, addresses6, own6, vlan_slots, vlan_slots_written: BTreeMap::new() })
    }

    /// Writes the entries of `wanted` (and of `wanted6`, `own6`) that differ and removes the
    /// others. New entries go in before stale ones leave, so an uplink being re-keyed is never
    /// missing.
    pub fn apply(&mut self, wanted: &UplinkSet, wanted6: &Uplink6Set, own6: &Uplink6Set) -> Result<()> {
        apply(&mut self.map, UPLINKS, wanted)?;
        apply(&mut self.addresses6, UPLINK_ADDRS6, wanted6)?;
        apply(&mut self.own6, VRRP_OWN6, own6)?;
        // After the uplink map, which the program falls back on for a VLAN not in the array.
        let slots = vlan_slots(wanted);
        let map_err = |source: MapError| Error::BpfMap { map: VLAN_SLOTS, source };
        for (vlan, entry) in &slots {
            if self.vlan_slots_written.get(vlan) != Some(entry) {
                self.vlan_slots.set(u32::from(*vlan), entry, 0).map_err(map_err)?;
            }
        }
        for vlan in self.vlan_slots_written.keys().filter(|v| !slots.contains_key(v)) {
            self.vlan_slots.set(u32::from(*vlan), VlanSlot::default(), 0).map_err(map_err)?;
        }
        self.vlan_slots_written = slots;
        Ok(())
    }
}

/// The VLAN-id array's entries for the uplinks `wanted` holds: each VLAN's uplink on the
/// lowest ifindex that serves it (another parent's uplink on the same VLAN id stays in the
/// uplink map alone, where the program looks next).
fn vlan_slots(wanted: &UplinkSet) -> BTreeMap<u16, VlanSlot> {
    let mut slots = BTreeMap::new();
    for (key, uplink) in wanted.iter().filter(|(key, _)| key.vlan != 0) {
        slots.entry(key.vlan).or_insert(VlanSlot { ifindex: key.ifindex, slot: uplink.slot, _pad: [0; 3] });
    }
    slots
}

fn apply<V: aya::Pod + PartialEq>(
    map: &mut HashMap<MapData, UplinkKey, V>,
    name: &'static str,
    wanted: &BTreeMap<UplinkKey, V>,
) -> Result<()> {
    let map_err = |source: MapError| Error::BpfMap { map: name, source };
    let current: BTreeMap<UplinkKey, V> =
        map.iter().collect::<std::result::Result<_, _>>().map_err(map_err)?;
    let (write, remove) = diff(&current, wanted);
    for key in write {
        map.insert(key, wanted[&key], 0).map_err(map_err)?;
    }
    for key in remove {
        map.remove(&key).map_err(map_err)?;
    }
    Ok(())
}

/// The keys to write and the keys to remove.
fn diff<V: PartialEq>(
    current: &BTreeMap<UplinkKey, V>,
    wanted: &BTreeMap<UplinkKey, V>,
) -> (Vec<UplinkKey>, Vec<UplinkKey>) {
    let write = wanted.iter().filter(|(k, v)| current.get(k) != Some(v)).map(|(k, _)| *k).collect();
    let remove = current.keys().filter(|k| !wanted.contains_key(k)).copied().collect();
    (write, remove)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_with_their_interface_and_a_lone_uplink_serves_any() {
        let mut slots = Slots::default();
        slots.assign(["eth0"]);
        assert_eq!((slots.get("eth0"), slots.for_vips("eth0")), (Some(1), ANY_UPLINK));
        slots.assign(["eth0", "eth1", "eth0.30"]);
        assert_eq!([slots.for_vips("eth0"), slots.for_vips("eth0.30"), slots.for_vips("eth1")], [1, 2, 3]);
        slots.assign(["eth0.30", "eth1", "bond0"]);
        // eth0 left: its slot is the lowest free one for the newcomer; the others keep theirs.
        assert_eq!([slots.for_vips("bond0"), slots.for_vips("eth0.30"), slots.for_vips("eth1")], [1, 2, 3]);
        assert_eq!(slots.for_vips("eth9"), ANY_UPLINK);
    }

    #[test]
    fn each_vlan_id_goes_to_its_lowest_parent_in_the_array() {
        let entry = |slot| Uplink { source: [192, 0, 2, 10], mac: [2, 0, 0, 0, 0, 1], slot, _pad: 0 };
        let wanted: UplinkSet = [
            (UplinkKey::new(2, 0), entry(1)),
            (UplinkKey::new(2, 30), entry(2)),
            (UplinkKey::new(3, 30), entry(3)),
            (UplinkKey::new(3, 40), entry(4)),
        ]
        .into();
        let at = |ifindex, slot| VlanSlot { ifindex, slot, _pad: [0; 3] };
        assert_eq!(vlan_slots(&wanted), [(30, at(2, 2)), (40, at(3, 4))].into());
    }

    #[test]
    fn the_diff_writes_what_differs_and_removes_the_rest() {
        let entry = |slot| Uplink { source: [192, 0, 2, 10], mac: [2, 0, 0, 0, 0, 1], slot, _pad: 0 };
        let current: UplinkSet = [(UplinkKey::new(2, 0), entry(1)), (UplinkKey::new(3, 0), entry(2))].into();
        let wanted: UplinkSet = [
            (UplinkKey::new(2, 0), entry(1)),
            (UplinkKey::new(3, 0), entry(3)),
            (UplinkKey::new(4, 30), entry(2)),
        ]
        .into();
        let (write, remove) = diff(&current, &wanted);
        assert_eq!(write, vec![UplinkKey::new(3, 0), UplinkKey::new(4, 30)]);
        assert!(remove.is_empty());
        let (write, remove) = diff(&wanted, &current);
        assert_eq!((write.len(), remove), (1, vec![UplinkKey::new(4, 30)]));
    }
}
