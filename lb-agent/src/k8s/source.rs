//! The Kubernetes source: LoadBalancerGroups, Services, EndpointSlices and Nodes in, the same
//! `Config` the standalone YAML gives out. Pure: every agent computes the same config from the
//! same objects, and the planner downstream cannot tell the two sources apart.
//!
//! Groups and services are built as documents and parsed with the config's own types, so they
//! get the same defaults and the same validation as a YAML file.
//!
//! At scale, a watch event must not cost a rebuild of every Service: a [`Translator`] keeps
//! each Service's translation and reuses it while the Service's inputs (the resource versions
//! of it and of its EndpointSlices, and how it is bound) are unchanged, and EndpointSlices are
//! indexed by Service once per pass instead of searched per Service.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    sync::Arc,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use serde_json::{Value, json};

use super::{
    binding::{Bound, Refusal, bind},
    crd::{LoadBalancerGroup, RemoteMode},
};
use crate::config::{Config, GroupConfig, ServiceConfig};

/// The objects a plan is made from, shared with the watch stores they come from (a snapshot
/// per event costs a pointer per object, not a deep copy).
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub groups: Vec<Arc<LoadBalancerGroup>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub nodes: Vec<Arc<Node>>,
    /// This node's interface towards each group's `interfaceFromIP` (looked up by the shell).
    pub routes: BTreeMap<std::net::IpAddr, String>,
}

/// Refusals about a group rather than a Service carry this prefix before the group's name.
pub const GROUP_REFUSAL_PREFIX: &str = "LoadBalancerGroup/";

#[derive(Clone, Debug)]
pub struct Translation {
    pub config: Config,
    pub refusals: Vec<Refusal>,
}

/// Builds the config for the node `base.node`, keeping `base`'s agent-level settings
/// (interface, listen, data plane). Returns an error naming the offending object when the
/// result does not validate; the caller then keeps its last good plan.
pub fn translate(state: &ClusterState, base: &Config) -> Result<Translation, String> {
    Translator::default().translate(state, base)
}

/// [`translate`] with memory of the previous pass (see the module's notes).
#[derive(Default)]
pub struct Translator {
    services: HashMap<ServiceInputs, Vec<ServiceConfig>>,
    rebuilt: usize,
}

/// Everything a Service's translation depends on, by identity. Objects without a
/// `resourceVersion` (built by hand, never from an API server) are not cached.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ServiceInputs {
    service_version: String,
    slice_versions: Vec<(String, String)>,
    bound: Bound,
    mode: crate::config::RemoteMode,
}

impl ServiceInputs {
    fn of(
        service: &Service,
        slices: &[&EndpointSlice],
        bound: &Bound,
        mode: crate::config::RemoteMode,
    ) -> Option<Self> {
        let mut slice_versions = slices
            .iter()
            .map(|s| Some((s.metadata.name.clone()?, s.metadata.resource_version.clone()?)))
            .collect::<Option<Vec<_>>>()?;
        slice_versions.sort();
        Some(Self {
            service_version: service.metadata.resource_version.clone()?,
            slice_versions,
            bound: bound.clone(),
            mode,
        })
    }
}

/// EndpointSlices by the Service they belong to: (namespace, `kubernetes.io/service-name`).
fn slices_by_service(slices: &[Arc<EndpointSlice>]) -> HashMap<(&str, &str), Vec<&EndpointSlice>> {
    let mut index: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices.iter().map(Arc::as_ref) {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(name) = slice.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) {
            index.entry((namespace, name.as_str())).or_default().push(slice);
        }
    }
    index
}

impl Translator {
    /// As [`translate`], reusing the previous pass's translation of every unchanged Service.
    pub fn translate(&mut self, state: &ClusterState, base: &Config) -> Result<Translation, String> {
        let mut previous = std::mem::take(&mut self.services);
        self.rebuilt = 0;
        let result = translate_with(state, base, &mut previous, &mut self.services, &mut self.rebuilt);
        if result.is_err() {
            // Keep what is known good for the next pass.
            self.services.extend(previous);
        }
        result
    }

    /// How many Services the last pass built afresh rather than reused.
    pub fn rebuilt(&self) -> usize {
        self.rebuilt
    }
}

/// The translation, taking unchanged Services' from `previous` and leaving every Service's
/// in `next`.
fn translate_with(
    state: &ClusterState,
    base: &Config,
    previous: &mut HashMap<ServiceInputs, Vec<ServiceConfig>>,
    next: &mut HashMap<ServiceInputs, Vec<ServiceConfig>>,
    rebuilt: &mut usize,
) -> Result<Translation, String> {
    let slices = slices_by_service(&state.slices);
    let mut refusals = Vec::new();
    let mut groups_sorted: Vec<&LoadBalancerGroup> = state.groups.iter().map(Arc::as_ref).collect();
    groups_sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut services_sorted: Vec<&Service> = state.services.iter().map(Arc::as_ref).collect();
    services_sorted.sort_by(|a, b| {
        (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
            .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
    });

    let mut bound: Vec<(Bound, &Service)> = Vec::new();
    for service in services_sorted {
        let (b, r) = bind(service, &state.groups);
        refusals.extend(r);
        if let Some(b) = b {
            bound.push((b, service));
        }
    }

    let mut groups = Vec::new();
    let mut services = Vec::new();
    for group in groups_sorted {
        let name = group.metadata.name.clone().unwrap_or_default();
        let spec = &group.spec;
        let interface = match (&spec.interface, &spec.interface_from_ip) {
            (Some(interface), _) => Ok(interface.clone()),
            (None, Some(ip)) => {
                state.routes.get(ip).cloned().ok_or_else(|| format!("no route from this node to {ip}"))
            }
            (None, None) => Err("neither interface nor interfaceFromIP is set".to_owned()),
        };
        let refusal = match interface {
            Err(message) => Some(("InterfaceNotFound", message)),
            Ok(interface) if interface != base.interface => Some((
                "InterfaceMismatch",
                format!("the group uses {interface} on this node, whose agent runs on {}", base.interface),
            )),
            Ok(_) => None,
        };
        if let Some((reason, message)) = refusal {
            refusals.push(Refusal { service: format!("{GROUP_REFUSAL_PREFIX}{name}"), reason, message });
            continue;
        }
        let members: Vec<Value> = members(&state.nodes, &spec.node_selector)
            .into_iter()
            .map(|(node, address)| json!({"name": node, "address": address.to_string()}))
            .collect();
        let mut vips = Vec::new();
        let member_set: Vec<String> =
            members.iter().filter_map(|m| m["name"].as_str().map(str::to_owned)).collect();
        for (b, service) in bound.iter().filter(|(b, _)| b.group == name) {
            let addresses = service_vips(b, service);
            // `externalTrafficPolicy: Local`: only members with a ready endpoint may own it.
            let local =
                service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
            let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
            let name = service.metadata.name.as_deref().unwrap_or_default();
            let mine: &[&EndpointSlice] = slices.get(&(namespace, name)).map_or(&[], Vec::as_slice);
            let eligible: Option<Vec<String>> = local.then(|| {
                let with_endpoints = ready_endpoint_nodes(mine);
                member_set.iter().filter(|m| with_endpoints.contains(*m)).cloned().collect()
            });
            for address in &addresses {
                let mut vip = json!({"address": address.to_string(), "service": b.service});
                if let Some(spread) = b.spread {
                    vip["spread"] = json!(spread);
                }
                if let Some(eligible) = &eligible {
                    vip["eligibleNodes"] = json!(eligible);
                }
                vips.push(vip);
            }
            let inputs = ServiceInputs::of(service, mine, b, spec.remote_mode);
            let configs = match inputs.as_ref().and_then(|k| previous.remove(k)) {
                Some(done) => done,
                None => {
                    *rebuilt += 1;
                    addresses
                        .iter()
                        .map(|address| {
                            let document = service_document(b, service, *address, mine, spec.remote_mode);
                            serde_json::from_value(document)
                                .map_err(|e| format!("Service {}: {e}", b.service))
                        })
                        .collect::<Result<Vec<ServiceConfig>, String>>()?
                }
            };
            if let Some(inputs) = inputs {
                next.insert(inputs, configs.clone());
            }
            services.extend(configs);
        }
        let document = json!({
            "name": name,
            "nodes": members,
            "vips": vips,
            "advertInterval": spec.advert_interval,
            "garp": {"refresh": spec.garp_refresh.as_deref().unwrap_or("0s")},
            "spread": spec.spread,
            "transport": spec.transport,
            "excludedVrids": spec.excluded_vrids,
            "preempt": spec.preempt,
            "vipMode": spec.vip_mode,
            // Keep the VRIDs the leader published, so instances are never renumbered.
            "pinnedVrids": group.status.as_ref().map(|s| s.vrids.clone()).unwrap_or_default(),
        });
        let group: GroupConfig =
            serde_json::from_value(document).map_err(|e| format!("LoadBalancerGroup {name}: {e}"))?;
        groups.push(group);
    }
    let config = Config { groups, services, ..base.clone() };
    config.validate().map_err(|e| e.to_string())?;
    Ok(Translation { config, refusals })
}

/// The names of the nodes in a group, in order.
pub fn member_names<N: Borrow<Node>>(nodes: &[N], selector: &BTreeMap<String, String>) -> Vec<String> {
    members(nodes, selector).into_iter().map(|(n, _)| n).collect()
}

/// Nodes matching `selector`, with their IPv4 InternalIP, in name order.
fn members<N: Borrow<Node>>(nodes: &[N], selector: &BTreeMap<String, String>) -> Vec<(String, Ipv4Addr)> {
    let mut out: Vec<(String, Ipv4Addr)> = nodes
        .iter()
        .map(Borrow::<Node>::borrow)
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter_map(|n| {
            let address = n.status.as_ref()?.addresses.as_ref()?.iter().find_map(|a| {
                (a.type_ == "InternalIP").then(|| a.address.parse::<Ipv4Addr>().ok()).flatten()
            })?;
            Some((n.metadata.name.clone()?, address))
        })
        .collect();
    out.sort();
    out
}

/// Nodes with a ready endpoint in a Service's `slices`.
fn ready_endpoint_nodes(slices: &[&EndpointSlice]) -> std::collections::BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

/// A Service's VIPs: its LoadBalancer addresses (written by the IPAM leader into
/// `status.loadBalancer.ingress`) and its allowed externalIPs.
fn service_vips(bound: &Bound, service: &Service) -> Vec<Ipv4Addr> {
    let mut vips = super::status::current_ingress(service);
    vips.extend(bound.external_ips.iter().copied());
    vips.dedup();
    vips
}

/// A Service's entry for one of its VIPs, from the Service and its EndpointSlices.
fn service_document(
    bound: &Bound,
    service: &Service,
    vip: Ipv4Addr,
    slices: &[&EndpointSlice],
    mode: RemoteMode,
) -> Value {
    let spec = service.spec.clone().unwrap_or_default();
    let mine: Vec<&EndpointSlice> = slices.iter().copied().filter(|s| s.address_type == "IPv4").collect();
    let ports: Vec<Value> = spec
        .ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let target = match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n as u16,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(port_name)) => mine
                    .iter()
                    .flat_map(|s| s.ports.iter().flatten())
                    .find(|sp| sp.name.as_deref() == Some(port_name.as_str()))
                    .and_then(|sp| sp.port)
                    .map_or(p.port as u16, |n| n as u16),
                None => p.port as u16,
            };
            json!({"port": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()), "targetPort": target})
        })
        .collect();
    // Ready endpoints; when none is, the serving ones that are terminating, so connections
    // drain instead of failing (as kube-proxy does).
    let all: Vec<(&str, Option<&str>, bool, bool)> = mine
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            let ready = c.ready.unwrap_or(true);
            let serving_terminating = c.serving.unwrap_or(ready) && c.terminating.unwrap_or(false);
            e.addresses.iter().map(move |a| (a.as_str(), e.node_name.as_deref(), ready, serving_terminating))
        })
        .collect();
    let any_ready = all.iter().any(|e| e.2);
    let mut endpoints: Vec<Value> = all
        .iter()
        .filter(|e| if any_ready { e.2 } else { e.3 })
        .filter_map(|(address, node, _, _)| Some(json!({"address": address, "node": (*node)?})))
        .collect();
    endpoints.sort_by_key(|e| e["address"].as_str().unwrap_or_default().to_owned());
    endpoints.dedup();
    json!({
        "name": bound.service,
        "vip": vip.to_string(),
        "ports": ports,
        "endpoints": endpoints,
        "remoteMode": mode,
        "trafficPolicy": if spec.external_traffic_policy.as_deref() == Some("Local") { "Local" } else { "Cluster" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{node_plan::node_plan, service_plan};
    use std::time::Duration;

    fn objects<T: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<T>> {
        yaml.split("\n---\n").map(|doc| Arc::new(serde_yaml::from_str(doc).unwrap())).collect()
    }

    fn cluster() -> ClusterState {
        ClusterState {
            routes: Default::default(),
            groups: objects(
                "metadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/28], advertInterval: 10ms, remoteMode: dsr, default: true, allowedExternalIPs: [203.0.113.0/24], nodeSelector: {lb: 'yes'}}",
            ),
            nodes: objects(
                "metadata: {name: n2, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.12}]}\n---\n\
                 metadata: {name: n0, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.10}]}\n---\n\
                 metadata: {name: n1, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: Hostname, address: n1}, {type: InternalIP, address: 192.0.2.11}]}\n---\n\
                 metadata: {name: worker, labels: {}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.50}]}",
            ),
            services: objects(
                "metadata: {name: web, namespace: shop, annotations: {lb-agent.io/spread: 'false'}}\nspec: {type: LoadBalancer, ports: [{port: 80, targetPort: http}, {port: 443, targetPort: 8443}], externalIPs: [203.0.113.9, 8.8.8.8]}\n\
                 status: {loadBalancer: {ingress: [{ip: 198.51.100.1}]}}\n---\n\
                 metadata: {name: dns, namespace: kube-system, annotations: {lb-agent.io/group: edge}}\nspec: {type: LoadBalancer, externalTrafficPolicy: Local, ports: [{port: 53, protocol: UDP}]}\n\
                 status: {loadBalancer: {ingress: [{ip: 198.51.100.2}]}}",
            ),
            slices: objects(
                "metadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\n\
                 endpoints: [{addresses: [10.244.1.5], nodeName: n1, conditions: {ready: true}}, {addresses: [10.244.2.7], nodeName: n2}, {addresses: [10.244.2.8], nodeName: n2, conditions: {ready: false, serving: true, terminating: true}}]\n---\n\
                 metadata: {name: dns-a, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\n\
                 endpoints: [{addresses: [10.244.0.9], nodeName: n0}]",
            ),
        }
    }

    const BASE: &str = "interface: eth0\nnode: n0\n";

    /// The standalone YAML that says what `cluster()` says.
    const EQUIVALENT: &str = "
interface: eth0
node: n0
groups:
  - name: edge
    advertInterval: 10ms
    nodes:
      - {name: n0, address: 192.0.2.10}
      - {name: n1, address: 192.0.2.11}
      - {name: n2, address: 192.0.2.12}
    vips:
      - {address: 198.51.100.2, service: kube-system/dns, eligibleNodes: [n0]}
      - {address: 198.51.100.1, service: shop/web, spread: false}
      - {address: 203.0.113.9, service: shop/web, spread: false}
services:
  - name: kube-system/dns
    vip: 198.51.100.2
    remoteMode: dsr
    trafficPolicy: Local
    ports: [{port: 53, protocol: UDP, targetPort: 53}]
    endpoints: [{address: 10.244.0.9, node: n0}]
  - name: shop/web
    vip: 198.51.100.1
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}, {port: 443, targetPort: 8443}]
    endpoints: [{address: 10.244.1.5, node: n1}, {address: 10.244.2.7, node: n2}]
  - name: shop/web
    vip: 203.0.113.9
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}, {port: 443, targetPort: 8443}]
    endpoints: [{address: 10.244.1.5, node: n1}, {address: 10.244.2.7, node: n2}]
";

    #[test]
    fn kubernetes_and_yaml_sources_give_the_same_plan() {
        let base = Config::parse(BASE).unwrap();
        let from_cluster = translate(&cluster(), &base).unwrap();
        let from_yaml = Config::parse(EQUIVALENT).unwrap();
        for node in ["n0", "n1", "n2"] {
            assert_eq!(
                node_plan(&from_cluster.config, node),
                node_plan(&from_yaml, node),
                "VRRP plan on {node}"
            );
            assert_eq!(
                service_plan::plan(&from_cluster.config, node),
                service_plan::plan(&from_yaml, node),
                "data plane on {node}"
            );
        }
        // `Local` policy: only n0 has a dns endpoint, so only n0 may own its VIP.
        let vip = Ipv4Addr::new(198, 51, 100, 2);
        for node in ["n1", "n2"] {
            assert!(
                node_plan(&from_cluster.config, node).instances.iter().all(|i| !i.vips.contains(&vip)),
                "{node}"
            );
        }
        assert!(node_plan(&from_cluster.config, "n0").instances.iter().any(|i| i.vips.contains(&vip)));
        // The refused externalIP is reported, not served.
        assert_eq!(from_cluster.refusals.len(), 1, "{:?}", from_cluster.refusals);
        assert_eq!(from_cluster.refusals[0].reason, "ExternalIPNotAllowed");
    }

    #[test]
    fn published_vrids_are_kept() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let first = node_plan(&translate(&state, &base).unwrap().config, "n0");
        let pinned: BTreeMap<String, u8> =
            first.vrids["edge"].keys().enumerate().map(|(i, key)| (key.clone(), 200 + i as u8)).collect();
        assert!(!pinned.is_empty());
        Arc::make_mut(&mut state.groups[0]).status =
            Some(crate::k8s::crd::LoadBalancerGroupStatus { vrids: pinned.clone(), ..Default::default() });
        let second = node_plan(&translate(&state, &base).unwrap().config, "n0");
        assert_eq!(second.vrids["edge"], pinned, "the published VRIDs win over fresh allocation");
        assert!(second.instances.iter().all(|i| i.vrid >= 200));
    }

    #[test]
    fn interface_from_ip_uses_this_nodes_route() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let group = Arc::make_mut(&mut state.groups[0]);
        group.spec.interface = None;
        group.spec.interface_from_ip = Some("192.0.2.1".parse().unwrap());
        let t = translate(&state, &base).unwrap();
        assert!(t.config.groups.is_empty());
        let refusal = t.refusals.iter().find(|r| r.reason == "InterfaceNotFound").expect("a refusal");
        assert_eq!(refusal.service, "LoadBalancerGroup/edge");
        state.routes.insert("192.0.2.1".parse().unwrap(), "eth1".into());
        let t = translate(&state, &base).unwrap();
        assert!(t.refusals.iter().any(|r| r.reason == "InterfaceMismatch"), "{:?}", t.refusals);
        state.routes.insert("192.0.2.1".parse().unwrap(), "eth0".into());
        assert_eq!(translate(&state, &base).unwrap().config.groups.len(), 1);
    }

    proptest::proptest! {
        /// Kubernetes-shaped inputs of any size and order: every node gets the same config, and
        /// every node's plan agrees on each VIP's instance (VRID) and who ranks where.
        #[test]
        fn every_node_plans_the_same_from_the_same_objects(
            node_count in 1usize..6,
            service_count in 0usize..12,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let base = Config::parse("interface: eth0\nnode: n0\n").unwrap();
            let mut state = ClusterState {
                groups: objects("metadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/24], default: true}"),
                nodes: (0..node_count)
                    .map(|i| serde_yaml::from_str(&format!("metadata: {{name: n{i}}}\nstatus: {{addresses: [{{type: InternalIP, address: 192.0.2.{}}}]}}", 10 + i)).unwrap())
                    .collect(),
                services: (0..service_count)
                    .map(|i| serde_yaml::from_str(&format!(
                        "metadata: {{name: s{i}, namespace: ns}}\nspec: {{type: LoadBalancer, ports: [{{port: 80}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 198.51.100.{}}}]}}}}", i + 1
                    )).unwrap())
                    .collect(),
                ..Default::default()
            };
            let reference = translate(&state, &base).unwrap().config;
            let len = state.services.len().max(1);
            state.services.rotate_left(seed as usize % len);
            state.nodes.reverse();
            let shuffled = translate(&state, &base).unwrap().config;
            proptest::prop_assert_eq!(&shuffled, &reference);

            let mut seen: BTreeMap<Ipv4Addr, (u8, u8, String)> = BTreeMap::new();
            for n in 0..node_count {
                let node = format!("n{n}");
                for instance in node_plan(&reference, &node).instances {
                    for vip in &instance.vips {
                        // The same VRID everywhere, and a distinct priority per node.
                        let entry = seen.entry(*vip).or_insert((instance.vrid, instance.priority, node.clone()));
                        proptest::prop_assert_eq!(entry.0, instance.vrid);
                        if entry.2 != node {
                            proptest::prop_assert_ne!(entry.1, instance.priority);
                        }
                    }
                }
            }
            proptest::prop_assert_eq!(seen.len(), service_count);
        }
    }

    #[test]
    fn a_translator_rebuilds_only_the_services_whose_objects_changed() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let versioned = |state: &mut ClusterState, version: &str| {
            for s in &mut state.services {
                Arc::make_mut(s).metadata.resource_version = Some(version.into());
            }
            for s in &mut state.slices {
                Arc::make_mut(s).metadata.resource_version = Some(version.into());
            }
        };
        versioned(&mut state, "1");
        let mut translator = Translator::default();
        assert_eq!(
            translator.translate(&state, &base).unwrap().config,
            translate(&state, &base).unwrap().config
        );
        assert_eq!(translator.rebuilt(), 2);
        assert_eq!(
            translator.translate(&state, &base).unwrap().config,
            translate(&state, &base).unwrap().config
        );
        assert_eq!(translator.rebuilt(), 0, "nothing changed");

        // One EndpointSlice changes: only its Service is rebuilt, and the result is the
        // whole translation's.
        let web = state.slices.iter_mut().find(|s| s.metadata.name.as_deref() == Some("web-a")).unwrap();
        let web = Arc::make_mut(web);
        web.endpoints[0].addresses = vec!["10.244.1.6".into()];
        web.metadata.resource_version = Some("2".into());
        let incremental = translator.translate(&state, &base).unwrap().config;
        assert_eq!(translator.rebuilt(), 1);
        assert_eq!(incremental, translate(&state, &base).unwrap().config);
        assert!(
            incremental
                .services
                .iter()
                .any(|s| s.endpoints.iter().any(|e| e.address.to_string() == "10.244.1.6"))
        );

        // A Service bound differently (its group's allowed externalIPs) is rebuilt too.
        Arc::make_mut(&mut state.groups[0]).spec.allowed_external_ips = vec![];
        let rebound = translator.translate(&state, &base).unwrap().config;
        assert_eq!(rebound, translate(&state, &base).unwrap().config);
        assert_eq!(translator.rebuilt(), 1, "web loses its externalIP; dns is bound as before");

        // Objects without resource versions are never reused.
        versioned(&mut state, "");
        for s in &mut state.services {
            Arc::make_mut(s).metadata.resource_version = None;
        }
        translator.translate(&state, &base).unwrap();
        translator.translate(&state, &base).unwrap();
        assert_eq!(translator.rebuilt(), 2);
    }

    #[test]
    fn a_groups_garp_refresh_reaches_the_config() {
        let base = Config::parse(BASE).unwrap();
        assert_eq!(translate(&cluster(), &base).unwrap().config.groups[0].garp.refresh, Duration::ZERO);
        let mut state = cluster();
        Arc::make_mut(&mut state.groups[0]).spec.garp_refresh = Some("30s".into());
        let config = translate(&state, &base).unwrap().config;
        assert_eq!(config.groups[0].garp.refresh, Duration::from_secs(30));
    }

    #[test]
    fn object_order_does_not_matter() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let first = translate(&state, &base).unwrap().config;
        state.nodes.reverse();
        state.services.reverse();
        state.slices.reverse();
        assert_eq!(translate(&state, &base).unwrap().config, first);
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        for slice in &mut state.slices {
            for e in &mut Arc::make_mut(slice).endpoints {
                if e.conditions.is_none() || e.conditions.as_ref().is_some_and(|c| c.ready != Some(false)) {
                    e.conditions = Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                        ready: Some(false),
                        serving: Some(false),
                        terminating: Some(true),
                    });
                }
            }
        }
        let config = translate(&state, &base).unwrap().config;
        let web = config.services.iter().find(|s| s.name == "shop/web").unwrap();
        assert_eq!(web.endpoints.len(), 1);
        assert_eq!(web.endpoints[0].address, Ipv4Addr::new(10, 244, 2, 8));
    }
}
