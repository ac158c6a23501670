//! VRRP sources as the XDP program learned them: each IPv4 and IPv6 source of advertisements with the
//! MAC they come from, and how many came from another MAC while that one was live (see
//! `lb-ebpf/src/vrrp.rs`). Read by the agent to report a member being impersonated.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::maps::{HashMap, MapData};
use lb_common::maps::{VRRP_SPEAKERS, VRRP_SPEAKERS6, Vip6Key, VipKey, VrrpSpeaker};

use crate::{error::Result, mac::MacAddr};

/// Advertisements with `source` from `other_mac`, while `source` was live at `mac`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Impersonation {
    pub source: IpAddr,
    pub mac: MacAddr,
    pub other_mac: MacAddr,
    /// Counted since the program started (the map survives agent restarts).
    pub adverts: u64,
}

/// Both families' speaker maps.
pub struct Speakers {
    v4: HashMap<MapData, VipKey, VrrpSpeaker>,
    v6: HashMap<MapData, Vip6Key, VrrpSpeaker>,
}

impl Speakers {
    pub fn take(v4: aya::maps::Map, v6: aya::maps::Map) -> Result<Self> {
        let err = |map| move |source| crate::error::Error::BpfMap { map, source };
        Ok(Self {
            v4: HashMap::try_from(v4).map_err(err(VRRP_SPEAKERS))?,
            v6: HashMap::try_from(v6).map_err(err(VRRP_SPEAKERS6))?,
        })
    }

    /// Every source heard from another MAC than its learned one (at most each map's 1,024).
    pub fn impersonations(&self) -> Vec<Impersonation> {
        let v4 = self.v4.iter().filter_map(|e| e.ok()).map(|(k, s)| (IpAddr::V4(Ipv4Addr::from(k.addr)), s));
        let v6 = self.v6.iter().filter_map(|e| e.ok()).map(|(k, s)| (IpAddr::V6(Ipv6Addr::from(k.addr)), s));
        v4.chain(v6)
            .filter(|(_, s)| s.other_mac_adverts > 0)
            .map(|(source, s)| Impersonation {
                source,
                mac: MacAddr(s.mac),
                other_mac: MacAddr(s.other_mac),
                adverts: s.other_mac_adverts,
            })
            .collect()
    }

    /// Marks `own` (this node's group addresses) as ours in the maps and unmarks any address
    /// marked before that is ours no more: an advertisement with a marked address is counted
    /// whatever its MAC (`VrrpSpeaker::own`). Idempotent; a mark an LRU eviction took is put
    /// back on the next call.
    pub fn mark_own(&mut self, own: &BTreeSet<IpAddr>) -> Result<()> {
        unmark_stale(&mut self.v4, own, |k| Ipv4Addr::from(k.addr).into())?;
        unmark_stale(&mut self.v6, own, |k| Ipv6Addr::from(k.addr).into())?;
        for address in own {
            match address {
                IpAddr::V4(v4) => mark(&mut self.v4, VipKey::new(v4.octets()), 1)?,
                IpAddr::V6(v6) => mark(&mut self.v6, Vip6Key::new(v6.octets()), 1)?,
            }
        }
        Ok(())
    }
}

/// Clears the mark of every address in `map` that is not in `own` any more.
fn unmark_stale<K: aya::Pod>(
    map: &mut HashMap<MapData, K, VrrpSpeaker>,
    own: &BTreeSet<IpAddr>,
    address: impl Fn(&K) -> IpAddr,
) -> Result<()> {
    let stale: Vec<K> = map
        .iter()
        .filter_map(|e| e.ok())
        .filter(|(k, s)| s.own != 0 && !own.contains(&address(k)))
        .map(|(k, _)| k)
        .collect();
    stale.into_iter().try_for_each(|key| mark(map, key, 0))
}

/// Sets `key`'s mark to `own`, keeping what was learned and counted; writes only a change.
fn mark<K: aya::Pod>(map: &mut HashMap<MapData, K, VrrpSpeaker>, key: K, own: u8) -> Result<()> {
    let current = map.get(&key, 0).ok();
    if current.is_some_and(|s| s.own == own) || (current.is_none() && own == 0) {
        return Ok(());
    }
    let speaker = VrrpSpeaker { own, ..current.unwrap_or_default() };
    map.insert(key, speaker, 0).map_err(|source| crate::error::Error::BpfMap { map: "VRRP_SPEAKERS", source })
}
