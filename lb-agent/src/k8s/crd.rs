//! The `LoadBalancerGroup` custom resource (`lb-agent.io/v1alpha1`, cluster-scoped): an
//! administrator's set of nodes, interface, address pools and VRRP settings. The YAML in
//! `deploy/crds/` is generated from these types (`lb-agent crd`), and a test fails if it drifts.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The group shares the standalone config's vocabulary, so the two sources cannot drift apart.
pub use crate::{
    config::{Announce, Authentication, RemoteMode, VipMode},
    vrrp::router::Transport,
};

/// The API group.
pub const GROUP: &str = "lb-agent.io";
/// A Service with this `spec.loadBalancerClass` is ours.
pub const LOAD_BALANCER_CLASS: &str = "lb-agent.io/vrrp";
/// Service annotations.
pub const ANNOTATION_GROUP: &str = "lb-agent.io/group";
pub const ANNOTATION_SPREAD: &str = "lb-agent.io/spread";
pub const ANNOTATION_IPS: &str = "lb-agent.io/ips";
pub const ANNOTATION_SHARED: &str = "lb-agent.io/allow-shared-ip";

#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lb-agent.io",
    version = "v1alpha1",
    kind = "LoadBalancerGroup",
    plural = "loadbalancergroups",
    shortname = "lbg",
    status = "LoadBalancerGroupStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Members","type":"integer","jsonPath":".status.memberCount"}"#,
    printcolumn = r#"{"name":"VIPs","type":"integer","jsonPath":".status.vipCount"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.remoteMode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.interface) != has(self.interfaceFromIP)",
     "message": "set exactly one of interface and interfaceFromIP"}
]))]
pub struct LoadBalancerGroupSpec {
    /// Nodes in the group: those whose labels match all of these. Empty: every node.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// The group's interface on every member node: any interface, not only the agent's default
    /// uplink (a node serves each of its groups on that group's interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub interface: Option<String>,
    /// Or: each node uses the interface that routes to this address (IPv4 or IPv6).
    #[serde(default, rename = "interfaceFromIP", skip_serializing_if = "Option::is_none")]
    pub interface_from_ip: Option<std::net::IpAddr>,
    /// An 802.1Q VLAN (1–4094) of that interface to run on, without a VLAN device: the
    /// group's advertisements and answers are tagged, and only frames tagged with it reach its
    /// VIPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan: Option<u16>,
    /// Where LoadBalancer Services get their addresses: CIDRs (`198.51.100.0/28`,
    /// `2001:db8:6::/112`) or ranges (`198.51.100.10-198.51.100.20`), of either family. A
    /// dual-stack Service gets one address of each of its `ipFamilies`.
    #[serde(default)]
    pub address_pools: Vec<String>,
    /// CIDRs (IPv4 or IPv6) that `spec.externalIPs` may use in Services of this group.
    /// Anything else is refused (CVE-2020-8554). Empty: no externalIPs at all.
    #[serde(default, rename = "allowedExternalIPs")]
    pub allowed_external_ips: Vec<String>,
    /// VRIDs other routers on the segment use.
    #[serde(default)]
    #[schemars(length(max = 255))]
    pub excluded_vrids: Vec<u8>,
    /// VRRP advertisement interval, 10ms to 40.95s in steps of 10ms.
    #[serde(default = "default_advert_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s))+$"))]
    pub advert_interval: String,
    /// Announce the owned VIPs again this often while master (gratuitous ARP), for switches
    /// whose MAC tables age out first; unset or `0s`: never. At least 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m))+$"))]
    pub garp_refresh: Option<String>,
    #[serde(default = "yes")]
    pub preempt: bool,
    #[serde(default)]
    pub transport: Transport,
    /// Spread each Service's VIPs over distinct nodes.
    #[serde(default = "yes")]
    pub spread: bool,
    /// How owners answer for VIPs.
    #[serde(default)]
    pub vip_mode: VipMode,
    /// How the VIPs reach the network: `arp` (VRRP on a shared segment), `bgp` (every member
    /// node routes them to its FRR: ECMP) or `bgpOwner` (only the VRRP master routes each).
    #[serde(default)]
    pub announce: Announce,
    /// How endpoints on other nodes are reached.
    #[serde(default)]
    pub remote_mode: RemoteMode,
    /// LoadBalancer Services without a class are served by the group marked default.
    #[serde(default)]
    pub default: bool,
    /// Sign VRRP advertisements with HMAC-SHA-256 and drop unsigned or replayed ones. The key
    /// file is read on each member node: mount a Secret there (the DaemonSet mounts
    /// `lb-agent-vrrp-keys` at `/etc/lb-agent-vrrp-keys`), one key per line, the first signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Authentication>,
}

fn default_advert_interval() -> String {
    "1s".into()
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerGroupStatus {
    /// VRIDs by instance (`<primary>/<secondary>` node pair), kept stable across changes.
    #[serde(default)]
    pub vrids: BTreeMap<String, u8>,
    /// Each VIP, its Service and current owner.
    #[serde(default)]
    pub vips: Vec<VipStatus>,
    #[serde(default)]
    pub members: Vec<String>,
    #[serde(default)]
    pub member_count: u32,
    #[serde(default)]
    pub vip_count: u32,
    /// `Ready` and `Degraded`, each replaced in place (never appended).
    #[serde(default)]
    pub conditions: Vec<GroupCondition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VipStatus {
    pub address: String,
    /// `namespace/name`.
    pub service: String,
    /// The node currently Master for it, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// As `metav1.Condition`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupCondition {
    #[serde(rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub observed_generation: i64,
    pub last_transition_time: String,
}

/// The CRD manifest, as `deploy/crds/loadbalancergroups.yaml` holds it.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = LoadBalancerGroup::crd();
    format!(
        "# Generated by `lb-agent crd` from lb-agent/src/k8s/crd.rs; do not edit.\n{}",
        serde_yaml::to_string(&crd).expect("a CRD serialises")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployed_crd_matches_the_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/loadbalancergroups.yaml");
        let deployed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            deployed == crd_yaml(),
            "deploy/crds/loadbalancergroups.yaml is stale: regenerate it with \
             `cargo run -p lb-agent -- crd > deploy/crds/loadbalancergroups.yaml`"
        );
    }

    #[test]
    fn a_minimal_group_takes_the_defaults() {
        let spec: LoadBalancerGroupSpec =
            serde_yaml::from_str("interface: eth0\naddressPools: [198.51.100.0/28]\n").unwrap();
        assert_eq!(spec.advert_interval, "1s");
        assert!(spec.preempt && spec.spread && !spec.default);
        assert_eq!(
            (spec.transport, spec.vip_mode, spec.remote_mode),
            (Transport::Multicast, VipMode::Xdp, RemoteMode::FullNat)
        );
    }

    #[test]
    fn the_schema_checks_what_it_can() {
        let yaml = crd_yaml();
        for needle in [
            "x-kubernetes-validations",
            "set exactly one of interface and interfaceFromIP",
            "shortNames",
            "lbg",
            "subresources",
            "status: {}",
            "Members",
        ] {
            assert!(yaml.contains(needle), "CRD lacks {needle}:\n{yaml}");
        }
    }
}
