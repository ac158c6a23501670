//! IPv6 forwarding with real packets: a client, nodes running lb-agent with an IPv6 VIP, and
//! pods with IPv6 addresses behind the nodes. Every mode carries TCP and UDP to the right
//! endpoint with the client address each mode promises (the replies of local and DSR delivery
//! translated by the TC program, full NAT's by XDP), and DSR flows survive the load-balancing
//! node failing.

use std::{
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use lb_lab::{
    Lab, Session,
    cluster::{ServiceLab, service_config},
};

const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);
const TARGET_PORT: u16 = 8080;
const ECHO_WAIT: Duration = Duration::from_secs(5);

type Cluster = ServiceLab;

/// `pods[i]` pods on node i, IPv6 everywhere, servers in every pod, no agents yet.
fn cluster(pods: &[usize]) -> Cluster {
    ServiceLab::new(pods, true, TARGET_PORT, VIP6, config)
}

/// One VRRP group over every node, VRRPv3 over IPv6 (link-local members), n0 preferred, the
/// IPv6 VIP, then `services`.
fn config(lab: &Lab, me: usize, services: &str) -> String {
    lb_lab::cluster::agent_config6(lab, me, services, VIP6)
}

#[test]
fn every_mode_carries_ipv6_tcp_and_udp_to_the_right_endpoint() {
    let mut c = cluster(&[1, 1]);
    let services = [
        service_config(&c.lab, "local", VIP6, 80, TARGET_PORT, "fullNat", &[0]),
        service_config(&c.lab, "full-nat", VIP6, 81, TARGET_PORT, "fullNat", &[1]),
        service_config(&c.lab, "dsr", VIP6, 82, TARGET_PORT, "dsr", &[1]),
    ]
    .concat();
    c.start(&services);
    let client: IpAddr = c.lab.client.global6().into();
    let node0: IpAddr = c.lab.nodes[0].global6().into();

    // Local endpoint: DNAT only, the client address is kept; the TC program translates the
    // pod's replies back to the VIP.
    let mut s = c.session(80);
    assert_eq!(s.pod(), c.pod_name(0), "{}", s.greeting);
    assert_eq!(s.seen_address(), client, "local delivery keeps the client address");
    assert_eq!(s.echo("one", ECHO_WAIT).as_deref(), Some("n0p0 one"));
    // Full NAT: the endpoint sees the load-balancing node's IPv6 address.
    let mut s = c.session(81);
    assert_eq!(s.pod(), c.pod_name(1), "{}", s.greeting);
    assert_eq!(s.seen_address(), node0, "full NAT translates the source to the node");
    assert_eq!(s.echo("two", ECHO_WAIT).as_deref(), Some("n1p0 two"));
    // DSR: IPv6 in IPv6 to the endpoint's node, which unwraps it; the pod replies directly.
    let mut s = c.session(82);
    assert_eq!(s.pod(), c.pod_name(1), "{}", s.greeting);
    assert_eq!(s.seen_address(), client, "DSR keeps the client address");
    assert_eq!(s.echo("three", ECHO_WAIT).as_deref(), Some("n1p0 three"));

    for (port, pod, seen) in [(80, 0, client), (81, 1, node0), (82, 1, client)] {
        let answer = c.lab.client.udp_ask(VIP6, port);
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
    assert!(c.reason(1, "dsr_decapsulated") > 0.0, "n1 unwrapped nothing:\n{}", c.logs());
    assert!(c.reason(1, "reply_translated") > 0.0, "n1 translated no DSR reply:\n{}", c.logs());
    let m = c.agents[0].metrics();
    let remote = c.lab.pods[1].ip6.unwrap();
    let backend = format!("lbagent_backend_packets_total{{backend=\"[{remote}]:8080\",delivery=\"dsr\"}}");
    assert!(lb_lab::metric(&m, &backend).unwrap_or(0.0) > 0.0, "{backend}:\n{m}");
    let vip = format!("lbagent_vip_packets_total{{vip=\"{VIP6}\"}}");
    assert!(lb_lab::metric(&m, &vip).unwrap_or(0.0) > 0.0, "{vip}:\n{m}");
    assert_eq!(lb_lab::metric(&m, "lbagent_xdp_packets_total{action=\"aborted\"}"), Some(0.0));
}

#[test]
fn ipv6_dsr_connections_survive_the_load_balancer_failing() {
    let mut c = cluster(&[0, 1, 1]);
    let services = service_config(&c.lab, "dsr", VIP6, 82, TARGET_PORT, "dsr", &[0, 1]);
    c.start(&services);
    let mut sessions: Vec<Session> = (0..16).map(|_| c.session(82)).collect();
    assert!(c.reason(0, "forwarded_dsr") > 0.0, "n0 forwarded nothing:\n{}", c.logs());
    let pods: Vec<String> = sessions.iter().map(|s| s.pod().to_owned()).collect();
    assert!(pods.iter().any(|p| p == "n1p0") && pods.iter().any(|p| p == "n2p0"), "{pods:?}");

    // n0 fails hard: its port goes down, then its agent dies. n1 takes the VIP over, with the
    // same Maglev ring, and sends each flow on to the same endpoint.
    c.lab.cut(0);
    c.agents[0].kill();
    c.agents[1].wait_metric("lbagent_owned_vips", 1.0);
    for (i, s) in sessions.iter_mut().enumerate() {
        let answer = s.echo(&format!("after {i}"), ECHO_WAIT);
        assert_eq!(answer, Some(format!("{} after {i}", pods[i])), "session {i}:\n{}", c.logs());
    }
    assert!(c.reason(1, "forwarded_dsr") + c.reason(1, "forwarded_local") > 0.0, "{}", c.logs());
}

/// `nodeAddress6` chooses full NAT's IPv6 source over the uplink's first global address.
#[test]
fn full_nat_takes_the_configured_ipv6_source() {
    let mut c = cluster(&[0, 1]);
    let source: Ipv6Addr = "2001:db8:2::1:10".parse().unwrap();
    c.lab.nodes[0].ns.run_cmd(&["ip", "-6", "addr", "add", &format!("{source}/64"), "dev", "eth0", "nodad"]);
    let services = service_config(&c.lab, "full-nat", VIP6, 81, TARGET_PORT, "fullNat", &[0]);
    c.start_with(&services, &format!("nodeAddress6: '{source}'\n"), &[]);
    let mut s = c.session(81);
    assert_eq!(s.seen_address(), IpAddr::V6(source), "{}", s.greeting);
    assert_eq!(s.echo("hello", ECHO_WAIT).as_deref(), Some("n1p0 hello"));
}

/// The IPv6 path's programs sit in a pinned program array: with the endpoint's agent killed
/// (no handover), its node keeps unwrapping and translating IPv6 DSR, and the next agent takes
/// the pins over without a gap.
#[test]
fn ipv6_forwarding_outlives_a_killed_agent() {
    let mut c = cluster(&[0, 1]);
    let services = service_config(&c.lab, "dsr", VIP6, 82, TARGET_PORT, "dsr", &[0]);
    c.start(&services);
    let mut session = c.session(82);
    assert_eq!(session.pod(), "n1p0");

    c.agents[1].kill();
    for i in 0..5 {
        let gap = format!("gap {i}");
        assert_eq!(session.echo(&gap, ECHO_WAIT), Some(format!("n1p0 {gap}")), "{}", c.logs());
    }
    let mut agent = c.lab.start_agent(1, &config(&c.lab, 1, &services));
    agent.wait_ready();
    let log = agent.log_text();
    assert!(log.contains("resumed=true"), "the links were taken over, not attached afresh:\n{log}");
    c.agents[1] = agent;
    assert_eq!(session.echo("back", ECHO_WAIT).as_deref(), Some("n1p0 back"), "{}", c.logs());
    assert!(c.reason(1, "dsr_decapsulated") > 0.0, "{}", c.logs());
}
