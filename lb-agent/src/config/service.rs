//! Services in the standalone config: a VIP, its ports, and the endpoints behind them, each
//! with the node it runs on. The same shape the Kubernetes source produces from Services and
//! EndpointSlices.

use std::{collections::HashMap, net::IpAddr};

use serde::Deserialize;

use super::{ConfigError, check_unicast, is_unicast};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceConfig {
    /// For logs and metrics, e.g. `default/web`.
    pub name: String,
    /// One of the config's VIPs (`vips[]` or `groups[].vips[]`), IPv4 or IPv6; its endpoints
    /// are of the same family.
    pub vip: IpAddr,
    pub ports: Vec<ServicePort>,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// How endpoints on other nodes are reached. Endpoints on this node are always delivered
    /// locally.
    #[serde(default)]
    pub remote_mode: RemoteMode,
    /// `Local`: only this node's endpoints serve traffic arriving here, as Kubernetes'
    /// `externalTrafficPolicy: Local`.
    #[serde(default)]
    pub traffic_policy: TrafficPolicy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServicePort {
    pub port: u16,
    #[serde(default)]
    pub protocol: Protocol,
    /// The endpoints' port; defaults to `port`.
    #[serde(default)]
    pub target_port: Option<u16>,
}

impl ServicePort {
    pub fn target(&self) -> u16 {
        self.target_port.unwrap_or(self.port)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub address: IpAddr,
    /// The node the endpoint runs on, by name.
    pub node: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => lb_common::service::PROTO_TCP,
            Protocol::Udp => lb_common::service::PROTO_UDP,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RemoteMode {
    /// DNAT and SNAT to this node (kube-proxy's Cluster semantics); the client address is not
    /// preserved and flows do not survive the VIP moving to another node.
    #[default]
    FullNat,
    /// IPIP to the endpoint, which replies straight to the client: the client address is
    /// preserved and flows survive the VIP moving. Needs routable pod addresses.
    Dsr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// The most endpoints a service may have: its Maglev ring (at most 65,521 slots) must stay at
/// least 100 times larger.
pub const MAX_ENDPOINTS: usize = 655;

impl ServiceConfig {
    /// The checks that concern this service alone; an error names the field within the
    /// service (`name`, `ports[0].port`, …), for the caller to prefix with where it is.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Field names are only formatted for an error: a valid config of 10,000 services is
        // validated on every reload.
        let at = |field: &str| field.to_owned();
        if self.name.is_empty() {
            return Err(ConfigError::new(at("name"), "a non-empty name"));
        }
        if self.ports.is_empty() {
            return Err(ConfigError::new(at("ports"), "at least one port"));
        }
        for (p, port) in self.ports.iter().enumerate() {
            if port.port == 0 {
                return Err(ConfigError::new(
                    at(&format!("ports[{p}].port")),
                    "a port from 1 to 65535, got 0",
                ));
            }
            if port.target_port == Some(0) {
                return Err(ConfigError::new(
                    at(&format!("ports[{p}].targetPort")),
                    "a port from 1 to 65535, got 0",
                ));
            }
            if let Some(first) =
                self.ports[..p].iter().position(|q| (q.port, q.protocol) == (port.port, port.protocol))
            {
                return Err(ConfigError::new(
                    at(&format!("ports[{p}]")),
                    format!(
                        "each port and protocol once, but {}/{} is also ports[{first}]",
                        port.port,
                        port.protocol.as_str()
                    ),
                ));
            }
        }
        if self.endpoints.len() > MAX_ENDPOINTS {
            return Err(ConfigError::new(
                at("endpoints"),
                format!("at most {MAX_ENDPOINTS} endpoints, got {}", self.endpoints.len()),
            ));
        }
        // Most services have a few endpoints: scanning the earlier ones allocates nothing.
        let mut addresses: HashMap<IpAddr, usize, foldhash::fast::FixedState> = HashMap::default();
        let few = self.endpoints.len() <= 16;
        for (e, endpoint) in self.endpoints.iter().enumerate() {
            if !is_unicast(endpoint.address) {
                check_unicast(&at(&format!("endpoints[{e}].address")), endpoint.address)?;
            }
            if endpoint.address.is_ipv4() != self.vip.is_ipv4() {
                let family = if self.vip.is_ipv4() { "an IPv4" } else { "an IPv6" };
                return Err(ConfigError::new(
                    at(&format!("endpoints[{e}].address")),
                    format!(
                        "{family} address, as the service's VIP {} is, got {}",
                        self.vip, endpoint.address
                    ),
                ));
            }
            if endpoint.node.is_empty() {
                return Err(ConfigError::new(
                    at(&format!("endpoints[{e}].node")),
                    "the name of the node it runs on",
                ));
            }
            let first = if few {
                self.endpoints[..e].iter().position(|x| x.address == endpoint.address)
            } else {
                addresses.insert(endpoint.address, e)
            };
            if let Some(first) = first {
                return Err(ConfigError::new(
                    at(&format!("endpoints[{e}].address")),
                    format!("each endpoint once, but {} is also endpoints[{first}]", endpoint.address),
                ));
            }
        }
        Ok(())
    }
}

pub(super) fn validate_services(
    services: &[std::sync::Arc<ServiceConfig>],
    vips: &std::collections::BTreeMap<std::net::IpAddr, super::VipField>,
) -> Result<(), ConfigError> {
    let mut seen: HashMap<(IpAddr, u16, Protocol), (usize, usize), foldhash::fast::FixedState> =
        HashMap::with_capacity_and_hasher(services.len(), Default::default());
    for (s, service) in services.iter().enumerate() {
        let at = |field: &str| format!("services[{s}].{field}");
        service.validate().map_err(|e| ConfigError { field: at(&e.field), ..e })?;
        if !vips.contains_key(&service.vip) {
            return Err(ConfigError::new(
                at("vip"),
                format!("one of the VIPs in `vips` or `groups[].vips`, but {} is in neither", service.vip),
            ));
        }
        for (p, port) in service.ports.iter().enumerate() {
            if let Some((first_s, first_p)) = seen.insert((service.vip, port.port, port.protocol), (s, p)) {
                return Err(ConfigError::new(
                    at(&format!("ports[{p}]")),
                    format!(
                        "each VIP, port and protocol once, but {}:{}/{} is also services[{first_s}].ports[{first_p}]",
                        service.vip,
                        port.port,
                        port.protocol.as_str()
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    const HEAD: &str = "interface: eth0\nvips:\n  - address: 198.51.100.10\n";

    fn err(services: &str) -> ConfigError {
        Config::parse(&format!("{HEAD}services:\n{services}")).expect_err("should be rejected")
    }

    #[test]
    fn a_service_parses_with_defaults() {
        let c = Config::parse(&format!(
            "{HEAD}services:\n  - name: web\n    vip: 198.51.100.10\n    ports:\n      - port: 80\n        targetPort: 8080\n    endpoints:\n      - {{address: 10.244.1.2, node: n1}}\n"
        ))
        .unwrap();
        let s = &c.services[0];
        assert_eq!(s.ports[0].target(), 8080);
        assert_eq!(s.ports[0].protocol, super::Protocol::Tcp);
        assert_eq!(s.remote_mode, super::RemoteMode::FullNat);
        assert_eq!(s.traffic_policy, super::TrafficPolicy::Cluster);
    }

    #[test]
    fn a_vip_that_is_not_configured_is_named() {
        let e = err("  - name: web\n    vip: 198.51.100.99\n    ports: [{port: 80}]\n");
        assert_eq!(e.field, "services[0].vip");
        assert!(e.expected.contains("198.51.100.99"), "{e}");
    }

    #[test]
    fn duplicate_ports_name_both_places() {
        let e = err(
            "  - name: a\n    vip: 198.51.100.10\n    ports: [{port: 80}]\n  - name: b\n    vip: 198.51.100.10\n    ports: [{port: 443}, {port: 80, protocol: TCP}]\n",
        );
        assert_eq!(e.field, "services[1].ports[1]");
        assert!(e.expected.contains("services[0].ports[0]"), "{e}");
        // The same port over UDP is a different service.
        Config::parse(&format!(
            "{HEAD}services:\n  - name: a\n    vip: 198.51.100.10\n    ports: [{{port: 53}}, {{port: 53, protocol: UDP}}]\n"
        ))
        .unwrap();
    }

    #[test]
    fn bad_ports_modes_and_endpoints_are_named() {
        let e = err("  - name: a\n    vip: 198.51.100.10\n    ports: [{port: 0}]\n");
        assert_eq!(e.field, "services[0].ports[0].port");
        let e = err("  - name: a\n    vip: 198.51.100.10\n    ports: [{port: 80, protocol: SCTP}]\n");
        assert_eq!(e.field, "services[0].ports[0].protocol");
        assert!(e.expected.contains("TCP") && e.expected.contains("UDP"), "{e}");
        let e = err("  - name: a\n    vip: 198.51.100.10\n    remoteMode: tunnel\n    ports: [{port: 80}]\n");
        assert_eq!(e.field, "services[0].remoteMode");
        assert!(e.expected.contains("dsr") && e.expected.contains("fullNat"), "{e}");
        let e = err(
            "  - name: a\n    vip: 198.51.100.10\n    ports: [{port: 80}]\n    endpoints: [{address: 10.0.0.1, node: n1}, {address: 10.0.0.1, node: n2}]\n",
        );
        assert_eq!(e.field, "services[0].endpoints[1].address");
        let e = err(
            "  - name: a\n    vip: 198.51.100.10\n    ports: [{port: 80}]\n    endpoints: [{address: 10.0.0.1}]\n",
        );
        assert_eq!(e.field, "services[0].endpoints[0]");
        assert!(e.expected.contains("node"), "{e}");
    }

    #[test]
    fn an_endpoint_of_the_other_family_is_named() {
        let head = "interface: eth0\nvips:\n  - address: 198.51.100.10\n  - address: 2001:db8:6::10\n";
        let e = Config::parse(&format!(
            "{head}services:\n  - name: a\n    vip: 2001:db8:6::10\n    ports: [{{port: 80}}]\n    endpoints: [{{address: 'fd00:10:244::2', node: n0}}, {{address: 10.244.0.2, node: n0}}]\n"
        ))
        .expect_err("an IPv4 endpoint behind an IPv6 VIP");
        assert_eq!(e.field, "services[0].endpoints[1].address");
        assert!(e.expected.contains("an IPv6 address") && e.expected.contains("10.244.0.2"), "{e}");
        Config::parse(&format!(
            "{head}services:\n  - name: a\n    vip: 2001:db8:6::10\n    ports: [{{port: 80}}]\n    endpoints: [{{address: 'fd00:10:244::2', node: n0}}]\n"
        ))
        .expect("an IPv6 service");
    }
}
