//! Local endpoints' services in `ENDPOINT_SERVICES`, and each service entry's
//! `REPLIES_BY_TABLE` mark, kept in step (see [`crate::endpoint_listings`]): a service is
//! marked only once it is listed at every local endpoint, and unmarked before it loses a
//! listing, so its flows always have a listing or a reply entry.

use crate::endpoint_listings::{self, ServiceEndpoints};

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

    /// The flags of `key`'s new entry: its old mark is kept only while the listings still name
    /// it at each of its (new) local endpoints, so an entry never claims a listing that is not
    /// there; a new service starts unmarked.
    pub(super) fn flags_for(&self, key: ServiceKeyOf<A>, number: u16, backends: &[BackendOf<A>]) -> u8 {
        match self.installed.get(&key) {
            Some(old)
                if old.entry.replies_by_table()
                    && self.service_endpoints(key, number, backends).is_listed_in(&self.listings) =>
            {
                Service::REPLIES_BY_TABLE
            }
            _ => 0,
        }
    }

    /// Brings `ENDPOINT_SERVICES` and the entries' marks to the installed services: marks that
    /// go are cleared first, then the listings written, then the new marks set.
    pub(super) fn sync_listings(&mut self, report: &mut SyncReport) -> Result<()> {
        let services: Vec<ServiceEndpoints<A>> = self
            .installed
            .iter()
            .map(|(key, i)| self.service_endpoints(*key, i.entry.number, &i.backends))
            .collect();
        let wanted =
            endpoint_listings::listings(&self.listings, &services, self.limits.local_endpoints as usize);
        let marks = |this: &Self, set: bool| -> Vec<(ServiceKeyOf<A>, Service)> {
            this.installed
                .iter()
                .filter(|(key, i)| i.entry.replies_by_table() != set && wanted.complete.contains(key) == set)
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
        let gone: Vec<EndpointKeyOf<A>> =
            self.listings.keys().filter(|k| !wanted.endpoints.contains_key(k)).copied().collect();
        for key in gone {
            self.endpoint_services.remove(&key).map_err(err(A::MAPS.endpoint_services))?;
            self.listings.remove(&key);
            report.local_endpoints_changed += 1;
        }
        for (key, value) in wanted.endpoints {
            if self.listings.get(&key) != Some(&value) {
                self.endpoint_services.insert(key, value, 0).map_err(err(A::MAPS.endpoint_services))?;
                self.listings.insert(key, value);
                report.local_endpoints_changed += 1;
            }
        }
        let marked = marks(self, true);
        if !marked.is_empty() {
            self.rewrite_entries(marked)?;
        }
        Ok(())
    }

    /// What `ENDPOINT_SERVICES` holds (status and tests).
    pub fn listings(&self) -> &HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>> {
        &self.listings
    }
}
