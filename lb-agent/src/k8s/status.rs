//! What the leader writes back: each served Service's addresses (from IPAM), the IPAM
//! finalizer, Warning Events for refusals, and each group's status. Pure: computed from the
//! cluster objects, so re-running it changes nothing that is already right.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::Service;

use super::{
    binding::{Refusal, bind},
    cluster::{ClusterState, current_ingress},
    crd::{GroupCondition, LoadBalancerGroupStatus, VipStatus},
    ipam::{self, Pools},
};

/// The finalizer that keeps a Service's address allocated until the Service is gone.
pub const IPAM_FINALIZER: &str = "lb-agent.io/ipam";
/// The condition on Services aimed at lb-agent: `True` when served, `False` with the reason.
pub const SERVICE_CONDITION: &str = "lb-agent.io/Served";

/// The reason of the Event and condition of a Service the data plane has no room for.
pub const CAPACITY_EXCEEDED: &str = "CapacityExceeded";

/// A Service's `lb-agent.io/Served` condition as it must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCondition {
    pub status: &'static str,
    pub reason: String,
    pub message: String,
    pub observed_generation: i64,
    pub last_transition_time: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusWrites {
    /// `(namespace, name)` → the addresses `status.loadBalancer.ingress` must list.
    pub ingress: BTreeMap<(String, String), Vec<IpAddr>>,
    /// Services that need the finalizer added.
    pub add_finalizer: Vec<(String, String)>,
    /// Services being deleted whose finalizer can go.
    pub release: Vec<(String, String)>,
    /// Warning Events: `(namespace, name)` of the Service, reason, message.
    pub warnings: Vec<((String, String), &'static str, String)>,
    /// Group name → its status.
    pub groups: BTreeMap<String, LoadBalancerGroupStatus>,
    /// Services whose `lb-agent.io/Served` condition must change.
    pub conditions: BTreeMap<(String, String), ServiceCondition>,
}

/// The status writes the cluster needs. `owners` is who is Master for each VIP, as this node's VRRP sees it;
/// `planned` is the node plan of the translated config (its VRIDs and unplaced VIPs are the
/// same on every node); `refused` names the Services (`namespace/name`) this node's data plane
/// has no room for, with why; `unserved` those the translation left out (invalid, or a port
/// another Service serves); `now` is the timestamp for conditions that change (RFC 3339).
pub fn writes(
    state: &ClusterState,
    owners: &BTreeMap<std::net::IpAddr, String>,
    planned: &crate::node_plan::NodePlan,
    refused: &BTreeMap<String, String>,
    unserved: &[Refusal],
    now: &str,
) -> StatusWrites {
    let mut out = StatusWrites::default();
    let pools: BTreeMap<String, Pools> = state
        .groups
        .iter()
        .filter_map(|g| Some((g.metadata.name.clone()?, Pools::parse(&g.spec.address_pools).ok()?)))
        .collect();
    let Requests { requests, by_name, refusals } = requests(state, &mut out);
    let allocation = ipam::allocate(&pools, &requests);
    ingress_and_warnings(&allocation, &by_name, planned, &mut out);
    for refusal in refusals.iter().chain(unserved) {
        if let Some((ns, name)) = refusal.service.split_once('/') {
            out.warnings.push(((ns.to_owned(), name.to_owned()), refusal.reason, refusal.message.clone()));
        }
    }
    for (service, message) in refused {
        if let Some((ns, name)) = service.split_once('/') {
            out.warnings.push(((ns.to_owned(), name.to_owned()), CAPACITY_EXCEEDED, message.clone()));
        }
    }
    service_conditions(state, &allocation, &mut out, now);
    for group in &state.groups {
        if let Some((name, status)) = group_status(group, state, owners, planned, &allocation, &by_name, now)
        {
            out.groups.insert(name, status);
        }
    }
    out
}

/// A Service's `(namespace, name)`.
fn service_key(s: &Service) -> (String, String) {
    (
        s.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

/// The Services aimed at a group, as address requests; each by name with its group; and the
/// refusals of binding. Finalizers to add and release go into `out`.
struct Requests<'s> {
    requests: Vec<ipam::Request>,
    by_name: BTreeMap<String, (&'s Service, String)>,
    refusals: Vec<Refusal>,
}

fn requests<'s>(state: &'s ClusterState, out: &mut StatusWrites) -> Requests<'s> {
    let mut requests = Vec::new();
    let mut by_name: BTreeMap<String, (&Service, String)> = BTreeMap::new();
    let mut refusals: Vec<Refusal> = Vec::new();
    for service in &state.services {
        let (bound, r) = bind(service, &state.groups);
        refusals.extend(r);
        let Some(bound) = bound else { continue };
        let k = service_key(service);
        if service.metadata.deletion_timestamp.is_some() {
            if has_finalizer(service) {
                out.release.push(k);
            }
            continue;
        }
        by_name.insert(bound.service.clone(), (service, bound.group.clone()));
        if !bound.wants_load_balancer_ip {
            continue;
        }
        if !has_finalizer(service) {
            out.add_finalizer.push(k.clone());
        }
        requests.push(ipam::Request {
            service: bound.service.clone(),
            group: bound.group.clone(),
            families: bound.families.clone(),
            prefer_dual_stack: bound.prefer_dual_stack,
            current: current_ingress(service),
            requested: bound.requested.clone(),
            shared_key: bound.shared_key.clone(),
            ports: service
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .unwrap_or_default()
                .iter()
                .map(|p| (p.port as u16, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
                .collect(),
        });
    }
    Requests { requests, by_name, refusals }
}

/// Ingress to write where the allocation changed it, and warnings for what it could not give
/// and for VIPs placement left without an owner.
fn ingress_and_warnings(
    allocation: &ipam::Allocation,
    by_name: &BTreeMap<String, (&Service, String)>,
    planned: &crate::node_plan::NodePlan,
    out: &mut StatusWrites,
) {
    for (service, ips) in &allocation.addresses {
        let (svc, _) = by_name[service];
        if current_ingress(svc) != *ips {
            out.ingress.insert(service_key(svc), ips.clone());
        }
    }
    for (service, error) in &allocation.errors {
        let (svc, _) = by_name[service];
        out.warnings.push((service_key(svc), error.reason(), error.to_string()));
    }
    for (group, vip, reason) in &planned.unplaced {
        let service = allocation
            .addresses
            .iter()
            .find(|(s, ips)| ips.contains(vip) && by_name.get(*s).is_some_and(|(_, g)| g == group))
            .map(|(s, _)| s.clone());
        if let Some((ns, name)) = service.as_deref().and_then(|s| s.split_once('/')) {
            let event_reason = if reason == "VridsExhausted" { "VridsExhausted" } else { "NoEligibleNode" };
            out.warnings.push((
                (ns.to_owned(), name.to_owned()),
                event_reason,
                format!("VIP {vip} has no owner: {reason}"),
            ));
        }
    }
}

/// One `Served` condition per Service aimed at us: the first problem, or served; written only
/// where it changes, keeping its transition time while its status stays.
fn service_conditions(
    state: &ClusterState,
    allocation: &ipam::Allocation,
    out: &mut StatusWrites,
    now: &str,
) {
    let mut verdicts: BTreeMap<String, (&'static str, String, String)> = BTreeMap::new();
    for (service, ips) in &allocation.addresses {
        let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        verdicts.insert(service.clone(), ("True", "Served".into(), format!("served at {}", list.join(", "))));
    }
    for ((ns, name), reason, message) in &out.warnings {
        let entry = verdicts.entry(format!("{ns}/{name}")).or_insert(("False", String::new(), String::new()));
        if entry.0 == "True" || entry.1.is_empty() {
            *entry = ("False", (*reason).to_owned(), message.clone());
        }
    }
    for svc in &state.services {
        let k = service_key(svc);
        let Some((status, reason, message)) = verdicts.get(&format!("{}/{}", k.0, k.1)) else { continue };
        if svc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let current = svc
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == SERVICE_CONDITION));
        if current.is_some_and(|c| c.status == *status && c.reason == *reason && c.message == *message) {
            continue;
        }
        let last_transition_time = match current {
            Some(c) if c.status == *status => c.last_transition_time.0.to_string(),
            _ => now.to_owned(),
        };
        out.conditions.insert(
            k,
            ServiceCondition {
                status,
                reason: reason.clone(),
                message: message.clone(),
                observed_generation: svc.metadata.generation.unwrap_or(0),
                last_transition_time,
            },
        );
    }
}

/// A group's status (members, VIPs and owners, VRIDs, Ready and Degraded), when it differs
/// from the stored one.
fn group_status(
    group: &super::crd::LoadBalancerGroup,
    state: &ClusterState,
    owners: &BTreeMap<std::net::IpAddr, String>,
    planned: &crate::node_plan::NodePlan,
    allocation: &ipam::Allocation,
    by_name: &BTreeMap<String, (&Service, String)>,
    now: &str,
) -> Option<(String, LoadBalancerGroupStatus)> {
    let name = group.metadata.name.clone()?;
    let members = super::source::member_names(&state.nodes, group);
    let mut vips = Vec::new();
    for (service, ips) in &allocation.addresses {
        if by_name[service].1 == name {
            for ip in ips {
                vips.push(VipStatus {
                    address: ip.to_string(),
                    service: service.clone(),
                    owner: owners.get(ip).cloned(),
                });
            }
        }
    }
    let mut problems: Vec<String> = allocation
        .errors
        .iter()
        .filter(|(s, _)| by_name.get(*s).is_some_and(|(_, g)| *g == name))
        .map(|(s, e)| format!("{s}: {e}"))
        .collect();
    for (_, vip, reason) in planned.unplaced.iter().filter(|(g, _, _)| *g == name) {
        problems.push(format!("VIP {vip} is not placed: {reason}"));
    }
    let pools_ok = Pools::parse(&group.spec.address_pools);
    let generation = group.metadata.generation.unwrap_or(0);
    let previous = group.status.clone().unwrap_or_default().conditions;
    let ready = match (&pools_ok, members.is_empty()) {
        (Err(e), _) => ("False", "InvalidPools", e.clone()),
        (_, true) => ("False", "NoMembers", "no node matches nodeSelector".to_owned()),
        _ => ("True", "Serving", format!("{} members, {} VIPs", members.len(), vips.len())),
    };
    let degraded = if problems.is_empty() {
        ("False", "AllServed", String::new())
    } else {
        ("True", "ServicesRefused", problems.join("; "))
    };
    let conditions = vec![
        condition(&previous, "Ready", ready, generation, now),
        condition(&previous, "Degraded", degraded, generation, now),
    ];
    let status = LoadBalancerGroupStatus {
        vrids: planned.vrids.get(&name).cloned().unwrap_or_default(),
        member_count: members.len() as u32,
        vip_count: vips.len() as u32,
        members,
        vips,
        conditions,
    };
    (group.status.as_ref() != Some(&status)).then_some((name, status))
}

/// A condition of `kind`, keeping its transition time when the status did not change: the
/// list holds one condition per type, replaced in place, never appended.
fn condition(
    previous: &[GroupCondition],
    kind: &str,
    (status, reason, message): (&str, &str, String),
    generation: i64,
    now: &str,
) -> GroupCondition {
    let old = previous.iter().find(|c| c.kind == kind);
    let last_transition_time = match old {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.to_owned(),
    };
    GroupCondition {
        kind: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// The Service conditions this leader has written, by Service.
pub type Written = BTreeMap<(String, String), ServiceCondition>;

/// A condition the leader wrote but its watch has not shown yet is written again (the status
/// writes read the cache); it keeps the transition time it was written with, so the write repeats
/// it exactly, which the API server takes as no change: no new resourceVersion, no event,
/// and so no next pass writing it again with a newer time. Without this, a leader writing
/// more conditions than its watch delivers in one pass rewrote them forever (found at 1,000
/// Services by `cargo xtask bench control`).
pub fn keep_written_times(writes: &mut StatusWrites, written: &Written) {
    for (k, c) in &mut writes.conditions {
        if let Some(w) = written.get(k)
            && (w.status, &w.reason, &w.message, w.observed_generation)
                == (c.status, &c.reason, &c.message, c.observed_generation)
        {
            c.last_transition_time.clone_from(&w.last_transition_time);
        }
    }
}

fn has_finalizer(service: &Service) -> bool {
    service.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == IPAM_FINALIZER))
}

/// Used by tests of other modules to make groups.
#[cfg(test)]
pub(crate) fn test_group(name: &str, yaml_spec: &str) -> super::crd::LoadBalancerGroup {
    super::crd::LoadBalancerGroup::new(name, serde_yaml::from_str(yaml_spec).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(services: &str) -> ClusterState {
        ClusterState {
            missing_interfaces: Default::default(),
            routes: Default::default(),
            groups: vec![
                test_group("edge", "{interface: eth0, addressPools: [198.51.100.0/30], default: true}")
                    .into(),
            ],
            nodes: vec![
                serde_yaml::from_str(
                    "metadata: {name: n0}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.10}]}",
                )
                .unwrap(),
            ],
            services: services.split("\n---\n").map(|d| serde_yaml::from_str(d).unwrap()).collect(),
            slices: vec![],
        }
    }

    #[test]
    fn a_service_the_data_plane_has_no_room_for_is_not_served() {
        let s =
            state("metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}");
        let refused = BTreeMap::from([(
            "shop/web".to_owned(),
            "198.51.100.1:80/TCP: the data plane holds at most 4 services (dataplane.capacity.services)"
                .to_owned(),
        )]);
        let p = writes(&s, &BTreeMap::new(), &Default::default(), &refused, &[], "2026-11-22T00:00:00Z");
        let k = ("shop".to_owned(), "web".to_owned());
        let c = &p.conditions[&k];
        assert_eq!((c.status, c.reason.as_str()), ("False", CAPACITY_EXCEEDED));
        assert!(c.message.contains("dataplane.capacity.services"), "{}", c.message);
        assert!(p.warnings.iter().any(|(key, reason, _)| *key == k && *reason == CAPACITY_EXCEEDED));
        assert_eq!(p.ingress[&k], [IpAddr::from([198, 51, 100, 1])], "the address stays allocated");
    }

    #[test]
    fn a_service_the_translation_left_out_is_not_served() {
        let s =
            state("metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}");
        let unserved = [Refusal {
            service: "shop/web".into(),
            reason: "PortConflict",
            message: "198.51.100.1:80/TCP is already served for shop/api".into(),
        }];
        let p = writes(
            &s,
            &BTreeMap::new(),
            &Default::default(),
            &BTreeMap::new(),
            &unserved,
            "2026-11-22T00:00:00Z",
        );
        let k = ("shop".to_owned(), "web".to_owned());
        let c = &p.conditions[&k];
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            ("False", "PortConflict", unserved[0].message.as_str())
        );
        assert!(p.warnings.iter().any(|(key, reason, _)| *key == k && *reason == "PortConflict"));
    }

    #[test]
    fn a_new_service_gets_an_address_and_the_finalizer() {
        let s =
            state("metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}");
        let p =
            writes(&s, &BTreeMap::new(), &Default::default(), &BTreeMap::new(), &[], "2026-11-22T00:00:00Z");
        let k = ("shop".to_owned(), "web".to_owned());
        assert_eq!(p.ingress[&k], [IpAddr::from([198, 51, 100, 1])]);
        assert_eq!(p.add_finalizer, std::slice::from_ref(&k));
        assert_eq!((p.conditions[&k].status, p.conditions[&k].reason.as_str()), ("True", "Served"));
        let g = &p.groups["edge"];
        assert_eq!((g.member_count, g.vip_count), (1, 1));
        assert_eq!(
            g.conditions.iter().map(|c| (c.kind.as_str(), c.status.as_str())).collect::<Vec<_>>(),
            [("Ready", "True"), ("Degraded", "False")]
        );
    }

    #[test]
    fn vrids_are_published_and_an_unplaceable_vip_is_reported() {
        // A Local-policy Service whose only endpoint is on a node outside the group.
        let mut s = state(
            "metadata: {name: dns, namespace: kube-system}\nspec: {type: LoadBalancer, externalTrafficPolicy: Local, ports: [{port: 53, protocol: UDP}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.1}]}}\n---\n\
             metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.2}]}}",
        );
        s.slices = vec![serde_yaml::from_str(
            "metadata: {name: dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\nendpoints: [{addresses: [10.244.9.9], nodeName: elsewhere}]",
        )
        .unwrap()];
        let base = crate::config::Config::parse("interface: eth0\nnode: n0\n").unwrap();
        let config = super::super::source::translate(&s, &base).unwrap().config;
        let planned = crate::node_plan::node_plan(&config, "n0");
        let p = writes(&s, &BTreeMap::new(), &planned, &BTreeMap::new(), &[], "2026-11-22T00:00:00Z");
        let edge = &p.groups["edge"];
        assert!(!edge.vrids.is_empty(), "the allocation is published");
        assert_eq!(edge.vrids, planned.vrids["edge"]);
        let warning =
            p.warnings.iter().find(|w| w.1 == "NoEligibleNode").expect("an Event for the unplaced VIP");
        assert_eq!(warning.0, ("kube-system".to_owned(), "dns".to_owned()));
        let degraded = edge.conditions.iter().find(|c| c.kind == "Degraded").unwrap();
        assert_eq!(degraded.status, "True");
        assert!(degraded.message.contains("198.51.100.1"), "{}", degraded.message);
    }

    #[test]
    fn a_dual_stack_service_gets_an_address_per_family_and_a_missing_family_is_reported() {
        let mut s = state(
            "metadata: {name: web, namespace: shop}\nspec: {type: LoadBalancer, ipFamilies: [IPv6, IPv4], ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}\n---\n\
             metadata: {name: api, namespace: shop}\nspec: {type: LoadBalancer, ipFamilies: [IPv6], ports: [{port: 80}]}\n---\n\
             metadata: {name: old, namespace: shop}\nspec: {type: LoadBalancer, ipFamilies: [IPv4, IPv6], ipFamilyPolicy: PreferDualStack, ports: [{port: 81}]}",
        );
        std::sync::Arc::make_mut(&mut s.groups[0]).spec.address_pools.push("2001:db8:6::/127".into());
        let v6: IpAddr = "2001:db8:6::1".parse().unwrap();
        let owners = BTreeMap::from([(v6, "n0".to_owned())]);
        let p = writes(&s, &owners, &Default::default(), &BTreeMap::new(), &[], "2026-11-22T00:00:00Z");
        let ips = |name: &str| -> Vec<String> {
            p.ingress[&("shop".to_owned(), name.to_owned())].iter().map(IpAddr::to_string).collect()
        };
        // In name order: api takes 2001:db8:6::, old both, and web finds the IPv6 pool empty.
        assert_eq!(ips("api"), ["2001:db8:6::"]);
        assert_eq!(ips("old"), ["198.51.100.1", "2001:db8:6::1"]);
        assert_eq!(ips("web"), ["198.51.100.2"], "web keeps the family it could get");
        let web = &p.conditions[&("shop".to_owned(), "web".to_owned())];
        assert_eq!((web.status, web.reason.as_str()), ("False", "PoolExhausted"));
        assert!(web.message.contains("IPv6 address pools"), "{}", web.message);
        let vips: Vec<(String, Option<String>)> =
            p.groups["edge"].vips.iter().map(|v| (v.address.clone(), v.owner.clone())).collect();
        assert_eq!(
            vips,
            [
                ("2001:db8:6::".to_owned(), None),
                ("198.51.100.1".to_owned(), None),
                ("2001:db8:6::1".to_owned(), Some("n0".to_owned())),
                ("198.51.100.2".to_owned(), None),
            ]
        );
        let old = &p.conditions[&("shop".to_owned(), "old".to_owned())];
        assert_eq!((old.status, old.message.as_str()), ("True", "served at 198.51.100.1, 2001:db8:6::1"));
    }

    #[test]
    fn a_settled_service_needs_no_write_and_conditions_do_not_pile_up() {
        let s = state(
            "metadata: {name: web, namespace: shop, finalizers: [lb-agent.io/ipam]}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.1}]}}",
        );
        let first =
            writes(&s, &BTreeMap::new(), &Default::default(), &BTreeMap::new(), &[], "2026-11-22T00:00:00Z");
        assert!(first.ingress.is_empty() && first.add_finalizer.is_empty());
        let mut settled = s.clone();
        std::sync::Arc::make_mut(&mut settled.groups[0]).status = Some(first.groups["edge"].clone());
        let again = writes(
            &settled,
            &BTreeMap::new(),
            &Default::default(),
            &BTreeMap::new(),
            &[],
            "2026-11-22T01:00:00Z",
        );
        assert!(again.groups.is_empty(), "nothing changed, nothing to write: {:?}", again.groups);
    }

    #[test]
    fn a_condition_written_but_not_yet_seen_is_planned_with_the_time_it_was_written() {
        let condition = |message: &str, time: &str| ServiceCondition {
            status: "True",
            reason: "Served".into(),
            message: message.into(),
            observed_generation: 1,
            last_transition_time: time.into(),
        };
        let k = ("ns".to_owned(), "web".to_owned());
        let mut writes = StatusWrites::default();
        writes.conditions.insert(k.clone(), condition("served at 198.51.100.1", "later"));
        let written: Written = [(k.clone(), condition("served at 198.51.100.1", "first"))].into();
        keep_written_times(&mut writes, &written);
        assert_eq!(writes.conditions[&k].last_transition_time, "first");
        // A different verdict is a transition: it keeps its own time.
        writes.conditions.insert(k.clone(), condition("served at 198.51.100.2", "later"));
        keep_written_times(&mut writes, &written);
        assert_eq!(writes.conditions[&k].last_transition_time, "later");
    }

    #[test]
    fn exhaustion_warns_and_degrades_the_group_and_deletion_releases() {
        let s = state(
            "metadata: {name: a, namespace: ns}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n---\n\
             metadata: {name: b, namespace: ns}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n---\n\
             metadata: {name: c, namespace: ns}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n---\n\
             metadata: {name: gone, namespace: ns, finalizers: [lb-agent.io/ipam], deletionTimestamp: '2026-11-22T00:00:00Z'}\nspec: {type: LoadBalancer}",
        );
        let p =
            writes(&s, &BTreeMap::new(), &Default::default(), &BTreeMap::new(), &[], "2026-11-22T00:00:00Z");
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert_eq!(p.warnings[0].1, "PoolExhausted");
        assert_eq!(p.warnings[0].0, ("ns".to_owned(), "c".to_owned()));
        let degraded = p.groups["edge"].conditions.iter().find(|c| c.kind == "Degraded").unwrap();
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "ServicesRefused"));
        assert_eq!(p.release, [("ns".to_owned(), "gone".to_owned())]);
        let c = &p.conditions[&("ns".to_owned(), "c".to_owned())];
        assert_eq!((c.status, c.reason.as_str()), ("False", "PoolExhausted"));
        assert!(!p.conditions.contains_key(&("ns".to_owned(), "gone".to_owned())));
    }
}
