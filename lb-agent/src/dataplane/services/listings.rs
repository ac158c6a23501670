//! Local endpoints' services in `ENDPOINT_SERVICES`, and each service entry's
//! `REPLIES_BY_TABLE` mark, kept in step (see [`crate::endpoint_listings`]): a service is
//! marked only once it is listed at every local endpoint, and unmarked before it loses a
//! listing, so its flows always have a listing or a reply entry.

use crate::endpoint_listings::{ServiceEndpoints, Settled};

use super::*;

impl<A: Address> ServiceMaps<A> {
    /// `key`'s service as the listings see it, with `backends` and `number`.
    fn service_endpoints(
        &self,
        key: ServiceKeyOf<A>,
        number: u16,
        backends: &[BackendOf<A>],
    ) -> ServiceEndpoints<A> {
        let local = backends
            .iter()
            .filter(|b| b.delivery == Delivery::Local as u8)
            // Backend ids are below `MAX_BACKENDS`, 2^16.
            .filter_map(|b| Some((b.addr, b.port, *self.slots.get(b)? as u16)))
            .collect();
        ServiceEndpoints { key, number, local }
    }

    /// The flags of `key`'s new entry: its old mark is kept only while the map still lists it
    /// at each of its (new) local endpoints, so an entry never claims a listing that is not
    /// there; a new service starts unmarked.
    pub(super) fn flags_for(&self, key: ServiceKeyOf<A>, number: u16, backends: &[BackendOf<A>]) -> u8 {
        match self.installed.get(&key) {
            Some(old)
                if old.entry.replies_by_table()
                    && self.listings.is_listed(&self.service_endpoints(key, number, backends)) =>
            {
                Service::REPLIES_BY_TABLE
            }
            _ => 0,
        }
    }

    /// The listings follow `key`'s service as the mirror now holds it (installed or gone), at
    /// once, so that a sync failing later still leaves the change for the next one to write.
    pub(super) fn note_listings(&mut self, key: ServiceKeyOf<A>) {
        match self.installed.get(&key) {
            Some(i) => {
                let service = self.service_endpoints(key, i.entry.number, &i.backends);
                self.listings.set(service);
            }
            None => self.listings.remove(key),
        }
    }

    /// Brings `ENDPOINT_SERVICES` and the entries' marks to the services changed since the
    /// last sync (see [`Self::note_listings`]): marks that go are cleared first, then the
    /// listings written, then the new marks set. Costs the endpoints the change touches. A
    /// write that fails leaves the mirror with what the map holds, and the services for the
    /// next sync.
    pub(super) fn sync_listings(&mut self, report: &mut SyncReport) -> Result<()> {
        let settled = self.listings.settle();
        let synced = self.write_settled(&settled, report);
        if synced.is_err() {
            self.listings.unsettled(settled.services);
        }
        synced
    }

    fn write_settled(&mut self, settled: &Settled<A>, report: &mut SyncReport) -> Result<()> {
        let marks = |this: &Self, set: bool| -> Vec<(ServiceKeyOf<A>, Service)> {
            settled
                .services
                .iter()
                .filter_map(|key| Some((key, this.installed.get(key)?)))
                .filter(|(key, i)| i.entry.replies_by_table() != set && this.listings.is_complete(key) == set)
                .map(|(key, i)| {
                    let flags = if set { Service::REPLIES_BY_TABLE } else { 0 };
                    (*key, Service { flags, ..i.entry })
                })
                .collect()
        };
        let unmarked = marks(self, false);
        if !unmarked.is_empty() {
            self.rewrite_entries(unmarked)?;
        }
        for (key, value) in &settled.writes {
            let written = match value {
                Some(value) => self.endpoint_services.insert(key, value, 0),
                None => self.endpoint_services.remove(key),
            };
            if let Err(e) = written {
                let held = self.endpoint_services.get(key, 0).ok();
                self.listings.resync(*key, held);
                return Err(err(A::MAPS.endpoint_services)(e));
            }
            report.local_endpoints_changed += 1;
        }
        let marked = marks(self, true);
        if !marked.is_empty() {
            self.rewrite_entries(marked)?;
        }
        Ok(())
    }

    /// Installed services whose local flows keep reply entries: an endpoint of theirs lists
    /// four others already, or the map had no room for it.
    pub fn services_with_reply_entries(&self) -> usize {
        self.listings.falling_back()
    }

    /// What `ENDPOINT_SERVICES` holds (status and tests).
    pub fn listings(&self) -> &HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>> {
        self.listings.listed()
    }
}
