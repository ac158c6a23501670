//! VRRP sources as the XDP program learned them: each IPv4 source of advertisements with the
//! MAC they come from, and how many came from another MAC while that one was live (see
//! `lb-ebpf/src/vrrp.rs`). Read by the agent to report a member being impersonated.

use std::net::Ipv4Addr;

use aya::maps::{HashMap, MapData};
use lb_common::maps::{VRRP_SPEAKERS, VipKey, VrrpSpeaker};

use crate::{config::MacAddr, error::Result};

/// Advertisements with `source` from `other_mac`, while `source` was live at `mac`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Impersonation {
    pub source: Ipv4Addr,
    pub mac: MacAddr,
    pub other_mac: MacAddr,
    /// Counted since the program started (the map survives agent restarts).
    pub adverts: u64,
}

pub struct Speakers {
    map: HashMap<MapData, VipKey, VrrpSpeaker>,
}

impl Speakers {
    pub fn take(map: aya::maps::Map) -> Result<Self> {
        let map = HashMap::try_from(map)
            .map_err(|source| crate::error::Error::BpfMap { map: VRRP_SPEAKERS, source })?;
        Ok(Self { map })
    }

    /// Every source heard from another MAC than its learned one (at most the map's 1,024).
    pub fn impersonations(&self) -> Vec<Impersonation> {
        self.map
            .iter()
            .filter_map(|entry| entry.ok())
            .filter(|(_, s)| s.other_mac_adverts > 0)
            .map(|(key, s)| Impersonation {
                source: Ipv4Addr::from(key.addr),
                mac: MacAddr(s.mac),
                other_mac: MacAddr(s.other_mac),
                adverts: s.other_mac_adverts,
            })
            .collect()
    }
}
