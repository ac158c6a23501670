//! VRRP groups in the standalone config: which nodes share which VIPs, and how.

use std::borrow::Cow;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use serde::{Deserialize, Deserializer, de};

use super::{ConfigError, check_interface_name, check_unicast};
use crate::vrrp::{packet::ChecksumMode, router::Transport};

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupConfig {
    pub name: String,
    /// The interface the group's VRRP and VIPs use on each of its nodes: its own uplink.
    /// Defaults to the top-level `interface`.
    #[serde(default)]
    pub interface: Option<String>,
    /// An 802.1Q VLAN (1–4094) of `interface` the group runs on, without a VLAN device: its
    /// advertisements, announcements and answers are tagged, and only frames tagged with it
    /// reach its VIPs. The group's uplink is then named `<interface>.<vlan>` (the key of
    /// `nodeAddresses` for it).
    #[serde(default)]
    pub vlan: Option<u16>,
    pub nodes: Vec<GroupNode>,
    /// Shared, so that a config whose VIPs did not change (an endpoint change, from the
    /// Kubernetes source) costs no copy of them, and compares equal at a glance.
    #[serde(default)]
    pub vips: std::sync::Arc<[GroupVip]>,
    /// How often the master advertises: 10ms to 40.95s in steps of 10ms.
    #[serde(default = "default_advert_interval", deserialize_with = "duration")]
    pub advert_interval: Duration,
    /// Spread a Service's VIPs over distinct nodes (placement). Off: each Service's VIPs all
    /// follow its first VIP.
    #[serde(default)]
    pub spread: Option<bool>,
    /// A single, manually numbered VRRP instance carrying every VIP of the group, as keepalived
    /// is configured. Needs `priorities`; placement is not used.
    #[serde(default)]
    pub vrid: Option<u8>,
    /// Manual priorities by node name (1–254; 255 for the address owner). Only with `vrid`.
    #[serde(default)]
    pub priorities: Option<BTreeMap<String, u8>>,
    #[serde(default)]
    pub transport: Transport,
    /// VRIDs placement must not use (other routers on the segment).
    #[serde(default)]
    pub excluded_vrids: Vec<u8>,
    #[serde(default = "yes")]
    pub preempt: bool,
    #[serde(default, deserialize_with = "duration")]
    pub preempt_delay: Duration,
    #[serde(default)]
    pub checksum: ChecksumMode,
    #[serde(default)]
    pub vip_mode: VipMode,
    /// How the group's VIPs reach the network: ARP/NDP after a VRRP election, or BGP routes
    /// (see [`Announce`]).
    #[serde(default)]
    pub announce: Announce,
    /// Gratuitous ARP and unsolicited Neighbor Advertisements; the key keeps keepalived's
    /// name, `garp`.
    #[serde(default, rename = "garp")]
    pub announcements: AnnouncementConfig,
    /// VRIDs allocated earlier, by instance (`owner/backup` as in a LoadBalancerGroup's
    /// `status.vrids`): kept while still valid, so a change does not renumber instances.
    #[serde(default)]
    pub pinned_vrids: BTreeMap<String, u8>,
    /// Sign advertisements and drop those without a valid tag (groups of lb-agents only: a
    /// keepalived peer would not understand them).
    #[serde(default)]
    pub authentication: Option<Authentication>,
}

/// Where a group's VRRP keys are (see `vrrp::auth`): one key per line, the first signs, any
/// verifies. Re-read every second, so a key rotates without a restart.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Authentication {
    /// An absolute path on the node, e.g. a mounted Secret's file.
    pub key_file: std::path::PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupNode {
    pub name: String,
    /// The node's address on the group's interface: the source of its IPv4 advertisements.
    pub address: Ipv4Addr,
    /// The node's IPv6 address there: the source of its IPv6 advertisements, which the other
    /// members accept only from it. Its link-local address for multicast (RFC 5798 §5.1.2.1
    /// sends from the link-local address); any of its addresses for unicast. Needed when the
    /// group has IPv6 VIPs.
    #[serde(default)]
    pub address6: Option<Ipv6Addr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupVip {
    /// IPv4 or IPv6; each family's VIPs get VRRP instances of their own.
    #[serde(deserialize_with = "super::ip_address")]
    pub address: IpAddr,
    /// The Service the VIP belongs to (e.g. `default/web`); a Service's VIPs are spread.
    #[serde(default)]
    pub service: Option<String>,
    /// Overrides the group's `spread` for this VIP's Service.
    #[serde(default)]
    pub spread: Option<bool>,
    /// Only these nodes may own the VIP (e.g. those with a ready local endpoint, for
    /// `trafficPolicy: Local`). Absent: every member.
    #[serde(default)]
    pub eligible_nodes: Option<Vec<String>>,
}

/// How a Master makes its VIPs reachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum VipMode {
    /// XDP answers ARP; the kernel does not hold the address.
    #[default]
    Xdp,
    /// The address is added to the uplink through rtnetlink and the kernel answers ARP: for
    /// hosts where XDP is unavailable.
    Netlink,
    /// Both: XDP answers ARP, and the kernel accepts traffic to the VIP locally.
    Both,
}

impl VipMode {
    pub fn uses_xdp(self) -> bool {
        matches!(self, VipMode::Xdp | VipMode::Both)
    }

    pub fn uses_netlink(self) -> bool {
        matches!(self, VipMode::Netlink | VipMode::Both)
    }
}

/// How a group's VIPs are announced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Announce {
    /// The VRRP master answers ARP/NDP: a shared layer-2 segment.
    #[default]
    Arp,
    /// Every member node (eligible for the VIP) serves it and routes it to the local FRR, which
    /// announces it to the fabric: the router spreads flows over the nodes by ECMP. No VRRP.
    Bgp,
    /// Only the VRRP master routes each VIP: active-backup over a routed fabric, failing over
    /// at VRRP's speed rather than BGP's timers.
    BgpOwner,
}

impl Announce {
    /// Routed to the fabric, never answered by ARP/NDP.
    pub fn routed(self) -> bool {
        matches!(self, Announce::Bgp | Announce::BgpOwner)
    }

    /// Decided by a VRRP election.
    pub fn elected(self) -> bool {
        matches!(self, Announce::Arp | Announce::BgpOwner)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Announce::Arp => "arp",
            Announce::Bgp => "bgp",
            Announce::BgpOwner => "bgpOwner",
        }
    }
}

/// Announcements (gratuitous ARP, unsolicited Neighbor Advertisements) on becoming Master,
/// and while Master.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnouncementConfig {
    /// Announcements per VIP.
    #[serde(default = "default_announcement_count")]
    pub count: u32,
    /// Pause between announcements.
    #[serde(default = "default_announcement_interval", deserialize_with = "duration")]
    pub interval: Duration,
    /// Announce the owned VIPs again this often while Master (zero: never), for switches
    /// whose MAC tables age out before routers' ARP caches do (keepalived's
    /// `garp_master_refresh`).
    #[serde(default, deserialize_with = "duration")]
    pub refresh: Duration,
}

impl Default for AnnouncementConfig {
    fn default() -> Self {
        Self {
            count: default_announcement_count(),
            interval: default_announcement_interval(),
            refresh: Duration::ZERO,
        }
    }
}

/// The shortest `garp.refresh`: more often would flood the segment with announcements.
pub const MIN_ANNOUNCEMENT_REFRESH: Duration = Duration::from_millis(100);

fn default_advert_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_announcement_count() -> u32 {
    3
}
fn default_announcement_interval() -> Duration {
    Duration::from_millis(20)
}
fn yes() -> bool {
    true
}

/// A node's IPv6 VRRP address: unicast, and link-local for multicast adverts (RFC 5798
/// §5.1.2.1: "the IPv6 link-local address of the interface the packet is being sent from";
/// keepalived sends from it, and the other members recognise a member by it).
fn check_node_address6(field: &str, address: Ipv6Addr, transport: Transport) -> Result<(), ConfigError> {
    check_unicast(field, address.into())?;
    if transport == Transport::Multicast && !address.is_unicast_link_local() {
        return Err(ConfigError::new(
            field,
            format!(
                "the node's link-local address (fe80::/10), since multicast IPv6 adverts are sent from it \
                 (RFC 5798 §5.1.2.1; `transport: unicast` may use any address), got {address}"
            ),
        ));
    }
    Ok(())
}

/// Durations are written as `10ms`, `1s`, `1m`.
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map_err(|e| de::Error::custom(format!("a duration like 100ms or 1s, got {text:?} ({e})")))
}

const MAX_ADVERT_INTERVAL: Duration = Duration::from_millis(40_950);

/// The uplink a group on `interface` (and `vlan`) runs on: the interface, or `<interface>.<vlan>`
/// (as a VLAN device is usually named, so a group naming such a device is the same uplink).
pub fn uplink_name(interface: &str, vlan: Option<u16>) -> Cow<'_, str> {
    match vlan {
        Some(vlan) => Cow::Owned(format!("{interface}.{vlan}")),
        None => Cow::Borrowed(interface),
    }
}

mod validate;
pub(super) use validate::validate_groups;

#[cfg(test)]
mod tests;
