//! The data-plane plan: from the config's services to what this node's maps must hold. Pure.
//!
//! Every node computes the same Maglev ring for a service from the same endpoints, whatever
//! their order and whichever node it is: the ring is built from the endpoints' identities
//! (address and port), never from how this node reaches them. That is what lets a DSR flow keep
//! its endpoint when the VIP moves to another node.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use lb_common::service::{Backend, Delivery, LocalEndpoint, LocalEndpointKey, ServiceKey};

use crate::{
    config::{Config, RemoteMode, TrafficPolicy},
    maglev,
};

/// What the service maps must hold on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataplanePlan {
    pub services: BTreeMap<ServiceKey, PlannedService>,
    /// This node's endpoints, for decapsulating DSR traffic addressed to them.
    pub local_endpoints: BTreeMap<LocalEndpointKey, LocalEndpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedService {
    /// The config's service name, for logs and metrics.
    pub name: String,
    /// Distinct backends, sorted.
    pub backends: Vec<Backend>,
    /// The Maglev ring: indices into `backends`. Empty when there are none.
    pub ring: Vec<u32>,
}

impl DataplanePlan {
    /// Every backend the plan uses, once.
    pub fn backends(&self) -> BTreeSet<Backend> {
        self.services.values().flat_map(|s| s.backends.iter().copied()).collect()
    }
}

/// Plans `node`'s service maps.
pub fn plan(config: &Config, node: &str) -> DataplanePlan {
    let node_addresses: BTreeMap<&str, Ipv4Addr> =
        config.groups.iter().flat_map(|g| g.nodes.iter().map(|n| (n.name.as_str(), n.address))).collect();
    let mut plan = DataplanePlan::default();
    for service in &config.services {
        for port in &service.ports {
            let key = ServiceKey::new(service.vip.octets(), port.port, port.protocol.number());
            let target = port.target().to_be_bytes();
            let mut backends: Vec<Backend> = service
                .endpoints
                .iter()
                .filter(|e| service.traffic_policy == TrafficPolicy::Cluster || e.node == node)
                .map(|e| {
                    let delivery = match (e.node == node, service.remote_mode) {
                        (true, _) => Delivery::Local,
                        (false, RemoteMode::FullNat) => Delivery::FullNat,
                        (false, RemoteMode::Dsr) => Delivery::Dsr,
                    };
                    Backend {
                        addr: e.address.octets(),
                        port: target,
                        delivery: delivery as u8,
                        _pad: 0,
                        node: node_addresses.get(e.node.as_str()).map(|a| a.octets()).unwrap_or_default(),
                    }
                })
                .collect();
            backends.sort();
            backends.dedup_by_key(|b| (b.addr, b.port));
            for e in service.endpoints.iter().filter(|e| e.node == node) {
                plan.local_endpoints.insert(
                    LocalEndpointKey { service: key, addr: e.address.octets() },
                    LocalEndpoint { target_port: target, _pad: [0; 2] },
                );
            }
            let identities: Vec<String> = backends.iter().map(identity).collect();
            let ring = maglev::lookup_table(&identities, maglev::table_size(identities.len()));
            plan.services.insert(key, PlannedService { name: service.name.clone(), backends, ring });
        }
    }
    plan
}

/// A backend's identity for Maglev: the same on every node.
pub fn identity(backend: &Backend) -> String {
    format!("{}:{}", Ipv4Addr::from(backend.addr), u16::from_be_bytes(backend.port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
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
        let on_n0 = plan(&c, "n0");
        let s = &on_n0.services[&web()];
        let deliveries: Vec<_> = s.backends.iter().map(|b| Delivery::from_u8(b.delivery).unwrap()).collect();
        assert_eq!(deliveries, [Delivery::Local, Delivery::Dsr]);
        assert_eq!(s.backends[0].port, 8080u16.to_be_bytes());
        assert_eq!(
            on_n0.services[&ServiceKey::new([198, 51, 100, 10], 53, 17)].backends[0].port,
            53u16.to_be_bytes()
        );
        assert_eq!(on_n0.local_endpoints.len(), 2, "one per port");
        let on_n2 = plan(&c, "n2");
        assert!(on_n2.local_endpoints.is_empty());
        assert!(on_n2.services[&web()].backends.iter().all(|b| b.delivery == Delivery::Dsr as u8));
    }

    #[test]
    fn local_policy_keeps_only_this_nodes_endpoints() {
        let c = config(&[("10.244.0.2", "n0"), ("10.244.1.2", "n1")], "fullNat", "Local");
        assert_eq!(plan(&c, "n0").services[&web()].backends.len(), 1);
        let on_n2 = plan(&c, "n2");
        assert!(on_n2.services[&web()].backends.is_empty() && on_n2.services[&web()].ring.is_empty());
    }

    #[test]
    fn the_ring_is_sized_for_its_backends() {
        let c = config(&[("10.244.0.2", "n0"), ("10.244.1.2", "n1"), ("10.244.2.2", "n2")], "dsr", "Cluster");
        let s = &plan(&c, "n0").services[&web()];
        assert_eq!(s.ring.len() as u32, maglev::table_size(3));
        assert!(s.ring.len() >= 300);
    }

    #[test]
    fn consecutive_client_ports_spread_over_the_ring() {
        let c = config(&[("10.244.1.2", "n1"), ("10.244.2.2", "n2")], "dsr", "Cluster");
        let s = &plan(&c, "n0").services[&web()];
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
                    let p = plan(&config(&eps, "dsr", "Cluster"), &format!("n{n}"));
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
