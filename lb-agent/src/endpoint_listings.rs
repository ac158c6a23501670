//! Endpoint listings: which services each local endpoint lists in `ENDPOINT_SERVICES`, so
//! that its replies are verified by the connection table (see
//! `lb_common::endpoint_services`), and which services are listed for all of theirs. Pure.
//!
//! Listings are stable: a service listed for an endpoint stays listed while it delivers to it
//! with the same backend id, and a new one takes a free place, never another's. So a service
//! only ever gains its listing (written before its entry says so) or loses it with a change of
//! its own (its entry says so first): no flow finds neither a listing nor a reply entry.

use std::collections::{BTreeSet, HashMap, HashSet};

use lb_common::{
    endpoint_services::{ENDPOINT_SERVICES_MAX, EndpointKeyOf, EndpointServiceOf, EndpointServicesOf},
    service::{Address, ServiceKeyOf},
};

/// An installed service as the listings see it: its key, number, and its local endpoints'
/// backend ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEndpoints<A> {
    pub key: ServiceKeyOf<A>,
    pub number: u16,
    /// Each local endpoint: address, port, backend id.
    pub local: Vec<(A, [u8; 2], u16)>,
}

impl<A: Address> ServiceEndpoints<A> {
    /// Each local endpoint's key and the listing that names this service there.
    fn listings(&self) -> impl Iterator<Item = (EndpointKeyOf<A>, EndpointServiceOf<A>)> + '_ {
        self.local.iter().map(|&(addr, port, backend)| {
            (
                EndpointKeyOf::new(addr, port, self.key.proto),
                EndpointServiceOf::new(self.key.vip, self.key.port, self.number, backend),
            )
        })
    }

    /// Whether `listings` name this service at each of its local endpoints.
    pub fn is_listed_in(&self, listings: &HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>>) -> bool {
        self.listings().all(|(endpoint, service)| {
            listings.get(&endpoint).is_some_and(|listed| listed.listed().contains(&service))
        })
    }
}

/// The listings as they follow the installed services, one change at a time: a change costs
/// the endpoints it touches, whatever the number of services.
#[derive(Clone, Debug)]
pub struct EndpointListings<A> {
    /// Endpoints the map has room for.
    capacity: usize,
    /// Each service's listings, as it delivers.
    services: HashMap<ServiceKeyOf<A>, ServiceEndpoints<A>>,
    /// The services delivering to each endpoint.
    delivering: HashMap<EndpointKeyOf<A>, BTreeSet<EndpointServiceOf<A>>>,
    /// What the map holds.
    listed: HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>>,
    /// Endpoints changed since the last [`EndpointListings::settle`], and those the map had no
    /// room for.
    dirty: BTreeSet<EndpointKeyOf<A>>,
    waiting: BTreeSet<EndpointKeyOf<A>>,
    /// Services set or removed since the last settle (their marks may change even where no
    /// listing does).
    changed: BTreeSet<ServiceKeyOf<A>>,
    /// Services with local endpoints that do not list them, as of the last settle.
    falling_back: HashSet<ServiceKeyOf<A>>,
}

/// What a [`EndpointListings::settle`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled<A> {
    /// Map writes (`None` removes), removals first.
    pub writes: Vec<(EndpointKeyOf<A>, Option<EndpointServicesOf<A>>)>,
    /// Services whose [`EndpointListings::is_complete`] may have changed: those set or removed
    /// since the last settle, and those whose listings changed.
    pub services: BTreeSet<ServiceKeyOf<A>>,
}

impl<A: Address> EndpointListings<A> {
    /// Listings as the map holds them (read back from a pinned map: each is checked at the
    /// next settle, and goes unless a service delivers there).
    pub fn new(capacity: usize, listed: HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>>) -> Self {
        let dirty = listed.keys().copied().collect();
        Self {
            capacity,
            services: HashMap::new(),
            delivering: HashMap::new(),
            listed,
            dirty,
            waiting: BTreeSet::new(),
            changed: BTreeSet::new(),
            falling_back: HashSet::new(),
        }
    }

    /// The service delivers as `service` says from now on.
    pub fn set(&mut self, service: ServiceEndpoints<A>) {
        self.remove(service.key);
        self.changed.insert(service.key);
        for (endpoint, listing) in service.listings() {
            self.delivering.entry(endpoint).or_default().insert(listing);
            self.dirty.insert(endpoint);
        }
        self.services.insert(service.key, service);
    }

    /// The service is gone.
    pub fn remove(&mut self, key: ServiceKeyOf<A>) {
        let Some(old) = self.services.remove(&key) else { return };
        self.changed.insert(key);
        for (endpoint, listing) in old.listings() {
            if let Some(set) = self.delivering.get_mut(&endpoint) {
                set.remove(&listing);
                if set.is_empty() {
                    self.delivering.remove(&endpoint);
                }
            }
            self.dirty.insert(endpoint);
        }
    }

    /// The map holds `held` at `endpoint` after all (a write failed): the listing is made again
    /// at the next settle.
    pub fn resync(&mut self, endpoint: EndpointKeyOf<A>, held: Option<EndpointServicesOf<A>>) {
        match held {
            Some(held) => self.listed.insert(endpoint, held),
            None => self.listed.remove(&endpoint),
        };
        self.dirty.insert(endpoint);
        let delivering: Vec<_> =
            self.delivering.get(&endpoint).into_iter().flatten().map(|s| service_key(&endpoint, s)).collect();
        self.note_falling_back(delivering);
    }

    /// A settle's services whose marks could not be brought to it (a map write failed): they
    /// are settled again next time.
    pub fn unsettled(&mut self, services: BTreeSet<ServiceKeyOf<A>>) {
        self.changed.extend(services);
    }

    /// How many services [`EndpointListings::falls_back`], as of the last settle.
    pub fn falling_back(&self) -> usize {
        self.falling_back.len()
    }

    fn note_falling_back(&mut self, services: impl IntoIterator<Item = ServiceKeyOf<A>>) {
        for key in services {
            if self.falls_back(&key) {
                self.falling_back.insert(key);
            } else {
                self.falling_back.remove(&key);
            }
        }
    }

    /// Whether the map lists `service` at each of its local endpoints.
    pub fn is_listed(&self, service: &ServiceEndpoints<A>) -> bool {
        service.is_listed_in(&self.listed)
    }

    /// Whether the service `key` has local endpoints that do not list it: its local flows keep
    /// reply entries (`REPLY_NAT`).
    pub fn falls_back(&self, key: &ServiceKeyOf<A>) -> bool {
        self.services.get(key).is_some_and(|s| !s.local.is_empty() && !self.is_listed(s))
    }

    /// Whether the map lists the service `key` (as last [`EndpointListings::set`]) everywhere.
    pub fn is_complete(&self, key: &ServiceKeyOf<A>) -> bool {
        self.services.get(key).is_some_and(|s| self.is_listed(s))
    }

    pub fn listed(&self) -> &HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>> {
        &self.listed
    }

    /// Brings the listings of the changed endpoints (and of those waiting for room) to the
    /// services delivering there. Endpoints no service delivers to go first, to make room;
    /// then those listed already; then new ones in key order, while there is room. The
    /// services it names are those set or removed since, and those whose listings changed.
    pub fn settle(&mut self) -> Settled<A> {
        let services = std::mem::take(&mut self.changed);
        let mut settled = Settled { writes: Vec::new(), services };
        let dirty = std::mem::take(&mut self.dirty);
        let waiting = std::mem::take(&mut self.waiting);
        let (gone, wanted): (Vec<_>, Vec<_>) = dirty.iter().partition(|e| !self.delivering.contains_key(e));
        for endpoint in gone {
            if let Some(old) = self.listed.remove(endpoint) {
                settled.services.extend(old.listed().iter().map(|s| service_key(endpoint, s)));
                settled.writes.push((*endpoint, None));
            }
        }
        let (kept, new): (Vec<_>, Vec<_>) = wanted.into_iter().partition(|e| self.listed.contains_key(e));
        let mut new: BTreeSet<EndpointKeyOf<A>> = new.into_iter().copied().collect();
        new.extend(waiting.into_iter().filter(|e| self.delivering.contains_key(e)));
        for endpoint in kept.into_iter().chain(&new) {
            let delivering = &self.delivering[endpoint];
            settled.services.extend(delivering.iter().map(|s| service_key(endpoint, s)));
            let old = self.listed.get(endpoint);
            if old.is_none() && self.listed.len() >= self.capacity {
                self.waiting.insert(*endpoint);
                continue;
            }
            let listing = listing(old, delivering);
            if old != Some(&listing) {
                if let Some(old) = old {
                    settled.services.extend(old.listed().iter().map(|s| service_key(endpoint, s)));
                }
                self.listed.insert(*endpoint, listing);
                settled.writes.push((*endpoint, Some(listing)));
            }
        }
        self.note_falling_back(settled.services.iter().copied());
        settled
    }
}

/// The service a listing at `endpoint` names.
fn service_key<A: Copy>(endpoint: &EndpointKeyOf<A>, listing: &EndpointServiceOf<A>) -> ServiceKeyOf<A> {
    ServiceKeyOf { vip: listing.vip, port: listing.vip_port, proto: endpoint.proto, _pad: 0 }
}

/// An endpoint's listing: what `old` lists that is still true, in its places, then services
/// from `delivering` in order while there is room.
pub fn listing<A: Address>(
    old: Option<&EndpointServicesOf<A>>,
    delivering: &BTreeSet<EndpointServiceOf<A>>,
) -> EndpointServicesOf<A> {
    let mut listed: Vec<EndpointServiceOf<A>> = Vec::with_capacity(ENDPOINT_SERVICES_MAX);
    if let Some(old) = old {
        listed.extend(old.listed().iter().filter(|s| delivering.contains(s)));
    }
    let room = ENDPOINT_SERVICES_MAX.saturating_sub(listed.len());
    let fresh: Vec<EndpointServiceOf<A>> =
        delivering.iter().filter(|s| !listed.contains(s)).take(room).copied().collect();
    listed.extend(fresh);
    EndpointServicesOf::of(&listed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lb_common::service::{Addr4, PROTO_TCP, PROTO_UDP};
    use proptest::prelude::*;

    use super::*;

    const POD: Addr4 = [10, 244, 0, 2];
    const PORT: [u8; 2] = 8080u16.to_be_bytes();

    fn service(vip_last: u8, port: u16, number: u16, local: &[(Addr4, u16)]) -> ServiceEndpoints<Addr4> {
        ServiceEndpoints {
            key: ServiceKeyOf::new([198, 51, 100, vip_last], port, PROTO_TCP),
            number,
            local: local.iter().map(|&(addr, backend)| (addr, PORT, backend)).collect(),
        }
    }

    fn endpoint() -> EndpointKeyOf<Addr4> {
        EndpointKeyOf::new(POD, PORT, PROTO_TCP)
    }

    /// Listings with `services` set, settled.
    fn settled(capacity: usize, services: &[ServiceEndpoints<Addr4>]) -> EndpointListings<Addr4> {
        let mut listings = EndpointListings::new(capacity, HashMap::new());
        for s in services {
            listings.set(s.clone());
        }
        listings.settle();
        listings
    }

    #[test]
    fn each_local_endpoint_lists_its_services_and_a_protocol_is_its_own_endpoint() {
        let mut udp = service(10, 53, 2, &[(POD, 4)]);
        udp.key.proto = PROTO_UDP;
        let services = [service(10, 80, 1, &[(POD, 4)]), udp, service(11, 80, 3, &[])];
        let got = settled(16, &services);
        assert_eq!(got.listed().len(), 2, "TCP and UDP to the same port are two endpoints");
        let tcp = &got.listed()[&endpoint()];
        assert_eq!(tcp.listed(), &[EndpointServiceOf::new([198, 51, 100, 10], 80u16.to_be_bytes(), 1, 4)]);
        assert!(services.iter().all(|s| got.is_complete(&s.key)), "one without local endpoints trivially");
    }

    #[test]
    fn a_fifth_service_is_not_listed_and_an_earlier_one_is_never_displaced() {
        let five: Vec<_> = (0..5).map(|n| service(10 + n as u8, 80, 10 - n, &[(POD, 1)])).collect();
        let mut listings = settled(16, &five[1..]);
        let first = listings.listed()[&endpoint()];
        // The fifth sorts first, but the four already listed keep their places.
        listings.set(five[0].clone());
        let settled = listings.settle();
        assert!(settled.writes.is_empty(), "nothing to write: {settled:?}");
        assert!(!listings.is_complete(&five[0].key), "the fifth falls back to reply entries");
        assert!(listings.falls_back(&five[0].key) && !listings.falls_back(&five[1].key));
        // One of the four leaves: the fifth takes its place.
        listings.remove(five[1].key);
        let settled = listings.settle();
        assert_eq!(settled.writes.len(), 1);
        assert!(settled.services.contains(&five[0].key) && settled.services.contains(&five[1].key));
        assert!(listings.is_complete(&five[0].key));
        assert_eq!(
            listings.listed()[&endpoint()].listed()[..3],
            first.listed()[1..],
            "the others kept, in order"
        );
    }

    #[test]
    fn the_falling_back_services_are_counted_as_of_each_settle_and_a_failed_write_recounts() {
        let five: Vec<_> = (0..5).map(|n| service(10 + n as u8, 80, 10 - n, &[(POD, 1)])).collect();
        let mut listings = settled(16, &five[1..]);
        assert_eq!(listings.falling_back(), 0);
        listings.set(five[0].clone());
        assert_eq!(listings.falling_back(), 0, "counted at the settle, not before");
        let settled = listings.settle();
        assert!(
            settled.services.contains(&five[0].key),
            "a service set is settled even with nothing to write"
        );
        assert_eq!(listings.falling_back(), 1);
        // A place frees: the fifth is listed, nothing falls back.
        listings.remove(five[1].key);
        listings.settle();
        assert_eq!(listings.falling_back(), 0);
        // The write of that listing failed, and the map holds none at the endpoint: every
        // service there falls back until the next settle lists them again.
        listings.resync(endpoint(), None);
        assert_eq!(listings.falling_back(), 4);
        let settled = listings.settle();
        assert_eq!(settled.writes.len(), 1);
        assert_eq!(listings.falling_back(), 0);
        // A sync whose writes failed hands its services back for the next settle.
        listings.unsettled(settled.services.clone());
        assert_eq!(listings.settle().services, settled.services);
    }

    #[test]
    fn a_changed_backend_id_is_listed_anew_and_a_full_map_makes_an_endpoint_wait() {
        let mut listings = settled(16, &[service(10, 80, 1, &[(POD, 4)])]);
        listings.set(service(10, 80, 1, &[(POD, 5)]));
        listings.settle();
        let listed = listings.listed()[&endpoint()];
        assert!(listed.lists(1, 5) && !listed.lists(1, 4));

        let other_pod = [10, 244, 0, 3];
        let mut listings = settled(1, &[service(10, 80, 1, &[(POD, 4), (other_pod, 6)])]);
        assert_eq!(listings.listed().len(), 1);
        assert!(!listings.is_complete(&ServiceKeyOf::new([198, 51, 100, 10], 80, PROTO_TCP)));
        // Room appears (another change elsewhere): the waiting endpoint is listed.
        listings.set(service(10, 80, 1, &[(other_pod, 6)]));
        let settled = listings.settle();
        assert_eq!(settled.writes.len(), 2, "one removal, then the waiting endpoint: {settled:?}");
        assert!(listings.is_complete(&ServiceKeyOf::new([198, 51, 100, 10], 80, PROTO_TCP)));
    }

    #[test]
    fn listings_read_back_are_kept_where_true_and_removed_where_not() {
        let before = settled(16, &[service(10, 80, 1, &[(POD, 4)])]);
        let mut stale = before.listed().clone();
        stale.insert(EndpointKeyOf::new([10, 244, 0, 9], PORT, PROTO_TCP), EndpointServicesOf::EMPTY);
        let mut listings = EndpointListings::new(16, stale);
        listings.set(service(10, 80, 1, &[(POD, 4)]));
        let settled = listings.settle();
        assert_eq!(settled.writes, vec![(EndpointKeyOf::new([10, 244, 0, 9], PORT, PROTO_TCP), None)]);
        assert_eq!(listings.listed(), before.listed());
    }

    #[test]
    fn a_write_that_failed_is_made_again_at_the_next_settle() {
        let mut listings = settled(16, &[service(10, 80, 1, &[(POD, 4)])]);
        let listed = listings.listed()[&endpoint()];
        // The map kept nothing: the mirror says so, and the next settle writes it again.
        listings.resync(endpoint(), None);
        assert!(!listings.is_complete(&ServiceKeyOf::new([198, 51, 100, 10], 80, PROTO_TCP)));
        let settled = listings.settle();
        assert_eq!(settled.writes, vec![(endpoint(), Some(listed))]);
        assert!(listings.is_complete(&ServiceKeyOf::new([198, 51, 100, 10], 80, PROTO_TCP)));
    }

    /// The model: every endpoint's listing computed afresh from all services, endpoints
    /// listed already first, then the others in key order while there is room.
    fn model(
        current: &HashMap<EndpointKeyOf<Addr4>, EndpointServicesOf<Addr4>>,
        services: &BTreeMap<ServiceKeyOf<Addr4>, ServiceEndpoints<Addr4>>,
        capacity: usize,
    ) -> HashMap<EndpointKeyOf<Addr4>, EndpointServicesOf<Addr4>> {
        let mut delivering: BTreeMap<EndpointKeyOf<Addr4>, BTreeSet<EndpointServiceOf<Addr4>>> =
            BTreeMap::new();
        for service in services.values() {
            for (endpoint, listing) in service.listings() {
                delivering.entry(endpoint).or_default().insert(listing);
            }
        }
        let (kept, new): (Vec<_>, Vec<_>) = delivering.iter().partition(|(e, _)| current.contains_key(e));
        kept.into_iter()
            .chain(new)
            .take(capacity)
            .map(|(endpoint, delivering)| (*endpoint, listing(current.get(endpoint), delivering)))
            .collect()
    }

    proptest! {
        /// Changes one service at a time, settling now and then, against the model: the same
        /// listings, every listing true, each at most four, completeness as listed, and a
        /// listing true before and after a settle kept.
        #[test]
        fn incremental_listings_agree_with_the_model(
            steps in prop::collection::vec(
                (0u16..8, prop::option::of(prop::collection::vec((0u8..3, 0u16..3), 0..3)), any::<bool>()),
                1..40,
            ),
            capacity in 1usize..4,
        ) {
            let mut listings = EndpointListings::new(capacity, HashMap::new());
            let mut services = BTreeMap::new();
            let mut current = HashMap::new();
            for (number, local, settle) in steps {
                let key = ServiceKeyOf::new([198, 51, 100, number as u8], 80, PROTO_TCP);
                match local {
                    Some(local) => {
                        let local: Vec<_> = local.iter().map(|&(pod, b)| ([10, 244, 0, pod], b)).collect();
                        let s = service(number as u8, 80, number, &local);
                        services.insert(key, s.clone());
                        listings.set(s);
                    }
                    None => {
                        services.remove(&key);
                        listings.remove(key);
                    }
                }
                if !settle {
                    continue;
                }
                let settled = listings.settle();
                let expected = model(&current, &services, capacity);
                prop_assert_eq!(listings.listed(), &expected);
                for (endpoint, value) in &settled.writes {
                    prop_assert_eq!(value.as_ref(), expected.get(endpoint));
                }
                for (endpoint, listed) in &expected {
                    prop_assert!(listed.count as usize <= ENDPOINT_SERVICES_MAX);
                    if let Some(old) = current.get(endpoint) {
                        for s in old.listed() {
                            let still = services.values().any(|x| x.listings().any(|l| l == (*endpoint, *s)));
                            prop_assert!(!still || listed.listed().contains(s), "a true listing was dropped");
                        }
                    }
                }
                for s in services.values() {
                    prop_assert_eq!(listings.is_complete(&s.key), s.is_listed_in(&expected));
                }
                current = expected;
            }
        }
    }
}
