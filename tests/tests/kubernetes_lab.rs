//! `lb-agent run --kubernetes` in the lab: two nodes read the same cluster from one lab API
//! server (a [`ClusterLab`]) — a LoadBalancerGroup, a LoadBalancer Service, its EndpointSlice
//! and the Nodes. The leader allocates the Service's address and writes status; both elect the
//! VIP's owner and forward to the pod. A dual-stack Service gets an address of each family,
//! and both are owned and served.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use lb_lab::cluster_api::{ClusterLab, NAMESPACE, endpoint_slice, service};
use serde_json::{Value, json};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 1);

/// Two nodes, the group `edge` with one IPv4 pool (VRRP every 20 ms), and `web` with its pod
/// on n1.
fn two_nodes() -> ClusterLab {
    ClusterLab::with(
        2,
        false,
        json!({"addressPools": ["198.51.100.0/29"], "advertInterval": "20ms"}),
        |lab, pod| {
            vec![service("web"), endpoint_slice("web", "web-1", "IPv4", &[(lab.pods[pod].ip.into(), "n1")])]
        },
    )
}

/// Waits until `check` finds what it looks for in the stored object.
fn wait_stored<T>(
    cluster: &ClusterLab,
    what: &str,
    object: impl Fn() -> Option<Value>,
    check: impl Fn(&Value) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stored = object().unwrap_or_default();
        if let Some(found) = check(&stored) {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: {stored:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn agents_serve_a_service_defined_in_the_cluster() {
    let cluster = two_nodes();
    let _server = cluster.lab.pods[cluster.pod].serve(8080);

    // The leader allocated the pool's first address; it is elected, answered and forwarded
    // (DSR) to the pod.
    assert_eq!(cluster.wait_address("web", Duration::from_secs(20)), VIP);
    let session = cluster.session_to(VIP, cluster.pod);
    assert_eq!(session.seen_client(), cluster.lab.client.ip, "DSR keeps the client address");
    assert_eq!(cluster.owned(), 1.0, "exactly one node owns the VIP");

    // The leader's status, as stored: the Service's condition and the group's counts.
    let service = || cluster.api.get("v1", "Service", NAMESPACE, "web");
    wait_stored(&cluster, "web is not marked served", service, |s| {
        let conditions = s.pointer("/status/conditions")?.as_array()?;
        conditions.iter().find(|c| c["status"] == "True" && c["reason"] == "Served").cloned()
    });
    let group = || cluster.api.get("lb-agent.io/v1alpha1", "LoadBalancerGroup", "", "edge");
    let status = wait_stored(&cluster, "no group status", group, |g| {
        let status = g.get("status")?;
        (status["vipCount"] == 1 && status["memberCount"] == 2).then(|| status.clone())
    });
    assert!(status["vrids"].as_object().is_some_and(|v| !v.is_empty()), "{status:#}");
}

#[test]
fn a_node_leaving_its_group_hands_over_and_runs_on() {
    let cluster = two_nodes();
    cluster.wait_address("web", Duration::from_secs(20));

    // The group now selects only n0 (labelled so); n1's agent hears of it.
    let mut n0 = cluster.api.get("v1", "Node", "", "n0").unwrap();
    n0["metadata"]["labels"] = json!({"kubernetes.io/hostname": "n0"});
    cluster.api.put(n0);
    let mut group = cluster.api.get("lb-agent.io/v1alpha1", "LoadBalancerGroup", "", "edge").unwrap();
    group["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "n0"});
    cluster.api.put(group);

    // n1 resigns its instances and closes its VRRP socket, without a restart.
    let n1 = cluster.agents[1].as_ref().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = n1.admin("GET", "/status", "").unwrap_or_default();
        let status: Value = serde_json::from_str(&status).unwrap_or_default();
        if status["instances"].as_array().is_some_and(|i| i.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "n1 still runs instances: {status:#}\n{}", n1.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    for agent in cluster.agents.iter().flatten() {
        assert!(agent.try_get("/readyz").is_some_and(|r| r.contains("200")), "{}", agent.log_text());
    }
    // n0 alone owns the VIP now (at once, if n1 owned it and resigned).
    let deadline = Instant::now() + Duration::from_secs(5);
    while (cluster.agents[0].as_ref().unwrap().metric("lbagent_owned_vips"), cluster.owned()) != (1.0, 1.0) {
        assert!(
            Instant::now() < deadline,
            "owners: n0 {}, all {}",
            cluster.agents[0].as_ref().unwrap().metric("lbagent_owned_vips"),
            cluster.owned()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_endpoint_slice_event_moves_new_connections_to_the_new_pod() {
    let mut cluster = two_nodes();
    let moved_to = cluster.lab.add_pod(1);
    let _servers = [cluster.lab.pods[cluster.pod].serve(8080), cluster.lab.pods[moved_to].serve(8080)];
    let vip = cluster.wait_address("web", Duration::from_secs(20));
    cluster.session_to(vip, cluster.pod);

    // The EndpointSlice now names the other pod: a watch event, which each agent translates
    // for this Service alone (no other object changed).
    let ip = cluster.lab.pods[moved_to].ip.into();
    cluster.api.put(endpoint_slice("web", "web-1", "IPv4", &[(ip, "n1")]));
    let after = cluster.session_to(vip, moved_to);
    assert_eq!(after.seen_client(), cluster.lab.client.ip, "DSR keeps the client address");
    for agent in cluster.agents.iter().flatten() {
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

/// A dual-stack cluster: the group has pools of both families; `web` asks for both
/// (`RequireDualStack`); its pod has an IPv4 and an IPv6 slice.
fn dual_stack() -> ClusterLab {
    let pools = json!({"addressPools": ["198.51.100.0/29", "2001:db8:6::/125"], "advertInterval": "20ms"});
    ClusterLab::with(2, true, pools, |lab, pod| {
        let mut web = service("web");
        web["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
        web["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        let pod = &lab.pods[pod];
        vec![
            web,
            endpoint_slice("web", "web-1", "IPv4", &[(pod.ip.into(), "n1")]),
            endpoint_slice("web", "web-2", "IPv6", &[(pod.ip6.unwrap().into(), "n1")]),
        ]
    })
}

#[test]
fn a_dual_stack_service_gets_both_addresses_owned_and_served() {
    let cluster = dual_stack();
    let _server = cluster.lab.pods[cluster.pod].serve(8080);

    // The leader allocates one address of each family, IPv4 first as `ipFamilies` says.
    let service = || cluster.api.get("v1", "Service", NAMESPACE, "web");
    let ingress = wait_stored(&cluster, "no addresses for web", service, |s| {
        let ingress = s.pointer("/status/loadBalancer/ingress")?;
        (ingress.as_array()?.len() == 2).then(|| ingress.clone())
    });
    assert_eq!(
        ingress,
        json!([{"ip": VIP.to_string(), "ipMode": "VIP"}, {"ip": VIP6.to_string(), "ipMode": "VIP"}])
    );
    // Each agent publishes its link-local address on the group's interface on its Node (no
    // Node field has it; its peers address VRRPv3 over IPv6 to it), by a merge patch the
    // server applies.
    for (i, node) in cluster.lab.nodes.iter().enumerate() {
        let expected = json!({"edge": node.link_local().to_string()}).to_string();
        let stored = || cluster.api.get("v1", "Node", "", &node.name);
        wait_stored(&cluster, &format!("n{i} did not publish its link-local address"), stored, |n| {
            (n.pointer("/metadata/annotations/lb-agent.io~1group-addresses6")? == &json!(expected))
                .then_some(())
        });
    }

    // Both VIPs are owned (once each) and served, DSR to the pod on n1 with the client's own
    // address in each family.
    let client6: IpAddr = cluster.lab.client.global6().into();
    for (vip, client) in [(IpAddr::V4(VIP), IpAddr::V4(cluster.lab.client.ip)), (IpAddr::V6(VIP6), client6)] {
        let session = cluster.session_to(vip, cluster.pod);
        assert_eq!(session.seen_address(), client, "DSR keeps the client address over {vip}");
    }
    // Each VIP has one owner: once the elections settle, for a preempted master keeps
    // answering 150 ms beside its successor by design (the IPv6 instances start only once the
    // nodes' link-local addresses are published, so theirs may still be settling here).
    let deadline = Instant::now() + Duration::from_secs(3);
    while cluster.owned() != 2.0 {
        assert!(Instant::now() < deadline, "each VIP has exactly one owner: {} owned", cluster.owned());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each node runs an instance of each family, and one of them is the IPv6 VIP's master.
    let families = |node: usize| -> Vec<String> {
        let agent = cluster.agents[node].as_ref().unwrap();
        let status: Value = serde_json::from_str(&agent.admin("GET", "/status", "").unwrap()).unwrap();
        let instances = status["instances"].as_array().cloned().unwrap_or_default();
        instances.iter().map(|i| format!("{}:{}", i["family"].as_str().unwrap(), i["state"])).collect()
    };
    let (n0, n1) = (families(0), families(1));
    for families in [&n0, &n1] {
        assert!(families.iter().any(|f| f.starts_with("ipv4:")), "{families:?}");
        assert!(families.iter().any(|f| f.starts_with("ipv6:")), "{families:?}");
    }
    let masters6 = n0.iter().chain(&n1).filter(|f| *f == "ipv6:\"master\"").count();
    assert_eq!(masters6, 1, "n0 {n0:?}, n1 {n1:?}");
}
