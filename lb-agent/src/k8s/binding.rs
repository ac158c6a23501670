//! Which group serves a Service, with which addresses, and what is refused. Pure.
//!
//! A Service is ours when it has `spec.loadBalancerClass: lb-agent.io/vrrp`, or the annotation
//! `lb-agent.io/group`, or is a class-less LoadBalancer and a group is marked `default`.
//! `spec.externalIPs` are honoured only inside the group's `allowedExternalIPs`: anything else
//! is refused (CVE-2020-8554, the externalIPs man-in-the-middle). A Service is served in the
//! families of its `spec.ipFamilies` (one address each): an address it asks for, or an
//! externalIP, of another family has no endpoints to go to and is refused
//! (`AddressFamilyMismatch`).

use std::{borrow::Borrow, collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::crd::{
    ANNOTATION_GROUP, ANNOTATION_IPS, ANNOTATION_SHARED, ANNOTATION_SPREAD, LOAD_BALANCER_CLASS,
    LoadBalancerGroup,
};
use super::ipam::{Pools, family_name};
use crate::vrrp::family::IpFamily;

/// A Service this agent serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    /// `namespace/name`.
    pub service: String,
    pub group: String,
    /// `lb-agent.io/spread`, when set.
    pub spread: Option<bool>,
    /// Its families, primary first (`spec.ipFamilies`; IPv4 on objects without it).
    pub families: Vec<IpFamily>,
    /// `ipFamilyPolicy: PreferDualStack`: a family its group has no pool of is left out.
    pub prefer_dual_stack: bool,
    /// Addresses it asks for (`lb-agent.io/ips`, or the deprecated `spec.loadBalancerIP`).
    pub requested: Vec<IpAddr>,
    pub shared_key: Option<String>,
    /// Whether it needs a LoadBalancer address (type LoadBalancer).
    pub wants_load_balancer_ip: bool,
    /// `spec.externalIPs` inside the group's allowed CIDRs.
    pub external_ips: Vec<IpAddr>,
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
    let (group_name, group) = match group_of(spec, annotations, groups, &refuse) {
        Ok(found) => found,
        Err(refusal) => return (None, refusal.into_iter().collect()),
    };
    let mut refusals = Vec::new();
    let families = families_of(spec, &mut refusals, &refuse);
    let families_text =
        || format!("[{}]", families.iter().map(|f| family_name(*f)).collect::<Vec<_>>().join(", "));
    // An address of a family the Service is not served in: nothing would answer it there.
    let mismatch = |field: &str, ip: IpAddr| {
        let message = format!(
            "{field}: {ip} is an {} address, but the Service's ipFamilies are {}; it is not served",
            family_name(IpFamily::of(ip)),
            families_text()
        );
        refuse(ADDRESS_FAMILY_MISMATCH, message)
    };
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
    let requested = requested_addresses(spec, annotations, &families, &mut refusals, &refuse, &mismatch);
    let external_ips =
        allowed_external_ips(spec, group, &group_name, &families, &mut refusals, &refuse, &mismatch);
    let bound = Bound {
        service: name.clone(),
        group: group_name,
        spread,
        families,
        prefer_dual_stack: spec.ip_family_policy.as_deref() == Some("PreferDualStack"),
        requested,
        shared_key: annotations.get(ANNOTATION_SHARED).cloned(),
        wants_load_balancer_ip: is_lb,
        external_ips,
    };
    (Some(bound), refusals)
}

/// Builds a refusal of this Service: reason and message.
type Refuse<'a> = dyn Fn(&'static str, String) -> Refusal + 'a;

/// The group a Service is aimed at (its annotation, else the one default group for a
/// LoadBalancer Service), by name; `Err` with a refusal, or with none for a Service that is
/// not ours.
fn group_of<'g, G: Borrow<LoadBalancerGroup>>(
    spec: &ServiceSpec,
    annotations: &BTreeMap<String, String>,
    groups: &'g [G],
    refuse: &Refuse,
) -> Result<(String, &'g LoadBalancerGroup), Option<Refusal>> {
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
    let class = spec.load_balancer_class.as_deref();
    let annotated = annotations.get(ANNOTATION_GROUP).cloned();
    let group_name = match (class, annotated) {
        (Some(c), _) if c != LOAD_BALANCER_CLASS => return Err(None),
        (_, Some(g)) => g,
        (Some(_), None) | (None, None) if is_lb => {
            let defaults: Vec<&LoadBalancerGroup> =
                groups.iter().map(Borrow::borrow).filter(|g: &&LoadBalancerGroup| g.spec.default).collect();
            match defaults.as_slice() {
                [one] => one.metadata.name.clone().unwrap_or_default(),
                [] if class.is_some() => {
                    return Err(Some(refuse(
                        "NoGroup",
                        format!("no {ANNOTATION_GROUP} annotation and no default LoadBalancerGroup"),
                    )));
                }
                [] => return Err(None),
                many => {
                    let names: Vec<String> = many.iter().filter_map(|g| g.metadata.name.clone()).collect();
                    return Err(Some(refuse(
                        "AmbiguousDefault",
                        format!("several default LoadBalancerGroups: {}", names.join(", ")),
                    )));
                }
            }
        }
        _ => return Err(None),
    };
    let Some(group) = groups
        .iter()
        .map(Borrow::<LoadBalancerGroup>::borrow)
        .find(|g| g.metadata.name.as_deref() == Some(group_name.as_str()))
    else {
        return Err(Some(refuse("UnknownGroup", format!("LoadBalancerGroup {group_name:?} does not exist"))));
    };
    Ok((group_name, group))
}

/// `spec.ipFamilies` as the API server filled it in; IPv4 on old objects that have none.
fn families_of(spec: &ServiceSpec, refusals: &mut Vec<Refusal>, refuse: &Refuse) -> Vec<IpFamily> {
    let mut families: Vec<IpFamily> = Vec::new();
    for name in spec.ip_families.iter().flatten() {
        let family = match name.as_str() {
            "IPv4" => IpFamily::V4,
            "IPv6" => IpFamily::V6,
            other => {
                refusals
                    .push(refuse("BadIPFamily", format!("ipFamilies: expected IPv4 or IPv6, got {other:?}")));
                continue;
            }
        };
        if !families.contains(&family) {
            families.push(family);
        }
    }
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    families
}

/// The addresses the Service asks for (the annotation, else `loadBalancerIP`), of its families.
fn requested_addresses(
    spec: &ServiceSpec,
    annotations: &BTreeMap<String, String>,
    families: &[IpFamily],
    refusals: &mut Vec<Refusal>,
    refuse: &Refuse,
    mismatch: &dyn Fn(&str, IpAddr) -> Refusal,
) -> Vec<IpAddr> {
    let mut requested = Vec::new();
    if let Some(list) = annotations.get(ANNOTATION_IPS) {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.parse::<IpAddr>() {
                Ok(ip) if families.contains(&IpFamily::of(ip)) => requested.push(ip),
                Ok(ip) => refusals.push(mismatch(ANNOTATION_IPS, ip)),
                Err(_) => refusals.push(refuse(
                    "BadAnnotation",
                    format!(
                        "{ANNOTATION_IPS}: expected comma-separated IPv4 or IPv6 addresses, got {item:?}"
                    ),
                )),
            }
        }
    } else if let Some(ip) = spec.load_balancer_ip.as_deref().and_then(|s| s.parse::<IpAddr>().ok()) {
        if families.contains(&IpFamily::of(ip)) {
            requested.push(ip);
        } else {
            refusals.push(mismatch("loadBalancerIP", ip));
        }
    }
    requested
}

/// The Service's `externalIPs` that its group allows, of its families.
fn allowed_external_ips(
    spec: &ServiceSpec,
    group: &LoadBalancerGroup,
    group_name: &str,
    families: &[IpFamily],
    refusals: &mut Vec<Refusal>,
    refuse: &Refuse,
    mismatch: &dyn Fn(&str, IpAddr) -> Refusal,
) -> Vec<IpAddr> {
    let allowed = Pools::parse_allowed(&group.spec.allowed_external_ips).unwrap_or_default();
    let mut external_ips = Vec::new();
    for text in spec.external_ips.iter().flatten() {
        match text.parse::<IpAddr>() {
            Ok(ip) if !allowed.contains(ip) => refusals.push(refuse(
                "ExternalIPNotAllowed",
                format!(
                    "externalIP {text} is outside group {group_name:?}'s allowedExternalIPs ({}); it is not served",
                    if group.spec.allowed_external_ips.is_empty() {
                        "none".into()
                    } else {
                        group.spec.allowed_external_ips.join(", ")
                    }
                ),
            )),
            Ok(ip) if !families.contains(&IpFamily::of(ip)) => refusals.push(mismatch("externalIPs", ip)),
            Ok(ip) => external_ips.push(ip),
            Err(_) => refusals.push(refuse(
                "ExternalIPNotAllowed",
                format!("externalIPs: expected an IPv4 or IPv6 address, got {text:?}; it is not served"),
            )),
        }
    }
    external_ips
}

/// The reason of a refusal of an address of a family the Service is not served in.
pub const ADDRESS_FAMILY_MISMATCH: &str = "AddressFamilyMismatch";

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

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn families_follow_ip_families_and_other_families_are_refused() {
        let groups = [group("edge", true, &["198.51.100.0/24", "2001:db8:6::/64"])];
        let only_ipv6 = service(
            "metadata: {name: a, namespace: ns, annotations: {lb-agent.io/ips: \"198.51.100.7, 2001:db8:6::7\"}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv6], ipFamilyPolicy: SingleStack, externalIPs: [198.51.100.8]}\n",
        );
        let (bound, refusals) = bind(&only_ipv6, &groups);
        let bound = bound.expect("served over IPv6");
        assert_eq!((bound.families.as_slice(), bound.prefer_dual_stack), (&[IpFamily::V6][..], false));
        assert_eq!(bound.requested, [ip("2001:db8:6::7")]);
        assert!(bound.external_ips.is_empty());
        let refused: Vec<(&str, &str)> = refusals.iter().map(|r| (r.reason, r.message.as_str())).collect();
        assert_eq!(
            refused,
            [
                (
                    ADDRESS_FAMILY_MISMATCH,
                    "lb-agent.io/ips: 198.51.100.7 is an IPv4 address, but the Service's ipFamilies are [IPv6]; it is not served"
                ),
                (
                    ADDRESS_FAMILY_MISMATCH,
                    "externalIPs: 198.51.100.8 is an IPv4 address, but the Service's ipFamilies are [IPv6]; it is not served"
                ),
            ]
        );

        let dual = service(
            "metadata: {name: b, namespace: ns, annotations: {lb-agent.io/ips: \"198.51.100.7, 2001:db8:6::7\"}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv6, IPv4], ipFamilyPolicy: PreferDualStack, \
             externalIPs: [\"2001:db8:6::8\", 198.51.100.8, \"2001:db8:7::8\"]}\n",
        );
        let (bound, refusals) = bind(&dual, &groups);
        let bound = bound.expect("served");
        assert_eq!(
            (bound.families.as_slice(), bound.prefer_dual_stack),
            (&[IpFamily::V6, IpFamily::V4][..], true)
        );
        assert_eq!(bound.requested, [ip("198.51.100.7"), ip("2001:db8:6::7")]);
        assert_eq!(bound.external_ips, [ip("2001:db8:6::8"), ip("198.51.100.8")]);
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        assert_eq!(refusals[0].reason, "ExternalIPNotAllowed");
        assert!(refusals[0].message.contains("2001:db8:7::8"), "{}", refusals[0].message);

        // Objects from before ipFamilies are IPv4.
        let old = service(
            "metadata: {name: c, namespace: ns}\nspec: {type: LoadBalancer, loadBalancerIP: 198.51.100.9}\n",
        );
        let bound = bind(&old, &groups).0.unwrap();
        assert_eq!(
            (bound.families.as_slice(), bound.requested.as_slice()),
            (&[IpFamily::V4][..], &[ip("198.51.100.9")][..])
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
        assert_eq!(bound.requested, [ip("198.51.100.3")]);
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
        assert_eq!(bound.external_ips, [ip("203.0.113.0"), ip("203.0.113.7")]);
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
