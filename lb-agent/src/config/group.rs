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
    /// Spread a Service's VIPs over distinct nodes (the planner). Off: each Service's VIPs all
    /// follow its first VIP.
    #[serde(default)]
    pub spread: Option<bool>,
    /// A single, manually numbered VRRP instance carrying every VIP of the group, as keepalived
    /// is configured. Needs `priorities`; the planner is not used.
    #[serde(default)]
    pub vrid: Option<u8>,
    /// Manual priorities by node name (1–254; 255 for the address owner). Only with `vrid`.
    #[serde(default)]
    pub priorities: Option<BTreeMap<String, u8>>,
    #[serde(default)]
    pub transport: Transport,
    /// VRIDs the planner must not use (other routers on the segment).
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

/// A VLAN id 802.1Q allows (0 is "no VLAN", 4095 reserved), on a group whose VIPs live in XDP
/// alone: without a VLAN device the kernel has nowhere on the VLAN to hold them.
fn check_vlan(group: &GroupConfig, at: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
    let Some(vlan) = group.vlan else { return Ok(()) };
    if !(1..=4094).contains(&vlan) {
        return Err(ConfigError::new(at("vlan"), format!("a VLAN id from 1 to 4094, got {vlan}")));
    }
    if group.vip_mode != VipMode::Xdp {
        return Err(ConfigError::new(
            at("vipMode"),
            "xdp (or absent), since the group is on a VLAN: the kernel has no device there to hold its VIPs",
        ));
    }
    if group.transport != Transport::Multicast {
        return Err(ConfigError::new(
            at("transport"),
            "multicast (or absent), since the group is on a VLAN: unicast advertisements would need the \
             peers' MACs there, which the kernel has no device to resolve",
        ));
    }
    Ok(())
}

/// `announce: bgp` runs no VRRP, and a routed VIP lives in XDP alone: on every node at once in
/// `bgp`, the kernel holding it would answer for it too.
fn check_announce(group: &GroupConfig, at: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
    if group.announce.routed() && group.vip_mode != VipMode::Xdp {
        return Err(ConfigError::new(
            at("vipMode"),
            format!(
                "xdp (or absent), since announce is {}: a routed VIP is served by XDP alone",
                group.announce.as_str()
            ),
        ));
    }
    if group.announce == Announce::Bgp {
        let vrrp_only = [
            ("vrid", group.vrid.is_some()),
            ("priorities", group.priorities.is_some()),
            ("authentication", group.authentication.is_some()),
        ];
        if let Some((field, _)) = vrrp_only.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                at(field),
                "absent, since announce is bgp: every member serves every VIP it is eligible for, without VRRP",
            ));
        }
    }
    Ok(())
}

pub(super) fn validate_groups(
    groups: &[GroupConfig],
    default_interface: &str,
    vip_owner: &mut BTreeMap<IpAddr, super::VipField>,
) -> Result<(), ConfigError> {
    let uplinks: Vec<Cow<str>> = groups
        .iter()
        .map(|g| uplink_name(g.interface.as_deref().unwrap_or(default_interface), g.vlan))
        .collect();
    let mut across = AcrossGroups::default();
    for (g, group) in groups.iter().enumerate() {
        let at = |field: &str| format!("groups[{g}].{field}");
        if let Some(interface) = &group.interface {
            check_interface_name(&at("interface"), interface)?;
        }
        check_vlan(group, &at)?;
        let interface = &*uplinks[g];
        check_identity(group, g, &mut across, &at)?;
        check_announce(group, &at)?;
        let members = check_nodes(group, interface, &mut across, &at)?;
        check_vips(group, g, &members, vip_owner, &at)?;
        check_timers(group, &at)?;
        check_manual_vrid(group, g, &members, &mut across, &at)?;
    }
    Ok(())
}

/// What must hold across groups: unique names and manual VRIDs, and one address per node on
/// each interface (a different one on each).
#[derive(Default)]
struct AcrossGroups<'c> {
    names: BTreeMap<&'c str, usize>,
    manual_vrids: BTreeMap<u8, usize>,
    node_addresses: BTreeMap<(&'c str, &'c str), (Ipv4Addr, String)>,
    address_users: BTreeMap<(&'c str, IpAddr), (&'c str, String)>,
    node_addresses6: BTreeMap<(&'c str, &'c str), (Ipv6Addr, String)>,
}

/// A field of group `g`, by its path in the group.
type At<'a> = dyn Fn(&str) -> String + 'a;

/// The group's name (non-empty, unique), its nodes (some), and its key file (absolute).
fn check_identity<'c>(
    group: &'c GroupConfig,
    g: usize,
    across: &mut AcrossGroups<'c>,
    at: &At,
) -> Result<(), ConfigError> {
    if group.name.is_empty() {
        return Err(ConfigError::new(at("name"), "a non-empty group name"));
    }
    if let Some(first) = across.names.insert(group.name.as_str(), g) {
        return Err(ConfigError::new(
            at("name"),
            format!("a unique name, but groups[{first}] is also {:?}", group.name),
        ));
    }
    if group.nodes.is_empty() {
        return Err(ConfigError::new(at("nodes"), "at least one node"));
    }
    if let Some(auth) = &group.authentication
        && !auth.key_file.is_absolute()
    {
        return Err(ConfigError::new(
            at("authentication.keyFile"),
            format!("an absolute path to the group's key file, got {:?}", auth.key_file),
        ));
    }
    Ok(())
}

/// Each node: a unique name, unicast addresses unique in the group, the same address on
/// `interface` as in other groups there, and an IPv6 address where it may own an IPv6 VIP.
/// Returns the members' names.
fn check_nodes<'c>(
    group: &'c GroupConfig,
    interface: &'c str,
    across: &mut AcrossGroups<'c>,
    at: &At,
) -> Result<BTreeSet<&'c str>, ConfigError> {
    let mut members = BTreeSet::new();
    let mut addresses: BTreeSet<IpAddr> = BTreeSet::new();
    for (n, node) in group.nodes.iter().enumerate() {
        let field = at(&format!("nodes[{n}]"));
        if node.name.is_empty() || !members.insert(node.name.as_str()) {
            return Err(ConfigError::new(
                format!("{field}.name"),
                format!("a unique, non-empty node name, got {:?}", node.name),
            ));
        }
        check_unicast(&format!("{field}.address"), node.address.into())?;
        check_node_ipv6(group, node, interface, &field, &mut addresses, across)?;
        if !addresses.insert(node.address.into()) {
            return Err(ConfigError::new(
                format!("{field}.address"),
                format!("a unique address, {} is listed twice", node.address),
            ));
        }
        check_shared_address(node, interface, &field, across)?;
    }
    Ok(members)
}

/// A node's `address6`: valid, unique in the group, the same on `interface` as in other groups
/// there; required where the node may own one of the group's IPv6 VIPs (with manual
/// priorities, every member runs every instance).
fn check_node_ipv6<'c>(
    group: &GroupConfig,
    node: &'c GroupNode,
    interface: &'c str,
    field: &str,
    addresses: &mut BTreeSet<IpAddr>,
    across: &mut AcrossGroups<'c>,
) -> Result<(), ConfigError> {
    let Some(address6) = node.address6 else {
        let manual = group.vrid.is_some() && group.priorities.is_some();
        let may_own_ipv6 = group.announce.elected()
            && group.vips.iter().any(|v| {
                v.address.is_ipv6()
                    && (manual || v.eligible_nodes.as_ref().is_none_or(|nodes| nodes.contains(&node.name)))
            });
        if may_own_ipv6 {
            return Err(ConfigError::new(
                format!("{field}.address6"),
                format!(
                    "this node's IPv6 address on {interface} (its link-local address, for multicast \
                     adverts), since the group has IPv6 VIPs it may own"
                ),
            ));
        }
        return Ok(());
    };
    check_node_address6(&format!("{field}.address6"), address6, group.transport)?;
    if !addresses.insert(address6.into()) {
        return Err(ConfigError::new(
            format!("{field}.address6"),
            format!("a unique address, {address6} is listed twice"),
        ));
    }
    match across.node_addresses6.get(&(node.name.as_str(), interface)) {
        Some((address, first)) if *address != address6 => Err(ConfigError::new(
            format!("{field}.address6"),
            format!(
                "{address} as in {first}, since a node has one IPv6 address on {interface} for \
                 VRRP, which both groups use"
            ),
        )),
        Some(_) => Ok(()),
        None => {
            across
                .node_addresses6
                .insert((node.name.as_str(), interface), (address6, format!("{field}.address6")));
            Ok(())
        }
    }
}

/// Groups on one interface share a node's address there, and a node's address is on one
/// interface only.
fn check_shared_address<'c>(
    node: &'c GroupNode,
    interface: &'c str,
    field: &str,
    across: &mut AcrossGroups<'c>,
) -> Result<(), ConfigError> {
    match across.node_addresses.get(&(node.name.as_str(), interface)) {
        Some((address, first)) if *address != node.address => {
            return Err(ConfigError::new(
                format!("{field}.address"),
                format!(
                    "{address} as in {first}, since a node has one address on {interface}, which both \
                     groups use"
                ),
            ));
        }
        Some(_) => {}
        None => {
            across
                .node_addresses
                .insert((node.name.as_str(), interface), (node.address, format!("{field}.address")));
        }
    }
    match across.address_users.get(&(node.name.as_str(), node.address.into())) {
        Some((other, first)) if *other != interface => Err(ConfigError::new(
            format!("{field}.address"),
            format!("an address of this node on {interface}, but {first} has {} on {other}", node.address),
        )),
        Some(_) => Ok(()),
        None => {
            across
                .address_users
                .insert((node.name.as_str(), node.address.into()), (interface, format!("{field}.address")));
            Ok(())
        }
    }
}

/// Each VIP: unicast, not link-local, in no other group or service, eligible only on members.
fn check_vips(
    group: &GroupConfig,
    g: usize,
    members: &BTreeSet<&str>,
    vip_owner: &mut BTreeMap<IpAddr, super::VipField>,
    at: &At,
) -> Result<(), ConfigError> {
    for (v, vip) in group.vips.iter().enumerate() {
        for (n, node) in vip.eligible_nodes.iter().flatten().enumerate() {
            if !members.contains(node.as_str()) {
                return Err(ConfigError::new(
                    at(&format!("vips[{v}].eligibleNodes[{n}]")),
                    format!("a node of this group, but {node:?} is not in its nodes"),
                ));
            }
        }
        let field = || at(&format!("vips[{v}].address"));
        if !super::is_unicast(vip.address) {
            check_unicast(&field(), vip.address)?;
        }
        if let IpAddr::V6(v6) = vip.address
            && v6.is_unicast_link_local()
        {
            return Err(ConfigError::new(field(), format!("a global IPv6 address, not the link-local {v6}")));
        }
        if let Some(first) = vip_owner.insert(vip.address, super::VipField::Group(g, v)) {
            return Err(ConfigError::new(
                field(),
                format!("each VIP once, but {} is also {first}", vip.address),
            ));
        }
    }
    Ok(())
}

/// The advertisement interval (VRRPv3's centiseconds), excluded VRIDs, and the announcements'
/// pacing.
fn check_timers(group: &GroupConfig, at: &At) -> Result<(), ConfigError> {
    let interval = group.advert_interval;
    if interval < Duration::from_millis(10)
        || interval > MAX_ADVERT_INTERVAL
        || !interval.as_micros().is_multiple_of(10_000)
    {
        return Err(ConfigError::new(
            at("advertInterval"),
            format!("10ms to 40.95s in steps of 10ms (VRRPv3 counts centiseconds), got {interval:?}"),
        ));
    }
    for (i, vrid) in group.excluded_vrids.iter().enumerate() {
        if *vrid == 0 {
            return Err(ConfigError::new(at(&format!("excludedVrids[{i}]")), "a VRID from 1 to 255"));
        }
    }
    if group.announcements.count > 100 || group.announcements.interval > Duration::from_secs(10) {
        return Err(ConfigError::new(at("garp"), "count ≤ 100 and interval ≤ 10s"));
    }
    let refresh = group.announcements.refresh;
    if !refresh.is_zero() && refresh < MIN_ANNOUNCEMENT_REFRESH {
        return Err(ConfigError::new(
            at("garp.refresh"),
            format!("zero (off) or at least {MIN_ANNOUNCEMENT_REFRESH:?}, got {refresh:?}"),
        ));
    }
    Ok(())
}

/// A manual `vrid` comes with `priorities` for every member (and neither alone), unique
/// across groups, never spread.
fn check_manual_vrid(
    group: &GroupConfig,
    g: usize,
    members: &BTreeSet<&str>,
    across: &mut AcrossGroups,
    at: &At,
) -> Result<(), ConfigError> {
    match (group.vrid, &group.priorities) {
        (None, None) => {}
        (Some(_), None) => {
            return Err(ConfigError::new(at("priorities"), "a priority for every node, since vrid is set"));
        }
        (None, Some(_)) => return Err(ConfigError::new(at("vrid"), "a VRID, since priorities are set")),
        (Some(vrid), Some(priorities)) => {
            if vrid == 0 || group.excluded_vrids.contains(&vrid) {
                return Err(ConfigError::new(
                    at("vrid"),
                    format!("a VRID from 1 to 255 not in excludedVrids, got {vrid}"),
                ));
            }
            if let Some(first) = across.manual_vrids.insert(vrid, g) {
                return Err(ConfigError::new(
                    at("vrid"),
                    format!("a VRID no other group uses, but groups[{first}] uses {vrid}"),
                ));
            }
            if group.spread == Some(true) {
                return Err(ConfigError::new(
                    at("spread"),
                    "false or absent: a manual vrid carries every VIP on one master",
                ));
            }
            for node in &group.nodes {
                match priorities.get(&node.name) {
                    Some(1..=255) => {}
                    Some(p) => {
                        return Err(ConfigError::new(
                            at(&format!("priorities.{}", node.name)),
                            format!("1 to 255, got {p}"),
                        ));
                    }
                    None => {
                        return Err(ConfigError::new(
                            at("priorities"),
                            format!("a priority for node {:?}", node.name),
                        ));
                    }
                }
            }
            if let Some(stranger) = priorities.keys().find(|n| !members.contains(n.as_str())) {
                return Err(ConfigError::new(
                    at(&format!("priorities.{stranger}")),
                    "a node listed in nodes",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
