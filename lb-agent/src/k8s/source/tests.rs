use super::*;
use crate::{config::MAX_ENDPOINTS, map_contents, node_plan::node_plan};
use std::time::Duration;

mod incremental;

fn objects<T: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<T>> {
    yaml.split("\n---\n").map(|doc| Arc::new(serde_yaml::from_str(doc).unwrap())).collect()
}

fn cluster() -> ClusterState {
    ClusterState {
        missing_interfaces: Default::default(),
        routes: Default::default(),
        groups: objects(
            "metadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/28], advertInterval: 10ms, remoteMode: dsr, default: true, allowedExternalIPs: [203.0.113.0/24], nodeSelector: {lb: 'yes'}, authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}}",
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
    authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}
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

/// Every node's plan and both families' map contents are the same from either.
fn assert_same_plans_and_contents(from_cluster: &Config, from_yaml: &Config) {
    for node in ["n0", "n1", "n2"] {
        assert_eq!(node_plan(from_cluster, node), node_plan(from_yaml, node), "node plan on {node}");
        assert_eq!(
            map_contents::for_node::<lb_common::service::Addr4>(from_cluster, node),
            map_contents::for_node(from_yaml, node),
            "IPv4 data plane on {node}"
        );
        assert_eq!(
            map_contents::for_node::<lb_common::service::Addr6>(from_cluster, node),
            map_contents::for_node(from_yaml, node),
            "IPv6 data plane on {node}"
        );
    }
}

#[test]
fn kubernetes_and_yaml_sources_give_the_same_plan() {
    let base = Config::parse(BASE).unwrap();
    let from_cluster = translate(&cluster(), &base).unwrap();
    assert_same_plans_and_contents(&from_cluster.config, &Config::parse(EQUIVALENT).unwrap());
    // `Local` policy: only n0 has a dns endpoint, so only n0 may own its VIP.
    let vip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));
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

/// `cluster()` made dual-stack: `web` and `dns` get IPv6 addresses and IPv6 pods, and n0
/// has published no usable link-local address.
fn dual_stack_cluster() -> ClusterState {
    let mut state = cluster();
    let group = Arc::make_mut(&mut state.groups[0]);
    group.spec.address_pools.push("2001:db8:6::/64".into());
    group.spec.allowed_external_ips.push("2001:db8:7::/64".into());
    for node in &mut state.nodes {
        let address6 = match node.metadata.name.as_deref() {
            Some("n1") => "fe80::a",
            Some("n2") => "fe80::b",
            _ => "not an address",
        };
        let annotation = format!("{{\"edge\": \"{address6}\"}}");
        Arc::make_mut(node).metadata.annotations =
            Some([(GROUP_ADDRESSES6_ANNOTATION.to_owned(), annotation)].into());
    }
    state.services = objects(
        "metadata: {name: web, namespace: shop, annotations: {lb-agent.io/spread: 'false'}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [{port: 80, targetPort: http}], externalIPs: ['2001:db8:7::9']}\n\
             status: {loadBalancer: {ingress: [{ip: 198.51.100.1}, {ip: '2001:db8:6::1'}]}}\n---\n\
             metadata: {name: dns, namespace: kube-system, annotations: {lb-agent.io/group: edge}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv6], externalTrafficPolicy: Local, ports: [{port: 53, protocol: UDP}]}\n\
             status: {loadBalancer: {ingress: [{ip: '2001:db8:6::2'}]}}",
    );
    state.slices = objects(
        "metadata: {name: web-4, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\n\
             endpoints: [{addresses: [10.244.1.5], nodeName: n1}]\n---\n\
             metadata: {name: web-6, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv6\nports: [{name: http, port: 8086}]\n\
             endpoints: [{addresses: ['fd00:244:2::7'], nodeName: n2}]\n---\n\
             metadata: {name: dns-6, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv6\n\
             endpoints: [{addresses: ['fd00:244:1::9'], nodeName: n1}, {addresses: ['fd00:244:2::9'], nodeName: n2}]\n---\n\
             metadata: {name: dns-4, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\n\
             endpoints: [{addresses: [10.244.0.9], nodeName: n0}]",
    );
    state
}

/// The standalone YAML that says what `dual_stack_cluster()` says: each VIP's endpoints are
/// of its family, named ports are looked up in that family's slices, and IPv6 VIPs may go
/// only to members with a link-local address (n0 published garbage).
const DUAL_STACK_EQUIVALENT: &str = "
interface: eth0
node: n0
groups:
  - name: edge
    advertInterval: 10ms
    authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}
    nodes:
      - {name: n0, address: 192.0.2.10}
      - {name: n1, address: 192.0.2.11, address6: 'fe80::a'}
      - {name: n2, address: 192.0.2.12, address6: 'fe80::b'}
    vips:
      - {address: '2001:db8:6::2', service: kube-system/dns, eligibleNodes: [n1, n2]}
      - {address: 198.51.100.1, service: shop/web, spread: false}
      - {address: '2001:db8:6::1', service: shop/web, spread: false, eligibleNodes: [n1, n2]}
      - {address: '2001:db8:7::9', service: shop/web, spread: false, eligibleNodes: [n1, n2]}
services:
  - name: kube-system/dns
    vip: '2001:db8:6::2'
    remoteMode: dsr
    trafficPolicy: Local
    ports: [{port: 53, protocol: UDP, targetPort: 53}]
    endpoints: [{address: 'fd00:244:1::9', node: n1}, {address: 'fd00:244:2::9', node: n2}]
  - name: shop/web
    vip: 198.51.100.1
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}]
    endpoints: [{address: 10.244.1.5, node: n1}]
  - name: shop/web
    vip: '2001:db8:6::1'
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8086}]
    endpoints: [{address: 'fd00:244:2::7', node: n2}]
  - name: shop/web
    vip: '2001:db8:7::9'
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8086}]
    endpoints: [{address: 'fd00:244:2::7', node: n2}]
";

#[test]
fn a_dual_stack_cluster_and_its_yaml_give_the_same_plan() {
    let base = Config::parse(BASE).unwrap();
    let from_cluster = translate(&dual_stack_cluster(), &base).unwrap();
    assert!(from_cluster.refusals.is_empty(), "{:?}", from_cluster.refusals);
    assert_same_plans_and_contents(&from_cluster.config, &Config::parse(DUAL_STACK_EQUIVALENT).unwrap());
    // n0 runs the IPv4 instance only; an IPv6 one runs where the IPv6 VIPs may go.
    use crate::vrrp::family::IpFamily;
    assert!(node_plan(&from_cluster.config, "n0").instances.iter().all(|i| i.family == IpFamily::V4));
    assert!(node_plan(&from_cluster.config, "n1").instances.iter().any(|i| i.family == IpFamily::V6));
}

#[test]
fn a_node_publishing_its_link_local_address_joins_the_ipv6_side_of_its_group() {
    let base = Config::parse(BASE).unwrap();
    let mut state = dual_stack_cluster();
    let mut translator = Translator::default();
    let eligible = |t: &Translation| -> Vec<Option<Vec<String>>> {
        let vips = &t.config.groups[0].vips;
        vips.iter().filter(|v| v.address.is_ipv6()).map(|v| v.eligible_nodes.clone()).collect()
    };
    let first = translator.translate(&state, &base).unwrap();
    assert!(
        eligible(&first).iter().all(|e| e.as_ref().is_some_and(|nodes| !nodes.contains(&"n0".to_owned())))
    );
    // The same objects again: nothing is read again, nothing rebuilt.
    assert_eq!(translator.translate(&state, &base).unwrap(), first);
    assert_eq!(translator.rebuilt(), 0);
    // n0's Node, a new object, now shows its address: every IPv6 VIP may go to any member
    // (dns's to those with its endpoints).
    let n0 = state.nodes.iter_mut().find(|n| n.metadata.name.as_deref() == Some("n0")).unwrap();
    Arc::make_mut(n0).metadata.annotations =
        Some([(GROUP_ADDRESSES6_ANNOTATION.to_owned(), r#"{"edge": "fe80::c"}"#.to_owned())].into());
    assert!(translator.needs_everything(&state));
    let next = translator.translate(&state, &base).unwrap();
    assert_eq!(
        eligible(&next),
        [Some(vec!["n1".to_owned(), "n2".to_owned()]), None, None],
        "dns's (Local) is still its endpoints' nodes"
    );
    let n0 = next.config.groups[0].nodes.iter().find(|n| n.name == "n0").unwrap();
    assert_eq!(n0.address6, Some("fe80::c".parse().unwrap()));
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
    // Another interface than the agent's default uplink is served, on that interface, by
    // the members that published their address there.
    state.routes.insert("192.0.2.1".parse().unwrap(), "eth1".into());
    let t = translate(&state, &base).unwrap();
    assert!(t.config.groups.is_empty(), "no member has published an address on eth1 yet");
    for (i, node) in state.nodes.iter_mut().enumerate() {
        let published = format!(r#"{{"edge": "10.1.0.{}"}}"#, 10 + i);
        Arc::make_mut(node).metadata.annotations =
            Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), published)].into());
    }
    let t = translate(&state, &base).unwrap();
    assert!(t.refusals.iter().all(|r| r.reason != "InterfaceNotFound"), "{:?}", t.refusals);
    assert_eq!(t.config.groups[0].interface.as_deref(), Some("eth1"));
    state.routes.insert("192.0.2.1".parse().unwrap(), "eth0".into());
    assert_eq!(translate(&state, &base).unwrap().config.groups.len(), 1);
}

#[test]
fn a_group_on_a_missing_interface_is_refused_and_the_others_served() {
    let base = Config::parse(BASE).unwrap();
    let mut state = cluster();
    let mut lan: LoadBalancerGroup = (*state.groups[0]).clone();
    lan.metadata.name = Some("lan".into());
    lan.spec.interface = Some("eth0.30".into());
    lan.spec.default = false;
    state.groups.push(Arc::new(lan));
    state.missing_interfaces.insert("eth0.30".into());
    let t = translate(&state, &base).unwrap();
    assert_eq!(t.config.groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), vec!["edge"]);
    let refusal = t.refusals.iter().find(|r| r.reason == "InterfaceNotFound").expect("a refusal");
    assert_eq!(refusal.service, "LoadBalancerGroup/lan");
    assert!(refusal.message.contains("eth0.30"), "{}", refusal.message);
}

#[test]
fn members_of_a_group_on_another_interface_use_their_published_address() {
    let base = Config::parse(BASE).unwrap();
    let mut state = cluster();
    let node = Arc::make_mut(&mut state.nodes[1]);
    node.metadata.annotations =
        Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), r#"{"edge": "10.30.0.11"}"#.to_owned())].into());
    let name = node.metadata.name.clone().unwrap();
    let t = translate(&state, &base).unwrap();
    let address = |t: &Translation| {
        t.config.groups[0].nodes.iter().find(|n| n.name == name).map(|n| n.address).unwrap()
    };
    assert_eq!(address(&t), "10.30.0.11".parse::<Ipv4Addr>().unwrap());
    // Garbage there is no address: the InternalIP stands.
    Arc::make_mut(&mut state.nodes[1]).metadata.annotations =
        Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), "not json".to_owned())].into());
    assert_ne!(address(&translate(&state, &base).unwrap()), "10.30.0.11".parse::<Ipv4Addr>().unwrap());

    // On another interface than the default uplink, only nodes that published an address
    // there are members: a node not yet (or never) up leaves the rest of the config valid.
    Arc::make_mut(&mut state.groups[0]).spec.interface = Some("eth1".into());
    let node = Arc::make_mut(&mut state.nodes[1]);
    node.metadata.annotations =
        Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), r#"{"edge": "10.30.0.11"}"#.to_owned())].into());
    let t = translate(&state, &base).unwrap();
    let members: Vec<(&str, Ipv4Addr)> =
        t.config.groups[0].nodes.iter().map(|n| (n.name.as_str(), n.address)).collect();
    assert_eq!(members, vec![(name.as_str(), "10.30.0.11".parse().unwrap())]);
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

        let mut seen: BTreeMap<IpAddr, (u8, u8, String)> = BTreeMap::new();
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
fn a_bad_or_conflicting_service_is_refused_alone() {
    let base = Config::parse(BASE).unwrap();
    let mut state = cluster();
    let service = |name: &str, port: u16| -> Arc<Service> {
        Arc::new(
                serde_yaml::from_str(&format!(
                    "metadata: {{name: {name}, namespace: shop, annotations: {{lb-agent.io/allow-shared-ip: k}}}}\n\
                     spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 198.51.100.1}}]}}}}"
                ))
                .unwrap(),
            )
    };
    // Two more Services share web's address (MetalLB's allow-shared-ip): one on a port of
    // its own, one on web's port 80.
    state.services.push(service("admin", 8443));
    state.services.push(service("web2", 80));
    // One whose endpoints are more than a ring can spread.
    let crowd: Vec<String> = (0..=MAX_ENDPOINTS)
        .map(|i| format!("{{addresses: [10.245.{}.{}], nodeName: n1}}", i / 250, i % 250 + 1))
        .collect();
    state.services.push(Arc::new(serde_yaml::from_str("metadata: {name: crowd, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.3}]}}").unwrap()));
    state.slices.push(Arc::new(serde_yaml::from_str(&format!("metadata: {{name: crowd-a, namespace: shop, labels: {{kubernetes.io/service-name: crowd}}}}\naddressType: IPv4\nendpoints: [{}]", crowd.join(", "))).unwrap()));

    let t = translate(&state, &base).unwrap();
    let served: Vec<(&str, u16)> =
        t.config.services.iter().flat_map(|s| s.ports.iter().map(|p| (s.name.as_str(), p.port))).collect();
    assert!(served.contains(&("shop/admin", 8443)) && served.contains(&("shop/web", 80)), "{served:?}");
    assert!(!served.iter().any(|(name, _)| *name == "shop/web2" || *name == "shop/crowd"), "{served:?}");
    let vips: Vec<IpAddr> = t.config.groups[0].vips.iter().map(|v| v.address).collect();
    assert_eq!(
        vips.iter().filter(|v| **v == IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1))).count(),
        1,
        "one group VIP: {vips:?}"
    );
    let refused =
        |name: &str| t.unserved.iter().find(|r| r.service == name).map(|r| (r.reason, r.message.clone()));
    assert_eq!(t.unserved.len(), 2, "{:?}", t.unserved);
    assert!(t.unserved.iter().all(|u| t.refusals.contains(u)), "and logged");
    assert_eq!(
        refused("shop/web2"),
        Some(("PortConflict", "198.51.100.1:80/TCP is already served for shop/web".to_owned()))
    );
    let (reason, message) = refused("shop/crowd").unwrap();
    assert_eq!(reason, "InvalidService");
    assert!(message.contains("endpoints") && message.contains(&MAX_ENDPOINTS.to_string()), "{message}");
}

#[test]
fn a_groups_garp_refresh_reaches_the_config() {
    let base = Config::parse(BASE).unwrap();
    assert_eq!(translate(&cluster(), &base).unwrap().config.groups[0].announcements.refresh, Duration::ZERO);
    let mut state = cluster();
    Arc::make_mut(&mut state.groups[0]).spec.garp_refresh = Some("30s".into());
    let config = translate(&state, &base).unwrap().config;
    assert_eq!(config.groups[0].announcements.refresh, Duration::from_secs(30));
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
