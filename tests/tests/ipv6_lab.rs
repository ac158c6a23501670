//! VRRPv3 over IPv6 and IPv6 VIPs with real packets, what only IPv6 has: lab nodes run lb-agent
//! with an IPv4 and an IPv6 VIP under the same VRID, and the client checks who answers for each
//! by Neighbor Discovery (ndisc6), ARP, ping and TCP. The scenarios IPv4 shares (election,
//! failover, a killed or frozen master, graceful stop, uplink flap, keepalived interop,
//! impersonation, crash leftovers) run for both families in `vrrp_lab.rs`.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use lb_lab::{
    Agent, Lab,
    election::{self, PORT, manual_group},
    family::IpFamily,
    packet::{icmpv6, ipv6_frame, neighbor_advertisements, neighbor_solicitation, send_and_capture},
};

const VIP4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);

/// A manual group with one IPv4 and one IPv6 VIP: two instances, one per family, both VRID 10.
fn dual_stack_group(lab: &Lab, me: usize, priorities: &[u8], extra: &str) -> String {
    manual_group(lab, me, priorities, extra, IpFamily::V6)
}

fn lab_with_agents(nodes: usize, priorities: &[u8], extra: &str) -> (Lab, Vec<Agent>) {
    let mut lab = Lab::new(nodes);
    lab.enable_ipv6();
    let agents = election::start_all(&mut lab, |lab, i| dual_stack_group(lab, i, priorities, extra));
    (lab, agents)
}

/// Polls until Neighbor Discovery for the VIP is answered with `node`'s MAC, or panics.
fn wait_owner6(lab: &Lab, node: usize, agents: &[Agent]) {
    election::wait_owner(lab, VIP6.into(), node, agents)
}

fn wait_tcp6(lab: &Lab, node: usize) {
    election::wait_tcp(lab, VIP6.into(), node)
}

/// Both families' instances of one group run side by side under one VRID, each with its own
/// state; `vipMode: both` has the kernel hold the /128 too. (Election, failover, a killed or
/// frozen master: the shared scenarios in `vrrp_lab.rs`, run for both families.)
#[test]
fn dual_stack_instances_run_side_by_side_under_one_vrid() {
    let (lab, agents) = lab_with_agents(3, &[200, 150, 100], "    vipMode: both\n");
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
