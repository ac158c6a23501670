//! VRRP sources as the XDP program learned them: each IPv4 and IPv6 source of advertisements with the
//! MAC they come from, and how many came from another MAC while that one was live (see
//! `lb-ebpf/src/vrrp.rs`). Read by the agent to report a member being impersonated.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
}
