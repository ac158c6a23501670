//! The control half under cluster faults: three agents run `--kubernetes` against one API
//! server on the segment (a [`ClusterLab`]).
//!
//! What users see is asserted: a session through the VIP, pings without loss, who wrote what
//! under which leader term.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use lb_lab::{
    api_server::Write,
    cluster_api::{ClusterLab, endpoint_slice, service},
};
use serde_json::json;

/// The leader's writes: status, finalizers, group status (Events and the Lease are anyone's).
fn leader_writes(writes: &[Write]) -> Vec<&Write> {
    writes
        .iter()
        .filter(|w| w.client != "admin" && (w.resource.ends_with("/status") || w.resource == "services"))
        .collect()
}

/// Every leader write came from the Lease's holder at the time, and no term saw two writers.
fn assert_one_writer_per_term(writes: &[Write]) {
    let mut by_term: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
    for w in leader_writes(writes) {
        let (holder, term) = w.lease.as_ref().expect("a leader write with no Lease in the store");
        assert_eq!(
            &w.client, holder,
            "{} wrote {} {} while {holder} held the Lease (term {term})",
            w.client, w.resource, w.name
        );
        by_term.entry(*term).or_default().insert(&w.client);
    }
    for (term, writers) in by_term {
        assert_eq!(writers.len(), 1, "term {term} had writers {writers:?}");
    }
}

#[test]
fn leadership_moves_on_a_kill_within_the_lease_and_at_once_on_a_graceful_stop() {
    let mut cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    let first = cluster.leader().expect("a leader");

    // SIGKILL: no release; another agent leads once the Lease (15 s) has run out.
    let killed = cluster.node_of(&first);
    cluster.agents[killed].take().unwrap().kill();
    let killed_at = Instant::now();
    cluster.api.put(service("second"));
    cluster.wait_address("second", Duration::from_secs(25));
    let taken = killed_at.elapsed();
    let second = cluster.leader().expect("a new leader");
    assert_ne!(second, first);
    assert!(
        taken <= Duration::from_secs(17),
        "the new leader wrote status {taken:?} after the kill (lease 15 s + 2 s)"
    );

    // SIGTERM: the leader releases the Lease and the last agent takes it within a tick.
    let stopped = cluster.node_of(&second);
    let stopped_at = Instant::now();
    cluster.agents[stopped].as_ref().unwrap().signal(libc::SIGTERM);
    let third = loop {
        if let Some(holder) = cluster.leader().filter(|h| *h != second) {
            break holder;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(6),
            "the Lease was not handed over:\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let handed = stopped_at.elapsed();
    assert!(handed <= Duration::from_secs(3), "handed over in {handed:?}, not within a 2 s tick");
    cluster.agents[stopped].as_mut().unwrap().wait_exit(Duration::from_secs(20));
    assert!(cluster.agents[stopped].as_ref().unwrap().log_text().contains("leader Lease released"));
    cluster.api.put(service("third"));
    cluster.wait_address("third", Duration::from_secs(10));
    assert_eq!(cluster.leader().as_deref(), Some(third.as_str()));
    cluster.wait_session(vip);

    let writes = cluster.api.writes();
    assert_one_writer_per_term(&writes);
    let writers: BTreeSet<&str> = leader_writes(&writes).iter().map(|w| w.client.as_str()).collect();
    assert_eq!(writers.len(), 3, "each leader in turn wrote: {writers:?}");
    let forbidden: Vec<_> = cluster.api.requests().into_iter().filter(|r| r.code == 403).collect();
    assert!(forbidden.is_empty(), "requests the RBAC manifests do not allow: {forbidden:?}");
    eprintln!(
        "leader killed: status by the next {taken:?} later; graceful stop: Lease handed over in {handed:?}"
    );
}

#[test]
fn an_api_server_down_for_a_minute_loses_no_reply_and_changes_nothing_when_back() {
    let cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    // Settle: the owner elected, status written.
    std::thread::sleep(Duration::from_secs(3));
    cluster.assert_one_owner("once settled");
    let before = cluster.api.get("v1", "Service", "shop", "web").unwrap();
    let writes_before = cluster.api.writes().len();

    let pings_from = Instant::now();
    let pings = cluster.lab.client.ping_every_5ms(vip, 14_000);
    cluster.api.set_down(true);
    let down_at = Instant::now();
    while down_at.elapsed() < Duration::from_secs(60) {
        cluster.assert_one_owner("while the API server is down");
        std::thread::sleep(Duration::from_secs(1));
    }
    cluster.api.set_down(false);
    let up_at = Instant::now();
    // Each agent is back: a successful request from each since.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let back: BTreeSet<String> = cluster
            .api
            .requests()
            .into_iter()
            .filter(|r| r.at > up_at && r.code == 200 && r.client != "admin")
            .map(|r| r.client)
            .collect();
        if back.len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "agents back after the outage: {back:?}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster.assert_no_reply_lost(&pings.join().unwrap(), pings_from, "through the outage");
    std::thread::sleep(Duration::from_secs(5));
    cluster.assert_one_owner("after the outage");
    let after = cluster.api.get("v1", "Service", "shop", "web").unwrap();
    assert_eq!(
        before.pointer("/status/loadBalancer"),
        after.pointer("/status/loadBalancer"),
        "the address stays"
    );
    let changed: Vec<String> = leader_writes(&cluster.api.writes()[writes_before..])
        .iter()
        .map(|w| format!("{} {} {} {}", w.client, w.verb, w.resource, w.name))
        .collect();
    assert!(
        changed.iter().all(|w| w.contains("loadbalancergroups/status")),
        "no Service was rewritten after the outage: {changed:?}"
    );
    cluster.wait_session(vip);
}

/// A partition: packets to and from the API server are dropped, so requests and watches hang
/// instead of failing. Forwarding carries on and the outage is logged; once it heals, a change
/// lands on every agent within seconds.
#[test]
fn an_api_server_behind_a_partition_loses_no_reply_and_changes_land_soon_after() {
    let mut cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    std::thread::sleep(Duration::from_secs(3));
    let pings_from = Instant::now();
    let pings = cluster.lab.client.ping_every_5ms(vip, 7_000);
    cluster.set_unreachable(true);
    let cut_at = Instant::now();
    while cut_at.elapsed() < Duration::from_secs(30) {
        cluster.assert_one_owner("during the partition");
        std::thread::sleep(Duration::from_secs(1));
    }
    cluster.set_unreachable(false);
    let healed_at = Instant::now();
    add_endpoint(&mut cluster);
    wait_backends(&cluster, 2.0, Duration::from_secs(60));
    let landed = healed_at.elapsed();
    cluster.assert_no_reply_lost(&pings.join().unwrap(), pings_from, "through the partition");
    eprintln!("partition of 30 s: the next endpoint change landed on every agent {landed:?} after it healed");
    // Each request but a watch is bounded (5 s), so nothing waits on TCP's retransmissions
    // (without the bound: ~25 s, the shell's loop held by a Lease renewal throughout).
    assert!(landed <= Duration::from_secs(10), "the change landed {landed:?} after the partition healed");
    assert!(log_lines(&cluster, "the API server answers again") >= 3, "{}", cluster.logs());
    cluster.assert_one_owner("after the partition");
}

/// Lines of every running agent's log containing `text`.
fn log_lines(cluster: &ClusterLab, text: &str) -> usize {
    cluster.agents.iter().flatten().map(|a| a.log_text().lines().filter(|l| l.contains(text)).count()).sum()
}

/// The successful lists each agent made since `since`, by client.
fn lists_since(cluster: &ClusterLab, since: Instant) -> BTreeMap<String, usize> {
    let mut lists = BTreeMap::new();
    for r in cluster.api.requests() {
        if r.at > since && r.code == 200 && r.verb == "list" && r.client != "admin" {
            *lists.entry(r.client).or_default() += 1;
        }
    }
    lists
}

/// A second endpoint for `web` (a pod on n2): every agent's maps must take it.
fn add_endpoint(cluster: &mut ClusterLab) -> usize {
    let pod = cluster.lab.add_pod(2);
    let pods = &cluster.lab.pods;
    let endpoints = [(pods[cluster.pod].ip.into(), "n1"), (pods[pod].ip.into(), "n2")];
    cluster.api.put(endpoint_slice("web", "web-1", "IPv4", &endpoints));
    pod
}

fn wait_backends(cluster: &ClusterLab, backends: f64, within: Duration) {
    let deadline = Instant::now() + within;
    while cluster.agents.iter().flatten().any(|a| a.metric("lbagent_backends") != backends) {
        assert!(Instant::now() < deadline, "not every agent has {backends} backends:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_expired_watch_relists_without_a_flap_or_a_ring_rewritten() {
    let mut cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    std::thread::sleep(Duration::from_secs(3));
    let (transitions, syncs) =
        (log_lines(&cluster, "VRRP transition"), log_lines(&cluster, "service maps updated"));
    let pings_from = Instant::now();
    let pings = cluster.lab.client.ping_every_5ms(vip, 1_000);

    let expired_at = Instant::now();
    cluster.api.expire_watches();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Each agent's four watches resume from a resourceVersion now compacted: 410, so each lists again.
    while lists_since(&cluster, expired_at).values().filter(|n| **n >= 4).count() < 3 {
        assert!(
            Instant::now() < deadline,
            "relists: {:?}\n{}",
            lists_since(&cluster, expired_at),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let gone = cluster.api.requests().iter().filter(|r| r.at > expired_at && r.verb == "watch").count();
    assert!(gone >= 12, "every watch was resumed (and refused): {gone}");
    cluster.assert_no_reply_lost(&pings.join().unwrap(), pings_from, "through the relists");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(log_lines(&cluster, "VRRP transition"), transitions, "no VRRP flap:\n{}", cluster.logs());
    assert_eq!(log_lines(&cluster, "service maps updated"), syncs, "no map rewritten:\n{}", cluster.logs());
    cluster.assert_one_owner("after the relists");

    // The new watches work: an endpoint added now reaches every agent's maps.
    add_endpoint(&mut cluster);
    wait_backends(&cluster, 2.0, Duration::from_secs(10));
}

#[test]
fn a_slow_and_throttling_api_server_is_backed_off_from_and_changes_still_land() {
    let mut cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    std::thread::sleep(Duration::from_secs(3));

    // At rest: watches and the Lease only.
    let rest_from = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let at_rest: Vec<_> =
        cluster.api.requests().into_iter().filter(|r| r.at > rest_from && r.client != "admin").collect();
    let polling: Vec<_> =
        at_rest.iter().filter(|r| !r.path.contains("/leases/")).map(|r| (&r.verb, &r.path)).collect();
    assert!(polling.is_empty(), "at rest only the Lease is renewed (watches stay open): {polling:?}");
    let at_rest = at_rest.len();

    // Slow, then every request refused with 429, for 20 s; watches are cut so all must retry.
    cluster.api.set_delay(Duration::from_millis(500));
    cluster.api.throttle(usize::MAX);
    cluster.api.expire_watches();
    let throttled_from = Instant::now();
    let pings = cluster.lab.client.ping_every_5ms(vip, 3_000);
    std::thread::sleep(Duration::from_secs(20));
    let during: BTreeMap<String, usize> =
        cluster.api.requests().iter().filter(|r| r.at > throttled_from && r.client != "admin").fold(
            BTreeMap::new(),
            |mut m, r| {
                *m.entry(r.client.clone()).or_default() += 1;
                m
            },
        );
    cluster.api.throttle(0);
    cluster.api.set_delay(Duration::ZERO);
    eprintln!("requests at rest (3 agents, 10 s): {at_rest}; per agent in 20 s of 429s: {during:?}");
    // Four watches (each in its own task) and the Lease, each waiting out Retry-After (1 s)
    // and backing off: no more than one request a second each (50–55 in all were seen).
    for (client, n) in &during {
        assert!(*n <= 5 * 20, "{client} made {n} requests in 20 s of 429s");
    }
    cluster.assert_no_reply_lost(&pings.join().unwrap(), throttled_from, "while slow and throttling");
    cluster.assert_one_owner("after the throttling");

    // Once it answers, a change lands everywhere.
    add_endpoint(&mut cluster);
    wait_backends(&cluster, 2.0, Duration::from_secs(60));
}

/// The MACs that answer ARP for `vip` over `count` requests.
fn answering_macs(cluster: &ClusterLab, vip: Ipv4Addr, count: u32) -> BTreeSet<String> {
    cluster
        .lab
        .client
        .arping(vip, count)
        .iter()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_hexdigit()) && l.len() == 17)
        .cloned()
        .collect()
}

/// The node that answers ARP for `vip` once exactly one MAC does, twice in a row (a preempted
/// master answers on for 150 ms beside its successor, by design); then five requests must
/// all be answered by it alone.
fn settled_answer(cluster: &ClusterLab, vip: Ipv4Addr) -> usize {
    let node_of_mac = |mac: &str| cluster.lab.nodes.iter().position(|n| lb_lab::format_mac(&n.mac) == mac);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut previous = None;
    let node = loop {
        let macs = answering_macs(cluster, vip, 3);
        let one = (macs.len() == 1).then(|| macs.first().cloned()).flatten();
        if one.is_some() && one == previous {
            break node_of_mac(one.as_deref().unwrap()).expect("a node's MAC answers");
        }
        assert!(Instant::now() < deadline, "no single MAC settled for {vip}: {macs:?}\n{}", cluster.logs());
        previous = one;
        std::thread::sleep(Duration::from_millis(300));
    };
    let macs = answering_macs(cluster, vip, 5);
    let expected = lb_lab::format_mac(&cluster.lab.nodes[node].mac);
    assert_eq!(macs, BTreeSet::from([expected]), "answers for {vip} (n{node}):\n{}", cluster.logs());
    node
}

/// Waits until a node other than `node` answers for `vip`, and returns it.
fn moved_from(cluster: &ClusterLab, vip: Ipv4Addr, node: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = settled_answer(cluster, vip);
        if now != node {
            return now;
        }
        assert!(Instant::now() < deadline, "n{node} still answers for {vip}:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn rolling_restarts_keep_one_owner_and_each_new_owner_answers() {
    let mut cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();
    settled_answer(&cluster, vip);
    let pings = cluster.lab.client.ping_every_5ms(vip, 60_000);
    let started = Instant::now();
    for round in 0..2 {
        for node in 0..3 {
            let mut agent = cluster.agents[node].take().unwrap();
            agent.signal(libc::SIGTERM);
            agent.wait_exit(Duration::from_secs(20));
            drop(agent);
            settled_answer(&cluster, vip);
            cluster.agents[node] = Some(cluster.start_agent(node));
            let answering = settled_answer(&cluster, vip);
            cluster.wait_session(vip);
            eprintln!("round {round}, n{node} restarted: n{answering} answers");
        }
    }
    let took = started.elapsed();
    // Stop the pings: they were sized for longer than the restarts take.
    let _ = cluster.lab.client.ns.output(&["pkill", "-INT", "ping"]);
    let pings = pings.join().unwrap();
    let summary = String::from_utf8_lossy(&pings.stdout).into_owned();
    eprintln!("six restarts in {took:?}: {summary}");
    let (sent, received) = lb_lab::ping_counts(&pings);
    // Alone, six restarts lose at most a few replies; a clean-clone CI run beside the other
    // labs lost 121 of 4,782 once (one handover slow on a loaded host; not yet explained), so
    // the bound is 5 %, well under what a missed handover (seconds of silence) would lose.
    let lost = sent - received;
    assert!(lost * 20 <= sent, "lost {lost} of {sent} replies over six graceful restarts");
    let writes = cluster.api.writes();
    assert_one_writer_per_term(&writes);
}

#[test]
fn services_sharing_an_address_are_answered_by_one_mac_through_failovers() {
    let mut cluster = ClusterLab::new();
    let _server = cluster.lab.pods[cluster.pod].serve(8080);
    for (name, port) in [("shared-a", 81), ("shared-b", 82)] {
        let mut s = service(name);
        s["metadata"]["annotations"] = json!({"lb-agent.io/allow-shared-ip": "front"});
        s["spec"]["ports"] = json!([{"port": port, "targetPort": 8080, "protocol": "TCP"}]);
        cluster.api.put(s);
        cluster.api.put(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                       "metadata": {"name": format!("{name}-1"), "namespace": "shop", "labels": {"kubernetes.io/service-name": name}},
                       "ports": [{"port": 8080}],
                       "endpoints": [{"addresses": [cluster.lab.pods[cluster.pod].ip.to_string()], "nodeName": "n1", "conditions": {"ready": true}}]}));
    }
    let a = cluster.wait_address("shared-a", Duration::from_secs(20));
    let b = cluster.wait_address("shared-b", Duration::from_secs(20));
    assert_eq!(a, b, "one address for the sharing key");
    let first = settled_answer(&cluster, a);
    // A hard failure of the owner, then it comes back (and preempts, by priority).
    cluster.agents[first].take().unwrap().kill();
    moved_from(&cluster, a, first);
    cluster.agents[first] = Some(cluster.start_agent(first));
    std::thread::sleep(Duration::from_secs(2));
    settled_answer(&cluster, a);
    for port in [81, 82] {
        assert!(cluster.lab.client.session(a, port).is_some(), "{a}:{port} is served");
    }
}

#[test]
fn a_recreated_service_keeps_its_address_and_a_removed_node_takes_its_vips_and_status_along() {
    let cluster = ClusterLab::new();
    let (_server, vip) = cluster.serve_web();

    // Deleted: the leader releases the address (its finalizer) and the Service goes.
    cluster.api.delete("v1", "Service", "shop", "web");
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.api.get("v1", "Service", "shop", "web").is_some() {
        assert!(
            Instant::now() < deadline,
            "the finalizer was not removed: {}\nlast writes: {:?}",
            cluster.api.get("v1", "Service", "shop", "web").unwrap(),
            cluster
                .api
                .writes()
                .iter()
                .rev()
                .take(4)
                .map(|w| (&w.client, &w.verb, &w.resource, &w.object))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Recreated asking for the same address: served again there.
    let mut again = service("web");
    again["metadata"]["annotations"] = json!({"lb-agent.io/ips": vip.to_string()});
    cluster.api.put(again);
    assert_eq!(cluster.wait_address("web", Duration::from_secs(15)), vip);
    cluster.wait_session(vip);

    // The owner's Node is deleted: the VIP moves, and the group's status forgets the node.
    let gone = settled_answer(&cluster, vip);
    let name = cluster.lab.nodes[gone].name.clone();
    cluster.api.delete("v1", "Node", "", &name);
    moved_from(&cluster, vip, gone);
    cluster.wait_session(vip);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status =
            cluster.api.get("lb-agent.io/v1alpha1", "LoadBalancerGroup", "", "edge").unwrap()["status"]
                .clone();
        let listed = status.to_string().contains(&format!("\"{name}\""));
        if !listed && status["members"].as_array().is_some_and(|m| m.len() == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "the group status still names {name}: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two agents that both believe they lead: the leader is paused (SIGSTOP) in the middle of a
/// pass of writes, as a VM stalled by its host would be, and stays paused past its Lease; the
/// next leader takes over and writes the same Services; the first wakes (SIGCONT) in the middle
/// of its pass, holding a plan made on what it saw before. A user edits a Service meanwhile.
/// Nothing is lost: the woken agent writes nothing more (its renew deadline passed while it
/// slept), no term has two writers, no address is given twice, and the user's edit and every
/// finalizer stand.
#[test]
fn a_leader_paused_mid_pass_wakes_to_a_new_term_and_overwrites_nothing() {
    let services: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let pools = json!({"addressPools": ["198.51.100.0/26"], "advertInterval": "100ms"});
    let cluster = ClusterLab::with(3, false, pools, |lab, pod| {
        vec![service("web"), endpoint_slice("web", "web-1", "IPv4", &[(lab.pods[pod].ip.into(), "n1")])]
    });
    let (_server, vip) = cluster.serve_web();
    let first = cluster.leader().expect("a leader");
    let paused = cluster.node_of(&first);

    // Ten new Services, each write taking 300 ms: the leader is paused after its first one.
    cluster.api.set_delay(Duration::from_millis(300));
    for name in &services {
        cluster.api.put(service(name));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.api.writes().iter().any(|w| w.client == first && services.contains(&w.name)) {
        assert!(Instant::now() < deadline, "the leader did not start writing:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.agents[paused].as_ref().unwrap().signal(libc::SIGSTOP);
    let paused_at = Instant::now();
    cluster.api.set_delay(Duration::ZERO);

    // The user relabels `web` (a whole-object replace, as `kubectl edit` does) while the next
    // leader takes over and writes.
    let mut web = cluster.api.get("v1", "Service", "shop", "web").unwrap();
    web["metadata"]["labels"] = json!({"team": "checkout"});
    cluster.api.put(web);
    for name in &services {
        cluster.wait_address(name, Duration::from_secs(30));
    }
    let next = cluster.leader().expect("a new leader");
    assert_ne!(next, first);
    eprintln!("the next leader had written every address {:?} after the pause", paused_at.elapsed());
    std::thread::sleep(Duration::from_secs(2));

    // Woken mid-pass, with a Service it has never seen arriving too.
    cluster.agents[paused].as_ref().unwrap().signal(libc::SIGCONT);
    let woken_at = Instant::now();
    cluster.api.put(service("third"));
    cluster.wait_address("third", Duration::from_secs(10));
    let woken = cluster.agents[paused].as_ref().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !woken.log_text().contains("leading=false") {
        assert!(Instant::now() < deadline, "the woken agent still thinks it leads:\n{}", woken.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));

    let writes = cluster.api.writes();
    assert_one_writer_per_term(&writes);
    let stale: Vec<_> =
        leader_writes(&writes).into_iter().filter(|w| w.at > woken_at && w.client == first).collect();
    assert!(
        stale.is_empty(),
        "the woken agent wrote: {:?}",
        stale.iter().map(|w| (&w.resource, &w.name)).collect::<Vec<_>>()
    );
    let mut given: Vec<Ipv4Addr> = Vec::new();
    for name in services.iter().map(String::as_str).chain(["web", "third"]) {
        let stored = cluster.api.get("v1", "Service", "shop", name).unwrap();
        let finalizers = stored["metadata"]["finalizers"].to_string();
        assert!(finalizers.contains("lb-agent.io/"), "{name} lost its finalizer: {stored}");
        let addresses = cluster.addresses(name);
        assert_eq!(addresses.len(), 1, "{name}: {stored}");
        given.push(cluster.address(name).unwrap());
    }
    let distinct: BTreeSet<_> = given.iter().collect();
    assert_eq!(distinct.len(), given.len(), "an address given twice: {given:?}");
    let web = cluster.api.get("v1", "Service", "shop", "web").unwrap();
    assert_eq!(web["metadata"]["labels"]["team"], "checkout", "the user's edit was lost: {web}");
    assert_eq!(cluster.address("web"), Some(vip), "web's address changed");
    cluster.wait_session(vip);
}
