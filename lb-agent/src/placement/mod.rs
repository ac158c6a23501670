//! Placement: a pure function from a group's members and VIPs to each VIP's ranked owners and
//! the VRRP instances (VRIDs) that carry them.
//!
//! Every agent computes the placement on its own and must reach the same result, so it depends only
//! on the *sets* it is given: inputs are sorted and deduplicated first, hashing is a fixed
//! function of names (never `RandomState`), and outputs are ordered maps.
//!
//! - Owners: Services are visited in hash order; each VIP ranks nodes by rendezvous (HRW) hash
//!   of its address and takes the first node that no earlier VIP of its Service took and that
//!   is not full. "Full" is a per-node capacity of ⌈1.2 × mean⌉ preferred VIPs (bounded-load
//!   HRW), which bounds max/mean for every input, not just on average. Per-VIP rankings keep a
//!   membership change local: only VIPs whose choice involved that node move.
//! - Backups: the next node of the VIP's own ranking, so a failed node's VIPs fall over to many
//!   survivors, each to where placement would put it next (when that node has room). Unspread
//!   VIPs take their Service's first VIP's owner *and* backup, so they fail over together.
//! - Instances: VIPs with the same (owner, backup) share one VRRP instance: at most n·(n−1)
//!   VRIDs, whatever the VIP count. Above [`PAIR_KEYED_MAX_NODES`] nodes, by owner only.
//! - VRIDs: pinned allocations (published earlier) are kept; other keys take their hash-preferred
//!   VRID, probing upwards, so a new key seldom shifts an existing one.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use crate::name_hash::{self, hrw};

/// Up to this many nodes, instances are keyed by (owner, backup): 16·15 = 240 ≤ 255 VRIDs.
pub const PAIR_KEYED_MAX_NODES: usize = 16;
/// Bounded-load factor: no node is preferred owner of more than ⌈1.2 × mean⌉ VIPs.
const LOAD_FACTOR: f64 = 1.2;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupInput {
    /// Member node names, any order; duplicates are ignored.
    pub nodes: Vec<String>,
    pub vips: Vec<VipInput>,
    /// Never allocated (other routers on the segment, other groups).
    pub excluded_vrids: BTreeSet<u8>,
    /// Allocations published earlier (e.g. in a LoadBalancerGroup's status), kept while valid.
    pub pinned_vrids: BTreeMap<InstanceKey, u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipInput {
    pub address: IpAddr,
    /// The Service, e.g. `namespace/name`; its VIPs go to distinct nodes. `None`: a Service of
    /// its own.
    pub service: Option<String>,
    /// `false`: every VIP of the Service follows the Service's first VIP (same owner and backup,
    /// so the same instance where eligibility allows).
    pub spread: bool,
    /// Only these nodes may own the VIP (`externalTrafficPolicy: Local`).
    pub eligible: Option<BTreeSet<String>>,
}

/// What VIPs sharing one VRRP instance have in common.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceKey {
    pub primary: String,
    /// `None` above [`PAIR_KEYED_MAX_NODES`] nodes, or when only one node is eligible.
    pub secondary: Option<String>,
    /// Set when the VIPs may only live on some nodes: such VIPs never share an instance with
    /// VIPs that could live elsewhere, or ineligible nodes would get a priority for them.
    pub eligible: Option<BTreeSet<String>>,
}

impl InstanceKey {
    /// The key as a LoadBalancerGroup's `status.vrids` writes it: `owner/backup`, `owner/-`
    /// without a backup, then `@node,node` when eligibility is restricted.
    pub fn status_key(&self) -> String {
        let mut s = format!("{}/{}", self.primary, self.secondary.as_deref().unwrap_or("-"));
        if let Some(eligible) = &self.eligible {
            s.push('@');
            s.push_str(&eligible.iter().cloned().collect::<Vec<_>>().join(","));
        }
        s
    }

    /// Reads [`InstanceKey::status_key`] back; `None` for text it never writes.
    pub fn from_status_key(text: &str) -> Option<InstanceKey> {
        let (pair, eligible) = match text.split_once('@') {
            Some((pair, list)) => {
                (pair, Some(list.split(',').filter(|n| !n.is_empty()).map(str::to_owned).collect()))
            }
            None => (text, None),
        };
        let (primary, secondary) = pair.split_once('/')?;
        if primary.is_empty() || secondary.is_empty() {
            return None;
        }
        Some(InstanceKey {
            primary: primary.to_owned(),
            secondary: (secondary != "-").then(|| secondary.to_owned()),
            eligible,
        })
    }

    fn label(&self) -> String {
        let mut s = self.primary.clone();
        s.push('\u{0}');
        if let Some(secondary) = &self.secondary {
            s.push_str(secondary);
        }
        for node in self.eligible.iter().flatten() {
            s.push('\u{0}');
            s.push_str(node);
        }
        s
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipPlacement {
    /// Best first: the instance's ranking, which this VIP follows.
    pub ranking: Vec<String>,
    pub vrid: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstancePlacement {
    pub key: InstanceKey,
    /// Best first: owner, backup, then the remaining eligible nodes by HRW on the key.
    pub ranking: Vec<String>,
    pub vips: BTreeSet<IpAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnplacedReason {
    /// No member node may own it (none in the group, or none of its eligible nodes is).
    NoEligibleNode,
    /// All 255 VRIDs are excluded or taken.
    VridsExhausted,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupPlacement {
    pub vips: BTreeMap<IpAddr, VipPlacement>,
    pub instances: BTreeMap<u8, InstancePlacement>,
    pub unplaced: BTreeMap<IpAddr, UnplacedReason>,
}

/// The VRRP priority `node` advertises for `instance`: 254 for the owner, one less per rank, so
/// the ranking is exactly the order of succession. 255 is left to address owners.
pub fn priority(instance: &InstancePlacement, node: &str) -> Option<u8> {
    let rank = instance.ranking.iter().position(|n| n == node)?;
    Some(254 - rank.min(253) as u8)
}

pub fn place(input: &GroupInput) -> GroupPlacement {
    let nodes: BTreeSet<&str> = input.nodes.iter().map(String::as_str).collect();
    let mut placement = GroupPlacement::default();

    // One entry per address. Duplicates keep the least by content, not the first listed, so
    // that the input's order cannot matter.
    let mut unique: Vec<&VipInput> = input.vips.iter().collect();
    unique.sort_by(|a, b| {
        (a.address, &a.service, a.spread, &a.eligible).cmp(&(b.address, &b.service, b.spread, &b.eligible))
    });
    unique.dedup_by_key(|v| v.address);
    let services = by_service(&unique);
    let mut order: Vec<(&String, &Vec<&VipInput>)> = services.iter().collect();
    order.sort_by_key(|(key, _)| (name_hash::of(key), *key));

    let placeable = unique.len().max(1) as f64;
    let capacity = ((placeable / nodes.len().max(1) as f64) * LOAD_FACTOR).ceil() as usize;
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (*n, 0)).collect();
    let pair_keyed = nodes.len() <= PAIR_KEYED_MAX_NODES;
    let mut members: BTreeMap<InstanceKey, BTreeSet<IpAddr>> = BTreeMap::new();

    for (_, vips) in order {
        let owners_in_service: Vec<Option<&str>> =
            place_service(vips, &nodes, &mut load, capacity, &mut placement);
        // The Service's first placed VIP: (owner, backup). Unspread VIPs follow both, so that they
        // share its instance and fail over together, not just start on the same node.
        let mut leader: Option<(&str, Option<&str>)> = None;
        for (index, (vip, owner)) in vips.iter().zip(&owners_in_service).enumerate() {
            let Some(owner) = *owner else { continue };
            let eligible = eligible_nodes(vip, &nodes);
            let secondary = match leader {
                Some((leader_owner, Some(leader_backup)))
                    if !vip.spread && leader_owner == owner && eligible.contains(&leader_backup) =>
                {
                    Some(leader_backup)
                }
                // The backup is where placement would put the VIP without its owner: next in
                // the VIP's own ranking, avoiding the nodes of the Service's earlier VIPs while
                // it can. Not the later VIPs' nodes too: that would keep a Service apart during
                // a failover, but placing again would then disagree with VRRP far more often
                // (measured: new owner = old backup for ~83% of a failed node's VIPs, not ~99%).
                _ => {
                    let earlier: BTreeSet<&str> =
                        owners_in_service[..index].iter().flatten().copied().collect();
                    let ranking = ranked(&vip.address.to_string(), &eligible);
                    let others: Vec<&str> = ranking.iter().copied().filter(|n| *n != owner).collect();
                    others.iter().copied().find(|n| !earlier.contains(n)).or(others.first().copied())
                }
            };
            leader.get_or_insert((owner, secondary));
            let key = InstanceKey {
                primary: owner.to_owned(),
                secondary: secondary.filter(|_| pair_keyed).map(str::to_owned),
                eligible: vip.eligible.as_ref().map(|_| eligible.iter().map(|n| (*n).to_owned()).collect()),
            };
            members.entry(key).or_default().insert(vip.address);
        }
    }

    number_instances(input, &nodes, members, &mut placement);
    placement
}

/// Services, each with its VIPs in address order (the index that rotates the ranking); a VIP
/// of no Service is a service of its own.
fn by_service<'v>(unique: &[&'v VipInput]) -> BTreeMap<String, Vec<&'v VipInput>> {
    let mut services: BTreeMap<String, Vec<&VipInput>> = BTreeMap::new();
    for vip in unique {
        let key = vip.service.clone().unwrap_or_else(|| format!("vip:{}", vip.address));
        services.entry(key).or_default().push(vip);
    }
    services
}

/// Gives each instance its VRID and ranking, and each VIP its instance's; VIPs of instances
/// left without a VRID are unplaced.
fn number_instances(
    input: &GroupInput,
    nodes: &BTreeSet<&str>,
    members: BTreeMap<InstanceKey, BTreeSet<IpAddr>>,
    placement: &mut GroupPlacement,
) {
    let vrids = allocate_vrids(members.keys(), &input.excluded_vrids, &input.pinned_vrids);
    for (key, vips) in members {
        let Some(&vrid) = vrids.get(&key) else {
            for vip in vips {
                placement.unplaced.insert(vip, UnplacedReason::VridsExhausted);
            }
            continue;
        };
        let ranking = instance_ranking(&key, nodes);
        for vip in &vips {
            placement.vips.insert(*vip, VipPlacement { ranking: ranking.clone(), vrid });
        }
        placement.instances.insert(vrid, InstancePlacement { key, ranking, vips });
    }
}

/// Nodes by HRW score for `seed`, best first (ties by name, so the order is total).
fn ranked<'a>(seed: &str, nodes: &[&'a str]) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = nodes.iter().map(|n| (hrw(seed, n), *n)).collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().map(|(_, n)| n).collect()
}

/// Owners for one Service's VIPs (in address order). Each VIP walks its own HRW ranking and
/// takes the first node that no earlier VIP of the Service took and that has room; failing
/// that, the first the Service has not used; failing that (more VIPs than nodes), its top node.
/// With `spread: false` every VIP follows the first one.
fn place_service<'a>(
    vips: &[&VipInput],
    nodes: &BTreeSet<&'a str>,
    load: &mut BTreeMap<&'a str, usize>,
    capacity: usize,
    placement: &mut GroupPlacement,
) -> Vec<Option<&'a str>> {
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let mut first: Option<&'a str> = None;
    vips.iter()
        .map(|vip| {
            let eligible = eligible_nodes(vip, nodes);
            if eligible.is_empty() {
                placement.unplaced.insert(vip.address, UnplacedReason::NoEligibleNode);
                return None;
            }
            let ranking = ranked(&vip.address.to_string(), &eligible);
            let owner = match first.filter(|f| !vip.spread && eligible.contains(f)) {
                Some(f) => f,
                None => ranking
                    .iter()
                    .copied()
                    .find(|n| !used.contains(n) && load.get(n).copied().unwrap_or(0) < capacity)
                    .or_else(|| ranking.iter().copied().find(|n| !used.contains(n)))
                    .unwrap_or(ranking[0]),
            };
            first.get_or_insert(owner);
            used.insert(owner);
            *load.entry(owner).or_default() += 1;
            Some(owner)
        })
        .collect()
}

fn eligible_nodes<'a>(vip: &VipInput, nodes: &BTreeSet<&'a str>) -> Vec<&'a str> {
    match &vip.eligible {
        Some(only) => nodes.iter().copied().filter(|n| only.contains(*n)).collect(),
        None => nodes.iter().copied().collect(),
    }
}

fn instance_ranking(key: &InstanceKey, nodes: &BTreeSet<&str>) -> Vec<String> {
    let eligible: Vec<&str> = match &key.eligible {
        Some(only) => nodes.iter().copied().filter(|n| only.contains(*n)).collect(),
        None => nodes.iter().copied().collect(),
    };
    let mut ranking = vec![key.primary.clone()];
    ranking.extend(key.secondary.clone());
    let rest: Vec<&str> = eligible.into_iter().filter(|n| !ranking.iter().any(|r| r == n)).collect();
    ranking.extend(ranked(&key.label(), &rest).into_iter().map(str::to_owned));
    ranking
}

/// Pinned keys keep their VRID when it is still valid; the others, in key order, take their
/// hash-preferred VRID or the next free one above it.
fn allocate_vrids<'a>(
    keys: impl Iterator<Item = &'a InstanceKey>,
    excluded: &BTreeSet<u8>,
    pinned: &BTreeMap<InstanceKey, u8>,
) -> BTreeMap<InstanceKey, u8> {
    let keys: Vec<&InstanceKey> = keys.collect();
    let mut taken: BTreeSet<u8> = excluded.iter().copied().chain([0]).collect();
    let mut out = BTreeMap::new();
    for key in &keys {
        if let Some(&vrid) = pinned.get(*key)
            && taken.insert(vrid)
        {
            out.insert((*key).clone(), vrid);
        }
    }
    for key in keys {
        if out.contains_key(key) {
            continue;
        }
        let preferred = (name_hash::of(&key.label()) % 255) as u8 + 1;
        let free = (0..255u16)
            .map(|step| ((u16::from(preferred) - 1 + step) % 255) as u8 + 1)
            .find(|v| !taken.contains(v));
        if let Some(vrid) = free {
            taken.insert(vrid);
            out.insert(key.clone(), vrid);
        }
    }
    out
}

#[cfg(test)]
mod tests;
