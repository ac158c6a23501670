//! From the configuration to what this node runs: its VRRP instances and how each VIP is served.
//!
//! Every node computes the plan for every group, member or not, so that all nodes agree on
//! which VRIDs are taken: the result depends only on the configuration, never on which node
//! computes it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use crate::{
    config::{Announce, AnnouncementConfig, Config, GroupConfig, GroupNode, VipMode},
    placement::{self, GroupInput, VipInput},
    vrrp::{
        family::IpFamily,
        router::{InstanceSpec, Locals},
    },
};

/// How a VRRP-managed VIP is served when this node is its master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipSettings {
    pub group: String,
    /// The group's interface: the only one the VIP is answered and served on.
    pub interface: String,
    pub mode: VipMode,
    pub announce: Announce,
    pub announcements: AnnouncementConfig,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// This node's address of each family on each interface where it is a member of a group:
    /// the source of its advertisements there.
    pub locals: Locals,
    /// The interfaces this node serves VIPs on: the default uplink and its groups'.
    pub uplinks: BTreeSet<String>,
    pub instances: Vec<InstanceSpec>,
    /// Every group VIP, whether or not this node ever owns it.
    pub vips: BTreeMap<IpAddr, VipSettings>,
    /// The VIPs of this node's `announce: bgp` groups it is eligible for: served and routed
    /// for as long as the node serves, no election.
    pub routed: BTreeSet<IpAddr>,
    /// VIPs placement could not place, with the reason, for logs and Events.
    pub unplaced: Vec<(String, IpAddr, String)>,
    /// Every planned group's VRIDs by instance (`status.vrids`): the same on every node.
    pub vrids: BTreeMap<String, BTreeMap<String, u8>>,
    /// The key file of each group of this node's that authenticates. The shell reads it and
    /// gives the group's instances their keys; an instance without them does not run.
    pub key_files: BTreeMap<String, std::path::PathBuf>,
}

impl NodePlan {
    /// This node's IPv4 address on `interface`, where it is a group member there.
    pub fn ipv4_local(&self, interface: &str) -> Option<Ipv4Addr> {
        match self.locals.get(&(interface.to_owned(), IpFamily::V4)) {
            Some(IpAddr::V4(v4)) => Some(*v4),
            _ => None,
        }
    }
}

pub fn node_plan(config: &Config, me: &str) -> NodePlan {
    let mut plan = NodePlan { uplinks: BTreeSet::from([config.interface.clone()]), ..NodePlan::default() };
    let mut groups: Vec<&GroupConfig> = config.groups.iter().collect();
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    // Manual VRIDs are reserved before placement allocates any.
    let mut taken: BTreeSet<u8> = groups.iter().filter_map(|g| g.vrid).collect();

    for group in groups {
        let interface = &*config.group_interface(group);
        let me_in_group = group.nodes.iter().find(|n| n.name == me);
        let peers = |family: IpFamily| -> BTreeSet<IpAddr> {
            let others = group.nodes.iter().filter(|n| n.name != me);
            match family {
                IpFamily::V4 => others.map(|n| IpAddr::V4(n.address)).collect(),
                IpFamily::V6 => others.filter_map(|n| Some(IpAddr::V6(n.address6?))).collect(),
            }
        };
        if group.announce == Announce::Bgp {
            plan_routed(&mut plan, group, interface, me);
            continue;
        }
        plan_member(&mut plan, group, interface, me_in_group);
        let spec = |family: IpFamily, vrid: u8, priority: u8, vips: BTreeSet<IpAddr>| InstanceSpec {
            group: group.name.clone(),
            interface: interface.to_owned(),
            family,
            vrid,
            priority,
            advert_interval: group.advert_interval,
            preempt: group.preempt,
            preempt_delay: group.preempt_delay,
            vips,
            peers: peers(family),
            transport: group.transport,
            checksum: group.checksum,
            keys: None,
        };
        // One instance per family: an advertisement carries addresses of its own family only.
        let specs = |vrid: u8, priority: u8, vips: BTreeSet<IpAddr>| -> Vec<InstanceSpec> {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .filter_map(|family| {
                    let vips: BTreeSet<IpAddr> =
                        vips.iter().filter(|v| IpFamily::of(**v) == family).copied().collect();
                    (!vips.is_empty()).then(|| spec(family, vrid, priority, vips))
                })
                .collect()
        };

        if let (Some(vrid), Some(priorities)) = (group.vrid, &group.priorities) {
            if let Some(priority) = priorities.get(me) {
                plan.instances.extend(specs(vrid, *priority, group.vips.iter().map(|v| v.address).collect()));
            }
            continue;
        }

        let group_placement = placement::place(&placement_input(group, &taken));
        taken.extend(group_placement.instances.keys().copied());
        plan.vrids.insert(
            group.name.clone(),
            group_placement.instances.iter().map(|(vrid, i)| (i.key.status_key(), *vrid)).collect(),
        );
        for (address, reason) in &group_placement.unplaced {
            plan.unplaced.push((group.name.clone(), *address, format!("{reason:?}")));
        }
        if me_in_group.is_none() {
            continue;
        }
        for (vrid, instance) in &group_placement.instances {
            let Some(priority) = placement::priority(instance, me) else { continue };
            plan.instances.extend(specs(*vrid, priority, instance.vips.clone()));
        }
    }
    plan
}

/// What a group adds wherever it runs: this node's local addresses, uplink and key file when it
/// is a member, and every VIP's settings.
fn plan_member(plan: &mut NodePlan, group: &GroupConfig, interface: &str, me_in_group: Option<&GroupNode>) {
    if let Some(node) = me_in_group {
        plan.locals.insert((interface.to_owned(), IpFamily::V4), node.address.into());
        if let Some(address6) = node.address6 {
            plan.locals.insert((interface.to_owned(), IpFamily::V6), address6.into());
        }
        plan.uplinks.insert(interface.to_owned());
        if let Some(auth) = &group.authentication {
            plan.key_files.insert(group.name.clone(), auth.key_file.clone());
        }
    }
    for vip in group.vips.iter() {
        plan.vips.insert(
            vip.address,
            VipSettings {
                group: group.name.clone(),
                interface: interface.to_owned(),
                mode: group.vip_mode,
                announce: group.announce,
                announcements: group.announcements.clone(),
            },
        );
    }
}

/// Placement's input for `group`, with the VRIDs other groups took excluded.
fn placement_input(group: &GroupConfig, taken: &BTreeSet<u8>) -> GroupInput {
    GroupInput {
        nodes: group.nodes.iter().map(|n| n.name.clone()).collect(),
        vips: group
            .vips
            .iter()
            .map(|v| VipInput {
                address: v.address,
                service: v.service.clone(),
                spread: v.spread.or(group.spread).unwrap_or(true),
                eligible: v.eligible_nodes.as_ref().map(|nodes| nodes.iter().cloned().collect()),
            })
            .collect(),
        excluded_vrids: group.excluded_vrids.iter().copied().chain(taken.iter().copied()).collect(),
        pinned_vrids: group
            .pinned_vrids
            .iter()
            .filter_map(|(key, vrid)| Some((placement::InstanceKey::from_status_key(key)?, *vrid)))
            .collect(),
    }
}

/// An `announce: bgp` group: no VRRP, so no instances, VRIDs or local addresses; this node
/// serves (and routes) each VIP it is eligible for, on the group's interface.
fn plan_routed(plan: &mut NodePlan, group: &GroupConfig, interface: &str, me: &str) {
    for vip in group.vips.iter() {
        let settings = VipSettings {
            group: group.name.clone(),
            interface: interface.to_owned(),
            mode: group.vip_mode,
            announce: group.announce,
            announcements: group.announcements.clone(),
        };
        plan.vips.insert(vip.address, settings);
    }
    if !group.nodes.iter().any(|n| n.name == me) {
        return;
    }
    plan.uplinks.insert(interface.to_owned());
    let eligible = |vip: &&crate::config::GroupVip| {
        vip.eligible_nodes.as_ref().is_none_or(|nodes| nodes.iter().any(|n| n == me))
    };
    plan.routed.extend(group.vips.iter().filter(eligible).map(|vip| vip.address));
}
