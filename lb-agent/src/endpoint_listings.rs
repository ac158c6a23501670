//! Endpoint listings: which services each local endpoint lists in `ENDPOINT_SERVICES`, so
//! that its replies are verified by the connection table (see
//! `lb_common::endpoint_services`), and which services are listed for all of theirs. Pure.
//!
//! Listings are stable: a service listed for an endpoint stays listed while it delivers to it
//! with the same backend id, and a new one takes a free place, never another's. So a service
//! only ever gains its listing (written before its entry says so) or loses it with a change of
//! its own (its entry says so first): no flow finds neither a listing nor a reply entry.

use std::collections::{BTreeMap, BTreeSet, HashMap};

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

/// What `ENDPOINT_SERVICES` must hold, and the services it lists at every local endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listings<A> {
    pub endpoints: BTreeMap<EndpointKeyOf<A>, EndpointServicesOf<A>>,
    pub complete: BTreeSet<ServiceKeyOf<A>>,
}

/// The listings for `services`, keeping what `current` lists where it is still true, with at
/// most `capacity` endpoints (those listed already first, then in key order).
pub fn listings<A: Address>(
    current: &HashMap<EndpointKeyOf<A>, EndpointServicesOf<A>>,
    services: &[ServiceEndpoints<A>],
    capacity: usize,
) -> Listings<A> {
    let mut wanted: BTreeMap<EndpointKeyOf<A>, BTreeSet<EndpointServiceOf<A>>> = BTreeMap::new();
    for service in services {
        for (endpoint, listing) in service.listings() {
            wanted.entry(endpoint).or_default().insert(listing);
        }
    }
    let (kept, new): (Vec<_>, Vec<_>) =
        wanted.into_iter().partition(|(endpoint, _)| current.contains_key(endpoint));
    let mut endpoints = BTreeMap::new();
    for (endpoint, mut wanted) in kept.into_iter().chain(new).take(capacity) {
        let mut listed: Vec<EndpointServiceOf<A>> = Vec::with_capacity(ENDPOINT_SERVICES_MAX);
        if let Some(old) = current.get(&endpoint) {
            listed.extend(old.listed().iter().filter(|s| wanted.remove(s)));
        }
        let room = ENDPOINT_SERVICES_MAX.saturating_sub(listed.len());
        listed.extend(wanted.into_iter().take(room));
        endpoints.insert(endpoint, EndpointServicesOf::of(&listed));
    }
    let as_map: HashMap<_, _> = endpoints.iter().map(|(k, v)| (*k, *v)).collect();
    let complete = services.iter().filter(|s| s.is_listed_in(&as_map)).map(|s| s.key).collect();
    Listings { endpoints, complete }
}

#[cfg(test)]
mod tests {
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

    fn as_current(listings: &Listings<Addr4>) -> HashMap<EndpointKeyOf<Addr4>, EndpointServicesOf<Addr4>> {
        listings.endpoints.iter().map(|(k, v)| (*k, *v)).collect()
    }

    #[test]
    fn each_local_endpoint_lists_its_services_and_a_protocol_is_its_own_endpoint() {
        let mut udp = service(10, 53, 2, &[(POD, 4)]);
        udp.key.proto = PROTO_UDP;
        let services = [service(10, 80, 1, &[(POD, 4)]), udp, service(11, 80, 3, &[])];
        let got = listings(&HashMap::new(), &services, 16);
        assert_eq!(got.endpoints.len(), 2, "TCP and UDP to the same port are two endpoints");
        let tcp = &got.endpoints[&endpoint()];
        assert_eq!(tcp.listed(), &[EndpointServiceOf::new([198, 51, 100, 10], 80u16.to_be_bytes(), 1, 4)]);
        assert_eq!(got.complete.len(), 3, "a service without local endpoints is trivially complete");
    }

    #[test]
    fn a_fifth_service_is_not_listed_and_an_earlier_one_is_never_displaced() {
        let five: Vec<_> = (0..5).map(|n| service(10 + n as u8, 80, 10 - n, &[(POD, 1)])).collect();
        let first = listings(&HashMap::new(), &five[1..], 16);
        assert_eq!(first.complete.len(), 4);
        // The fifth sorts first, but the four already listed keep their places.
        let second = listings(&as_current(&first), &five, 16);
        assert_eq!(second.endpoints[&endpoint()], first.endpoints[&endpoint()]);
        assert!(!second.complete.contains(&five[0].key), "the fifth falls back to reply entries");
        // One of the four leaves: the fifth takes its place.
        let without: Vec<_> = five.iter().filter(|s| s.number != 9).cloned().collect();
        let third = listings(&as_current(&second), &without, 16);
        assert!(third.complete.contains(&five[0].key));
        assert_eq!(third.complete.len(), 4);
    }

    #[test]
    fn a_changed_backend_id_is_listed_anew_and_a_full_map_leaves_services_unlisted() {
        let first = listings(&HashMap::new(), &[service(10, 80, 1, &[(POD, 4)])], 16);
        let moved = [service(10, 80, 1, &[(POD, 5)])];
        let second = listings(&as_current(&first), &moved, 16);
        assert!(second.endpoints[&endpoint()].lists(1, 5) && !second.endpoints[&endpoint()].lists(1, 4));
        let other_pod = [10, 244, 0, 3];
        let two = [service(10, 80, 1, &[(POD, 4), (other_pod, 6)])];
        let full = listings(&HashMap::new(), &two, 1);
        assert_eq!(full.endpoints.len(), 1);
        assert!(full.complete.is_empty(), "one of its endpoints is not listed");
    }

    proptest! {
        /// Whatever the history: every listing is true (the service delivers there with that
        /// backend id), no endpoint lists more than it holds, `complete` is exactly the services
        /// listed everywhere, and a listing true before and after a change stays.
        #[test]
        fn listings_are_true_bounded_and_stable(
            rounds in prop::collection::vec(
                prop::collection::vec((0u16..8, prop::collection::vec((0u8..3, 0u16..3), 0..3)), 0..8),
                1..5,
            ),
            capacity in 1usize..4,
        ) {
            let mut current = HashMap::new();
            for round in rounds {
                let mut seen = BTreeSet::new();
                let services: Vec<_> = round
                    .iter()
                    .filter(|(number, _)| seen.insert(*number))
                    .map(|(number, local)| {
                        let local: Vec<_> = local.iter().map(|&(pod, b)| ([10, 244, 0, pod], b)).collect();
                        service(*number as u8, 80, *number, &local)
                    })
                    .collect();
                let got = listings(&current, &services, capacity);
                prop_assert!(got.endpoints.len() <= capacity);
                let truth: BTreeSet<_> = services.iter().flat_map(|s| s.listings().collect::<Vec<_>>()).collect();
                for (endpoint, listed) in &got.endpoints {
                    prop_assert!(listed.count as usize <= ENDPOINT_SERVICES_MAX);
                    for s in listed.listed() {
                        prop_assert!(truth.contains(&(*endpoint, *s)), "a listing that is not true");
                    }
                    if let Some(old) = current.get(endpoint) {
                        for s in old.listed() {
                            if truth.contains(&(*endpoint, *s)) {
                                prop_assert!(listed.listed().contains(s), "a true listing was dropped");
                            }
                        }
                    }
                }
                let as_map: HashMap<_, _> = got.endpoints.iter().map(|(k, v)| (*k, *v)).collect();
                for s in &services {
                    prop_assert_eq!(got.complete.contains(&s.key), s.is_listed_in(&as_map));
                }
                current = as_map;
            }
        }
    }
}
