//! VRRPv3 over IPv6 and IPv6 VIPs with real packets: lab nodes run lb-agent (and, for interop,
//! keepalived) with an IPv4 and an IPv6 VIP under the same VRID, and the client checks who
//! answers for each by Neighbor Discovery (ndisc6), ARP, ping and TCP.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use lb_lab::{
    Agent, Lab,
    agent::AGENT_LISTEN,
    packet::{icmpv6, ipv6_frame, neighbor_advertisements, neighbor_solicitation, send_and_capture},
};

const VIP4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);
const VRID: u8 = 10;
const PORT: u16 = 8080;

/// A manual group with one IPv4 and one IPv6 VIP: two instances, one per family, both VRID 10.
fn dual_stack_group(lab: &Lab, me: usize, priorities: &[u8], extra: &str) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: web\n    vrid: {VRID}\n    \
         advertInterval: 50ms\n{extra}    nodes:\n",
        lab.nodes[me].name
    );
    for node in lab.nodes.iter().take(priorities.len()) {
        yaml.push_str(&format!(
            "      - name: {}\n        address: {}\n        address6: {}\n",
            node.name,
            node.ip,
            node.link_local()
        ));
    }
    yaml.push_str("    priorities:\n");
    for (node, p) in lab.nodes.iter().zip(priorities) {
        yaml.push_str(&format!("      {}: {p}\n", node.name));
    }
    yaml.push_str(&format!("    vips:\n      - address: {VIP4}\n      - address: {VIP6}\n"));
    yaml
}

fn lab_with_agents(nodes: usize, priorities: &[u8], extra: &str) -> (Lab, Vec<Agent>) {
    let mut lab = Lab::new(nodes);
    lab.enable_ipv6();
    let agents = (0..nodes)
        .map(|i| {
            lab.enable_native_xdp(i);
            let mut agent = lab.start_agent(i, &dual_stack_group(&lab, i, priorities, extra));
            agent.wait_ready();
            agent
        })
        .collect();
    (lab, agents)
}

/// Polls until Neighbor Discovery for `vip` is answered with `node`'s MAC, or panics.
fn wait_owner6(lab: &Lab, node: usize, agents: &[Agent]) {
    let expected = lab.nodes[node].mac_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = lab.client.ndisc(VIP6);
        if answer.as_deref() == Some(expected.as_str()) {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = agents.iter().map(|a| a.log_text()).collect();
            panic!("{VIP6} answered by {answer:?}, expected {expected}\n{}", logs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_tcp6(lab: &Lab, node: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.client.tcp_read(VIP6, PORT) != lab.nodes[node].name {
        assert!(Instant::now() < deadline, "TCP to {VIP6} never reached {}", lab.nodes[node].name);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replies among ping's summary ("N received").
fn received(ping: &std::process::Output) -> u32 {
    let text = String::from_utf8_lossy(&ping.stdout);
    let line = text.lines().find(|l| l.contains(" received")).unwrap_or_else(|| panic!("ping said {text}"));
    line.split(", ").find_map(|p| p.strip_suffix(" received")?.trim().parse().ok()).unwrap()
}

#[test]
fn ipv6_election_hard_failover_under_ping_and_graceful_stop() {
    let (lab, mut agents) = lab_with_agents(3, &[200, 150, 100], "    vipMode: both\n");
    let servers: Vec<_> = lab.nodes.iter().map(|n| n.serve_name6(PORT)).collect();
    wait_owner6(&lab, 0, &agents);
    wait_tcp6(&lab, 0);
    // Both families' instances run side by side under one VRID, each with its own state.
    for family in ["ipv4", "ipv6"] {
        agents[0].wait_metric(
            &format!(r#"lbagent_vrrp_state{{group="web",vrid="10",family="{family}",state="master"}}"#),
            1.0,
        );
        agents[1].wait_metric(
            &format!(r#"lbagent_vrrp_state{{group="web",vrid="10",family="{family}",state="backup"}}"#),
            1.0,
        );
    }
    agents[1].wait_metric(
        &format!(
            r#"lbagent_vrrp_master{{group="web",vrid="10",family="ipv6",master="{}"}}"#,
            lab.nodes[0].link_local()
        ),
        1.0,
    );
    assert_eq!(lab.client.arping(VIP4, 1), vec![lab.nodes[0].mac_string()]);
    assert!(lab.client.output_ok(&["ping", "-c", "2", "-i", "0.05", "-W", "1", &VIP6.to_string()]));
    assert!(agents[0].metric(r#"lbagent_xdp_reason_packets_total{reason="ndp_advertised"}"#) >= 1.0);
    // `vipMode: both`: the kernel holds the /128 too, added without DAD.
    let addresses = lab.nodes[0].ns.output(&["ip", "-6", "addr", "show", "dev", "eth0"]);
    let addresses = String::from_utf8_lossy(&addresses.stdout);
    assert!(addresses.contains(&format!("{VIP6}/128")) && !addresses.contains("tentative"), "{addresses}");

    // Hard failure of the master under ping every 2 ms: the backup takes over, the client
    // follows its unsolicited Neighbor Advertisement, and the pings come back.
    let ping = lab.client.ping_every(IpAddr::V6(VIP6), "0.002", 1500);
    std::thread::sleep(Duration::from_millis(500));
    lab.cut(0);
    agents[0].kill();
    wait_owner6(&lab, 1, &agents);
    wait_tcp6(&lab, 1);
    let output = ping.join().unwrap();
    let lost = 1500 - received(&output);
    assert!(lost < 1500 / 2, "the pings never came back: {lost} of 1500 lost");
    agents[1].wait_metric(r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="master"}"#, 1.0);

    // A graceful stop of the new master hands over with no ping lost.
    let ping = lab.client.ping_every(IpAddr::V6(VIP6), "0.005", 500);
    std::thread::sleep(Duration::from_millis(600));
    agents[1].signal(libc::SIGTERM);
    assert!(agents[1].wait_exit(Duration::from_secs(10)).success());
    let output = ping.join().unwrap();
    assert_eq!(received(&output), 500, "{}", String::from_utf8_lossy(&output.stdout));
    wait_owner6(&lab, 2, &agents);
    drop(servers);
}

#[test]
fn neighbor_solicitations_for_the_vip_are_answered_and_broken_ones_never_are() {
    let (lab, agents) = lab_with_agents(2, &[200, 100], "");
    wait_owner6(&lab, 0, &agents);
    let client = &lab.client;
    let good = neighbor_solicitation(client.mac, client.global6(), VIP6);
    let broken = |at: usize, value: u8| {
        let mut frame = good.clone();
        frame[at] = value;
        frame
    };
    let other = neighbor_solicitation(
        client.mac,
        client.global6(),
        Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x99),
    );
    // An echo request straight to the VIP's owner, ICMPv6 checksummed.
    let body = [0, 1, 0, 1, b'x'];
    let echo = ipv6_frame(
        client.mac,
        lab.nodes[0].mac,
        client.global6(),
        VIP6,
        64,
        58,
        &icmpv6(128, 0, &body, client.global6(), VIP6),
    );
    let hostile = vec![
        broken(21, 64),           // hop limit 64
        broken(57, good[57] ^ 1), // checksum
        broken(79, 0),            // option of length zero
        broken(19, 30),           // an option cut short (30-byte message)
    ];
    let malformed = r#"lbagent_xdp_reason_packets_total{reason="malformed_ndp"}"#;
    let before = agents[0].metric(malformed);
    let frames = send_and_capture(client.ns.name(), "eth0", hostile.clone(), Duration::from_millis(400));
    assert!(
        neighbor_advertisements(&frames).iter().all(|na| na.3 != VIP6),
        "a malformed solicitation was answered"
    );
    agents[0].wait_metric(malformed, before + hostile.len() as f64);

    let frames =
        send_and_capture(client.ns.name(), "eth0", vec![good, other, echo], Duration::from_millis(400));
    let answers = neighbor_advertisements(&frames);
    // One advertisement, from the master: to the client, Solicited and Override, its MAC.
    assert_eq!(answers, vec![(client.mac, VIP6, 0x60, VIP6, lab.nodes[0].mac)], "{frames:02x?}");
    let echo_replies = frames
        .iter()
        .filter(|f| f.len() > 54 && f[12..14] == [0x86, 0xdd] && f[20] == 58 && f[54] == 129)
        .count();
    assert_eq!(echo_replies, 1, "the echo request is answered once");
}

/// keepalived 2.2.7 speaking VRRPv3 over IPv6 on n1 and lb-agent on n0 share one VRID, in
/// both directions, each taking over when the other fails.
#[test]
fn interop_with_keepalived_over_ipv6() {
    for (agent_priority, keepalived_priority) in [(200u8, 100u8), (100, 200)] {
        let mut lab = Lab::new(2);
        lab.enable_ipv6();
        lab.enable_native_xdp(0);
        let mut keepalived = lab.start_keepalived(
            1,
            &format!(
                "global_defs {{\n  router_id n1\n}}\nvrrp_instance web6 {{\n  state BACKUP\n  interface eth0\n  \
                 virtual_router_id {VRID}\n  priority {keepalived_priority}\n  advert_int 0.05\n  version 3\n  \
                 native_ipv6\n  virtual_ipaddress {{\n    {VIP6}/128\n  }}\n}}\n",
            ),
        );
        let config = dual_stack_group(&lab, 0, &[agent_priority, keepalived_priority], "")
            .replace(&format!("      - address: {VIP4}\n"), "");
        let mut agent = lab.start_agent(0, &config);
        agent.wait_ready();
        let agents = [agent];
        let (winner, loser) = if agent_priority > keepalived_priority { (0, 1) } else { (1, 0) };
        wait_owner6(&lab, winner, &agents);
        // …and the other side agrees: no split brain.
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..3 {
            assert_eq!(lab.client.ndisc(VIP6), Some(lab.nodes[winner].mac_string()));
        }
        if winner == 1 {
            agents[0].wait_metric(
                &format!(
                    r#"lbagent_vrrp_master{{group="web",vrid="10",family="ipv6",master="{}"}}"#,
                    lab.nodes[1].link_local()
                ),
                1.0,
            );
        }
        lab.cut(winner);
        let [mut agent] = agents;
        if winner == 0 {
            agent.kill()
        } else {
            keepalived.kill()
        }
        wait_owner6(&lab, loser, std::slice::from_ref(&agent));
        if loser == 0 {
            agent.wait_metric(
                r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="master"}"#,
                1.0,
            );
        }
    }
}

/// VRRPv3 over IPv6 unicast: adverts to each peer's link-local address, through the group's
/// interface; the backup takes over when the master goes.
#[test]
fn ipv6_unicast_election_and_failover() {
    let (lab, mut agents) = lab_with_agents(2, &[200, 100], "    transport: unicast\n");
    wait_owner6(&lab, 0, &agents);
    agents[1].wait_metric(r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="backup"}"#, 1.0);
    // The backup hears the master's unicast adverts, ten every half second.
    let received = r#"lbagent_vrrp_adverts_received_total{group="web",vrid="10",family="ipv6"}"#;
    let before = agents[1].metric(received);
    std::thread::sleep(Duration::from_millis(500));
    assert!(agents[1].metric(received) >= before + 5.0, "{}", agents[1].metrics());
    lab.cut(0);
    agents[0].kill();
    wait_owner6(&lab, 1, &agents);
    agents[1].wait_metric(r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="master"}"#, 1.0);
}

/// The master's uplink loses its carrier for a second: the backup takes the IPv6 VIP, and once
/// the link is back the preferred master takes it back and announces it again with an
/// unsolicited Neighbor Advertisement, its link-local address (and so its adverts) intact.
#[test]
fn an_ipv6_uplink_flap_ends_with_one_owner_announced_again() {
    let (lab, agents) = lab_with_agents(2, &[200, 100], "");
    wait_owner6(&lab, 0, &agents);
    lab.cut(0);
    std::thread::sleep(Duration::from_secs(1));
    agents[1].wait_metric(r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="master"}"#, 1.0);
    let client = lab.client.ns.name().to_owned();
    let capture =
        std::thread::spawn(move || send_and_capture(&client, "eth0", vec![], Duration::from_millis(1500)));
    std::thread::sleep(Duration::from_millis(100));
    lab.restore(0);
    let frames = capture.join().unwrap();
    wait_owner6(&lab, 0, &agents);
    agents[1].wait_metric(r#"lbagent_vrrp_state{group="web",vrid="10",family="ipv6",state="backup"}"#, 1.0);
    let announced = neighbor_advertisements(&frames)
        .into_iter()
        .filter(|na| na.1 == VIP6 && na.3 == VIP6 && na.4 == lab.nodes[0].mac && na.2 & 0x20 != 0)
        .count();
    assert!(announced >= 1, "n0 announces the VIP again once its link is back:\n{}", agents[0].log_text());
    for _ in 0..3 {
        assert_eq!(lab.client.ndisc(VIP6), Some(lab.nodes[0].mac_string()), "one owner");
    }
}

/// An `address6` the node does not have is the config's mistake: the agent exits 64 before it
/// attaches anything, naming the field and the address.
#[test]
fn an_ipv6_address_the_node_lacks_is_refused_with_its_field() {
    let mut lab = Lab::new(2);
    lab.enable_ipv6();
    let config = dual_stack_group(&lab, 0, &[200, 100], "")
        .replace(&format!("address6: {}\n", lab.nodes[0].link_local()), "address6: fe80::99\n");
    let mut agent = lab.start_agent(0, &config);
    let status = agent.wait_exit(Duration::from_secs(10));
    let log = agent.log_text();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("groups[0].nodes[0].address6") && log.contains("fe80::99"), "{log}");
}

/// A host on the segment sends IPv6 adverts with the master's link-local address from its own
/// MAC: the backup's data plane sees the master's address from another MAC while the master's
/// is live, and its agent counts and logs it per member, as for IPv4.
#[test]
fn an_impersonated_ipv6_member_is_counted_and_logged() {
    use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V6};
    let (lab, agents) = lab_with_agents(2, &[200, 100], "");
    wait_owner6(&lab, 0, &agents);
    let master = lab.nodes[0].link_local();
    let spoofed =
        Advertisement { vrid: VRID, priority: 254, max_adver_int_cs: 5, addresses: vec![VIP6.into()] }
            .encode(master, VRRP_MULTICAST_V6, ChecksumMode::Rfc);
    let frame = ipv6_frame(
        lab.client.mac,
        [0x33, 0x33, 0, 0, 0, 0x12],
        master,
        VRRP_MULTICAST_V6,
        255,
        112,
        &spoofed,
    );
    for _ in 0..10 {
        send_and_capture(lab.client.ns.name(), "eth0", vec![frame.clone(); 2], Duration::from_millis(20));
    }
    let sample = format!(r#"lbagent_vrrp_impersonated_adverts_total{{member="{master}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while agents[1].metric(&sample) == 0.0 {
        assert!(Instant::now() < deadline, "{sample} never counted:\n{}", agents[1].log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agents[1].log_text();
    assert!(log.contains("impersonating") && log.contains(&master.to_string()), "{log}");
    assert_eq!(lab.client.ndisc(VIP6), Some(lab.nodes[0].mac_string()), "the master held");
}

/// A crashed run leaves its IPv6 VIP (`vipMode: both`) on the uplink; the next start removes
/// it, and only it.
#[test]
fn start_up_removes_ipv6_vip_addresses_left_by_a_crash() {
    let (lab, mut agents) = lab_with_agents(1, &[200], "    vipMode: both\n");
    let addresses = || {
        let out = lab.nodes[0].ns.run_cmd(&["ip", "-6", "addr", "show", "dev", "eth0"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    lab.nodes[0].ns.run_cmd(&["ip", "-6", "addr", "add", "2001:db8:6::200/128", "dev", "eth0", "nodad"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !addresses().contains(&format!("{VIP6}/128")) {
        assert!(Instant::now() < deadline, "the VIP never reached the uplink:\n{}", addresses());
        std::thread::sleep(Duration::from_millis(50));
    }
    agents[0].kill();
    assert!(addresses().contains(&format!("{VIP6}/128")), "the crash left the VIP behind");

    let mut agent = lab.start_agent(0, &format!("interface: eth0\nlisten: {AGENT_LISTEN}\n"));
    agent.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(5);
    while addresses().contains(&format!("{VIP6}/128")) {
        assert!(Instant::now() < deadline, "stale VIP never removed:\n{}", addresses());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(addresses().contains("2001:db8:6::200/128"), "an operator's address is never touched");
    assert!(addresses().contains(&lab.nodes[0].link_local().to_string()), "nor the link-local");
}

/// A Neighbor Solicitation goes to the target's solicited-node group, and a switch that
/// snoops MLD forwards it only to ports that joined that group. The kernel of a node in
/// `vipMode: xdp` does not hold the VIP, so the agent joins the group for the master (MLD
/// reports go out as for any joined group) and leaves it when it stops owning the VIP: the
/// group is on the master's interface only, before and after a failover.
#[test]
fn the_master_joins_its_ipv6_vips_solicited_node_group() {
    let (lab, agents) = lab_with_agents(2, &[200, 100], "");
    let group = "ff02::1:ff00:10";
    let joined = |node: usize| {
        let out = lab.nodes[node].ns.run_cmd(&["ip", "-6", "maddr", "show", "dev", "eth0"]);
        String::from_utf8_lossy(&out.stdout).contains(group)
    };
    let wait_joined = |node: usize, expected: bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while joined(node) != expected {
            assert!(Instant::now() < deadline, "n{node} joined {group}: expected {expected}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_owner6(&lab, 0, &agents);
    wait_joined(0, true);
    wait_joined(1, false);

    // The backup takes over and joins; the old master, back, takes over again (preemption),
    // and the backup leaves.
    lab.cut(0);
    std::thread::sleep(Duration::from_millis(400));
    wait_owner6(&lab, 1, &agents);
    wait_joined(1, true);
    lab.restore(0);
    wait_owner6(&lab, 0, &agents);
    wait_joined(1, false);
    wait_joined(0, true);
}
