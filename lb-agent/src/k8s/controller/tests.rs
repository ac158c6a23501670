//! The whole shell against a mock API server (tower-test): lists answered from fixtures,
//! watches left open, the first Service list failing (a watch error, retried with backoff),
//! and every write recorded.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

fn list(kind: &str, api_version: &str, items: Value) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {"resourceVersion": "1"}, "items": items})
}

type Writes = Arc<Mutex<Vec<(String, String, Value)>>>;

/// The fixture group's spec.
fn edge_spec() -> Value {
    json!({"interface": "eth0", "addressPools": ["198.51.100.0/29"], "default": true, "advertInterval": "10ms"})
}

/// What the mock API server lists: the group `edge`'s spec and the objects of each kind.
struct Fixture {
    edge: Value,
    services: Value,
    slices: Value,
    nodes: Value,
}

impl Fixture {
    /// `web` holding 198.51.100.1 with a pod on n1, `new` without an address, nodes n0, n1.
    fn new(edge: Value) -> Self {
        Fixture {
            edge,
            services: json!([
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop", "finalizers": ["lb-agent.io/ipam"]},
                 "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080}]},
                 "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "new", "namespace": "shop"},
                 "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}}
            ]),
            slices: json!([{
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                    "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                    "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "n1"}]}]),
            nodes: json!([
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0"}, "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}},
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.11"}]}}
            ]),
        }
    }
}

async fn api_server(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    writes: Writes,
    fixture: Fixture,
) {
    let Fixture { edge, services, slices, nodes } = fixture;
    let mut open_watches = Vec::new();
    let mut service_lists = 0;
    while let Some((request, send)) = handle.next_request().await {
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().unwrap_or_default().to_owned();
        let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
            .unwrap_or(Value::Null);
        if query.contains("watch=true") {
            open_watches.push(send);
            continue;
        }
        let reply = |status: u16, v: Value| {
            Response::builder().status(status).body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
        };
        let response = match (method.as_str(), path.as_str()) {
            ("GET", "/apis/lb-agent.io/v1alpha1/loadbalancergroups") => reply(
                200,
                list(
                    "LoadBalancerGroup",
                    "lb-agent.io/v1alpha1",
                    json!([{
                    "apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge", "generation": 1},
                    "spec": edge}]),
                ),
            ),
            ("GET", "/api/v1/services") => {
                service_lists += 1;
                if service_lists == 1 {
                    reply(
                        500,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd is sad", "code": 500}),
                    )
                } else {
                    reply(200, list("Service", "v1", services.clone()))
                }
            }
            ("GET", "/apis/discovery.k8s.io/v1/endpointslices") => {
                reply(200, list("EndpointSlice", "discovery.k8s.io/v1", slices.clone()))
            }
            ("GET", "/api/v1/nodes") => reply(200, list("Node", "v1", nodes.clone())),
            ("GET", p) if p.ends_with("/leases/lb-agent-leader") => reply(
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
            ),
            ("POST", p) if p.ends_with("/leases") => reply(201, body),
            (method, path) => {
                writes.lock().unwrap().push((method.to_owned(), path.to_owned(), body.clone()));
                // The object as a server returns it: a merge patch's nulls deleted (a Node
                // with a null annotation does not parse, and the write would read as failed).
                fn without_nulls(v: Value) -> Value {
                    match v {
                        Value::Object(map) => Value::Object(
                            map.into_iter()
                                .filter(|(_, v)| !v.is_null())
                                .map(|(k, v)| (k, without_nulls(v)))
                                .collect(),
                        ),
                        other => other,
                    }
                }
                let mut echo = without_nulls(body);
                if echo["metadata"].is_null() {
                    echo["metadata"] = json!({"name": "x", "namespace": "shop"});
                }
                reply(200, echo)
            }
        };
        send.send_response(response);
    }
}

/// What the agent's side holds of a running shell: its configs, and its reports.
struct AgentSide {
    configs: mpsc::Receiver<Config>,
    _owners: watch::Sender<BTreeMap<std::net::IpAddr, String>>,
    refused: watch::Sender<BTreeMap<String, String>>,
    foreign: watch::Sender<ForeignRouters>,
    impersonated: watch::Sender<Impersonations>,
}

/// Runs the shell of node n0 (default uplink eth0) against the mock API server listing
/// `fixture`; its recorded writes go to `writes`.
fn run_shell(fixture: Fixture, writes: &Writes) -> AgentSide {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(api_server(handle, writes.clone(), fixture));
    let shell = Shell {
        client: Client::new(service.clone(), "default"),
        requests: Client::new(service, "default"),
        netlink: crate::netdev::connect().unwrap(),
        base: Config::parse("interface: eth0\nnode: n0\n").unwrap(),
        node: "n0".into(),
        namespace: "lb-agent".into(),
    };
    let (tx, configs) = mpsc::channel(4);
    let (_owners, owners) = watch::channel(BTreeMap::new());
    let (refused, refused_rx) = watch::channel(BTreeMap::new());
    let (foreign, foreign_rx) = watch::channel(ForeignRouters::new());
    let (impersonated, impersonated_rx) = watch::channel(Impersonations::new());
    let from_agent =
        FromAgent { owners, refused: refused_rx, foreign: foreign_rx, impersonated: impersonated_rx };
    tokio::spawn(shell.run(tx, from_agent, watch::channel(false).1));
    AgentSide { configs, _owners, refused, foreign, impersonated }
}

/// The first Event with `reason` posted after the first `before` writes (waits up to 10 s).
async fn event_after(writes: &Writes, before: usize, reason: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen: Vec<_> = writes.lock().unwrap()[before..].to_vec();
        if let Some((_, _, event)) =
            seen.iter().find(|(m, p, b)| m == "POST" && p.contains("/events") && b["reason"] == reason)
        {
            return event.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no {reason} Event: {seen:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_cluster_becomes_a_config_and_the_leader_writes_status() {
    let writes: Writes = Arc::default();
    let mut agent = run_shell(Fixture::new(edge_spec()), &writes);
    let (refused_tx, foreign_tx, impersonated_tx) =
        (agent.refused.clone(), agent.foreign.clone(), agent.impersonated.clone());

    let config = tokio::time::timeout(Duration::from_secs(20), agent.configs.recv())
        .await
        .expect("a config in time")
        .unwrap();
    let group = &config.groups[0];
    assert_eq!(group.name, "edge");
    assert_eq!(group.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["n0", "n1"]);
    assert_eq!(group.vips.iter().map(|v| v.address.to_string()).collect::<Vec<_>>(), ["198.51.100.1"]);
    assert_eq!(config.services[0].endpoints[0].address, Ipv4Addr::new(10, 244, 1, 5));

    // The leader allocates the next free address to the new Service, after its finalizer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = writes.lock().unwrap().clone();
        let finalizer =
            seen.iter().position(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new");
        let status = seen
            .iter()
            .position(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new/status");
        if let (Some(f), Some(s)) = (finalizer, status) {
            assert!(f < s, "the finalizer comes first: {seen:#?}");
            assert_eq!(seen[s].2["status"]["loadBalancer"]["ingress"][0]["ip"], "198.51.100.2");
            assert!(
                seen.iter().any(|(_, p, b)| p.ends_with("/loadbalancergroups/edge/status")
                    && b["status"]["vipCount"] == 2),
                "{seen:#?}"
            );
            // web's address is already right: only its new condition is written.
            let web: Vec<_> =
                seen.iter().filter(|(_, p, _)| p == "/api/v1/namespaces/shop/services/web/status").collect();
            assert!(web.iter().all(|(_, _, b)| b["status"]["loadBalancer"].is_null()), "{web:#?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no status writes: {seen:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // This node's data plane has no room for web: without any cluster change, the leader
    // sets web's condition to False (CapacityExceeded) and records a Warning Event on it.
    let before = writes.lock().unwrap().len();
    let reason = "198.51.100.1:80/TCP: the data plane holds at most 1 services (dataplane.capacity.services)";
    refused_tx.send_replace(BTreeMap::from([("shop/web".to_owned(), reason.to_owned())]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen: Vec<_> = writes.lock().unwrap()[before..].to_vec();
        let condition = seen.iter().find_map(|(m, p, b)| {
            let conditions = b["status"]["conditions"].as_array()?;
            (m == "PATCH" && p == "/api/v1/namespaces/shop/services/web/status").then_some(conditions.clone())
        });
        let event = seen.iter().find(|(m, p, b)| {
            m == "POST"
                && p.contains("/events")
                && b["reason"] == "CapacityExceeded"
                && b["type"] == "Warning"
        });
        if let (Some(conditions), Some((_, _, event))) = (condition, event) {
            let served = conditions.iter().find(|c| c["type"] == "lb-agent.io/Served").unwrap();
            assert_eq!(
                (served["status"].as_str(), served["reason"].as_str()),
                (Some("False"), Some("CapacityExceeded"))
            );
            assert_eq!(served["message"], reason);
            assert_eq!(event["regarding"]["name"], "web", "{event:#}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no refusal written: {seen:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A router outside the group advertises its VRID: a Warning Event on the group,
    // naming the VRID and the source, once.
    let before = writes.lock().unwrap().len();
    let rogue: std::net::IpAddr = "192.0.2.66".parse().unwrap();
    let vrid = crate::vrrp::family::InstanceId::v4(10);
    foreign_tx.send_replace(ForeignRouters::from([("edge".to_owned(), vrid, rogue)]));
    let event = event_after(&writes, before, "ForeignVrid").await;
    assert_eq!(
        (event["type"].as_str(), event["regarding"]["kind"].as_str()),
        (Some("Warning"), Some("LoadBalancerGroup"))
    );
    assert_eq!(event["regarding"]["name"], "edge");
    let note = event["note"].as_str().unwrap();
    assert!(
        note.contains("VRID 10") && note.contains("192.0.2.66") && note.contains("excludedVrids"),
        "{note}"
    );
    foreign_tx.send_replace(ForeignRouters::from([("edge".to_owned(), vrid, rogue)]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again =
        writes.lock().unwrap()[before..].iter().filter(|(_, _, b)| b["reason"] == "ForeignVrid").count();
    assert_eq!(again, 1, "reported once");

    // A member impersonated on the segment: one Warning Event on its group, saying how.
    let before = writes.lock().unwrap().len();
    let member: std::net::IpAddr = "192.0.2.11".parse().unwrap();
    let how = "from MAC 02:1b:00:00:00:cc while it is at 02:00:00:00:00:11".to_owned();
    impersonated_tx.send_replace(Impersonations::from([("edge".to_owned(), member, how.clone())]));
    let event = event_after(&writes, before, "Impersonation").await;
    assert_eq!(
        (event["type"].as_str(), event["regarding"]["name"].as_str()),
        (Some("Warning"), Some("edge"))
    );
    let note = event["note"].as_str().unwrap();
    assert!(note.contains("192.0.2.11") && note.contains(&how), "{note}");
}

/// A group on another interface than the default uplink: the config runs it there, and
/// this node publishes its address on that interface on its Node, once, for the others.
#[tokio::test]
async fn a_group_on_another_interface_publishes_this_nodes_address_there() {
    let writes: Writes = Arc::default();
    // `lo` is the one interface every test host has, with 127.0.0.1.
    let mut edge = edge_spec();
    edge["interface"] = json!("lo");
    let mut agent = run_shell(Fixture::new(edge), &writes);
    let config =
        tokio::time::timeout(Duration::from_secs(20), agent.configs.recv()).await.expect("a config").unwrap();
    // No member has published an address on `lo` yet (the mock's watch never shows the
    // patch): the group waits, and the rest of the config is valid.
    assert!(config.groups.is_empty(), "{:?}", config.groups);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let patches = loop {
        let seen = writes.lock().unwrap().clone();
        let patches: Vec<Value> = seen
            .iter()
            .filter(|(m, p, _)| m == "PATCH" && p == "/api/v1/nodes/n0")
            .map(|(_, _, b)| b.clone())
            .collect();
        if !patches.is_empty() {
            break patches;
        }
        assert!(tokio::time::Instant::now() < deadline, "no Node patch: {seen:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        patches[0],
        json!({"metadata": {"annotations": {
            source::GROUP_ADDRESSES_ANNOTATION: "{\"edge\":\"127.0.0.1\"}",
            // `lo` has no link-local address.
            source::GROUP_ADDRESSES6_ANNOTATION: null,
        }}})
    );
    // Not patched again while the watch has not shown it (the mock never does).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again =
        writes.lock().unwrap().iter().filter(|(m, p, _)| m == "PATCH" && p == "/api/v1/nodes/n0").count();
    assert_eq!(again, 1);
}

/// A dual-stack cluster: a group with pools of both families, members that published their
/// link-local addresses, a Service holding one address of each family with pods of each,
/// and a new `RequireDualStack` one. The config serves both families, and the leader gives
/// the new Service the lowest free address of each, primary family first.
#[tokio::test]
async fn a_dual_stack_service_is_served_and_allocated_in_both_families() {
    let writes: Writes = Arc::default();
    let mut edge = edge_spec();
    edge["addressPools"] = json!(["198.51.100.0/29", "2001:db8:6::/125"]);
    let mut fixture = Fixture::new(edge);
    fixture.services = json!([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop", "finalizers": ["lb-agent.io/ipam"]},
         "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
                  "ports": [{"port": 80, "targetPort": 8080}]},
         "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"ip": "2001:db8:6::1"}]}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "new", "namespace": "shop"},
         "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack",
                  "ports": [{"port": 443}]}}
    ]);
    fixture.slices = json!([
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
         "metadata": {"name": "web-4", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
         "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "n1"}]},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv6",
         "metadata": {"name": "web-6", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
         "endpoints": [{"addresses": ["fd00:244:1::5"], "nodeName": "n1"}]}
    ]);
    for (i, node) in fixture.nodes.as_array_mut().unwrap().iter_mut().enumerate() {
        node["metadata"]["annotations"] =
            json!({source::GROUP_ADDRESSES6_ANNOTATION: format!("{{\"edge\":\"fe80::{i}\"}}")});
    }
    let mut agent = run_shell(fixture, &writes);
    let config = tokio::time::timeout(Duration::from_secs(20), agent.configs.recv())
        .await
        .expect("a config in time")
        .unwrap();
    let group = &config.groups[0];
    let members: Vec<(&str, Option<String>)> =
        group.nodes.iter().map(|n| (n.name.as_str(), n.address6.map(|a| a.to_string()))).collect();
    assert_eq!(members, [("n0", Some("fe80::".to_owned())), ("n1", Some("fe80::1".to_owned()))]);
    let vips: Vec<String> = group.vips.iter().map(|v| v.address.to_string()).collect();
    assert_eq!(vips, ["198.51.100.1", "2001:db8:6::1"]);
    let served: Vec<(String, String)> = config
        .services
        .iter()
        .map(|s| (s.vip.to_string(), s.endpoints.iter().map(|e| e.address.to_string()).collect()))
        .collect();
    assert_eq!(
        served,
        [
            ("198.51.100.1".to_owned(), "10.244.1.5".to_owned()),
            ("2001:db8:6::1".to_owned(), "fd00:244:1::5".to_owned())
        ]
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = writes.lock().unwrap().clone();
        let status =
            seen.iter().find(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new/status");
        if let Some((_, _, body)) = status {
            assert_eq!(
                *body,
                json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [
                    {"ip": "2001:db8:6::2", "ipMode": "VIP"}, {"ip": "198.51.100.2", "ipMode": "VIP"}
                ]}}})
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no address for new: {seen:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
