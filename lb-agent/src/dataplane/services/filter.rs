//! The family's `VIP_FILTER` ([`lb_common::vip_filter`]): a bit per installed service key,
//! counted here so that a sync writes the map's one element only when a bit flips. A hint for
//! the program's early read of a flow's line; a failed write is logged and retried at the next
//! sync, never fatal (the service lookup, not the filter, decides where a packet goes).

use aya::maps::{Array, MapData};
use lb_common::{
    service::{Address, ServiceKeyOf},
    vip_filter::{FilterCounts, VipFilter},
};
use tracing::warn;

use crate::error::{Error, Result};

pub struct FilterMap {
    map: Array<MapData, VipFilter>,
    counts: Box<FilterCounts>,
    /// A bit flipped since the element was last written.
    changed: bool,
}

impl FilterMap {
    pub fn take(map: aya::maps::Map, name: &'static str) -> Result<Self> {
        let map = Array::try_from(map).map_err(|source| Error::BpfMap { map: name, source })?;
        Ok(FilterMap { map, counts: Box::default(), changed: true })
    }

    pub fn count_in<A: Address>(&mut self, key: &ServiceKeyOf<A>) {
        self.changed |= self.counts.insert(key);
    }

    pub fn count_out<A: Address>(&mut self, key: &ServiceKeyOf<A>) {
        self.changed |= self.counts.remove(key);
    }

    /// Writes the element if a bit flipped since the last write.
    pub fn write_if_changed(&mut self) {
        if !self.changed {
            return;
        }
        match self.map.set(0, self.counts.filter(), 0) {
            Ok(()) => self.changed = false,
            Err(e) => warn!(error = %e, "writing the VIP filter failed; retried at the next sync"),
        }
    }

    /// The element as the program reads it.
    pub fn read(&self) -> Result<VipFilter> {
        self.map.get(&0, 0).map_err(|e| Error::io("reading the VIP filter", std::io::Error::other(e)))
    }
}
