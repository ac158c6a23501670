//! Reply translation without a per-flow reply entry: which services deliver to each local
//! endpoint (`ENDPOINT_SERVICES`), and the check that a reply belongs to one of them.
//!
//! Local delivery rewrites a flow's destination from the VIP to a pod on this node; the pod's
//! replies must leave with the VIP as their source. The TC egress program knows only the reply:
//! endpoint → client. It finds the endpoint's services here, rebuilds for each the forward
//! flow's connection-table key (client, client port, service number) and translates only if the
//! connection table's entry for that key names this endpoint's backend ([`verified`]). So the
//! XDP program writes nothing per flow for its replies, and checks nothing per packet: the one
//! cache line of the connection table already holds the proof.
//!
//! What can go wrong, by construction:
//! - **A flow without a connection-table entry** (a flood evicted it, or its first store lost
//!   a race to another CPU) has its replies left untranslated until its client's next packet
//!   records it again, as an evicted `REPLY_NAT` entry was.
//! - **A false match** needs a fingerprint collision with another flow of the same client port
//!   and service, in the same bucket, that names the same backend: at most
//!   `BUCKET_SLOTS / 2^32` a reply, and then the reply is one of this endpoint's own to that
//!   client, given the VIP of a service that does deliver to it.
//! - **More than [`ENDPOINT_SERVICES_MAX`] services on one endpoint** (address, port, protocol):
//!   the agent lists the first ones and leaves the others' entries unmarked
//!   ([`crate::service::Service::REPLIES_BY_TABLE`] clear), whose flows keep a `REPLY_NAT`
//!   entry as before.

use crate::service::{Address, ConnectionKeyOf};

/// Services listed for one endpoint. Four covers a pod behind an internal and an external
/// Service, each dual-port; the rest fall back to reply entries.
pub const ENDPOINT_SERVICES_MAX: usize = 4;

/// A local endpoint as its replies show it: source address, source port, protocol.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKeyOf<A> {
    pub addr: A,
    pub port: [u8; 2],
    pub proto: u8,
    pub _pad: u8,
}

impl<A> EndpointKeyOf<A> {
    pub const fn new(addr: A, port: [u8; 2], proto: u8) -> Self {
        Self { addr, port, proto, _pad: 0 }
    }
}

/// A service that delivers to the endpoint: its VIP and port (the reply's new source), its
/// number (the connection table's key) and the endpoint's backend id in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointServiceOf<A> {
    pub vip: A,
    pub vip_port: [u8; 2],
    pub service: u16,
    pub backend: u16,
    pub _pad: [u8; 2],
}

impl<A> EndpointServiceOf<A> {
    pub const fn new(vip: A, vip_port: [u8; 2], service: u16, backend: u16) -> Self {
        Self { vip, vip_port, service, backend, _pad: [0; 2] }
    }
}

/// `ENDPOINT_SERVICES`' value: the first `count` of `services`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointServicesOf<A> {
    pub services: [EndpointServiceOf<A>; ENDPOINT_SERVICES_MAX],
    pub count: u32,
}

impl<A: Address> EndpointServicesOf<A> {
    pub const EMPTY: Self =
        Self { services: [EndpointServiceOf::new(A::ZERO, [0; 2], 0, 0); ENDPOINT_SERVICES_MAX], count: 0 };

    /// The listed services.
    pub fn listed(&self) -> &[EndpointServiceOf<A>] {
        &self.services[..(self.count as usize).min(ENDPOINT_SERVICES_MAX)]
    }

    /// Whether `service` is listed with `backend`.
    pub fn lists(&self, service: u16, backend: u16) -> bool {
        self.listed().iter().any(|s| s.service == service && s.backend == backend)
    }

    /// `services` in order, the first [`ENDPOINT_SERVICES_MAX`] of them.
    pub fn of(services: &[EndpointServiceOf<A>]) -> Self {
        let mut value = Self::EMPTY;
        for (at, service) in value.services.iter_mut().zip(services) {
            *at = *service;
        }
        value.count = services.len().min(ENDPOINT_SERVICES_MAX) as u32;
        value
    }
}

pub type EndpointKey = EndpointKeyOf<[u8; 4]>;
pub type EndpointKey6 = EndpointKeyOf<[u8; 16]>;
pub type EndpointServices = EndpointServicesOf<[u8; 4]>;
pub type EndpointServices6 = EndpointServicesOf<[u8; 16]>;

/// The service a reply from the endpoint to `client`:`client_port` belongs to: the first
/// listed service whose connection-table entry for that client is this endpoint's
/// (`names(key, backend)`: whether the table holds an entry for `key` naming `backend`). `None`
/// leaves the reply to `REPLY_NAT`.
#[inline(always)]
pub fn verified<A: Copy>(
    services: &EndpointServicesOf<A>,
    client: A,
    client_port: [u8; 2],
    mut names: impl FnMut(&ConnectionKeyOf<A>, u16) -> bool,
) -> Option<EndpointServiceOf<A>> {
    // A bounded loop over a fixed array: the verifier sees four iterations at most.
    for (i, service) in services.services.iter().enumerate() {
        if i as u32 >= services.count {
            break;
        }
        let key = ConnectionKeyOf { client, client_port, service: service.service };
        if names(&key, service.backend) {
            return Some(*service);
        }
    }
    None
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: `#[repr(C)]`, integers and byte arrays only, every padding byte explicit.
    unsafe impl<A: Address> aya::Pod for EndpointKeyOf<A> {}
    unsafe impl<A: Address> aya::Pod for EndpointServicesOf<A> {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{collections::BTreeMap, vec::Vec};

    use proptest::prelude::*;

    use super::*;

    const CLIENT: [u8; 4] = [192, 0, 2, 7];
    const VIP_A: [u8; 4] = [198, 51, 100, 10];
    const VIP_B: [u8; 4] = [198, 51, 100, 11];

    #[test]
    fn layouts_have_no_implicit_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<EndpointKey>(), 8);
        assert_eq!(size_of::<EndpointKey6>(), 20);
        assert_eq!(size_of::<EndpointServiceOf<[u8; 4]>>(), 12);
        assert_eq!(size_of::<EndpointServiceOf<[u8; 16]>>(), 24);
        assert_eq!(size_of::<EndpointServices>(), 52);
        assert_eq!(size_of::<EndpointServices6>(), 100);
    }

    /// Each row: the connection table's entries (service, client port → backend), the reply's
    /// client port, and the VIP the reply must leave with (`None`: left to `REPLY_NAT`).
    #[test]
    fn a_reply_is_translated_only_for_a_flow_whose_entry_names_this_endpoint() {
        let listed = EndpointServices::of(&[
            EndpointServiceOf::new(VIP_A, 80u16.to_be_bytes(), 3, 7),
            EndpointServiceOf::new(VIP_B, 443u16.to_be_bytes(), 9, 7),
        ]);
        type Row = (&'static str, &'static [(u16, u16, u16)], u16, Option<([u8; 4], u16)>);
        let rows: [Row; 6] = [
            ("the first service's flow", &[(3, 40_000, 7)], 40_000, Some((VIP_A, 80))),
            ("the second service's flow", &[(9, 40_000, 7)], 40_000, Some((VIP_B, 443))),
            ("no flow: left to REPLY_NAT", &[], 40_000, None),
            ("the entry names another backend", &[(3, 40_000, 8)], 40_000, None),
            ("another client port's flow", &[(3, 40_001, 7)], 40_000, None),
            ("a service not listed", &[(5, 40_000, 7)], 40_000, None),
        ];
        for (name, entries, port, expected) in rows {
            let table: BTreeMap<(u16, [u8; 2]), u16> =
                entries.iter().map(|&(s, p, b)| ((s, p.to_be_bytes()), b)).collect();
            let got = verified(&listed, CLIENT, port.to_be_bytes(), |key, backend| {
                assert_eq!(key.client, CLIENT, "{name}: the reply's destination is the client");
                table.get(&(key.service, key.client_port)) == Some(&backend)
            });
            let got = got.map(|s| (s.vip, u16::from_be_bytes(s.vip_port)));
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn only_the_first_four_services_are_listed() {
        let services: Vec<_> = (0..6u16).map(|n| EndpointServiceOf::new(VIP_A, [0, n as u8], n, 1)).collect();
        let listed = EndpointServices::of(&services);
        assert_eq!(listed.listed(), &services[..ENDPOINT_SERVICES_MAX]);
        assert!(listed.lists(3, 1) && !listed.lists(4, 1) && !listed.lists(3, 2));
        // A fifth service's flow is not found here, whatever the table says.
        assert_eq!(verified(&listed, CLIENT, [0; 2], |k, backend| k.service == 4 && backend == 1), None);
    }

    proptest! {
        /// Against a plain model: the reply is translated exactly when some listed service's
        /// flow from that client port names this endpoint's backend, and then with the first
        /// such service's VIP.
        #[test]
        fn verified_agrees_with_the_model(
            listed in prop::collection::vec((0u16..8, 0u16..4), 0..=ENDPOINT_SERVICES_MAX),
            flows in prop::collection::btree_map((0u16..8, 0u16..3), 0u16..4, 0..16),
            port in 0u16..3,
        ) {
            let services: Vec<_> = listed
                .iter()
                .map(|&(number, backend)| EndpointServiceOf::new(VIP_A, number.to_be_bytes(), number, backend))
                .collect();
            let value = EndpointServices::of(&services);
            let got = verified(&value, CLIENT, port.to_be_bytes(), |key, backend| {
                flows.get(&(key.service, u16::from_be_bytes(key.client_port))) == Some(&backend)
            });
            let model = services.iter().find(|s| flows.get(&(s.service, port)) == Some(&s.backend)).copied();
            prop_assert_eq!(got, model);
        }
    }
}
