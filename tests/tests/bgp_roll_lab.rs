//! A DaemonSet roll of routed nodes, with real FRR and real packets ([`RoutedCluster`]: three
//! nodes run `lb-agent run --kubernetes` against the lab API server as their DaemonSet pods,
//! behind an FRR ToR; the test plays the kubelet).
//!
//! - A pod its DaemonSet replaces leaves its routes to the next agent: the ToR's route never
//!   changes, the node serves its connections through the gap from its pinned data plane, and
//!   the next agent takes the routes over.
//! - A replaced pod whose successor never comes: the sidecar's wait keeps FRR from announcing
//!   the left routes again, and the ToR's graceful-restart timer ends them.
//! - A pod that is not replaced (not deleted, or on the newest revision) withdraws, as a
//!   stop always did.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use lb_lab::{
    Session,
    cluster::LAB_VIP,
    fabric::{FAR_CLIENT, Frr, GRACEFUL_RESTART_TIME, TorDaemon},
    roll::RoutedCluster,
};

const VIP: std::net::Ipv4Addr = LAB_VIP;

/// Every session still answers, from the pod that greeted it.
fn assert_all_answer(cluster: &RoutedCluster, sessions: &mut [Session], after: &str) {
    lb_lab::cluster::assert_all_answer(sessions, after, || cluster.logs());
}

/// The routes into `node`'s routed VIPs' device, and whether it has carrier (an agent's keeper
/// holds it).
fn left_device(cluster: &RoutedCluster, node: usize) -> (String, bool) {
    let ns = &cluster.fabric.cluster.lab.nodes[node].ns;
    let routes =
        String::from_utf8_lossy(&ns.output(&["ip", "route", "show", "dev", "lb-vips"]).stdout).into_owned();
    let link = String::from_utf8_lossy(&ns.output(&["ip", "link", "show", "lb-vips"]).stdout).into_owned();
    (routes, !link.contains("NO-CARRIER"))
}

#[test]
fn a_daemonset_roll_keeps_a_routed_nodes_announcements_and_a_removal_withdraws_them() {
    let mut cluster = RoutedCluster::start();
    let vip = IpAddr::V4(VIP);
    let mut open: Vec<Session> =
        (0..24).map(|_| cluster.fabric.far.settled_session(VIP, 80, || cluster.logs())).collect();
    assert!(open.iter().all(|s| s.seen_client() == FAR_CLIENT), "DSR");
    assert_all_answer(&cluster, &mut open, "opening");

    // The DaemonSet's template changes; n1's pod is replaced.
    cluster.new_revision();
    let routes = cluster.fabric.watch_routes();
    let stopped = cluster.stop_pod(1, true);
    let log = stopped.log_text();
    assert!(log.contains("replaced by its DaemonSet's newer revision"), "{log}");
    assert!(log.contains("left for the agent that replaces this one"), "{log}");
    let (held, carrier) = left_device(&cluster, 1);
    assert!(held.contains(&VIP.to_string()) && !carrier, "the device stays, unheld, with its route: {held}");
    assert!(
        !cluster.fabric.frr_may_start(1, Duration::from_millis(600)),
        "the sidecar waits while the device is left"
    );
    // Between the pods: the ToR keeps n1 (graceful restart), and n1 serves from its pinned
    // data plane the connections that enter through it.
    assert_all_answer(&cluster, &mut open, "n1's pod stopped, before the next one");
    cluster.start_pod(1);
    let log = cluster.agents[1].as_ref().unwrap().log_text();
    assert!(log.contains("took over the routed VIPs' device"), "{log}");
    // Late changes (the stale path replaced) would show in the watch by now.
    std::thread::sleep(Duration::from_secs(1));
    let changes = routes.changes_to(VIP);
    assert!(changes.is_empty(), "the ToR's route changed through the roll: {changes:#?}");
    assert_all_answer(&cluster, &mut open, "n1's pod replaced");
    assert_eq!(cluster.agents[1].as_ref().unwrap().metric("lbagent_routed_vips"), 1.0);

    // n2's pod replaced by one that never comes: the sidecar's wait keeps the left routes from
    // being announced again, and the ToR's restart timer, which runs from the end of the
    // session (as bgpd gets SIGTERM), ends them.
    let stopping = Instant::now();
    cluster.stop_pod(2, true);
    assert!(!cluster.fabric.frr_may_start(2, Duration::from_secs(1)), "no successor took the device over");
    cluster.fabric.wait_next_hops(vip, &[0, 1], GRACEFUL_RESTART_TIME + Duration::from_secs(5));
    let ended = stopping.elapsed();
    assert!(ended >= GRACEFUL_RESTART_TIME, "n2's routes ended after {ended:?}");
    eprintln!("a replaced pod with no successor: withdrawn {ended:?} after its agent was stopped");

    // n0's pod stopped without being deleted (the node shutting down): a removal, withdrawn.
    let stopped = cluster.stop_pod(0, false);
    let log = stopped.log_text();
    assert!(log.contains("the pod is not being deleted"), "{log}");
    assert!(log.contains("withdrawing routed VIPs"), "{log}");
    assert!(!left_device(&cluster, 0).0.contains(&VIP.to_string()), "a removal leaves no route");
    cluster.fabric.wait_next_hops(vip, &[1], Duration::from_secs(5));
}

/// BIRD 2.0 as the ToR takes the BFD AdminDown of the stopping FRR for a failure and ends the
/// session without graceful restart (`bfd graceful` would keep the routes, but also a dead
/// node's, until the restart time): a roll withdraws and announces again there. What must hold
/// is what holds for any withdrawal: the connections carry on, and the node comes back.
#[test]
fn a_roll_under_a_bird_tor_withdraws_and_announces_again_and_connections_carry_on() {
    let mut cluster = RoutedCluster::start_with_tor(TorDaemon::Bird);
    let vip = IpAddr::V4(VIP);
    let mut open: Vec<Session> =
        (0..12).map(|_| cluster.fabric.far.settled_session(VIP, 80, || cluster.logs())).collect();
    cluster.new_revision();
    cluster.stop_pod(1, true);
    cluster.fabric.wait_next_hops(vip, &[0, 2], Duration::from_secs(5));
    assert_all_answer(&cluster, &mut open, "n1's pod stopped, under BIRD");
    cluster.start_pod(1);
    cluster.fabric.wait_next_hops(vip, &[0, 1, 2], Duration::from_secs(20));
    assert!(cluster.agents[1].as_ref().unwrap().log_text().contains("took over the routed VIPs' device"));
    assert_all_answer(&cluster, &mut open, "n1's pod replaced, under BIRD");
}

#[test]
fn the_example_frr_conf_loads_with_graceful_restart_and_no_bgp_bfd_registration() {
    let ns = lb_lab::Netns::create(format!("lbfrr{}", std::process::id()));
    let config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/frr/frr.conf")).unwrap();
    let frr = Frr::start(&ns, &config);
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
