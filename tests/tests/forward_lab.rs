//! The data path with real packets: a client, three nodes running lb-agent, and pods behind
//! the nodes. Every forwarding mode carries TCP and UDP to the right endpoints; flows keep
//! their endpoint when endpoints are added, and (DSR) when the VIP moves to another node;
//! unexposed ports are dropped; the program survives an agent restart.
//!
//! The scenarios both families share take the family as a parameter and run once per family
//! (IPv6: VRRP over link-local members, IPv6 pods, IPv6-in-IPv6 for DSR); the rest are IPv4's.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use lb_lab::{
    Lab, Session,
    cluster::ServiceLab,
    family::{IpFamily, LabFamily},
};

const VIP: Ipv4Addr = lb_lab::cluster::LAB_VIP;
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
const TARGET_PORT: u16 = 8080;
const ECHO_WAIT: Duration = Duration::from_secs(5);

fn config(lab: &Lab, me: usize, services: &str) -> String {
    lb_lab::cluster::agent_config(lab, me, services)
}

fn service(lab: &Lab, name: &str, port: u16, mode: &str, pods: &[usize]) -> String {
    lb_lab::cluster::service_config(lab, name, VIP, port, TARGET_PORT, mode, pods)
}

type Cluster = ServiceLab;

/// `pods[i]` pods on node i, servers in every pod, no agents yet.
fn cluster(pods: &[usize]) -> Cluster {
    cluster_in(IpFamily::V4, pods)
}

/// As [`cluster`], in family `f`: its VIP, and for IPv6 addresses on every host and pod and
/// one VRRP group of link-local members.
fn cluster_in(f: IpFamily, pods: &[usize]) -> Cluster {
    let config: AgentConfig = f.pick(config, config6);
    ServiceLab::new(pods, f == IpFamily::V6, TARGET_PORT, f.vip(), config)
}

/// How a node's agent is configured, given its services.
type AgentConfig = fn(&Lab, usize, &str) -> String;

fn config6(lab: &Lab, me: usize, services: &str) -> String {
    let IpAddr::V6(vip) = IpFamily::V6.vip() else { unreachable!("an IPv6 VIP") };
    lb_lab::cluster::agent_config6(lab, me, services, vip)
}

fn service_in(f: IpFamily, lab: &Lab, name: &str, port: u16, mode: &str, pods: &[usize]) -> String {
    lb_lab::cluster::service_config(lab, name, f.vip(), port, TARGET_PORT, mode, pods)
}

/// Pod `pod`'s address in family `f`, as a backend label shows it with the target port.
fn backend_label(c: &Cluster, f: IpFamily, pod: usize) -> String {
    let pod = &c.lab.pods[pod];
    let ip: IpAddr = match f {
        IpFamily::V4 => pod.ip.into(),
        IpFamily::V6 => pod.ip6.expect("an IPv6 pod").into(),
    };
    SocketAddr::new(ip, TARGET_PORT).to_string()
}

fn every_mode_carries_tcp_and_udp_to_the_right_endpoint(f: IpFamily) {
    let mut c = cluster_in(f, &[1, 1]);
    let services = [
        service_in(f, &c.lab, "local", 80, "fullNat", &[0]),
        service_in(f, &c.lab, "full-nat", 81, "fullNat", &[1]),
        service_in(f, &c.lab, "dsr", 82, "dsr", &[1]),
    ]
    .concat();
    c.start(&services);
    let (client, node0) = (f.client(), f.node());
    assert_eq!(node0, f.pick::<IpAddr>(c.lab.nodes[0].ip.into(), c.lab.nodes[0].global6().into()));

    // Local endpoint: DNAT only, the client address is kept; the TC program translates the
    // pod's replies back to the VIP.
    let mut s = c.session(80);
    assert_eq!(s.pod(), c.pod_name(0), "{}", s.greeting);
    assert_eq!(s.seen_address(), client, "local delivery keeps the client address");
    assert_eq!(s.echo("one", ECHO_WAIT).as_deref(), Some("n0p0 one"));
    // Full NAT: the endpoint sees the load-balancing node, as with kube-proxy.
    let mut s = c.session(81);
    assert_eq!(s.pod(), c.pod_name(1), "{}", s.greeting);
    assert_eq!(s.seen_address(), node0, "full NAT translates the source to the node");
    assert_eq!(s.echo("two", ECHO_WAIT).as_deref(), Some("n1p0 two"));
    // DSR (IPIP, or IPv6 in IPv6) to the endpoint's node, which unwraps it: the endpoint sees
    // the client, and replies to it directly.
    let mut s = c.session(82);
    assert_eq!(s.pod(), c.pod_name(1), "{}", s.greeting);
    assert_eq!(s.seen_address(), client, "DSR keeps the client address");
    assert_eq!(s.echo("three", ECHO_WAIT).as_deref(), Some("n1p0 three"));

    for (port, pod, seen) in [(80, 0, client), (81, 1, node0), (82, 1, client)] {
        let answer = c.lab.client.udp_ask(f.vip(), port);
        assert_eq!(
            answer.split(' ').next(),
            Some(c.pod_name(pod)),
            "UDP to port {port}: {answer:?}\n{}",
            c.logs()
        );
        assert_eq!(lb_lab::cluster::seen_address(&answer), seen, "UDP to port {port}: {answer:?}");
    }

    for reason in ["forwarded_local", "forwarded_full_nat", "forwarded_dsr", "reply_translated"] {
        assert!(c.reason(0, reason) > 0.0, "n0 counted no {reason}:\n{}", c.logs());
    }
    // n0's local replies were verified by its connection table: it wrote no reply entry. n1's
    // DSR replies come from reply entries written at decapsulation.
    let reply_nat = f.pick(lb_common::service::REPLY_NAT, lb_common::service::REPLY_NAT6);
    assert_eq!(pinned_entries(&c, 0, reply_nat), 0, "n0 wrote reply entries for local flows");
    assert!(pinned_entries(&c, 1, reply_nat) > 0, "n1 wrote no reply entry for DSR flows");
    assert!(c.reason(1, "dsr_decapsulated") > 0.0, "n1 decapsulated nothing:\n{}", c.logs());
    assert!(c.reason(1, "reply_translated") > 0.0, "n1 translated no DSR reply:\n{}", c.logs());
    let m = c.agents[0].metrics();
    let backend =
        format!("lbagent_backend_packets_total{{backend=\"{}\",delivery=\"dsr\"}}", backend_label(&c, f, 1));
    assert!(lb_lab::metric(&m, &backend).unwrap_or(0.0) > 0.0, "{backend}:\n{m}");
    let vip = format!("lbagent_vip_packets_total{{vip=\"{}\"}}", f.vip());
    assert!(lb_lab::metric(&m, &vip).unwrap_or(0.0) > 0.0, "{vip}:\n{m}");
    assert_eq!(lb_lab::metric(&m, "lbagent_xdp_packets_total{action=\"aborted\"}"), Some(0.0));
}

/// More services on one pod port than its listing holds (four, see
/// `lb_common::endpoint_services`): every one carries TCP to the pod and back, the four listed
/// with no reply entry, the fifth with one (its local flows keep `REPLY_NAT`).
#[test]
fn a_pod_port_behind_five_services_answers_on_each() {
    let mut c = cluster(&[1, 1]);
    let ports = [80u16, 90, 91, 92, 93];
    let services: String =
        ports.iter().map(|&port| service(&c.lab, &format!("s{port}"), port, "fullNat", &[0])).collect();
    c.start(&services);
    for port in ports {
        let mut s = c.session(port);
        assert_eq!(s.pod(), c.pod_name(0), "port {port}: {}", s.greeting);
        let echo = s.echo(&format!("to {port}"), ECHO_WAIT);
        assert_eq!(echo, Some(format!("n0p0 to {port}")), "port {port}:\n{}", c.logs());
    }
    let reply_entries = pinned_entries(&c, 0, lb_common::service::REPLY_NAT);
    assert_eq!(reply_entries, 1, "only the fifth service's connection has a reply entry");
    // The operator sees it: two service entries fall back, port 93's TCP and (its UDP endpoint
    // being behind five services too) its UDP.
    let falling_back = c.agents[0].metric("lbagent_services_with_reply_entries");
    assert_eq!(falling_back, 2.0, "{}", c.agents[0].metrics());
}

/// Entries in node `node`'s pinned map `map`.
fn pinned_entries(c: &Cluster, node: usize, map: &str) -> usize {
    let pin = lb_agent::dataplane::pin_dir(&c.lab.pin_path(node)).join(map);
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&pin)
        .output()
        .expect("running bpftool");
    assert!(
        out.status.success(),
        "bpftool map dump {}: {}",
        pin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    entries.as_array().map_or(0, Vec::len)
}

/// Opens `n` sessions on `port` and returns them with the pods that answered.
fn open_sessions(c: &Cluster, port: u16, n: usize) -> Vec<Session> {
    (0..n).map(|_| c.session(port)).collect()
}

fn assert_sessions_stay(c: &Cluster, sessions: &mut [Session], when: &str) {
    for (i, s) in sessions.iter_mut().enumerate() {
        let pod = s.pod().to_owned();
        let echo = s.echo(&format!("after {i}"), ECHO_WAIT);
        assert_eq!(
            echo,
            Some(format!("{pod} after {i}")),
            "session {i} ({}) {when}:\n{}",
            s.greeting,
            c.logs()
        );
    }
}

#[test]
fn connections_keep_their_endpoint_when_one_is_added() {
    let mut c = cluster(&[1, 2, 1]);
    // Pods: 0 on n0, 1 and 2 on n1, 3 on n2. Pod 2 joins later.
    let before =
        [service(&c.lab, "fn", 81, "fullNat", &[1, 3]), service(&c.lab, "dsr", 82, "dsr", &[1, 3])].concat();
    c.start(&before);
    let mut full_nat = open_sessions(&c, 81, 24);
    let mut dsr = open_sessions(&c, 82, 24);
    for sessions in [&full_nat, &dsr] {
        let pods: std::collections::BTreeSet<&str> = sessions.iter().map(|s| s.pod()).collect();
        assert_eq!(pods.len(), 2, "Maglev spreads flows over both endpoints: {pods:?}");
    }

    let after =
        [service(&c.lab, "fn", 81, "fullNat", &[1, 2, 3]), service(&c.lab, "dsr", 82, "dsr", &[1, 2, 3])]
            .concat();
    for (i, agent) in c.agents.iter().enumerate() {
        std::fs::write(&agent.config, config(&c.lab, i, &after)).unwrap();
        agent.signal(libc::SIGHUP);
    }
    for agent in &c.agents {
        // One sync at start, one for the reload.
        agent.wait_metric("lbagent_service_syncs_total{result=\"applied\"}", 2.0);
    }
    assert_sessions_stay(&c, &mut full_nat, "after an endpoint was added (full NAT)");
    assert_sessions_stay(&c, &mut dsr, "after an endpoint was added (DSR)");
    // New flows reach the new endpoint.
    let new_pod = c.pod_name(2).to_owned();
    let reached = (0..40).any(|_| c.session(82).pod() == new_pod);
    assert!(reached, "no new DSR flow reached the added endpoint {new_pod}:\n{}", c.logs());
}

/// How many of `sessions` (TCP to the VIP's `port`) have an entry in n0's pinned connection
/// table.
fn flow_entries(c: &Cluster, port: u16, sessions: &[Session]) -> usize {
    use lb_common::service::{ConnectionKey, FLOW_TABLE, FlowKey, SERVICES, Service, ServiceKey};
    let pins = lb_agent::dataplane::pin_dir(&c.lab.pin_path(0));
    let map = aya::maps::Map::HashMap(aya::maps::MapData::from_pin(pins.join(SERVICES)).unwrap());
    let services: aya::maps::HashMap<_, ServiceKey, Service> = aya::maps::HashMap::try_from(&map).unwrap();
    let number = services.get(&ServiceKey::new(VIP.octets(), port, 6), 0).unwrap().number;
    let table = aya::maps::MapData::from_pin(pins.join(FLOW_TABLE)).unwrap();
    let table = lb_agent::dataplane::flow_tables::FlowTable::new(&table).unwrap();
    let key = |s: &Session| {
        let flow =
            FlowKey::new(CLIENT.octets(), VIP.octets(), s.client_port().to_be_bytes(), port.to_be_bytes(), 6);
        ConnectionKey::of(&flow, number)
    };
    sessions.iter().filter(|s| table.lookup(&key(s)).is_some()).count()
}

/// A flood of new 5-tuples, from both CPUs, through a small connection table and reply table:
/// most established flows' entries are evicted, yet each connection carries on with the pod it
/// had, since Maglev gives an evicted flow the same backend while the backends are unchanged,
/// and its next packet writes its entries again. Local delivery: the pods are on the load
/// balancer's node.
#[test]
fn a_flood_of_new_flows_evicts_established_ones_and_they_keep_their_pod() {
    let mut c = cluster(&[2]);
    flood_past_established_sessions(&mut c, "forwarded_local", 512);
}

/// The same flood with full NAT, the pods on another node: the flood's new flows fill the
/// source-port table and are then refused ports (`snat_ports_exhausted`), where an evicting
/// table would have handed an established connection's port to one of them; flows whose
/// connection-table entry was evicted find their own port again. The port table is 8 times
/// the connection table, so the flood churns the connection table before it fills the port
/// table (refused flows insert no connection entry).
#[test]
fn a_flood_of_new_flows_never_takes_an_established_full_nat_flows_port() {
    let mut c = cluster(&[0, 2]);
    flood_past_established_sessions(&mut c, "forwarded_full_nat", 4096);
    assert!(c.reason(0, "snat_ports_exhausted") > 0.0, "the flood filled the table:\n{}", c.logs());
}

/// Opens 24 connections through a full-NAT service with a 512-entry connection table (and
/// `reply_nat` reply entries), floods new tuples until established flows' entries are
/// evicted, and checks every connection carries on.
fn flood_past_established_sessions(c: &mut Cluster, forwarded: &str, reply_nat: u32) {
    let services = service(&c.lab, "web", 81, "fullNat", &[0, 1]);
    // 512 flows (256 buckets of 8 in the connection table); the flood is 16 times that.
    c.start(&format!("{services}dataplane:\n  capacity: {{flows: 512, replyNat: {reply_nat}}}\n"));
    let mut sessions = open_sessions(c, 81, 24);
    let pods: std::collections::BTreeSet<&str> = sessions.iter().map(|s| s.pod()).collect();
    assert_eq!(pods.len(), 2, "Maglev spreads flows over both pods: {pods:?}");
    let established = flow_entries(c, 81, &sessions);
    assert_eq!(established, 24, "every session has its entry");

    let client = &c.lab.client;
    let frame = |port: u16| {
        let udp = lb_lab::packet::transport(17, CLIENT, VIP, port, 81, b"flood");
        lb_lab::packet::ipv4_frame(client.mac, c.lab.nodes[0].mac, CLIENT, VIP, 64, 17, &udp)
    };
    // Rounds of 1,024 new tuples from each CPU, paced so the veth's ring (256 frames) keeps up
    // on a busy host: 16 times the connection table (and twice the port table of the full-NAT
    // case, which must fill).
    let mut next_port = 10_000u16;
    for _ in 0..4 {
        for cpu in [0, 1] {
            for _ in 0..8 {
                let burst: Vec<Vec<u8>> = (next_port..next_port + 128).map(frame).collect();
                next_port += 128;
                lb_lab::packet::send_from_cpu(client.ns.name(), "eth0", burst, cpu);
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = flow_entries(c, 81, &sessions);
    // A full bucket evicts its oldest entry, so some survive; many go.
    assert!(
        established - left >= 4,
        "the flood evicted established flows: {left} of {established} left after {} new tuples, {} forwarded",
        next_port - 10_000,
        c.reason(0, forwarded)
    );
    assert_sessions_stay(c, &mut sessions, "after a flood evicted their entries");
}

fn dsr_connections_survive_the_load_balancer_failing(f: IpFamily) {
    let mut c = cluster_in(f, &[0, 1, 1]);
    let services = service_in(f, &c.lab, "dsr", 82, "dsr", &[0, 1]);
    c.start(&services);
    let mut sessions = open_sessions(&c, 82, 16);
    assert!(c.reason(0, "forwarded_dsr") > 0.0, "n0 forwarded nothing:\n{}", c.logs());
    let pods: Vec<&str> = sessions.iter().map(|s| s.pod()).collect();
    assert!(pods.contains(&"n1p0") && pods.contains(&"n2p0"), "both endpoints in use: {pods:?}");

    // n0 fails hard: its port goes down, then its agent dies. n1 takes the VIP over, with the
    // same Maglev ring, and keeps sending each flow to the same endpoint.
    c.lab.cut(0);
    c.agents[0].kill();
    c.agents[1].wait_metric("lbagent_owned_vips", 1.0);
    assert_sessions_stay(&c, &mut sessions, "after the load-balancing node failed");
    assert!(c.reason(1, "forwarded_dsr") + c.reason(1, "forwarded_local") > 0.0, "{}", c.logs());
}

/// The endpoint's node changes its MAC and the load balancer's neighbour entry is replaced:
/// an established full-NAT connection, whose next hop the program caches, follows within one
/// refresh interval (`HOP_REFRESH_NS`) instead of sending to the old MAC for ever.
#[test]
fn established_flows_follow_a_replaced_neighbour() {
    let mut c = cluster(&[0, 1]);
    let services = service(&c.lab, "full-nat", 81, "fullNat", &[0]);
    c.start(&services);
    let mut s = c.session(81);
    assert_eq!(s.echo("before", ECHO_WAIT).as_deref(), Some("n1p0 before"));

    let moved = "02:1b:00:00:01:77";
    c.lab.nodes[1].ns.run_cmd(&["ip", "link", "set", "dev", "eth0", "address", moved]);
    let n1 = c.lab.nodes[1].ip.to_string();
    c.lab.nodes[0].ns.run_cmd(&[
        "ip",
        "neigh",
        "replace",
        &n1,
        "lladdr",
        moved,
        "dev",
        "eth0",
        "nud",
        "reachable",
    ]);
    let changed = Instant::now();
    let refresh = Duration::from_nanos(lb_common::service::HOP_REFRESH_NS);
    // The connection's packets to the old MAC are dropped by n1 until the cache refreshes;
    // TCP retransmits them, and the echo comes back once the hop is followed.
    let answer = s.echo("after", refresh + Duration::from_secs(2));
    assert_eq!(answer.as_deref(), Some("n1p0 after"), "{}", c.logs());
    assert!(changed.elapsed() < refresh + Duration::from_secs(2));
    assert!(c.reason(0, "forwarded_full_nat") > 0.0);
}

#[test]
fn unexposed_ports_are_dropped_and_ping_is_answered() {
    let mut c = cluster(&[1]);
    let services = service(&c.lab, "web", 80, "fullNat", &[0]);
    c.start(&services);
    let _ = c.session(80);

    let before = c.reason(0, "unexposed_port");
    assert!(c.lab.client.session(VIP, 81).is_none(), "port 81 is not exposed");
    assert!(c.lab.client.udp_ask(VIP, 81).is_empty());
    assert!(c.reason(0, "unexposed_port") >= before + 2.0, "{}", c.agents[0].metrics());

    assert!(
        c.lab.client.output_ok(&["ping", "-c", "2", "-i", "0.2", "-W", "1", &VIP.to_string()]),
        "ping the VIP"
    );
    assert!(c.reason(0, "icmp_echo_replied") >= 2.0);
}

/// A DSR Service whose pod is on n1, with a connection open through it; n1's agent stops
/// (SIGTERM), `between` runs while no agent does, and the pinned program must keep
/// decapsulating through the gap; then a new agent starts, takes the pins over, and the same
/// connection and a new one reach the pod. Returns the cluster, the new agent's log and what
/// `between` returned.
fn restart_the_endpoints_agent<T>(between: impl FnOnce(&Cluster) -> T) -> (Cluster, String, T) {
    let (c, log, between, _) = stop_and_restart_the_endpoints_agent(IpFamily::V4, libc::SIGTERM, between);
    (c, log, between)
}

/// As [`restart_the_endpoints_agent`], in family `f`, the agent stopped by `signal`: SIGTERM
/// (a clean exit that leaves the data plane pinned) or SIGKILL (no handover at all). Also
/// returns `dsr_decapsulated` as counted before the stop and as the new agent reads it before
/// any new traffic.
fn stop_and_restart_the_endpoints_agent<T>(
    f: IpFamily,
    signal: libc::c_int,
    between: impl FnOnce(&Cluster) -> T,
) -> (Cluster, String, T, (f64, f64)) {
    let mut c = cluster_in(f, &[0, 1]);
    let services = service_in(f, &c.lab, "dsr", 82, "dsr", &[0]);
    c.start(&services);
    let mut session = c.session(82);
    assert_eq!(session.pod(), "n1p0");
    let unwrapped = c.reason(1, "dsr_decapsulated");

    if signal == libc::SIGKILL {
        c.agents[1].kill();
    } else {
        c.agents[1].signal(signal);
        let status = c.agents[1].wait_exit(Duration::from_secs(5));
        assert!(status.success(), "{status}");
    }
    let between = between(&c);
    for i in 0..5 {
        let gap = format!("gap {i}");
        assert_eq!(session.echo(&gap, ECHO_WAIT), Some(format!("n1p0 {gap}")), "{}", c.logs());
    }
    let mut agent = c.lab.start_agent(1, &c.agent_config(1, &services));
    agent.wait_ready();
    let log = agent.log_text();
    assert!(log.contains("resumed=true"), "the links were taken over, not attached afresh:\n{log}");
    // Counted before the stop, and by the new agent before any new traffic: an upgrade that
    // replaces the counter map starts it afresh, the same layout keeps it.
    let counted = (unwrapped, agent.metric(r#"lbagent_xdp_reason_packets_total{reason="dsr_decapsulated"}"#));
    c.agents[1] = agent;
    assert_eq!(session.echo("back", ECHO_WAIT).as_deref(), Some("n1p0 back"), "{}", c.logs());
    assert_eq!(c.session(82).pod(), "n1p0");
    (c, log, between, counted)
}

/// SIGTERM: a clean exit that leaves the data plane pinned; the counters survive too.
fn the_data_plane_outlives_a_stopped_agent(f: IpFamily) {
    let (.., counted) = stop_and_restart_the_endpoints_agent(f, libc::SIGTERM, |_| {});
    assert_counters_kept(counted);
}

/// What was unwrapped before the stop and through the gap (five echoes) is still counted: the
/// counters are the pinned maps'.
fn assert_counters_kept((before, after): (f64, f64)) {
    assert!(after >= before + 5.0, "dsr_decapsulated {after} after the restart, {before} before");
}

/// SIGKILL: no handover at all. The IPv6 path's programs sit in a pinned program array too,
/// so the node keeps unwrapping and translating DSR, and the next agent takes the pins over.
fn the_data_plane_outlives_a_killed_agent(f: IpFamily) {
    let (.., counted) = stop_and_restart_the_endpoints_agent(f, libc::SIGKILL, |_| {});
    assert_counters_kept(counted);
}

lb_lab::for_each_family!(
    every_mode_carries_tcp_and_udp_to_the_right_endpoint,
    dsr_connections_survive_the_load_balancer_failing,
    the_data_plane_outlives_a_stopped_agent,
    the_data_plane_outlives_a_killed_agent,
    full_nat_takes_the_configured_source,
);

#[test]
fn an_agent_of_a_newer_layout_takes_over_an_older_ones_pins_without_a_gap() {
    // While no agent runs, n1's pins are renamed to what an agent of the previous layout would
    // have left; the new agent moves the links over (its program replaces the old one in place,
    // on new maps) and removes the older directory.
    let (_, log, older) = restart_the_endpoints_agent(|c| {
        let pins = c.lab.pin_path(1);
        let older = pins.join(format!("v{}", lb_common::service::LAYOUT_VERSION - 1));
        std::fs::rename(lb_agent::dataplane::pin_dir(&pins), &older).unwrap();
        older
    });
    assert!(
        log.contains("pins of another map layout") && log.contains(&older.display().to_string()),
        "{log}"
    );
    assert!(!older.exists(), "the older layout's pins are removed");
}

/// An upgrade from a build whose connection table was the kernel's LRU hash (`FLOWS`): the
/// new agent converts its entries once its programs run (the fixtures check that a converted
/// flow keeps its backend) and unpins it.
#[test]
fn an_upgrade_converts_an_earlier_builds_connection_table() {
    let (_, log, pinned) = restart_the_endpoints_agent(|c| {
        use lb_common::service::{ConnectionKey, FLOWS, Flow};
        let pinned = lb_agent::dataplane::pin_dir(&c.lab.pin_path(1)).join(FLOWS);
        let mut flows = lb_lab::fixture::pin_earlier_flows(&pinned);
        for port in [40_000u16, 40_001] {
            let key = ConnectionKey { client: CLIENT.octets(), client_port: port.to_be_bytes(), service: 0 };
            flows.insert(key, Flow { backend: 0, snat_port: [0; 2], checked: 0 }, 0).unwrap();
        }
        pinned
    });
    assert!(
        log.contains("converted an earlier build's connection table") && log.contains("flows=2"),
        "{log}"
    );
    assert!(!pinned.exists(), "unpinned once converted");
}

/// An upgrade from an earlier build: its pins have no uplink map, no IPv6 service maps and a
/// reason-counter array one reason shorter. The new agent adds the missing maps and replaces
/// only the counter array (counts restart): every other map, flows and translations with them,
/// is kept.
#[test]
fn an_upgrade_that_grows_a_counter_map_keeps_every_other_map() {
    let (c, log, ()) = restart_the_endpoints_agent(|c| {
        let pins = lb_agent::dataplane::pin_dir(&c.lab.pin_path(1));
        std::fs::remove_file(pins.join(lb_common::maps::UPLINKS)).unwrap();
        // Nor had it the IPv6 service maps, nor the IPv6 path's program array.
        use lb_common::service::*;
        for map in [
            SERVICES6,
            BACKENDS6,
            BACKEND_STATS6,
            FLOW_TABLE6,
            REPLY_NAT6,
            SNAT_REPLIES6,
            LOCAL_ENDPOINTS6,
            UPLINK_ADDRS6,
            IPV6_SERVICES,
            lb_common::maps::VIP_TRAFFIC6,
        ] {
            std::fs::remove_file(pins.join(map)).unwrap();
        }
        let reasons = pins.join(lb_common::maps::REASON_STATS);
        std::fs::remove_file(&reasons).unwrap();
        let shorter = (lb_common::counters::Reason::COUNT - 1).to_string();
        let path = reasons.to_str().unwrap();
        let created = std::process::Command::new("bpftool")
            .args(["map", "create", path, "type", "percpu_array", "key", "4", "value", "16"])
            .args(["entries", &shorter, "name", "REASON_STATS"])
            .output()
            .unwrap();
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    });
    assert!(log.contains("replacing it alone"), "{log}");
    assert!(!log.contains("replacing them"), "no other map was replaced:\n{log}");
    assert!(c.reason(1, "dsr_decapsulated") > 0.0, "counting again on the new array");
}

#[test]
fn malformed_packets_are_counted_and_never_abort_or_crash() {
    use lb_lab::packet::{ipv4_frame, send_and_capture};
    let mut c = cluster(&[1]);
    let services = service(&c.lab, "web", 80, "dsr", &[0]);
    c.start(&services);
    let _ = c.session(80);

    let client = &c.lab.client;
    let node_mac = c.lab.nodes[0].mac;
    let good = ipv4_frame(
        client.mac,
        node_mac,
        CLIENT,
        VIP,
        64,
        6,
        &[0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0],
    );
    let patched = |at: usize, bytes: &[u8]| {
        let mut f = good.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        f
    };
    let mut frames = vec![
        good[..20].to_vec(),        // IPv4 header cut short
        patched(14, &[0x65]),       // version 6 under the IPv4 EtherType
        patched(14, &[0x4f]),       // 60-byte header in a 40-byte packet
        patched(16, &[0xff, 0xff]), // total length beyond the frame
        patched(20, &[0x20, 0x00]), // a fragment to the VIP
        patched(23, &[4]),          // IPIP with a TCP header as "inner" packet
        {
            // A TCP header cut short, with a total length that agrees.
            let mut f = good[..14 + 20 + 8].to_vec();
            f[16..18].copy_from_slice(&28u16.to_be_bytes());
            f
        },
    ];
    // And noise: every length, random bytes after a VIP-addressed IPv4 header.
    let mut noise = lb_lab::packet::Noise::new(0x2545_f491_4f6c_dd1d);
    for len in 34..200usize {
        let mut f = good.clone();
        f.resize(len, 0);
        for b in f[34..].iter_mut() {
            *b = noise.byte();
        }
        frames.push(f);
    }
    let _ = send_and_capture(client.ns.name(), "eth0", frames, Duration::from_millis(200));

    let m = c.agents[0].metrics();
    assert_eq!(lb_lab::metric(&m, "lbagent_xdp_packets_total{action=\"aborted\"}"), Some(0.0), "{m}");
    for reason in ["malformed_ipv4", "fragment", "malformed_l4"] {
        assert!(c.reason(0, reason) > 0.0, "no {reason} counted:\n{m}");
    }
    // The agent and the data path are still fine.
    assert!(c.agents[0].try_get("/healthz").is_some_and(|r| r.contains("200")));
    let mut s = c.session(80);
    assert_eq!(s.echo("still here", ECHO_WAIT).as_deref(), Some("n0p0 still here"));
}

#[test]
fn lb_agent_status_shows_instances_vips_and_backends() {
    let mut c = cluster(&[0, 1]);
    let services = service(&c.lab, "dsr", 82, "dsr", &[0]);
    c.start(&services);
    let mut s = c.session(82);
    assert!(s.echo("count me", ECHO_WAIT).is_some());

    let status = |node: usize, args: &[&str]| {
        let bin = lb_lab::agent_binary();
        let socket = c.agents[node].admin_socket.to_str().unwrap().to_owned();
        let mut argv = vec![bin.to_str().unwrap(), "status", "--socket", &socket];
        argv.extend_from_slice(args);
        let out = c.lab.nodes[node].ns.output(&argv);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let table = status(0, &[]);
    for needle in ["node n0", "web", "master", "192.0.2.10", "198.51.100.10", "10.244.1.2:8080", "dsr"] {
        assert!(table.contains(needle), "{needle} missing:\n{table}");
    }
    let json: serde_json::Value = serde_json::from_str(&status(1, &["--output", "json"])).unwrap();
    assert_eq!(json["node"], "n1");
    let instance = &json["instances"][0];
    assert_eq!(
        (instance["state"].as_str(), instance["master"].as_str()),
        (Some("backup"), Some("192.0.2.10")),
        "{json}\n{}",
        c.agents[1].log_text()
    );
    assert!(instance["advert_age_ms"].as_u64().is_some_and(|ms| ms < 1000), "{json}");
    // n0 sent the flow's packets to the backend; its counters show them.
    let n0: serde_json::Value = serde_json::from_str(&status(0, &["-o", "json"])).unwrap();
    let backend = n0["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == "10.244.1.2:8080")
        .unwrap()
        .clone();
    assert!(backend["packets"].as_u64().unwrap() > 0, "{n0}");
    // The master claims its VIPs under a lease of three advertisement intervals, renewed with
    // each advertisement; the backup claims nothing.
    let lease = n0["instances"][0]["lease_ms"].as_u64();
    let interval = lb_lab::cluster::LAB_ADVERT_INTERVAL_MS;
    assert!(lease.is_some_and(|ms| ms > 0 && ms <= 3 * interval), "advertInterval {interval}ms: {n0}");
    assert!(json["instances"][0]["lease_ms"].is_null(), "{json}");

    // Nothing listening: a clear error, exit 1.
    let bin = lb_lab::agent_binary();
    let out = c.lab.client.ns.output(&[bin.to_str().unwrap(), "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the agent"), "{out:?}");
}

/// The upgrade procedure: SIGTERM the master's agent, start the new one. VRRP hands the VIP
/// over and back, the pinned data plane keeps forwarding meanwhile, and the preempted node keeps
/// answering while the new master's gratuitous ARPs land: no ping and no connection is lost.
#[test]
fn restarting_the_masters_agent_loses_no_packet() {
    let mut c = cluster(&[0, 1]);
    let services = service(&c.lab, "dsr", 82, "dsr", &[0]);
    c.start(&services);
    let mut session = c.session(82);
    assert!(c.lab.client.output_ok(&["ping", "-c", "1", "-W", "1", &VIP.to_string()]));
    let vip_packets = format!("lbagent_vip_packets_total{{vip=\"{VIP}\"}}");
    let backend_packets = "lbagent_backend_packets_total{backend=\"10.244.1.2:8080\",delivery=\"dsr\"}";
    let before = (c.agents[0].metric(&vip_packets), c.agents[0].metric(backend_packets));
    assert!(before.0 > 0.0 && before.1 > 0.0, "{}", c.agents[0].metrics());

    let ping = c.lab.client.ping_every_5ms(VIP, 700);
    std::thread::sleep(Duration::from_millis(500));
    c.agents[0].signal(libc::SIGTERM);
    let status = c.agents[0].wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{status}");
    assert_eq!(session.echo("while n0 is down", ECHO_WAIT).as_deref(), Some("n1p0 while n0 is down"));
    let mut upgraded = c.lab.start_agent(0, &config(&c.lab, 0, &services));
    upgraded.wait_ready();
    assert!(upgraded.log_text().contains("resumed=true"), "{}", upgraded.log_text());
    c.agents[0] = upgraded;
    c.agents[0].wait_metric("lbagent_owned_vips", 1.0);

    let out = ping.join().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("700 packets transmitted, 700 received"), "{summary}\n{}", c.logs());
    assert_eq!(session.echo("after the upgrade", ECHO_WAIT).as_deref(), Some("n1p0 after the upgrade"));
    // The new agent reads the pinned counters where the old one left them: per VIP and per
    // backend, they go on counting (no reset, nothing missing).
    let after = (c.agents[0].metric(&vip_packets), c.agents[0].metric(backend_packets));
    assert!(after.0 > before.0 && after.1 > before.1, "{before:?} then {after:?}\n{}", c.agents[0].metrics());
}

/// An upgrade from the pins of a build before the endpoint listings: its service entries carry
/// no `REPLIES_BY_TABLE` mark and it pinned no `ENDPOINT_SERVICES`. A connection the VIP owner
/// delivers to its own pod carries on through the restart (DSR from the other node meanwhile),
/// and the new agent lists the pod's services and marks them.
#[test]
fn an_upgrade_lists_an_earlier_builds_services_and_keeps_a_local_connection() {
    use lb_common::service::{ENDPOINT_SERVICES, SERVICES, Service, ServiceKey};
    let mut c = cluster(&[1, 0]);
    let services = service(&c.lab, "dsr", 82, "dsr", &[0]);
    c.start(&services);
    let mut session = c.session(82);
    assert_eq!(session.pod(), "n0p0", "{}", session.greeting);
    let pins = lb_agent::dataplane::pin_dir(&c.lab.pin_path(0));
    // Each pinned service entry's mark, after `change` (if any) is applied to the entry.
    let marks = |change: Option<fn(&mut Service)>| -> Vec<bool> {
        let map = aya::maps::Map::HashMap(aya::maps::MapData::from_pin(pins.join(SERVICES)).unwrap());
        let mut entries: aya::maps::HashMap<_, ServiceKey, Service> =
            aya::maps::HashMap::try_from(map).unwrap();
        let keys: Vec<ServiceKey> = entries.keys().map(Result::unwrap).collect();
        keys.iter()
            .map(|key| {
                let mut entry = entries.get(key, 0).unwrap();
                if let Some(change) = change {
                    change(&mut entry);
                    entries.insert(key, entry, 0).unwrap();
                }
                entry.replies_by_table()
            })
            .collect()
    };
    let before = marks(None);
    assert!(
        !before.is_empty() && before.iter().all(|m| *m),
        "the running build marks its services: {before:?}"
    );

    c.agents[0].signal(libc::SIGTERM);
    let status = c.agents[0].wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{status}");
    assert!(marks(Some(|entry| entry.flags = 0)).iter().all(|m| !m));
    std::fs::remove_file(pins.join(ENDPOINT_SERVICES)).unwrap();
    assert_eq!(session.echo("while n0 is down", ECHO_WAIT).as_deref(), Some("n0p0 while n0 is down"));

    let mut upgraded = c.lab.start_agent(0, &config(&c.lab, 0, &services));
    upgraded.wait_ready();
    assert!(upgraded.log_text().contains("resumed=true"), "{}", upgraded.log_text());
    c.agents[0] = upgraded;
    c.agents[0].wait_metric("lbagent_owned_vips", 1.0);
    assert_eq!(session.echo("after the upgrade", ECHO_WAIT).as_deref(), Some("n0p0 after the upgrade"));
    assert_eq!(
        pinned_entries(&c, 0, ENDPOINT_SERVICES),
        before.len(),
        "the pod's port is listed, per protocol"
    );
    assert_eq!(marks(None), before, "and its services marked");
    assert_eq!(c.session(82).echo("a new one", ECHO_WAIT).as_deref(), Some("n0p0 a new one"));
}

/// The capabilities the DaemonSet gives the agent (`securityContext.capabilities.add`).
fn daemonset_capabilities() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml");
    let ds: k8s_openapi::api::apps::v1::DaemonSet =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let security = pod.containers[0].security_context.clone().unwrap();
    let capabilities = security.capabilities.unwrap();
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_owned()]), "the DaemonSet drops every other capability");
    assert_eq!(security.allow_privilege_escalation, Some(false));
    capabilities.add.unwrap()
}

/// Root with exactly the DaemonSet's capabilities (bounding set, hence permitted and
/// effective; none inheritable or ambient) and no_new_privs, as the container runs it: the
/// `setpriv` argv, up to its `--`.
fn daemonset_privileges(capabilities: &[String]) -> Vec<String> {
    let bounding = std::iter::once("-all".to_owned())
        .chain(capabilities.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    ["setpriv", "--bounding-set", &bounding, "--inh-caps", "-all", "--no-new-privs", "--"]
        .map(str::to_owned)
        .to_vec()
}

/// Two nodes whose agents `command` starts (see `Agent::spawn_under`): each runs with exactly
/// `capabilities`, attaches XDP natively, wins VRRP, forwards DSR with the client's address,
/// and an upgrade under the same command takes the pinned data plane over mid-connection.
fn runs_and_forwards_under(command: &[String], capabilities: &[String]) {
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let mut c = cluster(&[0, 1]);
    let services = service(&c.lab, "dsr", 82, "dsr", &[0]);
    c.start_with(&services, "", &command);

    // It is the program meant (wrappers exec'd into it), and really runs without the others.
    let program = command[command.iter().rposition(|a| *a == "--").map_or(0, |i| i + 1)];
    let exe = std::fs::read_link(format!("/proc/{}/exe", c.agents[0].pid())).unwrap();
    assert_eq!(exe, std::path::Path::new(program));
    let effective = lb_lab::agent::proc_status(c.agents[0].pid(), "CapEff").unwrap();
    let mask = u64::from_str_radix(&effective, 16).unwrap();
    assert_eq!(mask.count_ones() as usize, capabilities.len(), "CapEff {effective}: {capabilities:?}");

    // XDP attached (native), VRRP won, DSR forwarded with the client's address, counted.
    let mut s = c.session(82);
    assert_eq!(s.pod(), c.pod_name(0));
    assert_eq!(s.seen_client(), CLIENT);
    assert_eq!(s.echo("caps", ECHO_WAIT).as_deref(), Some("n1p0 caps"));
    assert!(c.reason(0, "forwarded_dsr") > 0.0 && c.reason(1, "dsr_decapsulated") > 0.0, "{}", c.logs());
    for agent in &c.agents {
        let log = agent.log_text();
        assert!(log.contains("mode=\"native\"") && !log.contains("ERROR"), "{log}");
    }

    // An upgrade under the same command: the new agent takes the pinned program and maps
    // over, and the connection carries on.
    c.agents[0].signal(libc::SIGTERM);
    assert!(c.agents[0].wait_exit(Duration::from_secs(5)).success());
    let mut agent = c.lab.start_agent_under(0, &config(&c.lab, 0, &services), &[], &[], &command);
    agent.wait_ready();
    agent.wait_metric("lbagent_owned_vips", 1.0);
    let log = agent.log_text();
    assert!(log.contains("resumed=true") && !log.contains("ERROR"), "{log}");
    c.agents[0] = agent;
    assert_eq!(s.echo("upgraded", ECHO_WAIT).as_deref(), Some("n1p0 upgraded"), "{}", c.logs());
}

#[test]
fn the_daemonsets_capabilities_are_enough() {
    let capabilities = daemonset_capabilities();
    let mut command = daemonset_privileges(&capabilities);
    command.push(lb_lab::agent::agent_binary().display().to_string());
    runs_and_forwards_under(&command, &capabilities);
}

/// The image `cargo xtask image` built (`cargo xtask test` builds it first), mounted from
/// podman's store while this lives.
struct ImageRoot {
    reference: String,
    path: std::path::PathBuf,
}

impl ImageRoot {
    /// The image must have been built: where podman cannot run, `cargo xtask test` skips it and
    /// the test that calls this is compiled as ignored (see `tests/build.rs`).
    fn mount() -> Self {
        let reference = format!("lb-agent:{}", env!("CARGO_PKG_VERSION"));
        let out = std::process::Command::new("podman").args(["image", "mount", &reference]).output().unwrap();
        assert!(
            out.status.success(),
            "podman image mount {reference}: {} (build it with `cargo xtask image`)",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8(out.stdout).unwrap().trim().into();
        Self { reference, path }
    }

    /// The argv that runs the image's agent with the image's own loader and libraries (no
    /// chroot: that would need a capability the DaemonSet does not grant).
    fn agent_command(&self) -> Vec<String> {
        let loader = self.path.join("lib64/ld-linux-x86-64.so.2");
        let libraries = self.path.join("lib/x86_64-linux-gnu");
        let agent = self.path.join("usr/local/bin/lb-agent");
        // Everything the agent loads resolves inside the image, never to the host's copies.
        let listing = std::process::Command::new(&loader)
            .args(["--inhibit-cache", "--library-path"])
            .arg(&libraries)
            .arg("--list")
            .arg(&agent)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
        let resolved: Vec<&str> = listing.lines().filter_map(|l| l.split("=> ").nth(1)).collect();
        assert!(!resolved.is_empty(), "{listing}");
        for library in resolved {
            assert!(
                library.starts_with(self.path.to_str().unwrap()),
                "{library} is not the image's:\n{listing}"
            );
        }
        [loader.display().to_string(), "--inhibit-cache".into(), "--library-path".into()]
            .into_iter()
            .chain([libraries.display().to_string(), agent.display().to_string()])
            .collect()
    }
}

impl Drop for ImageRoot {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman").args(["image", "unmount", &self.reference]).output();
    }
}

/// seccomp as a container runtime applies it for the DaemonSet's capabilities, from an OCI
/// profile: the argv of `tests/tools/oci-seccomp-exec.py`, up to its `--`.
fn seccomp_profile(profile: &str, capabilities: &[String], gate_bpf_on_cap_bpf: bool) -> Vec<String> {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/oci-seccomp-exec.py");
    let caps = capabilities.iter().map(|c| format!("CAP_{c}")).collect::<Vec<_>>().join(",");
    let mut argv =
        vec![tool.display().to_string(), "--profile".into(), profile.into(), "--caps".into(), caps];
    if gate_bpf_on_cap_bpf {
        argv.push("--gate-bpf-on-cap-bpf".into());
    }
    argv.push("--".into());
    argv
}

/// podman's and CRI-O's default seccomp profile (containers-common, as Debian ships it).
const CONTAINERS_SECCOMP: &str = "/usr/share/containers/seccomp.json";

/// The image's binary and libraries, run in a lab node with exactly the DaemonSet's
/// capabilities and under `RuntimeDefault` seccomp as containerd 1.7+ defines it (podman's
/// profile plus bpf(2) with CAP_BPF and perf_event_open(2) with CAP_PERFMON): it attaches,
/// wins VRRP, forwards and upgrades. Under podman's own profile, which allows bpf(2) only with
/// CAP_SYS_ADMIN, it cannot start: what the DaemonSet's comment warns about.
#[test]
#[cfg_attr(
    no_image,
    ignore = "podman cannot run here, so cargo xtask test built no image: target/image/skipped says why"
)]
fn the_images_binary_runs_with_the_daemonsets_capabilities_and_seccomp() {
    let image = ImageRoot::mount();
    let capabilities = daemonset_capabilities();
    let agent = image.agent_command();

    let lab = Lab::new(1);
    let mut refused = seccomp_profile(CONTAINERS_SECCOMP, &capabilities, false);
    refused.extend(daemonset_privileges(&capabilities));
    refused.extend(agent.iter().cloned());
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let config = format!("interface: eth0\nlisten: {}\n", lb_lab::agent::AGENT_LISTEN);
    let mut agent_refused = lab.start_agent_under(0, &config, &[], &[], &refused);
    let status = agent_refused.wait_exit(Duration::from_secs(10));
    let log = agent_refused.log_text();
    assert!(!status.success() && log.contains("Operation not permitted"), "{status}: {log}");

    let mut command = seccomp_profile(CONTAINERS_SECCOMP, &capabilities, true);
    command.extend(daemonset_privileges(&capabilities));
    command.extend(agent);
    runs_and_forwards_under(&command, &capabilities);
}

/// `nodeAddress` and `nodeAddress6` choose full NAT's source over the uplink's first address of
/// the family: the endpoint sees the configured one.
fn full_nat_takes_the_configured_source(f: IpFamily) {
    let mut c = cluster_in(f, &[0, 1]);
    let (source, key, prefix): (IpAddr, &str, &str) = f.pick(
        (Ipv4Addr::new(192, 0, 2, 210).into(), "nodeAddress", "24"),
        ("2001:db8:2::1:10".parse::<Ipv6Addr>().unwrap().into(), "nodeAddress6", "64"),
    );
    c.lab.nodes[0].ns.run_cmd(&["ip", "addr", "add", &format!("{source}/{prefix}"), "dev", "eth0", "nodad"]);
    let services = service_in(f, &c.lab, "full-nat", 81, "fullNat", &[0]);
    c.start_with(&services, &format!("{key}: '{source}'\n"), &[]);
    let mut s = c.session(81);
    assert_eq!(s.seen_address(), source, "{}", s.greeting);
    assert_eq!(s.echo("hello", ECHO_WAIT).as_deref(), Some("n1p0 hello"));
}
