//! A group's checks: each group alone (identity, announce mode, VLAN, members, VIPs, timers,
//! a manual VRID) and what must hold across groups.

use super::*;

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

pub(in crate::config) fn validate_groups(
    groups: &[GroupConfig],
    default_interface: &str,
    vip_owner: &mut BTreeMap<IpAddr, crate::config::VipField>,
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
    vip_owner: &mut BTreeMap<IpAddr, crate::config::VipField>,
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
        if !crate::config::is_unicast(vip.address) {
            check_unicast(&field(), vip.address)?;
        }
        if let IpAddr::V6(v6) = vip.address
            && v6.is_unicast_link_local()
        {
            return Err(ConfigError::new(field(), format!("a global IPv6 address, not the link-local {v6}")));
        }
        if let Some(first) = vip_owner.insert(vip.address, crate::config::VipField::Group(g, v)) {
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
