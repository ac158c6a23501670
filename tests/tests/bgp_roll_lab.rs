//! A DaemonSet roll of routed nodes, with real FRR and real packets: three nodes run
//! `lb-agent run --kubernetes` against the lab API server (a LoadBalancerGroup with
//! `announce: bgp`, a Service, its EndpointSlice, and each agent's Pod of the DaemonSet with its
//! ControllerRevisions), behind an FRR ToR. The kubelet's part is played by the test: it deletes
//! a pod, stops the agent (SIGTERM) and then the FRR sidecar (SIGTERM), and starts the next
//! pod's agent and, once the sidecar's own wait lets it, FRR.
//!
//! - A pod its DaemonSet replaces leaves its routes to the next agent: the ToR's route never
//!   changes, the node serves its connections through the gap from its pinned data plane, and
//!   the next agent takes the routes over.
//! - A replaced pod whose successor never comes: the sidecar's wait keeps FRR from announcing
//!   the left routes again, and the ToR's graceful-restart timer ends them.
//! - A pod that is not replaced (not deleted, or on the newest revision) withdraws, as a
//!   stop always did.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use lb_lab::{
    Agent, Session,
    agent::AGENT_LISTEN,
    api_server::ApiServer,
    cluster::{LAB_VIP, ServiceLab},
    cluster_api::{api_server_on, endpoint_slice, group, node_object, service, start_kubernetes_agent},
    fabric::{FAR_CLIENT, Fabric, GRACEFUL_RESTART_TIME},
};
use serde_json::{Value, json};

const VIP: Ipv4Addr = LAB_VIP;
const CONVERGE: Duration = Duration::from_secs(20);
const ECHO_WAIT: Duration = Duration::from_secs(5);
/// The agents' namespace, where their Pods, the DaemonSet's revisions and the Lease live.
const SYSTEM: &str = "lb-agent";
const DAEMONSET_UID: &str = "0d5e7a1c-lb-agent-ds";

/// A ControllerRevision of the agents' DaemonSet.
fn revision(hash: &str, number: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
           "metadata": {"name": format!("lb-agent-{hash}"), "namespace": SYSTEM,
                        "labels": {"app.kubernetes.io/name": "lb-agent", "controller-revision-hash": hash},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lb-agent",
                                             "uid": DAEMONSET_UID, "controller": true}]},
           "revision": number})
}

/// The DaemonSet's pod `name` on `node`, of revision `hash`. The finalizer plays the kubelet:
/// a delete leaves the pod marked (`deletionTimestamp`) while its containers stop.
fn pod(name: &str, node: &str, hash: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": SYSTEM, "finalizers": ["lab.lb-agent.io/kubelet"],
                        "labels": {"app.kubernetes.io/name": "lb-agent", "controller-revision-hash": hash},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lb-agent",
                                             "uid": DAEMONSET_UID, "controller": true}]},
           "spec": {"nodeName": node, "containers": [{"name": "lb-agent", "image": "lb-agent"}]}})
}

/// Pods on n0 and n1, every node in the group `edge` announcing over BGP, the Service `web`
/// (its address, the lab's VIP, from the group's pool) to both pods; an agent in each node's
/// pod of revision `old`.
fn routed_cluster() -> (Fabric, ApiServer, lb_lab::Host) {
    let cluster = ServiceLab::new(&[1, 1, 0], false, 8080, VIP, |_, _, _| String::new());
    let fabric = Fabric::new(cluster);
    let lab = &fabric.cluster.lab;
    let (api_host, api) = api_server_on(lab);
    api.put(group(json!({"announce": "bgp", "addressPools": [format!("{VIP}/32")]})));
    for node in &lab.nodes {
        api.put(node_object(node));
    }
    let pods: Vec<(IpAddr, &str)> = vec![(lab.pods[0].ip.into(), "n0"), (lab.pods[1].ip.into(), "n1")];
    api.put(service("web"));
    api.put(endpoint_slice("web", "web-1", "IPv4", &pods));
    api.put(revision("old", 1));
    (fabric, api, api_host)
}

/// Starts `node`'s agent as the pod `name` (which the test has put).
fn start_agent(fabric: &Fabric, api: &ApiServer, node: usize, name: &str) -> Agent {
    let base = format!(
        "interface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nroutes: {{drain: 2s, holdTime: 2s}}\n"
    );
    let mut agent = start_kubernetes_agent(
        &fabric.cluster.lab,
        api,
        node,
        &base,
        &[("RUST_LOG", "info"), ("POD_NAME", name)],
    );
    agent.wait_ready_within(Duration::from_secs(30));
    agent
}

/// Every session still answers, from the pod that greeted it.
fn assert_all_answer(fabric: &Fabric, sessions: &mut [Session], after: &str) {
    for (i, session) in sessions.iter_mut().enumerate() {
        let pod = session.pod().to_owned();
        let reply = session.echo(&format!("ping {i}"), ECHO_WAIT);
        assert_eq!(
            reply.as_deref(),
            Some(format!("{pod} ping {i}").as_str()),
            "session {i} after {after}\n{}",
            fabric.cluster.logs()
        );
    }
}

/// The routes into `node`'s routed VIPs' device, and whether it has carrier (an agent's keeper
/// holds it).
fn left_device(fabric: &Fabric, node: usize) -> (String, bool) {
    let ns = &fabric.cluster.lab.nodes[node].ns;
    let routes =
        String::from_utf8_lossy(&ns.output(&["ip", "route", "show", "dev", "lb-vips"]).stdout).into_owned();
    let link = String::from_utf8_lossy(&ns.output(&["ip", "link", "show", "lb-vips"]).stdout).into_owned();
    (routes, !link.contains("NO-CARRIER"))
}

#[test]
fn a_daemonset_roll_keeps_a_routed_nodes_announcements_and_a_removal_withdraws_them() {
    let (mut fabric, api, _api_host) = routed_cluster();
    let names = ["lb-agent-a0", "lb-agent-a1", "lb-agent-a2"];
    let mut agents = Vec::new();
    for (node, name) in names.iter().enumerate() {
        api.put(pod(name, &format!("n{node}"), "old"));
        agents.push(start_agent(&fabric, &api, node, name));
    }
    let vip = IpAddr::V4(VIP);
    let logs = |agents: &[Agent]| agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    fabric.wait_next_hops(vip, &[0, 1, 2], CONVERGE);
    fabric.wait_bfd_up(CONVERGE);
    let mut open: Vec<Session> =
        (0..24).map(|_| fabric.far.settled_session(VIP, 80, || logs(&agents))).collect();
    assert!(open.iter().all(|s| s.seen_client() == FAR_CLIENT), "DSR");
    assert_all_answer(&fabric, &mut open, "opening");

    // The DaemonSet's template changes: revision `new`. n1's pod is replaced.
    api.put(revision("new", 2));
    let routes = fabric.watch_routes();
    api.delete("v1", "Pod", SYSTEM, names[1]);
    agents[1].signal(libc::SIGTERM);
    let status = agents[1].wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    let log = agents[1].log_text();
    assert!(log.contains("replaced by its DaemonSet's newer revision"), "{log}");
    assert!(log.contains("left for the agent that replaces this one"), "{log}");
    let (held, carrier) = left_device(&fabric, 1);
    assert!(held.contains(&VIP.to_string()) && !carrier, "the device stays, unheld, with its route: {held}");
    fabric.stop_node_frr(1);
    assert!(
        !fabric.frr_may_start(1, Duration::from_millis(600)),
        "the sidecar waits while the device is left"
    );
    // Between the pods: the ToR keeps n1 (graceful restart), and n1 serves from its pinned
    // data plane the connections that enter through it.
    assert_all_answer(&fabric, &mut open, "n1's pod stopped, before the next one");

    api.put(pod("lb-agent-b1", "n1", "new"));
    agents[1] = start_agent(&fabric, &api, 1, "lb-agent-b1");
    // The sidecar's wait ends once the new agent's keeper holds the device.
    assert!(
        fabric.frr_may_start(1, Duration::from_secs(5)),
        "the sidecar still waits\n{}",
        agents[1].log_text()
    );
    let log = agents[1].log_text();
    assert!(log.contains("took over the routed VIPs' device"), "{log}");
    fabric.start_node_frr(1);
    let tor = fabric.tor_frr.as_ref().unwrap();
    let deadline = Instant::now() + CONVERGE;
    // The ToR has n1's session back, and its path fresh (no longer stale) again.
    while tor.vtysh(&format!("show bgp ipv4 unicast {VIP}/32")).contains("stale") {
        assert!(
            Instant::now() < deadline,
            "n1's session did not come back\n{}",
            tor.vtysh("show bgp summary")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Late changes (the stale path replaced) would show in the watch by now.
    std::thread::sleep(Duration::from_secs(1));
    let changes = routes.changes_to(VIP);
    assert!(changes.is_empty(), "the ToR's route changed through the roll: {changes:#?}");
    assert_all_answer(&fabric, &mut open, "n1's pod replaced");
    assert_eq!(agents[1].metric("lbagent_routed_vips"), 1.0);

    // n2's pod replaced by one that never comes: the sidecar's wait keeps the left routes from
    // being announced again, and the ToR's restart timer ends them.
    api.delete("v1", "Pod", SYSTEM, names[2]);
    agents[2].signal(libc::SIGTERM);
    assert!(agents[2].wait_exit(Duration::from_secs(10)).success());
    // The ToR's restart timer runs from the end of the session, as bgpd gets SIGTERM.
    let stopped = Instant::now();
    fabric.stop_node_frr(2);
    assert!(!fabric.frr_may_start(2, Duration::from_secs(1)), "no successor took the device over");
    fabric.wait_next_hops(vip, &[0, 1], GRACEFUL_RESTART_TIME + Duration::from_secs(5));
    let ended = stopped.elapsed();
    assert!(ended >= GRACEFUL_RESTART_TIME - Duration::from_secs(1), "n2's routes ended after {ended:?}");
    eprintln!("a replaced pod with no successor: withdrawn {ended:?} after its FRR was stopped");

    // n0's pod stopped without being deleted (the node shutting down): a removal, withdrawn.
    agents[0].signal(libc::SIGTERM);
    fabric.wait_next_hops(vip, &[1], Duration::from_secs(5));
    assert!(agents[0].wait_exit(Duration::from_secs(10)).success());
    let log = agents[0].log_text();
    assert!(log.contains("the pod is not being deleted"), "{log}");
    assert!(!left_device(&fabric, 0).0.contains(&VIP.to_string()), "a removal leaves no route");
}

#[test]
fn the_example_frr_conf_loads_with_graceful_restart_and_no_bgp_bfd_registration() {
    let ns = lb_lab::Netns::create(format!("lbfrr{}", std::process::id()));
    let config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/frr/frr.conf")).unwrap();
    let frr = lb_lab::fabric::Frr::start(&ns, &config);
    let running = frr.vtysh("show running-config");
    for line in [
        "bgp graceful-restart",
        "bgp graceful-restart preserve-fw-state",
        "neighbor 192.0.2.1 peer-group TOR",
    ] {
        assert!(running.lines().any(|l| l.trim() == line), "{line:?} missing from:\n{running}");
    }
    assert!(!running.lines().any(|l| l.trim().starts_with("neighbor") && l.contains(" bfd")), "{running}");
}
