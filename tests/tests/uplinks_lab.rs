//! Several uplinks per node, with real packets: two nodes on three segments (`br0` on `eth0`,
//! `br1` on `eth1`, `br2` on `eth2`), a group on each, a client on each. (VLAN sub-interfaces
//! cannot be made on this kernel, which lacks 802.1Q support, so the third network is a
//! segment of its own.)

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4};
use lb_lab::{
    Agent, Host, Lab,
    agent::AGENT_LISTEN,
    packet::{ipv4_frame, multicast_mac, send_and_capture},
};

const FRONT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const BACK: Ipv4Addr = Ipv4Addr::new(198, 51, 101, 10);
const THIRD: Ipv4Addr = Ipv4Addr::new(198, 51, 102, 10);
const SEGMENT_1: [u8; 3] = [10, 1, 0];
const SEGMENT_2: [u8; 3] = [10, 2, 0];
const TARGET_PORT: u16 = 8080;

/// One group: its interface, the subnet its nodes' addresses are in, VRID, priorities, VIP.
struct Group {
    name: &'static str,
    interface: &'static str,
    subnet: [u8; 3],
    vrid: u8,
    priorities: [u8; 2],
    vip: Ipv4Addr,
}

const FRONT_GROUP: Group = Group {
    name: "front",
    interface: "eth0",
    subnet: [192, 0, 2],
    vrid: 10,
    priorities: [200, 100],
    vip: FRONT,
};
const BACK_GROUP: Group =
    Group { name: "back", interface: "eth1", subnet: SEGMENT_1, vrid: 11, priorities: [100, 200], vip: BACK };
const THIRD_GROUP: Group = Group {
    name: "third",
    interface: "eth2",
    subnet: SEGMENT_2,
    vrid: 12,
    priorities: [200, 100],
    vip: THIRD,
};

fn group_yaml(g: &Group) -> String {
    let [a, b, c] = g.subnet;
    // One group holds its VIP in the kernel too, to show where that goes.
    let mode = if g.name == "back" { "both" } else { "xdp" };
    format!(
        "  - name: {}\n    interface: {}\n    vrid: {}\n    advertInterval: 50ms\n    vipMode: {mode}\n    nodes:\n      \
         - {{name: n0, address: {a}.{b}.{c}.10}}\n      - {{name: n1, address: {a}.{b}.{c}.11}}\n    \
         priorities: {{n0: {}, n1: {}}}\n    vips:\n      - address: {}\n",
        g.name, g.interface, g.vrid, g.priorities[0], g.priorities[1], g.vip
    )
}

fn config(me: usize, groups: &[&Group], services: &str) -> String {
    let mut yaml = format!("node: n{me}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n");
    for g in groups {
        yaml.push_str(&group_yaml(g));
    }
    yaml.push_str(&format!("services:\n{services}"));
    yaml
}

/// The lab: two nodes on `br0` (eth0), `br1` (eth1) and `br2` (eth2); a client on each.
struct Networks {
    agents: Vec<Agent>,
    segment_1: Host,
    segment_2: Host,
    lab: Lab,
}

/// The lab with `pods` pods on n1 and agents running `groups`; `prepare` sets the lab up
/// further before the agents start and returns their services.
fn networks(groups: &[&Group], prepare: impl Fn(&Lab) -> String, pods: usize) -> Networks {
    let mut lab = Lab::new(2);
    let segment_1 = lab.add_segment("br1", "eth1", SEGMENT_1);
    let segment_2 = lab.add_segment("br2", "eth2", SEGMENT_2);
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    for _ in 0..pods {
        lab.add_pod(1);
    }
    for (client, vip) in [(&segment_1, BACK), (&segment_2, THIRD)] {
        client.ns.run_cmd(&["ip", "route", "add", &format!("{vip}/32"), "dev", "eth0"]);
    }
    let services = prepare(&lab);
    let agents = (0..2)
        .map(|i| {
            let mut agent = lab.start_agent(i, &config(i, groups, &services));
            agent.wait_ready();
            agent
        })
        .collect();
    Networks { agents, segment_1, segment_2, lab }
}

impl Networks {
    /// Both agents' logs and data-plane reason counters, for a failure's message.
    fn logs(&self) -> String {
        lb_lab::cluster::logs_and_reasons(&self.agents)
    }

    /// Polls until `vip` is answered on `client`'s segment by `mac` alone.
    fn wait_answer(&self, client: &Host, vip: Ipv4Addr, mac: [u8; 6]) {
        client.wait_answered_by(vip, mac, || self.logs());
    }

    fn state(&self, node: usize, g: &Group, state: &str) -> f64 {
        self.agents[node].vrrp_state(g.name, g.vrid, state)
    }

    fn transitions(&self, node: usize, g: &Group) -> f64 {
        self.agents[node].vrrp_transitions(g.name, g.vrid)
    }
}

/// A node's MAC on a segment (see `Lab::add_segment`).
fn node_mac(subnet: [u8; 3], node: usize) -> [u8; 6] {
    match subnet {
        [192, 0, 2] => [0x02, 0x1b, 0, 0, 0, 0x10 + node as u8],
        [_, _, c] => [0x02, 0x1b, c, 0, 0, 0x20 + node as u8],
    }
}

/// Each group elects its own master on its own interface; each client resolves and reaches
/// its VIP; a VIP is never answered on another group's interface; an advertisement for one
/// group's VRID heard on another's interface is dropped and counted; a failure on one segment
/// moves only that segment's master.
#[test]
fn groups_on_three_networks_elect_answer_and_fail_over_apart() {
    let net = networks(&[&FRONT_GROUP, &BACK_GROUP, &THIRD_GROUP], |_| String::new(), 0);
    let (lab, segment_1, segment_2) = (&net.lab, &net.segment_1, &net.segment_2);
    net.wait_answer(&lab.client, FRONT, node_mac(FRONT_GROUP.subnet, 0));
    net.wait_answer(segment_1, BACK, node_mac(SEGMENT_1, 1));
    net.wait_answer(segment_2, THIRD, node_mac(SEGMENT_2, 0));
    for (client, vip) in [(&lab.client, FRONT), (segment_1, BACK), (segment_2, THIRD)] {
        assert!(
            client.output_ok(&["ping", "-c", "2", "-i", "0.1", "-W", "1", &vip.to_string()]),
            "ping {vip}\n{}",
            net.logs()
        );
    }
    let status = net.agents[0].admin("GET", "/status", "").unwrap();
    for uplink in ["\"eth0\"", "\"eth1\"", "\"eth2\""] {
        assert!(status.contains(uplink), "{uplink} missing from /status: {status}");
    }
    for g in [&FRONT_GROUP, &BACK_GROUP, &THIRD_GROUP] {
        let info = format!(
            r#"lbagent_vrrp_instance_interface{{group="{}",vrid="{}",family="ipv4",interface="{}"}}"#,
            g.name, g.vrid, g.interface
        );
        assert_eq!(net.agents[1].metric(&info), 1.0, "{info}");
        let attached = format!(r#"lbagent_xdp_attached{{interface="{}",mode="native"}}"#, g.interface);
        assert_eq!(net.agents[1].metric(&attached), 1.0, "{attached}");
    }
    // back runs in VIP mode `both`: its master holds the VIP on eth1, and only there.
    let addresses = |dev: &str| {
        String::from_utf8_lossy(&lab.nodes[1].ns.run_cmd(&["ip", "-4", "addr", "show", "dev", dev]).stdout)
            .into_owned()
    };
    assert!(addresses("eth1").contains(&format!("{BACK}/32")), "{}", addresses("eth1"));
    assert!(!addresses("eth0").contains(&BACK.to_string()), "{}", addresses("eth0"));

    // Another group's VIP on this segment: the request reaches both nodes' eth1, which
    // leave it to the kernel (counted), and nobody answers.
    let before = net.agents[0].metric(r#"lbagent_xdp_reason_packets_total{reason="wrong_interface"}"#);
    assert!(segment_1.arping(FRONT, 1).is_empty(), "{FRONT} answered on br1");
    assert!(lab.client.arping(BACK, 1).is_empty(), "{BACK} answered on br0");
    assert!(net.agents[0].metric(r#"lbagent_xdp_reason_packets_total{reason="wrong_interface"}"#) > before);

    // front's VRID at priority 254 from its backup's address, but on br1: not front's
    // interface, so dropped before it can move front's master.
    let advert = Advertisement {
        vrid: FRONT_GROUP.vrid,
        priority: 254,
        max_adver_int_cs: 5,
        addresses: vec![FRONT.into()],
    };
    let member = lab.nodes[1].ip;
    let payload = advert.encode(member, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
    let frame = ipv4_frame(
        segment_1.mac,
        multicast_mac(VRRP_MULTICAST_V4),
        member,
        VRRP_MULTICAST_V4,
        255,
        112,
        &payload,
    );
    send_and_capture(segment_1.ns.name(), "eth0", vec![frame; 5], Duration::from_millis(100));
    let dropped = r#"lbagent_vrrp_adverts_dropped_total{vrid="10",family="ipv4",reason="wrong_interface"}"#;
    assert_eq!(net.agents[0].metric(dropped), 5.0, "{}", net.logs());
    assert_eq!(net.state(0, &FRONT_GROUP, "master"), 1.0);

    // br1 fails under back's master, n1: n0 takes back over; front and tagged stay on n0.
    let before: Vec<f64> = [&FRONT_GROUP, &THIRD_GROUP].iter().map(|g| net.transitions(1, g)).collect();
    lab.switch.run_cmd(&["ip", "link", "set", "p-n1-br1", "down"]);
    net.wait_answer(segment_1, BACK, node_mac(SEGMENT_1, 0));
    for (g, before) in [&FRONT_GROUP, &THIRD_GROUP].iter().zip(before) {
        assert_eq!(net.state(0, g, "master"), 1.0, "{}", g.name);
        assert_eq!(net.transitions(1, g), before, "{} moved", g.name);
    }
    net.wait_answer(&lab.client, FRONT, node_mac(FRONT_GROUP.subnet, 0));
    net.wait_answer(segment_2, THIRD, node_mac(SEGMENT_2, 0));
}

/// A reload that moves the third group from `eth2` to `eth1` detaches from `eth2` and serves
/// the VIP on `eth1`, while pings to the untouched group's VIP lose nothing (unless this
/// machine froze meanwhile: see `freeze::assert_no_reply_lost`).
#[test]
fn a_reload_moving_a_group_to_another_interface_leaves_the_others_alone() {
    let net = networks(&[&FRONT_GROUP, &BACK_GROUP, &THIRD_GROUP], |_| String::new(), 0);
    let (lab, segment_1, segment_2) = (&net.lab, &net.segment_1, &net.segment_2);
    net.wait_answer(&lab.client, FRONT, node_mac(FRONT_GROUP.subnet, 0));
    net.wait_answer(segment_2, THIRD, node_mac(SEGMENT_2, 0));
    assert!(lab.client.output_ok(&["ping", "-c", "1", "-W", "1", &FRONT.to_string()]));
    let front_moves = net.transitions(0, &FRONT_GROUP);
    lb_lab::freeze::watch();
    let since = Instant::now();
    let ping = lab.client.ping_every_5ms(FRONT, 400);
    std::thread::sleep(Duration::from_millis(300));

    let moved = Group { interface: "eth1", subnet: SEGMENT_1, ..THIRD_GROUP };
    segment_1.ns.run_cmd(&["ip", "route", "add", &format!("{THIRD}/32"), "dev", "eth0"]);
    for (i, agent) in net.agents.iter().enumerate() {
        std::fs::write(&agent.config, config(i, &[&FRONT_GROUP, &BACK_GROUP, &moved], "")).unwrap();
        agent.signal(libc::SIGHUP);
    }
    net.wait_answer(segment_1, THIRD, node_mac(SEGMENT_1, 0));
    let out = ping.join().unwrap();
    let advert = Duration::from_millis(50);
    lb_lab::freeze::assert_no_reply_lost(&out, since, "while another group moved", advert, || net.logs());
    // Nothing is attached to eth2 any more, and the VIP is no longer answered there.
    for node in &lab.nodes {
        let link = node.ns.run_cmd(&["ip", "-d", "link", "show", "eth2"]);
        let link = String::from_utf8_lossy(&link.stdout);
        assert!(!link.contains("xdp"), "{}: {link}", node.name);
        let tc = node.ns.run_cmd(&["bpftool", "net", "show", "dev", "eth2"]);
        assert!(
            !String::from_utf8_lossy(&tc.stdout).contains("lb_reply"),
            "{}: TC still attached",
            node.name
        );
    }
    assert!(segment_2.arping(THIRD, 1).is_empty());
    assert_eq!(
        net.agents[0].metric(r#"lbagent_vrrp_state{group="front",vrid="10",family="ipv4",state="master"}"#),
        1.0
    );
    assert_eq!(net.transitions(0, &FRONT_GROUP), front_moves, "front never moved");
}

/// Full NAT through another uplink than the one the client came in by: the route to the
/// endpoint's node leaves by `eth1`, so the endpoint sees the node's `eth1` address, and its
/// replies come back there to be translated.
#[test]
fn full_nat_takes_its_source_from_the_egress_uplink() {
    let prepare = |lab: &Lab| {
        // n1's pods are reached through br1 from n0.
        let pods = lb_lab::cluster::pod_cidr(1);
        lab.nodes[0].ns.run_cmd(&["ip", "route", "replace", &pods, "via", "10.1.0.11", "dev", "eth1"]);
        lb_lab::cluster::service_config(lab, "web", FRONT, 80, TARGET_PORT, "fullNat", &[0])
    };
    let net = networks(&[&FRONT_GROUP, &BACK_GROUP], prepare, 1);
    let (lab, _servers) = (&net.lab, lab_servers(&net.lab));
    net.wait_answer(&lab.client, FRONT, node_mac(FRONT_GROUP.subnet, 0));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut session = loop {
        if let Some(s) = lab.client.session(FRONT, 80) {
            break s;
        }
        assert!(Instant::now() < deadline, "no session through full NAT\n{}", net.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(session.seen_client(), Ipv4Addr::new(10, 1, 0, 10), "{}", session.greeting);
    assert_eq!(
        session.echo("over eth1", Duration::from_secs(1)).as_deref(),
        Some(format!("{} over eth1", lab.pods[0].name).as_str())
    );
    assert!(
        net.agents[0].metric(r#"lbagent_xdp_reason_packets_total{reason="reply_translated"}"#) > 0.0,
        "{}",
        net.logs()
    );
}

fn lab_servers(lab: &Lab) -> Vec<lb_lab::Process> {
    lab.pods.iter().map(|p| p.serve(TARGET_PORT)).collect()
}
