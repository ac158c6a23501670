//! A group's members: the nodes its selector picks, their published addresses (annotations),
//! and the interface the group runs on.

use super::*;

/// The interface `group` uses on this node, or why it cannot be served here.
pub fn group_interface(group: &LoadBalancerGroup, state: &ClusterState) -> Result<String, Refusal> {
    let spec = &group.spec;
    let interface = match (&spec.interface, &spec.interface_from_ip) {
        (Some(interface), _) if state.missing_interfaces.contains(interface) => {
            Err(format!("this node has no interface {interface}"))
        }
        (Some(interface), _) => Ok(interface.clone()),
        (None, Some(ip)) => {
            state.routes.get(ip).cloned().ok_or_else(|| format!("no route from this node to {ip}"))
        }
        (None, None) => Err("neither interface nor interfaceFromIP is set".to_owned()),
    };
    interface.map_err(|message| Refusal { service: String::new(), reason: "InterfaceNotFound", message })
}

/// The members that may own a VIP: for an IPv6 one, those that published their link-local
/// address; under `externalTrafficPolicy: Local`, those of `with_endpoints`. `None`: all.
pub(super) fn eligible_members(
    members: &[Member],
    ipv6: bool,
    with_endpoints: Option<std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    let restricted = with_endpoints.is_some() || (ipv6 && members.iter().any(|m| m.address6.is_none()));
    restricted.then(|| {
        members
            .iter()
            .filter(|m| !ipv6 || m.address6.is_some())
            .filter(|m| with_endpoints.as_ref().is_none_or(|nodes| nodes.contains(&m.name)))
            .map(|m| m.name.clone())
            .collect()
    })
}

/// The names of the nodes in a group, in order.
pub fn member_names<N: Borrow<Node>>(nodes: &[N], group: &LoadBalancerGroup) -> Vec<String> {
    members(nodes, group, false).into_iter().map(|m| m.name).collect()
}

/// Whether `node` is one of `group`'s.
pub fn selects(group: &LoadBalancerGroup, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    group.spec.node_selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Nodes of `group`, with their addresses for it, in name order: the one the node published
/// for the group ([`GROUP_ADDRESSES_ANNOTATION`]), else (unless `published_only`) its IPv4
/// InternalIP; and the link-local one it published ([`GROUP_ADDRESSES6_ANNOTATION`]).
pub(super) fn members<N: Borrow<Node>>(
    nodes: &[N],
    group: &LoadBalancerGroup,
    published_only: bool,
) -> Vec<Member> {
    let name = group.metadata.name.as_deref().unwrap_or_default();
    let mut out: Vec<Member> = nodes
        .iter()
        .map(Borrow::<Node>::borrow)
        .filter(|n| selects(group, n))
        .filter_map(|n| {
            let published = published_addresses(n).remove(name);
            if published_only && published.is_none() {
                return None;
            }
            let address = published.or_else(|| {
                n.status.as_ref()?.addresses.as_ref()?.iter().find_map(|a| {
                    (a.type_ == "InternalIP").then(|| a.address.parse::<Ipv4Addr>().ok()).flatten()
                })
            })?;
            let address6 = published_addresses6(n).remove(name);
            Some(Member { name: n.metadata.name.clone()?, address, address6 })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The addresses `node`'s agent published for its groups; an unreadable annotation is none.
pub fn published_addresses(node: &Node) -> BTreeMap<String, Ipv4Addr> {
    published(node, GROUP_ADDRESSES_ANNOTATION)
}

/// The IPv6 link-local addresses `node`'s agent published for its groups; an unreadable
/// annotation, or an address that is not link-local, is none.
pub fn published_addresses6(node: &Node) -> BTreeMap<String, Ipv6Addr> {
    let mut addresses: BTreeMap<String, Ipv6Addr> = published(node, GROUP_ADDRESSES6_ANNOTATION);
    addresses.retain(|_, a| a.is_unicast_link_local());
    addresses
}

fn published<A: serde::de::DeserializeOwned>(node: &Node, annotation: &str) -> BTreeMap<String, A> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}
