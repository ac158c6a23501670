//! The standalone YAML configuration: the embedded default source that runs lb-agent without
//! Kubernetes.
//!
//! Parsing is two-step: serde checks shapes and types (unknown fields are errors, so a typo is
//! never silently ignored), then [`Config::validate`] checks meaning. Either way the error names
//! the field by its path, e.g. `vips[2].address`, and says what was expected.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Deserializer, de};

pub use crate::error::ConfigError;
use crate::{error::Error, mac::MacAddr};

mod dataplane;
mod group;
mod routes;
mod service;
pub use dataplane::{Capacity, Capacity6, DataplaneConfig, PortRange};
pub use group::{
    Announce, AnnouncementConfig, Authentication, GroupConfig, GroupNode, GroupVip, VipMode, uplink_name,
};
pub use routes::RoutesConfig;
pub use service::{Endpoint, MAX_ENDPOINTS, Protocol, RemoteMode, ServiceConfig, ServicePort, TrafficPolicy};

/// The agent's configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The default uplink: the interface on the VIPs' L2 segment, where XDP is attached, for
    /// `vips` and every group that names no `interface` of its own.
    pub interface: String,
    /// How XDP attaches to the uplink.
    #[serde(default)]
    pub xdp_mode: XdpModeSetting,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (read-only).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The Unix socket (mode 0600) where `/status` and `/loglevel` are served, for
    /// `lb-agent status` and `lb-agent log-level` on the node.
    #[serde(default = "default_admin_socket")]
    pub admin_socket: PathBuf,
    /// This node's name in `groups[].nodes`. `--node` overrides it; without either, `$NODE_NAME`,
    /// then the host name.
    #[serde(default)]
    pub node: Option<String>,
    /// VIPs this node answers for unconditionally, without VRRP.
    #[serde(default)]
    pub vips: Vec<VipConfig>,
    /// Groups of nodes that share VIPs through VRRP.
    #[serde(default)]
    pub groups: Vec<GroupConfig>,
    /// This node's address on the default uplink: the source of full-NAT and IPIP traffic
    /// leaving by it. Defaults to the uplink's first IPv4 address.
    #[serde(default)]
    pub node_address: Option<Ipv4Addr>,
    /// The same for other uplinks, by interface name (each defaults to the interface's first
    /// IPv4 address).
    #[serde(default)]
    pub node_addresses: BTreeMap<String, Ipv4Addr>,
    /// This node's IPv6 address on the default uplink: the source of IPv6 full NAT and of
    /// IPv6-in-IPv6 leaving by it. Defaults to the uplink's first global IPv6 address.
    #[serde(default)]
    pub node_address6: Option<Ipv6Addr>,
    /// The same for other uplinks, by interface name.
    #[serde(default)]
    pub node_addresses6: BTreeMap<String, Ipv6Addr>,
    /// Services: what traffic to the VIPs is forwarded to.
    #[serde(default)]
    pub services: Vec<Arc<ServiceConfig>>,
    #[serde(default)]
    pub dataplane: DataplaneConfig,
    /// Where routed VIPs (`announce: bgp`, `bgpOwner`) are handed to the node's routing daemon.
    #[serde(default)]
    pub routes: RoutesConfig,
}

/// XDP attach mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum XdpModeSetting {
    /// Native (driver) mode, falling back to generic SKB mode with a warning.
    #[default]
    Auto,
    /// Native mode only; fail if the driver cannot do it.
    Native,
    /// Generic SKB mode: works on any interface, slower.
    Skb,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VipConfig {
    /// IPv4 (answered by ARP) or IPv6 (answered by NDP).
    #[serde(deserialize_with = "ip_address")]
    pub address: IpAddr,
    /// The MAC that ARP replies carry. Defaults to the uplink's own MAC.
    #[serde(default)]
    pub mac: Option<MacAddr>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 9105))
}

/// Where the admin socket is unless the config says otherwise.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/lb-agent/admin.sock";

fn default_admin_socket() -> PathBuf {
    PathBuf::from(DEFAULT_ADMIN_SOCKET)
}

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::ConfigRead { path: path.to_owned(), source })?;
        Self::parse(&text).map_err(|e| e.in_file(path))
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let location = inner.location().map(|l| format!(" (line {}, column {})", l.line(), l.column()));
            let message = inner.to_string();
            let message = strip_serde_location(&message);
            // serde_yaml may already prefix the path (or, for a custom error, the path of the
            // enclosing mapping); say it once.
            let message = match message.split_once(": ") {
                Some((path, rest)) if !path.is_empty() && field.starts_with(path) => rest,
                _ => message,
            };
            ConfigError {
                field: if field == "." { "(document)".into() } else { field },
                expected: format!("{message}{}", location.unwrap_or_default()),
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let vip_owner = self.validate_vips_and_groups()?;
        service::validate_services(&self.services, &vip_owner)
    }

    /// [`Config::validate`] without `services`, for a source that validates each service as
    /// it makes it, and whose services conflict with nothing by construction (Kubernetes).
    pub fn validate_all_but_services(&self) -> Result<(), ConfigError> {
        self.validate_vips_and_groups().map(drop)
    }

    /// The uplink `group` runs on: its interface (else the default uplink's), or a VLAN of it
    /// (`<interface>.<vlan>`).
    pub fn group_interface<'a>(&'a self, group: &'a GroupConfig) -> std::borrow::Cow<'a, str> {
        group::uplink_name(group.interface.as_deref().unwrap_or(&self.interface), group.vlan)
    }

    /// The uplinks groups run on VLANs of, by name: the parent interface and the VLAN id.
    pub fn vlan_uplinks(&self) -> BTreeMap<String, (String, u16)> {
        self.groups
            .iter()
            .filter_map(|g| {
                let vlan = g.vlan?;
                let parent = g.interface.clone().unwrap_or_else(|| self.interface.clone());
                Some((self.group_interface(g).into_owned(), (parent, vlan)))
            })
            .collect()
    }

    /// Every check but the services', and where each VIP is declared.
    fn validate_vips_and_groups(&self) -> Result<BTreeMap<IpAddr, VipField>, ConfigError> {
        check_interface_name("interface", &self.interface)?;
        self.routes.validate()?;
        let mut seen: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for (i, vip) in self.vips.iter().enumerate() {
            let a = vip.address;
            check_unicast(&format!("vips[{i}].address"), a)?;
            if let Some(first) = seen.insert(a, i) {
                return Err(ConfigError::new(
                    format!("vips[{i}].address"),
                    format!("each VIP once, but {a} is also vips[{first}]"),
                ));
            }
            if let Some(mac) = vip.mac
                && !mac.is_unicast()
            {
                return Err(ConfigError::new(
                    format!("vips[{i}].mac"),
                    format!("a unicast MAC (lowest bit of the first octet clear), got {mac}"),
                ));
            }
        }
        let mut vip_owner: BTreeMap<IpAddr, VipField> =
            seen.into_iter().map(|(a, i)| (a, VipField::Node(i))).collect();
        group::validate_groups(&self.groups, &self.interface, &mut vip_owner)?;
        if let Some(address) = self.node_address {
            check_unicast("nodeAddress", address.into())?;
        }
        for (interface, address) in &self.node_addresses {
            let field = format!("nodeAddresses.{interface}");
            check_interface_name(&field, interface)?;
            check_unicast(&field, (*address).into())?;
            if *interface == self.interface && self.node_address.is_some_and(|a| a != *address) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "the same address as nodeAddress for the default uplink {interface}, or no entry"
                    ),
                ));
            }
        }
        let sources6 = self.node_address6.map(|a| ("nodeAddress6".to_owned(), a)).into_iter().chain(
            self.node_addresses6.iter().map(|(interface, a)| (format!("nodeAddresses6.{interface}"), *a)),
        );
        for (field, address) in sources6 {
            check_unicast(&field, address.into())?;
            if address.is_unicast_link_local() {
                return Err(ConfigError::new(
                    field,
                    format!("an IPv6 address the endpoints can route to (not link-local), got {address}"),
                ));
            }
        }
        for interface in self.node_addresses6.keys() {
            let field = format!("nodeAddresses6.{interface}");
            check_interface_name(&field, interface)?;
            if *interface == self.interface && self.node_address6.is_some() {
                return Err(ConfigError::new(
                    field,
                    format!("no entry for the default uplink {interface}: nodeAddress6 sets it"),
                ));
            }
        }
        self.dataplane.validate()?;
        Ok(vip_owner)
    }
}

/// Where a VIP is declared, named only for an error: a config of 10,000 VIPs is validated on
/// every Kubernetes event.
#[derive(Clone, Copy, Debug)]
enum VipField {
    /// `vips[i]`
    Node(usize),
    /// `groups[g].vips[v]`
    Group(usize, usize),
}

impl fmt::Display for VipField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Node(i) => write!(f, "vips[{i}]"),
            Self::Group(g, v) => write!(f, "groups[{g}].vips[{v}]"),
        }
    }
}

/// A Linux interface name: 1 to 15 bytes, no '/' or whitespace.
pub(crate) fn check_interface_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\t', '\n']) {
        return Err(ConfigError::new(
            field,
            format!("a network interface name of 1 to 15 characters without '/' or spaces, got {name:?}"),
        ));
    }
    Ok(())
}

/// VIPs and node addresses must be unicast.
fn check_unicast(field: &str, a: IpAddr) -> Result<(), ConfigError> {
    if !is_unicast(a) {
        let family = if a.is_ipv4() { "IPv4" } else { "IPv6" };
        return Err(ConfigError::new(field, format!("a unicast {family} address, got {a}")));
    }
    Ok(())
}

fn is_unicast(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => !(a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback()),
        IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast() || a.is_loopback()),
    }
}

/// An IPv4 or IPv6 address, with an error that says so (std's says "invalid IP address syntax").
pub(crate) fn ip_address<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| de::Error::custom(format!("an IPv4 or IPv6 address, got {text:?}")))
}

/// serde_yaml appends " at line L column C"; we report the location once, ourselves.
fn strip_serde_location(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> ConfigError {
        Config::parse(yaml).expect_err("config should be rejected")
    }

    #[test]
    fn ipv6_node_addresses_are_checked() {
        let c = Config::parse(
            "interface: eth0\nnodeAddress6: '2001:db8:2::10'\nnodeAddresses6: {eth1: '2001:db8:3::10'}\n",
        )
        .unwrap();
        assert_eq!(c.node_address6, Some("2001:db8:2::10".parse().unwrap()));
        assert_eq!(c.node_addresses6["eth1"], "2001:db8:3::10".parse::<Ipv6Addr>().unwrap());
        let e = err("interface: eth0\nnodeAddress6: 'fe80::10'\n");
        assert_eq!(e.field, "nodeAddress6");
        assert!(e.expected.contains("not link-local"), "{e}");
        let e = err("interface: eth0\nnodeAddresses6: {eth1: 'ff02::1'}\n");
        assert_eq!(e.field, "nodeAddresses6.eth1");
        let e = err(
            "interface: eth0\nnodeAddress6: '2001:db8:2::10'\nnodeAddresses6: {eth0: '2001:db8:2::11'}\n",
        );
        assert_eq!(e.field, "nodeAddresses6.eth0");
        let e = err("interface: eth0\nnodeAddress6: 192.0.2.10\n");
        assert_eq!(e.field, "nodeAddress6");
    }

    #[test]
    fn a_minimal_config_takes_defaults() {
        let c = Config::parse("interface: eth0\nvips:\n  - address: 198.51.100.10\n").unwrap();
        assert_eq!(c.interface, "eth0");
        assert_eq!(c.xdp_mode, XdpModeSetting::Auto);
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.vips, vec![VipConfig { address: Ipv4Addr::new(198, 51, 100, 10).into(), mac: None }]);
    }

    #[test]
    fn every_field_parses() {
        let c = Config::parse(
            "interface: eth1\nxdpMode: skb\nlisten: 127.0.0.1:9999\nvips:\n  - address: 198.51.100.10\n    mac: 02:00:00:00:00:AA\n",
        )
        .unwrap();
        assert_eq!(c.xdp_mode, XdpModeSetting::Skb);
        assert_eq!(c.listen, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(c.vips[0].mac, Some(MacAddr([2, 0, 0, 0, 0, 0xaa])));
    }

    #[test]
    fn a_bad_address_names_its_index() {
        let e = err("interface: eth0\nvips:\n  - address: 198.51.100.10\n  - address: 198.51.100.300\n");
        assert_eq!(e.field, "vips[1].address");
        assert!(e.expected.starts_with(r#"an IPv4 or IPv6 address, got "198.51.100.300""#), "{e}");
        assert!(e.expected.contains("line 4"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_named_with_the_fields_expected() {
        let e = err("interface: eth0\nvips:\n  - adress: 198.51.100.10\n");
        assert_eq!(e.field, "vips[0].adress");
        assert!(e.expected.contains("unknown field `adress`"), "{e}");
        assert!(e.expected.contains("address"), "{e}");
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = err("vips: []\n");
        assert!(e.expected.contains("missing field `interface`"), "{e}");
    }

    #[test]
    fn a_bad_mode_lists_the_choices() {
        let e = err("interface: eth0\nxdpMode: turbo\n");
        assert_eq!(e.field, "xdpMode");
        assert!(
            e.expected.contains("auto") && e.expected.contains("native") && e.expected.contains("skb"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_vips_name_both_places() {
        let e = err("interface: eth0\nvips:\n  - address: 198.51.100.10\n  - address: 198.51.100.10\n");
        assert_eq!(e.field, "vips[1].address");
        assert!(e.expected.contains("vips[0]"), "{e}");
    }

    #[test]
    fn non_unicast_vips_and_macs_are_refused() {
        for bad in ["0.0.0.0", "224.0.0.18", "255.255.255.255", "127.0.0.1"] {
            let e = err(&format!("interface: eth0\nvips:\n  - address: {bad}\n"));
            assert_eq!(e.field, "vips[0].address", "{bad}");
        }
        let e = err("interface: eth0\nvips:\n  - address: 198.51.100.10\n    mac: 01:00:5e:00:00:01\n");
        assert_eq!(e.field, "vips[0].mac");
        let e = err("interface: eth0\nvips:\n  - address: 198.51.100.10\n    mac: 02:00:00:00:00\n");
        assert_eq!(e.field, "vips[0].mac");
        assert!(e.expected.contains("02:00:5e:00:01:01"), "{e}");
    }

    #[test]
    fn bad_interface_names_are_refused() {
        assert_eq!(err("interface: ''\n").field, "interface");
        assert_eq!(err("interface: a-name-that-is-too-long\n").field, "interface");
    }
}
