//! What the VRRP labs share, per address family: the group every scenario runs, who answers
//! for its VIP, the metrics' labels, the announcements on the wire. A scenario written against
//! these runs for IPv4 and for IPv6 alike (`vrrp_lab.rs`).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use crate::{
    Agent, Lab,
    agent::AGENT_LISTEN,
    family::{IpFamily, LabFamily},
    packet::neighbor_advertisements,
};

/// The group's VRID (both families' instances use it, each deciding apart).
pub const VRID: u8 = 10;
/// Where each node serves its name over TCP.
pub const PORT: u16 = 8080;

/// A manual (keepalived-style) group `web`: one VRID, explicit priorities for the first
/// `priorities.len()` nodes, advertising every 50 ms. IPv4: the IPv4 VIP, `vipMode: both`.
/// IPv6: members with their link-local addresses too, an IPv4 and an IPv6 VIP, so two
/// instances, one per family, run side by side.
pub fn manual_group(lab: &Lab, me: usize, priorities: &[u8], extra: &str, f: IpFamily) -> String {
    let vip_mode = f.pick("    vipMode: both\n", "");
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n  - name: web\n    vrid: {VRID}\n    \
         advertInterval: 50ms\n{vip_mode}{extra}    nodes:\n",
        lab.nodes[me].name
    );
    for node in lab.nodes.iter().take(priorities.len()) {
        yaml.push_str(&format!("      - name: {}\n        address: {}\n", node.name, node.ip));
        if f == IpFamily::V6 {
            yaml.push_str(&format!("        address6: {}\n", node.link_local()));
        }
    }
    yaml.push_str("    priorities:\n");
    for (node, p) in lab.nodes.iter().zip(priorities) {
        yaml.push_str(&format!("      {}: {p}\n", node.name));
    }
    yaml.push_str(&format!("    vips:\n      - address: {}\n", IpFamily::V4.vip()));
    if f == IpFamily::V6 {
        yaml.push_str(&format!("      - address: {}\n", IpFamily::V6.vip()));
    }
    yaml
}

/// Starts an agent on every node with `config(lab, node)`, each ready, native XDP everywhere.
pub fn start_all(lab: &mut Lab, config: impl Fn(&Lab, usize) -> String) -> Vec<Agent> {
    (0..lab.nodes.len())
        .map(|i| {
            lab.enable_native_xdp(i);
            let mut agent = lab.start_agent(i, &config(lab, i));
            agent.wait_ready();
            agent
        })
        .collect()
}

/// The MACs that answer the client's address resolution for `vip`, `count` times over: ARP
/// replies, or Neighbor Advertisements (every one of each solicitation, so two owners show).
pub fn answering(lab: &Lab, vip: IpAddr, count: u32) -> Vec<String> {
    match vip {
        IpAddr::V4(v4) => lab.client.arping(v4, count),
        IpAddr::V6(v6) => (0..count).flat_map(|_| lab.client.ndisc_all(v6)).collect(),
    }
}

/// Polls until `vip` is answered by `node`'s MAC (and only that MAC), or panics with the logs.
pub fn wait_owner(lab: &Lab, vip: IpAddr, node: usize, agents: &[Agent]) {
    let expected = lab.nodes[node].mac_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let replies = answering(lab, vip, 1);
        if replies == [expected.as_str()] {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = agents.iter().map(|a| a.log_text()).collect();
            panic!(
                "{vip} answered by {replies:?}, expected {expected} ({})\n{}",
                lab.nodes[node].name,
                logs.join("\n----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until TCP to `vip` reaches `node`'s server.
pub fn wait_tcp(lab: &Lab, vip: IpAddr, node: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.client.tcp_read(vip, PORT) != lab.nodes[node].name {
        assert!(Instant::now() < deadline, "TCP to {vip} never reached {}", lab.nodes[node].name);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `node`'s address as a member of the group in family `f`: what it advertises from.
pub fn member(lab: &Lab, node: usize, f: IpFamily) -> IpAddr {
    match f {
        IpFamily::V4 => lab.nodes[node].ip.into(),
        IpFamily::V6 => lab.nodes[node].link_local().into(),
    }
}

/// The `lbagent_vrrp_state` sample of the group's family-`f` instance in `state`.
pub fn state_sample(f: IpFamily, state: &str) -> String {
    format!(r#"lbagent_vrrp_state{{group="web",vrid="{VRID}",family="{}",state="{state}"}}"#, f.as_str())
}

/// The `lbagent_vrrp_master` sample naming `master` for the group's family-`f` instance.
pub fn master_sample(f: IpFamily, master: IpAddr) -> String {
    format!(r#"lbagent_vrrp_master{{group="web",vrid="{VRID}",family="{}",master="{master}"}}"#, f.as_str())
}

/// How many announcements of `vip` from `mac` are among `frames`: gratuitous ARP (sender and
/// target the VIP) or unsolicited Neighbor Advertisements (Override set, the VIP's target).
pub fn announcements(frames: &[Vec<u8>], vip: IpAddr, mac: [u8; 6]) -> usize {
    match vip {
        IpAddr::V4(v4) => frames
            .iter()
            .filter(|f| f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[6..12] == mac)
            .filter(|f| f[28..32] == v4.octets() && f[38..42] == v4.octets())
            .count(),
        IpAddr::V6(v6) => neighbor_advertisements(frames)
            .into_iter()
            .filter(|na| na.1 == v6 && na.3 == v6 && na.4 == mac && na.2 & 0x20 != 0)
            .count(),
    }
}
