//! `lb-agent status`: what the local agent owns and forwards, from its `/status` endpoint, as a
//! table for people or JSON for scripts.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub node: String,
    /// The default uplink, and how XDP is attached to it.
    pub interface: String,
    pub xdp_mode: String,
    /// Every uplink, the default one included.
    #[serde(default)]
    pub uplinks: Vec<UplinkStatus>,
    pub instances: Vec<InstanceStatus>,
    /// The VIPs this node routes to its routing daemon now (`announce: bgp`, `bgpOwner`).
    #[serde(default)]
    pub routed: Vec<RoutedStatus>,
    pub backends: Vec<BackendStatus>,
}

/// A VIP this node routes to the fabric.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedStatus {
    pub vip: String,
    pub group: String,
    /// `bgp` or `bgpOwner`.
    pub announce: String,
}

/// An interface VIPs are served on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkStatus {
    pub interface: String,
    /// `native` or `skb`.
    pub xdp_mode: String,
    /// This node's address there: the source of full NAT and IPIP leaving by it.
    pub node_address: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub group: String,
    /// The interface its advertisements use.
    #[serde(default)]
    pub interface: String,
    pub vrid: u8,
    /// `ipv4` or `ipv6`: a VRID names one instance of each family.
    #[serde(default = "ipv4")]
    pub family: String,
    /// `master`, `backup` or `initialize`.
    pub state: String,
    pub priority: u8,
    /// The master's address, as this node knows it.
    pub master: Option<String>,
    /// Milliseconds since this VRID's last advertisement was sent or heard.
    pub advert_age_ms: Option<u64>,
    /// Milliseconds left on the lease under which the data plane claims this VRID's VIPs
    /// (zero once run out); `None` when this node claims none of them.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    pub vips: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// `address:port`.
    pub backend: String,
    /// `local`, `full_nat` or `dsr`.
    pub delivery: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Fetches `/status` from the agent's admin socket.
pub fn fetch(socket: &std::path::Path) -> Result<AgentStatus, String> {
    let body = crate::admin::get(socket, "/status")?;
    serde_json::from_str(&body)
        .map_err(|e| format!("the agent's /status is not what this client expects: {e}"))
}

/// The table `lb-agent status` prints.
pub fn render(status: &AgentStatus) -> String {
    let mut out = format!("node {}\n", status.node);
    if status.uplinks.is_empty() {
        let _ = writeln!(out, "uplink {} (XDP {})", status.interface, status.xdp_mode);
    }
    for u in &status.uplinks {
        let _ = writeln!(out, "uplink {} (XDP {}, address {})", u.interface, u.xdp_mode, u.node_address);
    }
    out.push('\n');
    if status.instances.is_empty() {
        out.push_str("no VRRP instances\n");
    } else {
        let _ = writeln!(
            out,
            "{:<16} {:<10} {:>4} {:<10} {:>8} {:<16} {:>10} {:>8}  VIPs",
            "GROUP", "INTERFACE", "VRID", "STATE", "PRIORITY", "MASTER", "ADVERT AGE", "LEASE"
        );
        let ms = |value: Option<u64>| value.map_or("-".to_owned(), |ms| format!("{ms} ms"));
        for i in &status.instances {
            let _ = writeln!(
                out,
                "{:<16} {:<10} {:>4} {:<10} {:>8} {:<16} {:>10} {:>8}  {}",
                i.group,
                i.interface,
                vrid_column(i),
                i.state,
                i.priority,
                i.master.as_deref().unwrap_or("-"),
                ms(i.advert_age_ms),
                ms(i.lease_ms),
                i.vips.join(", ")
            );
        }
    }
    out.push('\n');
    if !status.routed.is_empty() {
        let _ = writeln!(out, "{:<40} {:<16} ANNOUNCE", "ROUTED VIP", "GROUP");
        for r in &status.routed {
            let _ = writeln!(out, "{:<40} {:<16} {}", r.vip, r.group, r.announce);
        }
        out.push('\n');
    }
    if status.backends.is_empty() {
        out.push_str("no backends\n");
    } else {
        let _ = writeln!(out, "{:<24} {:<9} {:>12} {:>14}", "BACKEND", "DELIVERY", "PACKETS", "BYTES");
        for b in &status.backends {
            let _ = writeln!(out, "{:<24} {:<9} {:>12} {:>14}", b.backend, b.delivery, b.packets, b.bytes);
        }
    }
    out
}

/// `ipv4` when a status from an agent before IPv6 names no family.
fn ipv4() -> String {
    "ipv4".into()
}

/// The VRID as the table shows it: `51`, or `51/6` for an IPv6 instance.
fn vrid_column(instance: &InstanceStatus) -> String {
    match instance.family.as_str() {
        "ipv6" => format!("{}/6", instance.vrid),
        _ => instance.vrid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_every_field() {
        let status = AgentStatus {
            node: "n0".into(),
            interface: "eth0".into(),
            xdp_mode: "native".into(),
            uplinks: vec![
                UplinkStatus {
                    interface: "eth0".into(),
                    xdp_mode: "native".into(),
                    node_address: "192.0.2.10".into(),
                },
                UplinkStatus {
                    interface: "eth0.30".into(),
                    xdp_mode: "skb".into(),
                    node_address: "10.30.0.10".into(),
                },
            ],
            instances: vec![
                InstanceStatus {
                    group: "web".into(),
                    interface: "eth0.30".into(),
                    vrid: 20,
                    family: "ipv4".into(),
                    state: "master".into(),
                    priority: 200,
                    master: Some("192.0.2.10".into()),
                    advert_age_ms: Some(7),
                    lease_ms: Some(143),
                    vips: vec!["198.51.100.10".into()],
                },
                InstanceStatus {
                    group: "web".into(),
                    interface: "eth0.30".into(),
                    vrid: 21,
                    family: "ipv6".into(),
                    state: "backup".into(),
                    priority: 100,
                    master: Some("fe80::b".into()),
                    advert_age_ms: Some(3),
                    lease_ms: None,
                    vips: vec!["2001:db8:6::10".into()],
                },
            ],
            routed: vec![RoutedStatus {
                vip: "198.51.100.30".into(),
                group: "edge".into(),
                announce: "bgp".into(),
            }],
            backends: vec![BackendStatus {
                backend: "10.244.1.2:8080".into(),
                delivery: "dsr".into(),
                packets: 42,
                bytes: 4200,
            }],
        };
        let table = render(&status);
        for needle in [
            "node n0",
            "uplink eth0.30 (XDP skb, address 10.30.0.10)",
            "ROUTED VIP",
            "198.51.100.30",
            "edge",
            "web",
            "eth0.30",
            "20",
            "master",
            "200",
            "192.0.2.10",
            "7 ms",
            "143 ms",
            "198.51.100.10",
            "10.244.1.2:8080",
            "dsr",
            "42",
            "4200",
            "21/6",
            "fe80::b",
            "2001:db8:6::10",
        ] {
            assert!(table.contains(needle), "{needle} missing from:\n{table}");
        }
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(serde_json::from_str::<AgentStatus>(&json).unwrap(), status);
        // An agent from before IPv6 names no family: its instances are IPv4.
        let old = json.replace(r#""family":"ipv4","#, "");
        assert_eq!(serde_json::from_str::<AgentStatus>(&old).unwrap().instances[0].family, "ipv4");
    }
}
