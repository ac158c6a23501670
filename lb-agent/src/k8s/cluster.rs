//! The cluster's objects as the pure parts read them: the snapshot the agent's config and the
//! status writes are made from, and what a Service's status already holds. Both the translation
//! (`source`) and the status writes (`status`) read these; neither needs the other for them.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use k8s_openapi::api::core::v1::{Node, Service};

use super::{crd::LoadBalancerGroup, slice::Slice};

/// The objects a translation or status writes are made from, shared with the watch stores they come from (a snapshot
/// per event costs a pointer per object, not a deep copy).
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub groups: Vec<Arc<LoadBalancerGroup>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<Slice>>,
    pub nodes: Vec<Arc<Node>>,
    /// This node's interface towards each group's `interfaceFromIP` (looked up by the shell).
    pub routes: BTreeMap<std::net::IpAddr, String>,
    /// Groups' `interface` names this node has no interface of (looked up by the shell).
    pub missing_interfaces: std::collections::BTreeSet<String>,
}

/// The addresses in a Service's `status.loadBalancer.ingress`.
pub fn current_ingress(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.as_deref()?.parse().ok()).collect())
        .unwrap_or_default()
}
