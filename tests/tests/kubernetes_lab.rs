//! `lb-agent run --kubernetes` in the lab: two nodes read the same cluster (a fake API server on
//! each node's loopback) — a LoadBalancerGroup, a LoadBalancer Service with its address, its
//! EndpointSlice and the Nodes — elect the VIP's owner, forward to the pod, and write status.
//! A dual-stack Service gets an address of each family, and both are owned and served.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use lb_lab::{Agent, Lab, agent::AGENT_LISTEN, kube_api::KubeApi};
use serde_json::{Value, json};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const API_PORT: u16 = 18080;

/// Collection path → the objects the fake API lists there.
type Lists = BTreeMap<String, Vec<Value>>;

fn cluster(lab: &Lab, pod_ip: Ipv4Addr) -> Lists {
    let nodes = lab
        .nodes
        .iter()
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name},
                        "status": {"addresses": [{"type": "InternalIP", "address": n.ip.to_string()}]}})
        })
        .collect();
    [
        (
            "/apis/lb-agent.io/v1alpha1/loadbalancergroups",
            vec![json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge", "generation": 1},
                        "spec": {"interface": "eth0", "addressPools": ["198.51.100.0/29"], "advertInterval": "20ms",
                                 "default": true, "remoteMode": "dsr"}})],
        ),
        (
            "/api/v1/services",
            vec![json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop", "finalizers": ["lb-agent.io/ipam"]},
                        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
                        "status": {"loadBalancer": {"ingress": [{"ip": VIP.to_string()}]}}})],
        ),
        (
            "/apis/discovery.k8s.io/v1/endpointslices",
            vec![json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                        "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                        "ports": [{"port": 8080}],
                        "endpoints": [{"addresses": [pod_ip.to_string()], "nodeName": "n1", "conditions": {"ready": true}}]})],
        ),
        ("/api/v1/nodes", nodes),
    ]
    .into_iter()
    .map(|(path, items)| (path.to_owned(), items))
    .collect()
}

/// Two nodes with native XDP, a pod on n1, a fake API server on each node serving
/// [`cluster`], and an agent on each running `--kubernetes` against it. Returns the lab, the
/// pod's index, the served lists, the APIs and the agents.
fn kubernetes_cluster() -> (Lab, usize, Lists, Vec<KubeApi>, Vec<Agent>) {
    kubernetes_cluster_with(false, |lab, pod| cluster(lab, lab.pods[pod].ip))
}

/// As [`kubernetes_cluster`], IPv6 too when `ipv6`, the APIs serving `lists(lab, pod)`.
fn kubernetes_cluster_with(
    ipv6: bool,
    lists: impl Fn(&Lab, usize) -> Lists,
) -> (Lab, usize, Lists, Vec<KubeApi>, Vec<Agent>) {
    let mut lab = Lab::new(2);
    if ipv6 {
        lab.enable_ipv6();
    }
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    let pod = lab.add_pod(1);
    let lists = lists(&lab, pod);
    let apis: Vec<KubeApi> =
        (0..2).map(|i| KubeApi::start(&lab.nodes[i].ns, &lab.path(""), API_PORT, lists.clone())).collect();
    // Only the agent's own settings in the file: groups and services come from the cluster.
    let base = format!("interface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\n");
    let agents = (0..2)
        .map(|i| {
            let name = lab.nodes[i].name.clone();
            let kubeconfig = apis[i].kubeconfig.to_str().unwrap().to_owned();
            let mut agent = lab.start_agent_with(
                i,
                &base,
                &["--kubernetes", "--node", &name],
                &[("KUBECONFIG", &kubeconfig)],
            );
            agent.wait_ready();
            agent
        })
        .collect();
    (lab, pod, lists, apis, agents)
}

#[test]
fn agents_serve_a_service_defined_in_the_cluster() {
    let (lab, pod, _lists, apis, agents) = kubernetes_cluster();
    let _server = lab.pods[pod].serve(8080);
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");

    // The VIP from the Service's status is elected, answered and forwarded (DSR) to the pod.
    let deadline = Instant::now() + Duration::from_secs(10);
    let session = loop {
        if let Some(s) = lab.client.session(VIP, 80) {
            break s;
        }
        assert!(Instant::now() < deadline, "no session through {VIP}:80:\n{}", logs());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(session.pod(), lab.pods[pod].name);
    assert_eq!(session.seen_client(), lab.client.ip, "DSR keeps the client address");
    let owners: f64 = agents.iter().map(|a| a.metric("lbagent_owned_vips")).sum();
    assert_eq!(owners, 1.0, "exactly one node owns the VIP");

    // Each agent led its own API: the group status and the Service condition were applied.
    for (i, api) in apis.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let writes = api.writes();
            let group = writes
                .iter()
                .find(|(m, p, _)| m == "PATCH" && p.ends_with("/loadbalancergroups/edge/status"));
            let served = writes.iter().find(|(m, p, b)| {
                m == "PATCH"
                    && p == "/api/v1/namespaces/shop/services/web/status"
                    && b["status"]["conditions"][0]["status"] == "True"
            });
            if let (Some(group), Some(_)) = (group, served) {
                assert_eq!(group.2["status"]["vipCount"], 1, "{:#?}", group.2);
                assert_eq!(group.2["status"]["memberCount"], 2);
                assert!(group.2["status"]["vrids"].as_object().is_some_and(|v| !v.is_empty()));
                break;
            }
            assert!(Instant::now() < deadline, "node {i}: no status writes: {writes:#?}\n{}", logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn a_node_leaving_its_group_hands_over_and_runs_on() {
    let (_lab, _pod, lists, apis, agents) = kubernetes_cluster();

    // The group now selects only n0; n1's agent hears of it.
    let mut group = lists["/apis/lb-agent.io/v1alpha1/loadbalancergroups"][0].clone();
    group["metadata"]["resourceVersion"] = json!("2");
    group["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "n0"});
    let mut n0 = lists["/api/v1/nodes"][0].clone();
    n0["metadata"]["labels"] = json!({"kubernetes.io/hostname": "n0"});
    n0["metadata"]["resourceVersion"] = json!("2");
    let deadline = Instant::now() + Duration::from_secs(5);
    while apis[1].push("/api/v1/nodes", "MODIFIED", n0.clone()) == 0 {
        assert!(Instant::now() < deadline, "n1's agent never watched nodes");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(apis[1].push("/apis/lb-agent.io/v1alpha1/loadbalancergroups", "MODIFIED", group), 1);

    // n1 resigns its instances and closes its VRRP socket, without a restart.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = agents[1].admin("GET", "/status", "").unwrap_or_default();
        let status: Value = serde_json::from_str(&status).unwrap_or_default();
        if status["instances"].as_array().is_some_and(|i| i.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "n1 still runs instances: {status:#}\n{}", agents[1].log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    for agent in &agents {
        assert!(agent.try_get("/readyz").is_some_and(|r| r.contains("200")), "{}", agent.log_text());
    }
}

#[test]
fn an_endpoint_slice_event_moves_new_connections_to_the_new_pod() {
    let (mut lab, pod, lists, apis, agents) = kubernetes_cluster();
    let moved_to = lab.add_pod(1);
    let _servers = [lab.pods[pod].serve(8080), lab.pods[moved_to].serve(8080)];
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    let session_to = |name: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = lab.client.session(VIP, 80)
                && s.pod() == name
            {
                return s;
            }
            assert!(Instant::now() < deadline, "no session reached {name}:\n{}", logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    session_to(&lab.pods[pod].name);

    // The EndpointSlice now names the other pod: a watch event, which each agent translates
    // for this Service alone (no other object changed).
    let mut slice = lists["/apis/discovery.k8s.io/v1/endpointslices"][0].clone();
    slice["metadata"]["resourceVersion"] = json!("2");
    slice["endpoints"][0]["addresses"] = json!([lab.pods[moved_to].ip.to_string()]);
    for api in &apis {
        assert_eq!(api.push("/apis/discovery.k8s.io/v1/endpointslices", "MODIFIED", slice.clone()), 1);
    }
    let after = session_to(&lab.pods[moved_to].name);
    assert_eq!(after.seen_client(), lab.client.ip, "DSR keeps the client address");
    for agent in &agents {
        let log = agent.log_text();
        assert!(!log.contains("invalid config"), "{log}");
        assert!(
            log.lines().any(|l| l.contains("cluster objects translated")
                && l.contains("touched=1")
                && l.contains("everything=false")
                && l.contains("rebuilt=1")),
            "the event was translated for its Service alone:\n{log}"
        );
    }
}

const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 1);

/// A dual-stack cluster: the group has pools of both families; `web` asks for both
/// (`RequireDualStack`) and holds no address yet; its pod has an IPv4 and an IPv6 slice; n0's
/// Node carries the link-local address its agent publishes (the fake API does not apply
/// patches, so the list says what the agent's patch would), and n1's none yet.
fn dual_stack_cluster(lab: &Lab, pod: usize) -> Lists {
    let mut lists = cluster(lab, lab.pods[pod].ip);
    let group = &mut lists.get_mut("/apis/lb-agent.io/v1alpha1/loadbalancergroups").unwrap()[0];
    group["spec"]["addressPools"] = json!(["198.51.100.0/29", "2001:db8:6::/125"]);
    let service = &mut lists.get_mut("/api/v1/services").unwrap()[0];
    service["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    service["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
    service["status"] = json!({});
    let slices = lists.get_mut("/apis/discovery.k8s.io/v1/endpointslices").unwrap();
    let mut slice6 = slices[0].clone();
    slice6["addressType"] = json!("IPv6");
    slice6["metadata"]["name"] = json!("web-2");
    slice6["endpoints"][0]["addresses"] = json!([lab.pods[pod].ip6.unwrap().to_string()]);
    slices.push(slice6);
    let published = json!({"edge": lab.nodes[0].link_local().to_string()}).to_string();
    lists.get_mut("/api/v1/nodes").unwrap()[0]["metadata"]["annotations"] =
        json!({"lb-agent.io/group-addresses6": published});
    lists
}

#[test]
fn a_dual_stack_service_gets_both_addresses_owned_and_served() {
    let (lab, pod, lists, apis, agents) = kubernetes_cluster_with(true, dual_stack_cluster);
    let _server = lab.pods[pod].serve(8080);
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");

    // Each agent leads its own API: it allocates one address of each family, IPv4 first as
    // `ipFamilies` says. n1 publishes its real link-local address on the group's interface;
    // n0's Node already shows its own, so n0 patches nothing.
    for (i, api) in apis.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let writes = api.writes();
            let ingress = writes.iter().find_map(|(m, p, b)| {
                (m == "PATCH" && p == "/api/v1/namespaces/shop/services/web/status")
                    .then(|| b["status"]["loadBalancer"]["ingress"].clone())
                    .filter(|i| !i.is_null())
            });
            if let Some(ingress) = ingress {
                assert_eq!(
                    ingress,
                    json!([{"ip": VIP.to_string(), "ipMode": "VIP"}, {"ip": VIP6.to_string(), "ipMode": "VIP"}])
                );
                let node_patches: Vec<&Value> = writes
                    .iter()
                    .filter(|(m, p, _)| m == "PATCH" && p.starts_with("/api/v1/nodes/"))
                    .map(|(_, _, b)| b)
                    .collect();
                let expected: Vec<Value> = match i {
                    0 => vec![],
                    _ => vec![json!({"metadata": {"annotations": {
                        "lb-agent.io/group-addresses": null,
                        "lb-agent.io/group-addresses6": json!({"edge": lab.nodes[1].link_local().to_string()}).to_string(),
                    }}})],
                };
                assert_eq!(node_patches, expected.iter().collect::<Vec<_>>(), "node {i}'s Node patches");
                break;
            }
            assert!(Instant::now() < deadline, "node {i}: no addresses for web: {writes:#?}\n{}", logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // The cluster now shows the addresses: both VIPs are owned (once each) and served, DSR to
    // the pod on n1 with the client's own address in each family.
    let mut service = lists["/api/v1/services"][0].clone();
    service["metadata"]["resourceVersion"] = json!("2");
    service["status"] =
        json!({"loadBalancer": {"ingress": [{"ip": VIP.to_string()}, {"ip": VIP6.to_string()}]}});
    for api in &apis {
        assert_eq!(api.push("/api/v1/services", "MODIFIED", service.clone()), 1);
    }
    let client6: IpAddr = lab.client.global6().into();
    for (vip, client) in [(IpAddr::V4(VIP), IpAddr::V4(lab.client.ip)), (IpAddr::V6(VIP6), client6)] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let session = loop {
            if let Some(s) = lab.client.session(vip, 80) {
                break s;
            }
            assert!(Instant::now() < deadline, "no session through [{vip}]:80:\n{}", logs());
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(session.pod(), lab.pods[pod].name);
        assert_eq!(session.seen_address(), client, "DSR keeps the client address over {vip}");
    }
    let owned: f64 = agents.iter().map(|a| a.metric("lbagent_owned_vips")).sum();
    assert_eq!(owned, 2.0, "each VIP has exactly one owner");
    // n1 has not (as the cluster shows) published its link-local address: it runs the IPv4
    // instance and no IPv6 one, and n0 owns the IPv6 VIP.
    let families = |node: usize| -> Vec<String> {
        let status: Value = serde_json::from_str(&agents[node].admin("GET", "/status", "").unwrap()).unwrap();
        let instances = status["instances"].as_array().cloned().unwrap_or_default();
        instances.iter().map(|i| format!("{}:{}", i["family"].as_str().unwrap(), i["state"])).collect()
    };
    assert!(families(1).iter().all(|f| f.starts_with("ipv4:")), "{:?}", families(1));
    assert!(families(0).iter().any(|f| f == "ipv6:\"master\""), "{:?}", families(0));
}
