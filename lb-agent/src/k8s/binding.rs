//! Which group serves a Service, with which addresses, and what is refused. Pure.
//!
//! A Service is ours when it has `spec.loadBalancerClass: lb-agent.io/vrrp`, or the annotation
//! `lb-agent.io/group`, or is a class-less LoadBalancer and a group is marked `default`.
//! `spec.externalIPs` are honoured only inside the group's `allowedExternalIPs`: anything else
//! is refused (CVE-2020-8554, the externalIPs man-in-the-middle). Kubernetes Services are served
//! over IPv4 only for now (the data path forwards IPv6, the standalone YAML serves it; IPv6
//! allocation is not built): an IPv6-only Service is refused, a dual-stack one gets its IPv4
//! address alone, and IPv6 addresses it asks for are refused, each saying so (`FamilyNotServed`).

use std::{borrow::Borrow, collections::BTreeMap, net::Ipv4Addr};

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::crd::{
    ANNOTATION_GROUP, ANNOTATION_IPS, ANNOTATION_SHARED, ANNOTATION_SPREAD, LOAD_BALANCER_CLASS,
    LoadBalancerGroup,
};
use super::ipam::Pools;

/// A Service this agent serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    /// `namespace/name`.
    pub service: String,
    pub group: String,
    /// `lb-agent.io/spread`, when set.
    pub spread: Option<bool>,
    /// Addresses it asks for (`lb-agent.io/ips`, or the deprecated `spec.loadBalancerIP`).
    pub requested: Vec<Ipv4Addr>,
    pub shared_key: Option<String>,
    /// Whether it needs a LoadBalancer address (type LoadBalancer).
    pub wants_load_balancer_ip: bool,
    /// `spec.externalIPs` inside the group's allowed CIDRs.
    pub external_ips: Vec<Ipv4Addr>,
}

/// Something a user should hear about: the Service's Warning Event and condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub service: String,
    /// The Event reason, e.g. `ExternalIPNotAllowed`.
    pub reason: &'static str,
    pub message: String,
}

/// Decides whether `service` is ours and how. `Ok(None)`: someone else's.
pub fn bind<G: Borrow<LoadBalancerGroup>>(service: &Service, groups: &[G]) -> (Option<Bound>, Vec<Refusal>) {
    let name = format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    );
    let refuse = |reason, message: String| Refusal { service: name.clone(), reason, message };
    let default_spec = ServiceSpec::default();
    let spec = service.spec.as_ref().unwrap_or(&default_spec);
    let no_annotations = BTreeMap::new();
    let annotations = service.metadata.annotations.as_ref().unwrap_or(&no_annotations);
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
    let class = spec.load_balancer_class.as_deref();
    let annotated = annotations.get(ANNOTATION_GROUP).cloned();

    let group_name = match (class, annotated) {
        (Some(c), _) if c != LOAD_BALANCER_CLASS => return (None, Vec::new()),
        (_, Some(g)) => g,
        (Some(_), None) | (None, None) if is_lb => {
            let defaults: Vec<&LoadBalancerGroup> =
                groups.iter().map(Borrow::borrow).filter(|g: &&LoadBalancerGroup| g.spec.default).collect();
            match defaults.as_slice() {
                [one] => one.metadata.name.clone().unwrap_or_default(),
                [] if class.is_some() => {
                    return (
                        None,
                        vec![refuse(
                            "NoGroup",
                            format!("no {ANNOTATION_GROUP} annotation and no default LoadBalancerGroup"),
                        )],
                    );
                }
                [] => return (None, Vec::new()),
                many => {
                    let names: Vec<String> = many.iter().filter_map(|g| g.metadata.name.clone()).collect();
                    return (
                        None,
                        vec![refuse(
                            "AmbiguousDefault",
                            format!("several default LoadBalancerGroups: {}", names.join(", ")),
                        )],
                    );
                }
            }
        }
        _ => return (None, Vec::new()),
    };
    let Some(group) = groups
        .iter()
        .map(Borrow::<LoadBalancerGroup>::borrow)
        .find(|g| g.metadata.name.as_deref() == Some(group_name.as_str()))
    else {
        return (
            None,
            vec![refuse("UnknownGroup", format!("LoadBalancerGroup {group_name:?} does not exist"))],
        );
    };

    let mut refusals = Vec::new();
    // `spec.ipFamilies` as the API server filled it in; empty on old objects (IPv4).
    let families = spec.ip_families.as_deref().unwrap_or_default();
    if !families.is_empty() && !families.iter().any(|f| f == "IPv4") {
        let message = format!(
            "ipFamilies {families:?}: lb-agent serves Kubernetes Services over IPv4 only for now, so this Service gets no address \
             from group {group_name:?}"
        );
        return (None, vec![refuse(FAMILY_NOT_SERVED, message)]);
    }
    if families.iter().any(|f| f == "IPv6") {
        refusals.push(refuse(
            FAMILY_NOT_SERVED,
            format!(
                "ipFamilies {families:?}: only the IPv4 address is allocated and served (lb-agent serves Kubernetes Services over IPv4 \
                 only for now)"
            ),
        ));
    }
    let spread = match annotations.get(ANNOTATION_SPREAD).map(String::as_str) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            refusals.push(refuse(
                "BadAnnotation",
                format!("{ANNOTATION_SPREAD}: expected true or false, got {other:?}"),
            ));
            None
        }
    };
    let mut requested = Vec::new();
    if let Some(list) = annotations.get(ANNOTATION_IPS) {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.parse::<Ipv4Addr>() {
                Ok(ip) => requested.push(ip),
                Err(_) if item.parse::<std::net::Ipv6Addr>().is_ok() => {
                    refusals.push(refuse(FAMILY_NOT_SERVED, ipv6_not_served(ANNOTATION_IPS, item)));
                }
                Err(_) => refusals.push(refuse(
                    "BadAnnotation",
                    format!("{ANNOTATION_IPS}: expected comma-separated IPv4 addresses, got {item:?}"),
                )),
            }
        }
    } else if let Some(ip) = spec.load_balancer_ip.as_deref().and_then(|s| s.parse().ok()) {
        requested.push(ip);
    }

    let allowed = Pools::parse(&group.spec.allowed_external_ips).unwrap_or_default();
    let mut external_ips = Vec::new();
    for text in spec.external_ips.iter().flatten() {
        match text.parse::<Ipv4Addr>() {
            Ok(ip) if allowed.contains(ip) || allowed_cidr(&group.spec.allowed_external_ips, ip) => external_ips.push(ip),
            Err(_) if text.parse::<std::net::Ipv6Addr>().is_ok() => {
                refusals.push(refuse(FAMILY_NOT_SERVED, ipv6_not_served("externalIPs", text)));
            }
            _ => refusals.push(refuse(
                "ExternalIPNotAllowed",
                format!(
                    "externalIP {text} is outside group {group_name:?}'s allowedExternalIPs ({}); it is not served",
                    if group.spec.allowed_external_ips.is_empty() { "none".into() } else { group.spec.allowed_external_ips.join(", ") }
                ),
            )),
        }
    }
    let bound = Bound {
        service: name.clone(),
        group: group_name,
        spread,
        requested,
        shared_key: annotations.get(ANNOTATION_SHARED).cloned(),
        wants_load_balancer_ip: is_lb,
        external_ips,
    };
    (Some(bound), refusals)
}

/// The reason of a refusal for an address family lb-agent does not serve yet.
pub const FAMILY_NOT_SERVED: &str = "FamilyNotServed";

fn ipv6_not_served(field: &str, address: &str) -> String {
    format!(
        "{field}: {address} is an IPv6 address, and lb-agent serves Kubernetes Services over IPv4 only for now; it is not served"
    )
}

/// `Pools::parse` excludes a CIDR's network and broadcast addresses; for externalIPs every
/// address of an allowed CIDR counts.
fn allowed_cidr(cidrs: &[String], ip: Ipv4Addr) -> bool {
    cidrs.iter().any(|c| {
        let Some((net, len)) = c.split_once('/') else { return false };
        let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else { return false };
        let mask = if len == 0 { 0 } else { u32::MAX.checked_shl(32 - len.min(32)).unwrap_or(0) };
        u32::from(ip) & mask == u32::from(net) & mask
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::crd::LoadBalancerGroupSpec;

    pub(crate) fn group(name: &str, default: bool, allowed: &[&str]) -> LoadBalancerGroup {
        let mut spec: LoadBalancerGroupSpec =
            serde_yaml::from_str("interface: eth0\naddressPools: [198.51.100.0/28]\n").unwrap();
        spec.default = default;
        spec.allowed_external_ips = allowed.iter().map(|s| s.to_string()).collect();
        LoadBalancerGroup::new(name, spec)
    }

    fn service(yaml: &str) -> Service {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn ipv6_is_refused_as_not_served_yet_and_dual_stack_keeps_ipv4() {
        let groups = [group("edge", true, &["198.51.100.0/24", "2001:db8:6::/64"])];
        let only_ipv6 = service(
            "metadata: {name: a, namespace: ns}\nspec: {type: LoadBalancer, ipFamilies: [IPv6], ipFamilyPolicy: SingleStack}\n",
        );
        let (bound, refusals) = bind(&only_ipv6, &groups);
        assert!(bound.is_none(), "no IPv4 address for an IPv6-only Service");
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].reason, FAMILY_NOT_SERVED);
        assert!(refusals[0].message.contains("IPv4 only"), "{}", refusals[0].message);

        let dual = service(
            "metadata: {name: b, namespace: ns, annotations: {lb-agent.io/ips: \"198.51.100.7, 2001:db8:6::7\"}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv4, IPv6], ipFamilyPolicy: PreferDualStack, \
             externalIPs: [\"2001:db8:6::8\", 198.51.100.8]}\n",
        );
        let (bound, refusals) = bind(&dual, &groups);
        let bound = bound.expect("served over IPv4");
        assert_eq!(bound.requested, vec![Ipv4Addr::new(198, 51, 100, 7)]);
        assert_eq!(bound.external_ips, vec![Ipv4Addr::new(198, 51, 100, 8)]);
        let reasons: Vec<(&str, bool)> =
            refusals.iter().map(|r| (r.reason, r.message.contains("IPv4 only"))).collect();
        assert_eq!(reasons, vec![(FAMILY_NOT_SERVED, true); 3], "{refusals:?}");
        assert!(
            refusals[1].message.contains("2001:db8:6::7") && refusals[2].message.contains("2001:db8:6::8")
        );
    }

    #[test]
    fn class_annotation_and_default_group_bind() {
        let groups = [group("edge", true, &[]), group("internal", false, &[])];
        let by_class = service(
            "metadata: {name: a, namespace: ns}\nspec: {type: LoadBalancer, loadBalancerClass: lb-agent.io/vrrp}\n",
        );
        assert_eq!(bind(&by_class, &groups).0.unwrap().group, "edge");
        let annotated = service(
            "metadata: {name: b, namespace: ns, annotations: {lb-agent.io/group: internal}}\nspec: {type: LoadBalancer}\n",
        );
        assert_eq!(bind(&annotated, &groups).0.unwrap().group, "internal");
        let classless = service("metadata: {name: c, namespace: ns}\nspec: {type: LoadBalancer}\n");
        assert_eq!(bind(&classless, &groups).0.unwrap().group, "edge");
        let others = service(
            "metadata: {name: d, namespace: ns}\nspec: {type: LoadBalancer, loadBalancerClass: example.com/other}\n",
        );
        assert_eq!(bind(&others, &groups), (None, vec![]));
        let cluster_ip = service("metadata: {name: e, namespace: ns}\nspec: {type: ClusterIP}\n");
        assert_eq!(bind(&cluster_ip, &groups), (None, vec![]));
    }

    #[test]
    fn unknown_groups_and_bad_annotations_are_refused_by_name() {
        let groups = [group("edge", false, &[])];
        let s = service(
            "metadata: {name: a, namespace: ns, annotations: {lb-agent.io/group: nope}}\nspec: {type: LoadBalancer}\n",
        );
        let (bound, refusals) = bind(&s, &groups);
        assert!(bound.is_none());
        assert_eq!(refusals[0].reason, "UnknownGroup");
        let s = service(
            "metadata: {name: a, namespace: ns, annotations: {lb-agent.io/group: edge, lb-agent.io/spread: maybe, lb-agent.io/ips: '198.51.100.3, x'}}\nspec: {type: LoadBalancer}\n",
        );
        let (bound, refusals) = bind(&s, &groups);
        let bound = bound.unwrap();
        assert_eq!(bound.requested, [Ipv4Addr::new(198, 51, 100, 3)]);
        assert_eq!(bound.spread, None);
        assert_eq!(refusals.len(), 2);
        assert!(refusals.iter().all(|r| r.reason == "BadAnnotation"));
        assert!(refusals[0].message.contains("lb-agent.io/spread"), "{:?}", refusals[0]);
    }

    #[test]
    fn external_ips_outside_the_allowed_cidrs_are_refused() {
        let groups = [group("edge", false, &["203.0.113.0/24"])];
        let s = service(
            "metadata: {name: a, namespace: ns, annotations: {lb-agent.io/group: edge}}\nspec: {type: ClusterIP, externalIPs: [203.0.113.0, 203.0.113.7, 8.8.8.8]}\n",
        );
        let (bound, refusals) = bind(&s, &groups);
        let bound = bound.unwrap();
        assert_eq!(bound.external_ips, [Ipv4Addr::new(203, 0, 113, 0), Ipv4Addr::new(203, 0, 113, 7)]);
        assert!(!bound.wants_load_balancer_ip);
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].reason, "ExternalIPNotAllowed");
        assert!(refusals[0].message.contains("8.8.8.8"));
        // A group that allows none refuses all.
        let (bound, refusals) = bind(&s, &[group("edge", false, &[])]);
        assert!(bound.unwrap().external_ips.is_empty());
        assert_eq!(refusals.len(), 3);
    }
}
