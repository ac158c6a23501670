//! Which VIPs this node answers, on which uplink, and how: the decision that announcers carry
//! out. Pure: the config's standalone VIPs, the node plan, the uplinks and what VRRP claims go
//! in; the owned-VIP map's contents, the addresses each uplink should hold and the
//! solicited-node groups it should listen on come out. The agent's shell writes them (maps,
//! netlink) and announces the VIPs newly owned; the shell never decides.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
};

use lb_common::maps::OwnedVip;

use crate::{
    config::Config,
    dataplane::vips::OwnedSet,
    mac::MacAddr,
    node_plan::NodePlan,
    vrrp::{family::InstanceId, router::Claim},
};

/// What the decision needs of an uplink: the MAC its answers carry, and its slot in the
/// owned-VIP entries (which interface a VIP is answered on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UplinkView {
    pub mac: MacAddr,
    pub slot: u8,
}

/// What this node should answer and hold now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// The owned-VIP map: each VIP XDP answers for, with its MAC, lease and uplink.
    pub xdp: OwnedSet,
    /// The VIP addresses each uplink holds (modes `netlink`, `both`); every uplink is listed.
    pub kernel: BTreeMap<String, BTreeSet<IpAddr>>,
    /// The IPv6 VIPs only XDP answers for, per uplink: their solicited-node groups are joined
    /// for them (the kernel joins those of the addresses it holds).
    pub listening: BTreeMap<String, BTreeSet<Ipv6Addr>>,
    /// The VIPs owned through VRRP and announced by ARP/NDP (the ones an election can take or
    /// lose, and gratuitous ARPs announce).
    pub vrrp_owned: BTreeSet<IpAddr>,
    /// The VIPs routed to the fabric through the local FRR: every eligible one of the
    /// `announce: bgp` groups, and those this node is VRRP master of in `bgpOwner` groups.
    pub routes: BTreeSet<IpAddr>,
}

impl Wanted {
    /// Withdrawing before stopping: the routes go (the fabric moves its flows to the other
    /// nodes) while everything else keeps serving the flows still arriving meanwhile.
    pub fn withdrawn(self) -> Self {
        Self { routes: BTreeSet::new(), ..self }
    }
}

/// The decision. `uplinks` are this node's, by interface name; `default` names the one the
/// config's standalone VIPs are answered on. A claimed VIP the plan does not have, or whose
/// uplink the node does not have, is left out.
pub fn wanted(
    config: &Config,
    plan: &NodePlan,
    uplinks: &BTreeMap<String, UplinkView>,
    claims: &BTreeMap<InstanceId, Claim>,
) -> Wanted {
    let mut wanted = Wanted {
        kernel: uplinks.keys().map(|name| (name.clone(), BTreeSet::new())).collect(),
        listening: uplinks.keys().map(|name| (name.clone(), BTreeSet::new())).collect(),
        ..Wanted::default()
    };
    if let Some(default) = uplinks.get(&config.interface) {
        for vip in &config.vips {
            let entry = OwnedVip::new(vip.mac.unwrap_or(default.mac).0).on_uplink(default.slot);
            wanted.xdp.insert(vip.address, entry);
            if let IpAddr::V6(v6) = vip.address {
                wanted.listening.entry(config.interface.clone()).or_default().insert(v6);
            }
        }
    }
    for vip in &plan.routed {
        let Some(settings) = plan.vips.get(vip) else { continue };
        let Some(uplink) = uplinks.get(&settings.interface) else { continue };
        wanted.xdp.insert(*vip, OwnedVip::new(uplink.mac.0).routed().on_uplink(uplink.slot));
        wanted.routes.insert(*vip);
    }
    for (id, claim) in claims {
        // An instance's VIPs are all of one group: one interface, one mode, resolved once
        // (an instance may hold thousands).
        let Some(settings) = claim.vips.iter().find_map(|vip| plan.vips.get(vip)) else { continue };
        let Some(uplink) = uplinks.get(&settings.interface) else { continue };
        let mac = uplink.mac.0;
        let entry =
            if settings.mode.uses_netlink() { OwnedVip::with_kernel(mac) } else { OwnedVip::new(mac) };
        let entry = entry.with_lease(id.lease_slot()).on_uplink(uplink.slot);
        let planned = claim.vips.iter().filter(|vip| plan.vips.contains_key(*vip));
        if settings.announce.routed() {
            // bgpOwner: the master routes its VIPs; nothing is claimed on the segment.
            wanted.xdp.extend(planned.clone().map(|vip| (*vip, entry.routed())));
            wanted.routes.extend(planned);
            continue;
        }
        wanted.vrrp_owned.extend(&claim.vips);
        if settings.mode.uses_xdp() {
            wanted.xdp.extend(planned.clone().map(|vip| (*vip, entry)));
        }
        if settings.mode.uses_netlink() {
            wanted.kernel.entry(settings.interface.clone()).or_default().extend(planned);
        } else {
            let v6 = planned.filter_map(|vip| match vip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            });
            wanted.listening.entry(settings.interface.clone()).or_default().extend(v6);
        }
    }
    wanted
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::{config::VipMode, node_plan::node_plan, vrrp::family::IpFamily};

    const MAC0: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa0]);
    const MAC1: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa1]);

    /// Node n0 in group `web` on eth0 (mode `mode`) and `db` on eth1 (xdp), both with IPv4
    /// and IPv6 VIPs, and two standalone VIPs on eth0.
    fn config(mode: &str) -> Config {
        Config::parse(&format!(
            "interface: eth0\nvips:\n  - address: 203.0.113.1\n  - {{address: 2001:db8:9::1, mac: '02:00:00:00:00:ff'}}\ngroups:\n\
             \x20 - name: web\n    vipMode: {mode}\n    vrid: 10\n    priorities: {{n0: 200, n1: 100}}\n    nodes:\n\
             \x20     - {{name: n0, address: 192.0.2.10, address6: 'fe80::a'}}\n      - {{name: n1, address: 192.0.2.11, address6: 'fe80::b'}}\n\
             \x20   vips: [{{address: 198.51.100.10}}, {{address: 2001:db8:6::10}}]\n\
             \x20 - name: db\n    interface: eth1\n    vrid: 20\n    priorities: {{n0: 200, n1: 100}}\n    nodes:\n\
             \x20     - {{name: n0, address: 192.0.3.10, address6: 'fe80::a'}}\n      - {{name: n1, address: 192.0.3.11, address6: 'fe80::b'}}\n\
             \x20   vips: [{{address: 198.51.101.10}}, {{address: 2001:db8:7::10}}]\n"
        ))
        .expect("a valid config")
    }

    fn uplinks() -> BTreeMap<String, UplinkView> {
        [
            ("eth0".to_owned(), UplinkView { mac: MAC0, slot: 0 }),
            ("eth1".to_owned(), UplinkView { mac: MAC1, slot: 1 }),
        ]
        .into()
    }

    /// What VRRP claims when n0 is master of `vrids` (both families of each).
    fn claims(plan: &NodePlan, vrids: &[u8]) -> BTreeMap<InstanceId, Claim> {
        plan.instances
            .iter()
            .filter(|i| vrids.contains(&i.vrid))
            .map(|i| (i.id(), Claim { vips: i.vips.clone(), until: Instant::now() }))
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn standalone_vips_are_answered_on_the_default_uplink_whoever_is_master() {
        let config = config("xdp");
        let plan = node_plan(&config, "n0");
        let w = wanted(&config, &plan, &uplinks(), &BTreeMap::new());
        assert_eq!(w.xdp[&ip("203.0.113.1")], OwnedVip::new(MAC0.0).on_uplink(0));
        assert_eq!(w.xdp[&ip("2001:db8:9::1")], OwnedVip::new([2, 0, 0, 0, 0, 0xff]).on_uplink(0));
        assert_eq!(w.xdp.len(), 2);
        assert_eq!(w.listening["eth0"], ["2001:db8:9::1".parse().unwrap()].into());
        assert!(w.kernel.values().all(BTreeSet::is_empty) && w.vrrp_owned.is_empty());
        assert_eq!(w.kernel.keys().collect::<Vec<_>>(), ["eth0", "eth1"], "every uplink is listed");
    }

    #[test]
    fn a_claimed_vip_is_answered_on_its_groups_uplink_with_its_instances_lease() {
        let config = config("xdp");
        let plan = node_plan(&config, "n0");
        let w = wanted(&config, &plan, &uplinks(), &claims(&plan, &[20]));
        let lease = |family| InstanceId { family, vrid: 20 }.lease_slot();
        assert_eq!(
            w.xdp[&ip("198.51.101.10")],
            OwnedVip::new(MAC1.0).with_lease(lease(IpFamily::V4)).on_uplink(1)
        );
        assert_eq!(
            w.xdp[&ip("2001:db8:7::10")],
            OwnedVip::new(MAC1.0).with_lease(lease(IpFamily::V6)).on_uplink(1)
        );
        assert!(!w.xdp.contains_key(&ip("198.51.100.10")), "web's VIPs are not claimed");
        assert_eq!(w.listening["eth1"], ["2001:db8:7::10".parse().unwrap()].into());
        assert_eq!(w.vrrp_owned, [ip("198.51.101.10"), ip("2001:db8:7::10")].into());
    }

    #[test]
    fn the_vip_mode_decides_between_the_map_and_the_uplinks_addresses() {
        for (mode, in_xdp, in_kernel) in
            [("xdp", true, false), ("both", true, true), ("netlink", false, true)]
        {
            let config = config(mode);
            let plan = node_plan(&config, "n0");
            let w = wanted(&config, &plan, &uplinks(), &claims(&plan, &[10]));
            for vip in [ip("198.51.100.10"), ip("2001:db8:6::10")] {
                assert_eq!(w.xdp.contains_key(&vip), in_xdp, "{mode}: {vip} in the map");
                assert_eq!(w.kernel["eth0"].contains(&vip), in_kernel, "{mode}: {vip} on eth0");
                if in_xdp {
                    assert_eq!(w.xdp[&vip].kernel_too(), in_kernel, "{mode}: {vip}");
                }
            }
            // The kernel joins the groups of addresses it holds; XDP alone needs them joined.
            let listened = w.listening["eth0"].contains(&"2001:db8:6::10".parse().unwrap());
            assert_eq!(listened, !in_kernel, "{mode}");
        }
    }

    #[test]
    fn a_vip_outside_the_plan_or_on_a_missing_uplink_is_left_out() {
        let config = config("xdp");
        let plan = node_plan(&config, "n0");
        let mut claimed = claims(&plan, &[10, 20]);
        let stray = ip("198.51.100.99");
        claimed.values_mut().next().unwrap().vips.insert(stray);
        let only_eth0: BTreeMap<String, UplinkView> = uplinks().into_iter().take(1).collect();
        let w = wanted(&config, &plan, &only_eth0, &claimed);
        assert!(!w.xdp.contains_key(&stray));
        assert!(w.xdp.contains_key(&ip("198.51.100.10")));
        assert!(!w.xdp.contains_key(&ip("198.51.101.10")), "eth1 is not this node's");
        assert_eq!(w.kernel.keys().collect::<Vec<_>>(), ["eth0"]);
    }

    /// Group `edge` on eth0 in mode `announce` over n0, n1 and n2: one VIP of each family for
    /// every member, one (in `bgp`) only n1 is eligible for.
    fn routed_config(announce: &str) -> Config {
        let only_n1 =
            if announce == "bgp" { "\n      - {address: 198.51.100.30, eligibleNodes: [n1]}" } else { "" };
        Config::parse(&format!(
            "interface: eth0\ngroups:\n  - name: edge\n    announce: {announce}\n    nodes:\n\
             \x20     - {{name: n0, address: 192.0.2.10, address6: 'fe80::a'}}\n      - {{name: n1, address: 192.0.2.11, address6: 'fe80::b'}}\n\
             \x20     - {{name: n2, address: 192.0.2.12, address6: 'fe80::c'}}\n\
             \x20   vips:\n      - {{address: 198.51.100.20}}\n      - {{address: '2001:db8:6::20'}}{only_n1}\n"
        ))
        .expect("a valid config")
    }

    #[test]
    fn in_bgp_every_member_serves_and_routes_the_vips_it_is_eligible_for_unanswered_on_the_segment() {
        let config = routed_config("bgp");
        for (node, routed) in [
            ("n0", vec!["198.51.100.20", "2001:db8:6::20"]),
            ("n1", vec!["198.51.100.20", "198.51.100.30", "2001:db8:6::20"]),
            ("n3", vec![]),
        ] {
            let plan = node_plan(&config, node);
            assert!(plan.instances.is_empty() && plan.locals.is_empty(), "{node}: no VRRP in bgp");
            let w = wanted(&config, &plan, &uplinks(), &BTreeMap::new());
            let routed: BTreeSet<IpAddr> = routed.iter().map(|s| ip(s)).collect();
            assert_eq!(w.routes, routed, "{node}");
            assert_eq!(w.xdp.keys().copied().collect::<BTreeSet<_>>(), routed, "{node}");
            for entry in w.xdp.values() {
                assert_eq!(*entry, OwnedVip::new(MAC0.0).routed().on_uplink(0), "{node}: no lease, no ARP");
            }
            assert!(w.vrrp_owned.is_empty() && w.listening.values().all(BTreeSet::is_empty), "{node}");
            let draining = w.clone().withdrawn();
            assert!(draining.routes.is_empty() && draining.xdp == w.xdp, "{node}: withdrawn, still serving");
        }
    }

    #[test]
    fn in_bgp_owner_only_the_master_routes_under_its_lease_and_nothing_is_announced_on_the_segment() {
        let config = routed_config("bgpOwner");
        let plan = node_plan(&config, "n0");
        assert!(!plan.instances.is_empty(), "bgpOwner elects a master by VRRP");
        let backup = wanted(&config, &plan, &uplinks(), &BTreeMap::new());
        assert!(backup.routes.is_empty() && backup.xdp.is_empty());
        let all: Vec<u8> = plan.instances.iter().map(|i| i.vrid).collect();
        let master = wanted(&config, &plan, &uplinks(), &claims(&plan, &all));
        assert_eq!(master.routes, [ip("198.51.100.20"), ip("2001:db8:6::20")].into());
        for (vip, entry) in &master.xdp {
            assert!(entry.is_routed() && entry.lease != OwnedVip::NO_LEASE, "{vip}: {entry:?}");
        }
        assert!(master.vrrp_owned.is_empty(), "no gratuitous ARP for a routed VIP");
        assert!(master.listening.values().all(BTreeSet::is_empty));
    }

    #[test]
    fn a_routed_group_must_leave_the_kernel_and_vrrp_settings_alone() {
        let bad = [
            ("announce: bgp\n    vipMode: both", "groups[0].vipMode"),
            ("announce: bgp\n    vrid: 7\n    priorities: {n0: 100}", "groups[0].vrid"),
            ("announce: bgpOwner\n    vipMode: netlink", "groups[0].vipMode"),
        ];
        for (settings, field) in bad {
            let yaml = format!(
                "interface: eth0\ngroups:\n  - name: edge\n    {settings}\n    nodes: [{{name: n0, address: 192.0.2.10}}]\n    vips: [{{address: 198.51.100.20}}]\n"
            );
            let error = Config::parse(&yaml).expect_err(settings).to_string();
            assert!(error.contains(field), "{settings}: {error}");
        }
    }

    proptest! {
        /// Whatever VRRP claims: a claimed planned VIP is answered exactly as its group's mode
        /// says, on its group's uplink, and nothing else is (bar the standalone VIPs).
        #[test]
        fn every_claimed_vip_and_no_other_is_answered(
            mode in prop::sample::select(vec![VipMode::Xdp, VipMode::Both, VipMode::Netlink]),
            masters in prop::sample::subsequence(vec![10u8, 20], 0..=2),
        ) {
            let name = match mode { VipMode::Xdp => "xdp", VipMode::Both => "both", VipMode::Netlink => "netlink" };
            let config = config(name);
            let plan = node_plan(&config, "n0");
            let claimed = claims(&plan, &masters);
            let w = wanted(&config, &plan, &uplinks(), &claimed);
            let owned: BTreeSet<IpAddr> = claimed.values().flat_map(|c| c.vips.iter().copied()).collect();
            prop_assert_eq!(&w.vrrp_owned, &owned);
            for (vip, settings) in &plan.vips {
                let claimed = owned.contains(vip);
                prop_assert_eq!(w.xdp.contains_key(vip), claimed && settings.mode.uses_xdp());
                let held = w.kernel.values().any(|set| set.contains(vip));
                prop_assert_eq!(held, claimed && settings.mode.uses_netlink());
                if claimed && settings.mode.uses_netlink() {
                    prop_assert!(w.kernel[&settings.interface].contains(vip));
                }
            }
            prop_assert_eq!(w.xdp.len(), config.vips.len() + owned.iter().filter(|v| plan.vips[*v].mode.uses_xdp()).count());
        }
    }
}
