//! Map contents: from the config's services to what this node's service maps must hold. Pure.
//!
//! Every node computes the same Maglev ring for a service from the same endpoints, whatever
//! their order and whichever node it is: the ring is built from the endpoints' identities
//! (address and port), never from how this node reaches them. That is what lets a DSR flow keep
//! its endpoint when the VIP moves to another node.
//!
//! [`IncrementalContents`] follows a stream of configs: a service whose config is unchanged is not
//! computed again, and rings are cached by endpoint set, so one endpoint change costs one
//! service's entries, whatever the cluster's size.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
};

use lb_common::service::{
    Addr4, Address, BackendOf, Delivery, LocalEndpoint, LocalEndpointKeyOf, ServiceKeyOf,
};

use crate::{
    config::{Config, RemoteMode, ServiceConfig, TrafficPolicy},
    maglev,
};

/// What one family's service maps must hold on one node (IPv4's by default; each family has
/// maps of its own, computed from its services alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapContents<A = Addr4> {
    pub services: BTreeMap<ServiceKeyOf<A>, ServiceContents<A>>,
    /// This node's endpoints, for decapsulating DSR traffic addressed to them.
    pub local_endpoints: BTreeMap<LocalEndpointKeyOf<A>, LocalEndpoint>,
}

impl<A> Default for MapContents<A> {
    fn default() -> Self {
        Self { services: BTreeMap::new(), local_endpoints: BTreeMap::new() }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceContents<A = Addr4> {
    /// The config's service name, for logs and metrics.
    pub name: String,
    /// Distinct backends, sorted.
    pub backends: Vec<BackendOf<A>>,
    /// The Maglev ring: indices into `backends`. Empty when there are none. Shared between
    /// services with the same endpoint identities.
    pub ring: Arc<[u32]>,
}

impl<A: Address> MapContents<A> {
    /// Every backend the contents use, once.
    pub fn backends(&self) -> BTreeSet<BackendOf<A>> {
        self.services.values().flat_map(|s| s.backends.iter().copied()).collect()
    }

    /// The whole contents as a change: every entry written, everything else removed.
    pub fn to_delta(&self) -> ContentsDelta<A> {
        ContentsDelta {
            services: self.services.iter().map(|(k, s)| (*k, Some(s.clone()))).collect(),
            local_endpoints: self.local_endpoints.iter().map(|(k, e)| (*k, Some(*e))).collect(),
            complete: true,
        }
    }
}

/// A change to one family's maps: `Some` writes an entry, `None` removes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentsDelta<A = Addr4> {
    pub services: BTreeMap<ServiceKeyOf<A>, Option<ServiceContents<A>>>,
    pub local_endpoints: BTreeMap<LocalEndpointKeyOf<A>, Option<LocalEndpoint>>,
    /// Every wanted entry is listed: whatever else the maps hold goes (the first sync, which
    /// may find a previous agent's pinned maps).
    pub complete: bool,
}

impl<A> Default for ContentsDelta<A> {
    fn default() -> Self {
        Self { services: BTreeMap::new(), local_endpoints: BTreeMap::new(), complete: false }
    }
}

impl<A> ContentsDelta<A> {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.local_endpoints.is_empty() && !self.complete
    }
}

/// What a service's entries depend on besides the service itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentsContext {
    pub node: String,
    pub node_addresses: BTreeMap<String, Ipv4Addr>,
    /// The largest ring (`dataplane.capacity.ringSize`).
    pub ring_size: u32,
}

impl ContentsContext {
    pub fn new(config: &Config, node: &str) -> Self {
        Self {
            node: node.to_owned(),
            node_addresses: config
                .groups
                .iter()
                .flat_map(|g| g.nodes.iter().map(|n| (n.name.clone(), n.address)))
                .collect(),
            ring_size: config.dataplane.capacity.ring_size,
        }
    }
}

/// One config service's entries: one per port.
#[derive(Clone, Debug)]
pub struct ServiceEntries<A = Addr4> {
    pub services: Vec<(ServiceKeyOf<A>, ServiceContents<A>)>,
    pub local_endpoints: Vec<(LocalEndpointKeyOf<A>, LocalEndpoint)>,
}

impl<A> Default for ServiceEntries<A> {
    fn default() -> Self {
        Self { services: Vec::new(), local_endpoints: Vec::new() }
    }
}

/// Maglev rings by endpoint identities (address, port), so services with the same endpoints,
/// and a service computed again unchanged, share one computation.
#[derive(Default)]
pub struct RingCache {
    rings: HashMap<(u32, Vec<Identity>), Arc<[u32]>>,
}

/// An endpoint's identity for Maglev: the same on every node.
type Identity = (std::net::IpAddr, [u8; 2]);

impl RingCache {
    fn ring<A: Address>(&mut self, backends: &[BackendOf<A>], size: u32) -> Arc<[u32]> {
        let identities: Vec<Identity> = backends.iter().map(|b| (b.addr.to_ip(), b.port)).collect();
        self.rings
            .entry((size, identities))
            .or_insert_with(|| {
                let names: Vec<String> = backends.iter().map(identity).collect();
                maglev::lookup_table(&names, size).into()
            })
            .clone()
    }

    /// Forgets rings no computed service holds any more.
    fn prune(&mut self) {
        self.rings.retain(|_, ring| Arc::strong_count(ring) > 1);
    }
}

/// The entries of one config service on the node of `context`, in family `A`'s maps: nothing when its
/// VIP is of the other family (the config checked its endpoints are of its VIP's).
pub fn service_contents<A: Address>(
    service: &ServiceConfig,
    context: &ContentsContext,
    rings: &mut RingCache,
) -> ServiceEntries<A> {
    let node = context.node.as_str();
    let mut entries = ServiceEntries::default();
    let Some(vip) = A::from_ip(service.vip) else { return entries };
    for port in &service.ports {
        let key = ServiceKeyOf::new(vip, port.port, port.protocol.number());
        let target = port.target().to_be_bytes();
        let mut backends: Vec<BackendOf<A>> = service
            .endpoints
            .iter()
            .filter(|e| service.traffic_policy == TrafficPolicy::Cluster || e.node == node)
            .filter_map(|e| Some((e, A::from_ip(e.address)?)))
            .map(|(e, addr)| {
                let delivery = match (e.node == node, service.remote_mode) {
                    (true, _) => Delivery::Local,
                    (false, RemoteMode::FullNat) => Delivery::FullNat,
                    (false, RemoteMode::Dsr) => Delivery::Dsr,
                };
                BackendOf {
                    addr,
                    port: target,
                    delivery: delivery as u8,
                    _pad: 0,
                    node: context.node_addresses.get(e.node.as_str()).map(|a| a.octets()).unwrap_or_default(),
                }
            })
            .collect();
        backends.sort();
        backends.dedup_by_key(|b| (b.addr, b.port));
        for addr in service.endpoints.iter().filter(|e| e.node == node).filter_map(|e| A::from_ip(e.address))
        {
            entries.local_endpoints.push((
                LocalEndpointKeyOf { service: key, addr },
                LocalEndpoint { target_port: target, _pad: [0; 2] },
            ));
        }
        let ring = if backends.is_empty() {
            Arc::from([])
        } else {
            rings.ring(&backends, maglev::table_size(backends.len(), context.ring_size))
        };
        entries.services.push((key, ServiceContents { name: service.name.clone(), backends, ring }));
    }
    entries
}

/// What `node`'s service maps of family `A` must hold, whole.
pub fn for_node<A: Address>(config: &Config, node: &str) -> MapContents<A> {
    let context = ContentsContext::new(config, node);
    let mut rings = RingCache::default();
    let mut contents = MapContents::default();
    for service in &config.services {
        let entries = service_contents(service, &context, &mut rings);
        contents.services.extend(entries.services);
        contents.local_endpoints.extend(entries.local_endpoints);
    }
    contents
}

/// A backend's identity for Maglev: the same on every node (`10.244.1.2:8080`,
/// `[fd00::2]:8080`).
pub fn identity<A: Address>(backend: &BackendOf<A>) -> String {
    SocketAddr::new(backend.addr.to_ip(), u16::from_be_bytes(backend.port)).to_string()
}

/// Follows one config after another and returns only what changed, for family `A`'s maps.
pub struct IncrementalContents<A = Addr4> {
    context: Option<ContentsContext>,
    /// Each computed service config by its allocation (held here, so the address is not reused
    /// while computed), with the update that last saw it and its entries.
    computed: HashMap<usize, Computed<A>, foldhash::fast::FixedState>,
    /// The computed configs' addresses by content, for a config that comes back as a new
    /// allocation with the same content (a reloaded file).
    by_content: HashMap<Arc<ServiceConfig>, usize, foldhash::fast::FixedState>,
    /// Counts updates, to tell the services an update saw from the ones it did not.
    update: u64,
    rings: RingCache,
}

impl<A> Default for IncrementalContents<A> {
    fn default() -> Self {
        Self {
            context: None,
            computed: HashMap::default(),
            by_content: HashMap::default(),
            update: 0,
            rings: RingCache::default(),
        }
    }
}

struct Computed<A> {
    config: Arc<ServiceConfig>,
    seen: u64,
    entries: ServiceEntries<A>,
}

impl<A: Address> IncrementalContents<A> {
    /// The change from the last config's contents to `config`'s. Only services whose config
    /// differs are computed; the first call, and a change of this node's context (its name,
    /// the nodes' addresses, the ring size), compute everything and give a complete delta.
    /// An unchanged service costs one lookup of its address (the Kubernetes source hands an
    /// unchanged service over as the same allocation), or of its content (a reloaded file).
    pub fn update(&mut self, config: &Config, node: &str) -> ContentsDelta<A> {
        let context = ContentsContext::new(config, node);
        let mut delta = ContentsDelta::default();
        if self.context.as_ref() != Some(&context) {
            self.computed.clear();
            self.by_content.clear();
            self.context = Some(context.clone());
            delta.complete = true;
        }
        self.update += 1;
        let now = self.update;
        for service in &config.services {
            let address = Arc::as_ptr(service) as usize;
            if let Some(computed) = self.computed.get_mut(&address) {
                computed.seen = now;
                continue;
            }
            if let Some((known, old)) = self.by_content.remove_entry(service) {
                // The same content in a new allocation: move its entries over.
                let mut computed = self.computed.remove(&old).expect("indexed by content");
                drop(known);
                computed.config = service.clone();
                computed.seen = now;
                self.computed.insert(address, computed);
                self.by_content.insert(service.clone(), address);
                continue;
            }
            let entries = service_contents(service, &context, &mut self.rings);
            delta.services.extend(entries.services.iter().map(|(k, s)| (*k, Some(s.clone()))));
            delta.local_endpoints.extend(entries.local_endpoints.iter().map(|(k, e)| (*k, Some(*e))));
            self.computed.insert(address, Computed { config: service.clone(), seen: now, entries });
            self.by_content.insert(service.clone(), address);
        }
        // What this update did not see was changed (its new entries are already in the
        // delta) or removed.
        let mut swept = false;
        let by_content = &mut self.by_content;
        self.computed.retain(|_, computed| {
            if computed.seen == now {
                return true;
            }
            by_content.remove(&computed.config);
            for (key, _) in &computed.entries.services {
                delta.services.entry(*key).or_insert(None);
            }
            for (key, _) in &computed.entries.local_endpoints {
                delta.local_endpoints.entry(*key).or_insert(None);
            }
            swept = true;
            false
        });
        if swept {
            self.rings.prune();
        }
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use lb_common::service::{Addr6, ServiceKey, ServiceKey6};
    use proptest::prelude::*;

    fn config(endpoints: &[(&str, &str)], mode: &str, policy: &str) -> Config {
        let eps: String =
            endpoints.iter().map(|(a, n)| format!("      - {{address: {a}, node: {n}}}\n")).collect();
        Config::parse(&format!(
            "interface: eth0\nvips: [{{address: 198.51.100.10}}]\nservices:\n  - name: web\n    vip: 198.51.100.10\n    remoteMode: {mode}\n    trafficPolicy: {policy}\n    ports: [{{port: 80, targetPort: 8080}}, {{port: 53, protocol: UDP}}]\n    endpoints:\n{eps}"
        ))
        .unwrap()
    }

    fn web() -> ServiceKey {
        ServiceKey::new([198, 51, 100, 10], 80, 6)
    }

    #[test]
    fn deliveries_follow_the_endpoints_node() {
        let c = config(&[("10.244.0.2", "n0"), ("10.244.1.2", "n1")], "dsr", "Cluster");
        let on_n0: MapContents = for_node(&c, "n0");
        let s = &on_n0.services[&web()];
        let deliveries: Vec<_> = s.backends.iter().map(|b| Delivery::from_u8(b.delivery).unwrap()).collect();
        assert_eq!(deliveries, [Delivery::Local, Delivery::Dsr]);
        assert_eq!(s.backends[0].port, 8080u16.to_be_bytes());
        assert_eq!(
            on_n0.services[&ServiceKey::new([198, 51, 100, 10], 53, 17)].backends[0].port,
            53u16.to_be_bytes()
        );
        assert_eq!(on_n0.local_endpoints.len(), 2, "one per port");
        let on_n2 = for_node(&c, "n2");
        assert!(on_n2.local_endpoints.is_empty());
        assert!(on_n2.services[&web()].backends.iter().all(|b| b.delivery == Delivery::Dsr as u8));
    }

    #[test]
    fn local_policy_keeps_only_this_nodes_endpoints() {
        let c = config(&[("10.244.0.2", "n0"), ("10.244.1.2", "n1")], "fullNat", "Local");
        assert_eq!(for_node(&c, "n0").services[&web()].backends.len(), 1);
        let on_n2 = for_node(&c, "n2");
        assert!(on_n2.services[&web()].backends.is_empty() && on_n2.services[&web()].ring.is_empty());
    }

    #[test]
    fn the_ring_is_sized_for_its_backends() {
        let c = config(&[("10.244.0.2", "n0"), ("10.244.1.2", "n1"), ("10.244.2.2", "n2")], "dsr", "Cluster");
        let s = &for_node(&c, "n0").services[&web()];
        assert_eq!(s.ring.len() as u32, maglev::table_size(3, u32::MAX));
        assert!(s.ring.len() >= 300);
    }

    #[test]
    fn consecutive_client_ports_spread_over_the_ring() {
        let c = config(&[("10.244.1.2", "n1"), ("10.244.2.2", "n2")], "dsr", "Cluster");
        let s = &for_node(&c, "n0").services[&web()];
        let mut hits = [0u32; 2];
        // Linux hands out even ephemeral ports for connect(), one after the other.
        for port in (32_768u16..34_768).step_by(2) {
            let flow = lb_common::service::FlowKey::new(
                [192, 0, 2, 100],
                [198, 51, 100, 10],
                port.to_be_bytes(),
                80u16.to_be_bytes(),
                6,
            );
            let slot = lb_common::hash::flow_hash(&flow) % s.ring.len() as u32;
            hits[s.ring[slot as usize] as usize] += 1;
        }
        assert!(hits.iter().all(|&h| (400..600).contains(&h)), "{hits:?}");
    }

    #[test]
    fn each_family_plans_its_own_services() {
        let c = Config::parse(
            "interface: eth0\nvips: [{address: 198.51.100.10}, {address: '2001:db8:6::10'}]\nservices:\n  - name: web4\n    vip: 198.51.100.10\n    ports: [{port: 80}]\n    endpoints: [{address: 10.244.1.2, node: n1}]\n  - name: web6\n    vip: '2001:db8:6::10'\n    remoteMode: dsr\n    ports: [{port: 80, targetPort: 8080}]\n    endpoints: [{address: 'fd00:10:244:1::2', node: n1}, {address: 'fd00:10:244::2', node: n0}]\n",
        )
        .unwrap();
        let v4: MapContents = for_node(&c, "n0");
        let v6: MapContents<Addr6> = for_node(&c, "n0");
        assert_eq!(v4.services.keys().copied().collect::<Vec<_>>(), [web()]);
        let key6 = ServiceKey6::new("2001:db8:6::10".parse::<std::net::Ipv6Addr>().unwrap().octets(), 80, 6);
        let s = &v6.services[&key6];
        let deliveries: Vec<_> = s.backends.iter().map(|b| Delivery::from_u8(b.delivery).unwrap()).collect();
        assert_eq!(deliveries, [Delivery::Local, Delivery::Dsr]);
        assert_eq!(identity(&s.backends[0]), "[fd00:10:244::2]:8080");
        assert_eq!(v6.local_endpoints.len(), 1);
        // The same ring for the same endpoint identities, on every node.
        let on_n2: MapContents<Addr6> = for_node(&c, "n2");
        assert_eq!(on_n2.services[&key6].ring, s.ring);
    }

    /// Applies a delta to contents as the maps would hold them.
    fn apply(state: &mut MapContents, delta: &ContentsDelta) {
        if delta.complete {
            state.services.retain(|k, _| delta.services.contains_key(k));
            state.local_endpoints.retain(|k, _| delta.local_endpoints.contains_key(k));
        }
        for (key, service) in &delta.services {
            match service {
                Some(s) => state.services.insert(*key, s.clone()),
                None => state.services.remove(key),
            };
        }
        for (key, endpoint) in &delta.local_endpoints {
            match endpoint {
                Some(e) => state.local_endpoints.insert(*key, *e),
                None => state.local_endpoints.remove(key),
            };
        }
    }

    /// `n` services (`s0`…), each on its own port of the VIP, with `endpoints[i]` endpoints.
    fn services_config(endpoints: &[Vec<(u8, u8)>]) -> Config {
        let mut yaml = String::from("interface: eth0\nvips: [{address: 198.51.100.10}]\nservices:\n");
        for (i, eps) in endpoints.iter().enumerate() {
            yaml.push_str(&format!(
                "  - name: s{i}\n    vip: 198.51.100.10\n    remoteMode: dsr\n    ports: [{{port: {}}}]\n    endpoints:\n",
                1000 + i
            ));
            for (host, node) in eps {
                yaml.push_str(&format!("      - {{address: 10.244.{node}.{host}, node: n{node}}}\n"));
            }
            if eps.is_empty() {
                yaml.push_str("      []\n");
            }
        }
        Config::parse(&yaml.replace("    endpoints:\n      []\n", "    endpoints: []\n")).unwrap()
    }

    #[test]
    fn an_endpoint_change_plans_only_its_service() {
        let endpoints: Vec<Vec<(u8, u8)>> = (0..50).map(|i| vec![(i + 1, 0), (i + 1, 1)]).collect();
        let mut contents = IncrementalContents::default();
        let first = contents.update(&services_config(&endpoints), "n0");
        assert!(first.complete);
        assert_eq!(first.services.len(), 50);
        assert!(contents.update(&services_config(&endpoints), "n0").is_empty(), "nothing changed");

        let mut changed = endpoints.clone();
        changed[7][1] = (200, 1);
        let delta = contents.update(&services_config(&changed), "n0");
        assert!(!delta.complete);
        let key = ServiceKey::new([198, 51, 100, 10], 1007, 6);
        assert_eq!(delta.services.keys().copied().collect::<Vec<_>>(), [key]);
        assert!(delta.local_endpoints.keys().all(|e| e.service == key), "only that service's endpoints");

        // Another node's view (the context) changes every entry's delivery: all computed again.
        let delta = contents.update(&services_config(&changed), "n1");
        assert!(delta.complete);
        assert_eq!(delta.services.len(), 50);
    }

    proptest! {
        /// Any sequence of configs, computed incrementally and applied as deltas, leaves the maps
        /// exactly as planning the last config whole would: whether unchanged services come as
        /// the previous config's allocations (the Kubernetes source) or as new ones (a reload).
        #[test]
        fn deltas_add_up_to_the_whole_contents(
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::collection::vec((1u8..20, 0u8..3), 0..6), 1..12),
                    any::<bool>(),
                ),
                1..8,
            ),
        ) {
            let mut contents = IncrementalContents::default();
            let mut state = MapContents::default();
            let mut previous: Vec<Arc<ServiceConfig>> = Vec::new();
            for (endpoints, share) in &steps {
                let endpoints: Vec<Vec<(u8, u8)>> = endpoints
                    .iter()
                    .map(|eps| {
                        let mut seen = BTreeSet::new();
                        eps.iter().copied().filter(|(h, n)| seen.insert((*h, *n))).collect()
                    })
                    .collect();
                let mut config = services_config(&endpoints);
                if *share {
                    for service in &mut config.services {
                        if let Some(same) = previous.iter().find(|p| **p == *service) {
                            *service = same.clone();
                        }
                    }
                }
                apply(&mut state, &contents.update(&config, "n0"));
                prop_assert_eq!(&state, &for_node(&config, "n0"));
                previous = config.services;
            }
        }
    }

    proptest! {
        /// Every node, and every order of the endpoints, gives the same ring over the same
        /// endpoint identities: the property DSR failover relies on.
        #[test]
        fn every_node_gets_the_same_ring(
            hosts in proptest::collection::btree_set(1u8..250, 1..20),
            nodes in 1usize..5,
            seed in any::<u64>(),
        ) {
            let mut endpoints: Vec<(String, String)> =
                hosts.iter().map(|h| (format!("10.244.{}.{h}", h % 7), format!("n{}", *h as usize % nodes))).collect();
            let rings: Vec<Vec<String>> = (0..nodes + 1)
                .map(|n| {
                    let len = endpoints.len();
                    endpoints.rotate_left((seed as usize + n) % len);
                    let eps: Vec<(&str, &str)> = endpoints.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect();
                    let p = for_node(&config(&eps, "dsr", "Cluster"), &format!("n{n}"));
                    let s = &p.services[&web()];
                    s.ring.iter().map(|&i| identity(&s.backends[i as usize])).collect()
                })
                .collect();
            for ring in &rings[1..] {
                prop_assert_eq!(ring, &rings[0]);
            }
        }
    }
}
