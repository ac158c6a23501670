//! VRRP with real packets: three lab nodes run lb-agent (and, for interop, keepalived), and the
//! client checks who answers for each VIP — by ARP or Neighbor Discovery, ping and TCP.
//!
//! The scenarios both families share take the family as a parameter and run once per family
//! (IPv6: VRRPv3 over link-local members, an IPv4 and an IPv6 VIP under one VRID, see
//! `lb_lab::election`); the rest are IPv4's, and `ipv6_lab.rs` holds IPv6's own.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6};
use lb_lab::{
    Agent, Lab,
    agent::AGENT_LISTEN,
    election::{self, PORT, VRID, announcements, master_sample, member, start_all, state_sample},
    family::{IpFamily, LabFamily, ip_frame},
    packet::{multicast_mac, send_and_capture},
};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// The IPv4 group of [`election::manual_group`].
fn manual_group(lab: &Lab, me: usize, priorities: &[u8], extra: &str) -> String {
    election::manual_group(lab, me, priorities, extra, IpFamily::V4)
}

fn wait_owner(lab: &Lab, vip: impl Into<IpAddr>, node: usize, agents: &[Agent]) {
    election::wait_owner(lab, vip.into(), node, agents)
}

/// A lab of `nodes` nodes, with IPv6 on every host for family IPv6.
fn lab_in(f: IpFamily, nodes: usize) -> Lab {
    let mut lab = Lab::new(nodes);
    if f == IpFamily::V6 {
        lab.enable_ipv6();
    }
    lab
}

fn election_failover_and_preemption_multicast(f: IpFamily) {
    election_failover_and_preemption(f, "");
}

fn election_failover_and_preemption_unicast(f: IpFamily) {
    election_failover_and_preemption(f, "    transport: unicast\n");
}

lb_lab::for_each_family!(
    election_failover_and_preemption_multicast,
    election_failover_and_preemption_unicast,
    graceful_stop_loses_no_ping,
    a_killed_masters_data_plane_gives_its_vip_up,
    a_frozen_master_gives_its_vip_up_and_rejoins_as_backup,
    an_uplink_flap_ends_with_one_owner_announced_again,
    interop_with_keepalived,
    start_up_removes_vip_addresses_left_by_a_crash,
    an_impersonated_member_is_counted_and_logged,
);

/// Three nodes: n0 (priority 200) is elected and answers address resolution, ping and TCP for
/// the VIP; the backups hear it (unicast: each advert sent to each peer); it fails hard and
/// n1 takes over; it comes back and takes its VIP back (preemption).
fn election_failover_and_preemption(f: IpFamily, transport: &str) {
    let mut lab = lab_in(f, 3);
    let servers: Vec<_> = lab
        .nodes
        .iter()
        .map(|n| if f == IpFamily::V6 { n.serve_name6(PORT) } else { n.serve_name(PORT) })
        .collect();
    // The kernel holds the VIP too (IPv4's group has `vipMode: both` already), so the nodes'
    // own TCP servers answer on it.
    let extra = format!("{transport}{}", f.pick("", "    vipMode: both\n"));
    let group = |lab: &Lab, i: usize| election::manual_group(lab, i, &[200, 150, 100], &extra, f);
    let mut agents = start_all(&mut lab, group);
    let vip = f.vip();

    wait_owner(&lab, vip, 0, &agents);
    election::wait_tcp(&lab, vip, 0);
    let ping = lab.client.ns.output(&["ping", "-c", "3", "-i", "0.05", "-W", "1", &vip.to_string()]);
    assert!(
        ping.status.success(),
        "{}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    agents[0].wait_metric(&state_sample(f, "master"), 1.0);
    agents[1].wait_metric(&state_sample(f, "backup"), 1.0);
    agents[1].wait_metric(&master_sample(f, member(&lab, 0, f)), 1.0);
    // The backup hears the master's adverts, ten every half second.
    let received = format!(
        r#"lbagent_vrrp_adverts_received_total{{group="web",vrid="{VRID}",family="{}"}}"#,
        f.as_str()
    );
    let before = agents[1].metric(&received);
    std::thread::sleep(Duration::from_millis(500));
    assert!(agents[1].metric(&received) >= before + 5.0, "{}", agents[1].metrics());

    // Hard failure of the master: its port goes down, then it dies.
    lab.cut(0);
    agents[0].kill();
    wait_owner(&lab, vip, 1, &agents);
    election::wait_tcp(&lab, vip, 1);
    agents[1].wait_metric(&state_sample(f, "master"), 1.0);

    // The preferred node returns and takes its VIP back.
    lab.restore(0);
    let mut returned = lab.start_agent(0, &group(&lab, 0));
    returned.wait_ready();
    agents[0] = returned;
    wait_owner(&lab, vip, 0, &agents);
    election::wait_tcp(&lab, vip, 0);
    agents[1].wait_metric(&state_sample(f, "backup"), 1.0);
    drop(servers);
}

/// Pings to the VIP, one every 5 ms, under way.
struct PingStream {
    ping: std::thread::JoinHandle<std::process::Output>,
    sent: u32,
}

impl PingStream {
    fn output(self) -> std::process::Output {
        self.ping.join().unwrap()
    }

    /// Waits for the last ping; how many replies never came.
    fn lost(self) -> u32 {
        let sent = self.sent;
        sent - lb_lab::ping_counts(&self.output()).1 as u32
    }
}

/// Two nodes with `extra` group settings, n0 the master, and `count` pings under way.
fn two_nodes_under_ping(extra: &str, count: u32) -> (Lab, Vec<Agent>, PingStream) {
    two_nodes_under_ping_in(IpFamily::V4, extra, count)
}

/// As [`two_nodes_under_ping`], the group and the pings in family `f`.
fn two_nodes_under_ping_in(f: IpFamily, extra: &str, count: u32) -> (Lab, Vec<Agent>, PingStream) {
    let mut lab = lab_in(f, 2);
    let agents = start_all(&mut lab, |lab, i| election::manual_group(lab, i, &[200, 100], extra, f));
    wait_owner(&lab, f.vip(), 0, &agents);
    // Warm the client's neighbour entry.
    assert!(lab.client.output_ok(&["ping", "-c", "1", "-W", "1", &f.vip().to_string()]));
    let ping = PingStream { ping: lab.client.ping_every(f.vip(), "0.005", count), sent: count };
    (lab, agents, ping)
}

/// SIGTERM to the master under a ping every 5 ms: it resigns, the backup takes over at once,
/// and no reply is lost.
fn graceful_stop_loses_no_ping(f: IpFamily) {
    let (lab, mut agents, ping) = two_nodes_under_ping_in(f, "", 600);
    std::thread::sleep(Duration::from_millis(800));
    agents[0].signal(libc::SIGTERM);
    let status = agents[0].wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{}", agents[0].log_text());
    let out = ping.output();
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("600 packets transmitted, 600 received"), "{summary}\n{}", agents[0].log_text());
    wait_owner(&lab, f.vip(), 1, &agents);
    assert!(agents[0].log_text().contains("successor heard"), "{}", agents[0].log_text());
}

/// Asserts that `node` alone answers address resolution for `vip`, several times over.
fn only_owner(lab: &Lab, vip: IpAddr, node: usize) {
    for _ in 0..3 {
        assert_eq!(election::answering(lab, vip, 2), vec![lab.nodes[node].mac_string(); 2]);
    }
}

/// The master's agent dies (SIGKILL, as on an OOM kill) with its link up. Its pinned program
/// stops claiming the VIP when the lease runs out, before the backup takes over, so from then
/// on only the new master answers — instead of both, forever.
fn a_killed_masters_data_plane_gives_its_vip_up(f: IpFamily) {
    let (lab, mut agents, ping) = two_nodes_under_ping_in(f, "", 400);
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    agents[0].kill();
    // Master_Down_Interval (3 × 50 ms + 156/256 × 50 ms) plus one interval: from then on, at
    // most one node answers.
    std::thread::sleep(Duration::from_millis(231).saturating_sub(killed.elapsed()));
    let probe = Instant::now();
    let answering: BTreeSet<String> = election::answering(&lab, f.vip(), 2).into_iter().collect();
    assert!(answering.len() <= 1, "{answering:?} answer after Master_Down_Interval plus an interval");
    // ndisc6 waits out its whole timeout for every answer: its probes are not the takeover's time.
    let probing = probe.elapsed();
    wait_owner(&lab, f.vip(), 1, &agents);
    let converged = killed.elapsed().saturating_sub(probing);
    only_owner(&lab, f.vip(), 1);
    let lost = ping.lost();
    eprintln!("{f:?}: one owner {converged:?} after the SIGKILL; {lost} of 400 replies lost");
    // Master_Down_Interval (3 × 50 ms + skew) and one interval, with room for a busy machine;
    // without leases the dead node answers forever.
    assert!(converged < Duration::from_secs(1), "{converged:?}");
    // The old node served until its lease ran out, the new one from its takeover on.
    assert!(lost <= 40, "{lost} replies lost");
    agents[1].wait_metric(&election::state_sample(f, "master"), 1.0);
}

/// The master's agent freezes (SIGSTOP) for 2 s: its lease runs out, the backup takes over, and
/// exactly one node answers. Resumed, it rejoins as backup: without preemption it leaves the
/// VIP where it is; with preemption it takes it back through the protocol.
fn a_frozen_master_gives_its_vip_up_and_rejoins_as_backup(f: IpFamily) {
    for preempt in [false, true] {
        let (lab, agents, ping) = two_nodes_under_ping_in(f, &format!("    preempt: {preempt}\n"), 1600);
        std::thread::sleep(Duration::from_millis(200));

        agents[0].signal(libc::SIGSTOP);
        let stopped = Instant::now();
        wait_owner(&lab, f.vip(), 1, &agents);
        assert!(stopped.elapsed() < Duration::from_secs(1), "{:?}", stopped.elapsed());
        only_owner(&lab, f.vip(), 1);
        std::thread::sleep(Duration::from_secs(2).saturating_sub(stopped.elapsed()));
        agents[0].signal(libc::SIGCONT);

        let owner = if preempt { 0 } else { 1 };
        std::thread::sleep(Duration::from_millis(500));
        wait_owner(&lab, f.vip(), owner, &agents);
        only_owner(&lab, f.vip(), owner);
        let log = agents[0].log_text();
        assert!(log.contains("fell silent past its lease"), "{log}");
        let state = if preempt { "master" } else { "backup" };
        agents[0].wait_metric(&election::state_sample(f, state), 1.0);
        let expiries = format!(r#"lbagent_vip_lease_expiries_total{{vrid="10",family="{}"}}"#, f.as_str());
        assert!(agents[0].metric(&expiries) >= 1.0, "{}", agents[0].metrics());
        // The frozen node's data plane answered until its lease ran out, the backup from its
        // takeover on: the gap is Master_Down_Interval less the lease, plus the address update.
        let lost = ping.lost();
        eprintln!("{f:?}, preempt {preempt}: {lost} of 1600 replies lost across the freeze and the resume");
        assert!(lost <= 60, "preempt {preempt}: {lost} replies lost");
    }
}

/// The master's uplink flaps (down 1 s, up). The backup takes over meanwhile; once the link is
/// back, the preferred node announces its VIP again (the backup may yield on hearing it
/// without it ever hearing the backup), and exactly one node answers.
fn an_uplink_flap_ends_with_one_owner_announced_again(f: IpFamily) {
    let (lab, agents, ping) = two_nodes_under_ping_in(f, "", 1000);
    std::thread::sleep(Duration::from_millis(200));
    lab.cut(0);
    std::thread::sleep(Duration::from_secs(1));
    agents[1].wait_metric(&state_sample(f, "master"), 1.0);
    let client = lab.client.ns.name().to_owned();
    let capture =
        std::thread::spawn(move || send_and_capture(&client, "eth0", vec![], Duration::from_millis(1500)));
    std::thread::sleep(Duration::from_millis(100));
    lab.restore(0);
    let frames = capture.join().unwrap();
    wait_owner(&lab, f.vip(), 0, &agents);
    only_owner(&lab, f.vip(), 0);
    agents[1].wait_metric(&state_sample(f, "backup"), 1.0);
    let log = agents[0].log_text();
    let announced = announcements(&frames, f.vip(), lab.nodes[0].mac);
    assert!(announced >= 1, "n0 announces the VIP again once its link is back:\n{log}");
    assert!(
        log.contains("the uplink lost its link") && log.contains("the uplink has its link again"),
        "{log}"
    );
    // Lost: until the backup takes over and its announcements land (Master_Down_Interval),
    // and nothing once the link is back.
    let lost = ping.lost();
    eprintln!("{}: {lost} of 1000 replies lost across the flap", f.as_str());
    assert!(lost <= 100, "{lost} replies lost");
}

/// `garp.refresh`: while it stays master, the owner announces its VIP again every period, and
/// only the owner does.
#[test]
fn the_master_refreshes_its_gratuitous_arps() {
    let mut lab = Lab::new(2);
    let garp = "    garp: {count: 1, refresh: 200ms}\n";
    let agents = start_all(&mut lab, |lab, i| manual_group(lab, i, &[200, 100], garp));
    wait_owner(&lab, VIP, 0, &agents);
    std::thread::sleep(Duration::from_millis(300));
    let frames = send_and_capture(lab.client.ns.name(), "eth0", vec![], Duration::from_millis(1100));
    let announcers: Vec<[u8; 6]> = frames
        .iter()
        .filter(|f| f.len() >= 42 && f[12..14] == [0x08, 0x06])
        .filter(|f| f[28..32] == VIP.octets() && f[38..42] == VIP.octets())
        .map(|f| <[u8; 6]>::try_from(&f[6..12]).unwrap())
        .collect();
    // 1.1 s at one announcement per 200 ms: five, give or take one at either edge.
    assert!((4..=7).contains(&announcers.len()), "{} announcements", announcers.len());
    assert!(announcers.iter().all(|mac| *mac == lab.nodes[0].mac), "only the master announces");
}

/// keepalived 2.2.7 on n1 and lb-agent on n0 share one VRID (IPv6: VRRPv3 over IPv6,
/// `native_ipv6`), in both directions, each taking over when the other fails.
fn interop_with_keepalived(f: IpFamily) {
    let vip = f.vip();
    for (agent_priority, keepalived_priority) in [(200u8, 100u8), (100, 200)] {
        let mut lab = lab_in(f, 2);
        lab.enable_native_xdp(0);
        let (native_ipv6, prefix) = f.pick(("", 32), ("  native_ipv6\n", 128));
        let mut keepalived = lab.start_keepalived(
            1,
            &format!(
                "global_defs {{\n  router_id n1\n}}\nvrrp_instance web {{\n  state BACKUP\n  interface eth0\n  \
                 virtual_router_id {VRID}\n  priority {keepalived_priority}\n  advert_int 0.05\n  version 3\n\
                 {native_ipv6}  virtual_ipaddress {{\n    {vip}/{prefix}\n  }}\n}}\n",
            ),
        );
        // IPv6: the agent's group has the IPv6 VIP alone, as keepalived's instance has.
        let config = election::manual_group(&lab, 0, &[agent_priority, keepalived_priority], "", f);
        let config = match f {
            IpFamily::V4 => config,
            IpFamily::V6 => config.replace(&format!("      - address: {}\n", IpFamily::V4.vip()), ""),
        };
        let mut agent = lab.start_agent(0, &config);
        agent.wait_ready();
        let agents = [agent];

        let (winner, loser) = if agent_priority > keepalived_priority { (0, 1) } else { (1, 0) };
        wait_owner(&lab, vip, winner, &agents);
        // …and the other side agrees: no split brain.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(election::answering(&lab, vip, 2), vec![lab.nodes[winner].mac_string(); 2]);
        if winner == 1 {
            agents[0].wait_metric(&master_sample(f, member(&lab, 1, f)), 1.0);
        }

        // Hard failure of the winner; the other takes over.
        lab.cut(winner);
        let [mut agent] = agents;
        if winner == 0 {
            agent.kill()
        } else {
            keepalived.kill()
        }
        wait_owner(&lab, vip, loser, std::slice::from_ref(&agent));
        if loser == 0 {
            agent.wait_metric(&state_sample(f, "master"), 1.0);
        }
    }
}

/// A spread group: one Service's three VIPs land on three different nodes.
#[test]
fn spread_gives_each_vip_of_a_service_its_own_node() {
    let vips =
        [Ipv4Addr::new(198, 51, 100, 20), Ipv4Addr::new(198, 51, 100, 21), Ipv4Addr::new(198, 51, 100, 22)];
    let mut lab = Lab::new(3);
    let agents = start_all(&mut lab, |lab, me| {
        let mut yaml = format!(
            "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: spread\n    advertInterval: 50ms\n    nodes:\n",
            lab.nodes[me].name
        );
        for node in &lab.nodes {
            yaml.push_str(&format!("      - name: {}\n        address: {}\n", node.name, node.ip));
        }
        yaml.push_str("    vips:\n");
        for vip in vips {
            yaml.push_str(&format!("      - address: {vip}\n        service: default/web\n"));
        }
        yaml
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let owners: Vec<Vec<String>> = vips.iter().map(|v| lab.client.arping(*v, 1)).collect();
        let mut macs: Vec<String> = owners.iter().filter(|o| o.len() == 1).map(|o| o[0].clone()).collect();
        macs.sort();
        macs.dedup();
        if macs.len() == 3 {
            let node_macs: Vec<String> = lab.nodes.iter().map(|n| n.mac_string()).collect();
            assert!(macs.iter().all(|m| node_macs.contains(m)), "{macs:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "owners {owners:?}\n{}",
            agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two nodes in the manual group, n0 preferred and already answering for the VIP.
fn two_nodes_n0_owning() -> (Lab, Vec<Agent>) {
    let mut lab = Lab::new(2);
    let agents = start_all(&mut lab, |lab, i| manual_group(lab, i, &[200, 100], ""));
    wait_owner(&lab, VIP, 0, &agents);
    (lab, agents)
}

/// A VRRP datagram from the lab client to 224.0.0.18, with `src` as its IPv4 source.
fn advert_from_client(lab: &Lab, src: Ipv4Addr, ttl: u8, payload: &[u8]) -> Vec<u8> {
    let macs = (lab.client.mac, multicast_mac(VRRP_MULTICAST_V4));
    ip_frame(macs, src.into(), VRRP_MULTICAST_V4.into(), ttl, 112, payload)
}

/// Hostile advertisements on the segment are dropped and counted, and the master holds.
#[test]
fn hostile_advertisements_are_dropped_and_counted() {
    let (lab, agents) = two_nodes_n0_owning();
    let client = &lab.client;
    let member = lab.nodes[1].ip;
    let advert = |vrid: u8, priority: u8| Advertisement {
        vrid,
        priority,
        max_adver_int_cs: 100,
        addresses: vec![VIP.into()],
    };
    let frame = |src: Ipv4Addr, ttl: u8, payload: &[u8]| advert_from_client(&lab, src, ttl, payload);
    let good = |src: Ipv4Addr, vrid: u8, priority: u8| {
        advert(vrid, priority).encode(src, VRRP_MULTICAST_V4, ChecksumMode::Rfc)
    };
    let mut bad_checksum = good(member, VRID, 254);
    bad_checksum[7] ^= 0xff;
    let mut version2 = good(member, VRID, 254);
    version2[0] = 0x21;
    let hostile = vec![
        // A rogue on the segment claiming priority 254: not a member.
        frame(client.ip, 255, &good(client.ip, VRID, 254)),
        // A member's address, but TTL 64: it crossed a router.
        frame(member, 64, &good(member, VRID, 254)),
        frame(member, 255, &bad_checksum),
        frame(member, 255, &version2),
        frame(member, 255, &good(member, 99, 254)),
        frame(member, 255, &good(member, VRID, 254)[..10]),
    ];
    for _ in 0..5 {
        send_and_capture(client.ns.name(), "eth0", hostile.clone(), Duration::from_millis(60));
    }
    let dropped = |reason: &str, vrid: &str| {
        agents[0].metric(&format!(
            r#"lbagent_vrrp_adverts_dropped_total{{vrid="{vrid}",family="ipv4",reason="{reason}"}}"#
        ))
    };
    assert_eq!(dropped("not_member", "10"), 5.0);
    assert_eq!(dropped("bad_ttl", "10"), 5.0);
    assert_eq!(dropped("bad_checksum", "10"), 5.0);
    assert_eq!(dropped("bad_version", "10"), 5.0);
    assert_eq!(dropped("unknown_vrid", "99"), 5.0);
    assert_eq!(dropped("bad_count", "10"), 5.0);
    // The master never wavered.
    assert_eq!(
        agents[0].metric(
            r#"lbagent_vrrp_transitions_total{group="web",vrid="10",family="ipv4",from="master",to="backup"}"#
        ),
        0.0
    );
    assert_eq!(lab.client.arping(VIP, 2), vec![lab.nodes[0].mac_string(); 2]);
}

fn uplink_addresses(lab: &Lab, node: usize, f: IpFamily) -> String {
    let out = lab.nodes[node].ns.run_cmd(&["ip", f.pick("-4", "-6"), "addr", "show", "dev", "eth0"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A crashed run leaves its VIP address (`vipMode: both`) on the uplink; the next start
/// removes it, and only it: an operator's address and (IPv6) the link-local stay.
fn start_up_removes_vip_addresses_left_by_a_crash(f: IpFamily) {
    let mut lab = lab_in(f, 1);
    lab.enable_native_xdp(0);
    let (operators, held) = f.pick(
        ("198.51.100.200/32".to_owned(), format!("{}/32", f.vip())),
        ("2001:db8:6::200/128".to_owned(), format!("{}/128", f.vip())),
    );
    lab.nodes[0].ns.run_cmd(&["ip", "addr", "add", &operators, "dev", "eth0", "nodad"]);
    let mut agent =
        lab.start_agent(0, &election::manual_group(&lab, 0, &[200], f.pick("", "    vipMode: both\n"), f));
    agent.wait_ready();
    wait_owner(&lab, f.vip(), 0, std::slice::from_ref(&agent));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !uplink_addresses(&lab, 0, f).contains(&held) {
        assert!(
            Instant::now() < deadline,
            "the VIP never reached the uplink:\n{}",
            uplink_addresses(&lab, 0, f)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.kill();
    assert!(uplink_addresses(&lab, 0, f).contains(&held), "the crash left the VIP behind");

    let mut agent = lab.start_agent(0, &format!("interface: eth0\nlisten: {AGENT_LISTEN}\n"));
    agent.wait_ready();
    let addresses = uplink_addresses(&lab, 0, f);
    assert!(!addresses.contains(&held), "stale VIP removed:\n{addresses}");
    assert!(addresses.contains(&operators), "an operator's address is never touched:\n{addresses}");
    if f == IpFamily::V6 {
        assert!(
            addresses.contains(&lab.nodes[0].link_local().to_string()),
            "nor the link-local:\n{addresses}"
        );
    }
    assert!(agent.log_text().contains("VIP addresses updated"), "{}", agent.log_text());
}

/// A host on the segment sends advertisements with the master's address (priority 254): the
/// backup's XDP sees that address from another MAC than the master's own, and the master's XDP
/// sees its own address come in on that uplink (IPv4's kernel drops it as a martian, IPv6's
/// router as its own advert, so only XDP can tell). Both count it per member, log it, and the
/// master holds.
fn an_impersonated_member_is_counted_and_logged(f: IpFamily) {
    let mut lab = lab_in(f, 2);
    let agents = start_all(&mut lab, |lab, i| election::manual_group(lab, i, &[200, 100], "", f));
    wait_owner(&lab, f.vip(), 0, &agents);
    let client = &lab.client;
    let master = member(&lab, 0, f);
    let (group, group_mac): (IpAddr, [u8; 6]) = f.pick(
        (VRRP_MULTICAST_V4.into(), multicast_mac(VRRP_MULTICAST_V4)),
        (VRRP_MULTICAST_V6.into(), [0x33, 0x33, 0, 0, 0, 0x12]),
    );
    let spoofed = Advertisement { vrid: VRID, priority: 254, max_adver_int_cs: 5, addresses: vec![f.vip()] }
        .encode(master, group, ChecksumMode::Rfc);
    let frame = ip_frame((client.mac, group_mac), master, group, 255, 112, &spoofed);
    for _ in 0..10 {
        send_and_capture(client.ns.name(), "eth0", vec![frame.clone(); 2], Duration::from_millis(20));
    }
    let sample = format!(r#"lbagent_vrrp_impersonated_adverts_total{{member="{master}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while agents.iter().any(|a| a.metric(&sample) == 0.0) {
        assert!(
            Instant::now() < deadline,
            "{sample}: {:?}\n{}",
            agents.iter().map(|a| a.metric(&sample)).collect::<Vec<_>>(),
            agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The backup: the master's address from the client's MAC while the master's is live.
    let backup_log = agents[1].log_text();
    let client_mac = client.mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    assert!(
        backup_log.contains("impersonating")
            && backup_log.contains(&master.to_string())
            && backup_log.contains(&client_mac),
        "{backup_log}"
    );
    // The master: its own address from another host.
    let master_log = agents[0].log_text();
    assert!(
        master_log.contains("impersonating") && master_log.contains("this node's own address"),
        "{master_log}"
    );
    // Every other member starts at zero, and the master held.
    let other = format!(r#"lbagent_vrrp_impersonated_adverts_total{{member="{}"}}"#, member(&lab, 1, f));
    assert!(agents[0].metrics().contains(&other), "pre-created");
    assert_eq!(agents[0].metric(&other), 0.0);
    assert_eq!(election::answering(&lab, f.vip(), 2), vec![lab.nodes[0].mac_string(); 2]);
}

/// Priority-254 advertisements for the group's VRID with `member`'s address, crafted by scapy
/// on the client (a tool that is not ours), one every 10 ms.
fn scapy_spoof(lab: &Lab, member: Ipv4Addr, count: u32) {
    let mac = lab.client.mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let script = format!(
        r#"
from scapy.all import Ether, IP, sendp
from scapy.layers.vrrp import VRRPv3
frame = (Ether(src="{mac}", dst="01:00:5e:00:00:12")
         / IP(src="{member}", dst="224.0.0.18", ttl=255, proto=112)
         / VRRPv3(vrid={VRID}, priority=254, adv=5, ipcount=1, addrlist=["{VIP}"]))
sendp(frame, iface="eth0", count={count}, inter=0.01, verbose=False)
"#
    );
    // Debian's interpreter, where python3-scapy is installed (not a pyenv one on PATH).
    lab.client.ns.run_cmd(&["/usr/bin/python3", "-c", &script]);
}

fn master_to_backup(agent: &Agent) -> f64 {
    agent.metric(
        r#"lbagent_vrrp_transitions_total{group="web",vrid="10",family="ipv4",from="master",to="backup"}"#,
    )
}

/// A host on the segment sends priority-254 adverts with the backup's address. Without
/// authentication the master steps down for them (the control: the attack works here); with
/// it, they are dropped and counted, no reply is lost, and a genuine advert replayed is dropped.
#[test]
fn with_authentication_a_spoofed_member_costs_no_replies() {
    {
        let (lab, agents, ping) = two_nodes_under_ping("", 400);
        scapy_spoof(&lab, lab.nodes[1].ip, 100);
        let _ = ping.output();
        assert!(
            master_to_backup(&agents[0]) >= 1.0,
            "unauthenticated, the spoof moves the master:\n{}",
            agents[0].log_text()
        );
    }

    let dir = std::env::temp_dir().join(format!("lb-lab-vrrp-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("web");
    // Mid-rotation: both nodes sign with the first key and accept either.
    std::fs::write(&key_file, "0c4b8e2f5a7d9c1e3b6a8f0d2c4e6a8b\n# next\n7f3e1d9b5c2a4e6f8d0b1c3a5e7f9d2b\n")
        .unwrap();
    let extra = format!("    authentication: {{keyFile: {}}}\n", key_file.display());
    let (lab, agents, ping) = two_nodes_under_ping(&extra, 1000);
    scapy_spoof(&lab, lab.nodes[1].ip, 150);
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    assert_eq!(ping.lost(), 0, "{}", logs());
    assert_eq!(master_to_backup(&agents[0]), 0.0, "{}", logs());
    let dropped = |agent: &Agent, reason: &str| {
        agent.metric(&format!(
            r#"lbagent_vrrp_adverts_dropped_total{{vrid="10",family="ipv4",reason="{reason}"}}"#
        ))
    };
    assert_eq!(dropped(&agents[0], "unauthenticated"), 150.0, "{}", agents[0].metrics());
    assert_eq!(agents[0].metric(r#"lbagent_vrrp_authentication_keys{group="web"}"#), 2.0);

    // The master's own advert, captured on the segment and sent again (from the client's MAC,
    // so the switch keeps the master's port): the backup has already accepted it.
    let captured = send_and_capture(lab.client.ns.name(), "eth0", vec![], Duration::from_millis(300));
    let master = lab.nodes[0].ip.octets();
    let mut advert = captured
        .into_iter()
        .find(|f| f.len() > 34 && f[12..14] == [0x08, 0x00] && f[23] == 112 && f[26..30] == master)
        .expect("the master advertises");
    advert[6..12].copy_from_slice(&lab.client.mac);
    for _ in 0..3 {
        send_and_capture(lab.client.ns.name(), "eth0", vec![advert.clone()], Duration::from_millis(20));
    }
    assert!(dropped(&agents[1], "replayed") >= 3.0, "{}", agents[1].metrics());

    // The rotation finishes while both run: the new key signs, then the old one goes. The
    // agents follow the file within a second each time, and the master holds throughout.
    for (step, text) in [
        (2, "7f3e1d9b5c2a4e6f8d0b1c3a5e7f9d2b\n0c4b8e2f5a7d9c1e3b6a8f0d2c4e6a8b\n"),
        (3, "7f3e1d9b5c2a4e6f8d0b1c3a5e7f9d2b\n"),
    ] {
        std::fs::write(&key_file, text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while agents.iter().any(|a| a.log_text().matches("VRRP keys loaded").count() < step) {
            assert!(Instant::now() < deadline, "key file step {step} not followed:\n{}", logs());
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(agents[0].metric(r#"lbagent_vrrp_authentication_keys{group="web"}"#), 1.0);
    assert_eq!(master_to_backup(&agents[0]), 0.0, "{}", logs());
    assert_eq!(dropped(&agents[1], "unknown_key") + dropped(&agents[0], "unknown_key"), 0.0);
    assert_eq!(lab.client.arping(VIP, 2), vec![lab.nodes[0].mac_string(); 2]);
    std::fs::remove_dir_all(&dir).unwrap();
}
