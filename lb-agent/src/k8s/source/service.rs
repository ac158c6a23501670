//! One Service's translation: its VIPs from the binding, its ready endpoints' nodes, and the
//! config document built from it and its EndpointSlices.

use super::*;

/// One Service's translation from its objects: how it is bound, its group VIPs and its
/// service entries (one per VIP).
pub(super) fn translate_service(
    service: &Arc<Service>,
    slices: &[&Arc<Slice>],
    all_groups: &[Arc<LoadBalancerGroup>],
    groups: &GroupsByName<'_>,
) -> Result<Translated, String> {
    let (bound, refusals) = bind(service, all_groups);
    let mut translated = Translated {
        service: service.clone(),
        slices: slices.iter().map(|s| Arc::clone(s)).collect(),
        bound: None,
        refusals,
        unserved: None,
        vips: Vec::new(),
        configs: Vec::new(),
        ports: SmallVec::new(),
        at: None,
    };
    let Some(b) = bound else { return Ok(translated) };
    let Some((group, members)) = groups.get(b.group.as_str()) else {
        translated.bound = Some(b);
        return Ok(translated);
    };
    let addresses = service_vips(&b, service);
    // `externalTrafficPolicy: Local`: only members with a ready endpoint may own it.
    let local = service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    for address in &addresses {
        // The VIP's family's EndpointSlices: an IPv6 VIP forwards to IPv6 pods.
        let address_type = if address.is_ipv4() { "IPv4" } else { "IPv6" };
        let mine: Vec<&Slice> =
            slices.iter().map(|s| s.as_ref()).filter(|s| s.address_type == address_type).collect();
        let eligible =
            eligible_members(members, address.is_ipv6(), local.then(|| ready_endpoint_nodes(&mine)));
        translated.vips.push(GroupVip {
            address: *address,
            service: Some(b.service.clone()),
            spread: b.spread,
            eligible_nodes: eligible,
        });
        let document = service_document(&b, service, *address, &mine, group.spec.remote_mode);
        let config: ServiceConfig =
            serde_json::from_value(document).map_err(|e| format!("Service {}: {e}", b.service))?;
        if let Err(e) = config.validate() {
            // Refused alone: the rest of the cluster is served as before.
            translated.vips.clear();
            translated.configs.clear();
            translated.ports.clear();
            translated.unserved = Some(Refusal {
                service: b.service.clone(),
                reason: "InvalidService",
                message: format!("as a service of {address}: {e}"),
            });
            break;
        }
        translated.ports.extend(config.ports.iter().map(|p| (config.vip, p.port, p.protocol)));
        translated.configs.push(Arc::new(config));
    }
    translated.bound = Some(b);
    Ok(translated)
}

/// Nodes with a ready endpoint in a Service's `slices`.
fn ready_endpoint_nodes(slices: &[&Slice]) -> std::collections::BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

/// A Service's VIPs: its LoadBalancer addresses (written by the IPAM leader into
/// `status.loadBalancer.ingress`) and its allowed externalIPs.
fn service_vips(bound: &Bound, service: &Service) -> Vec<IpAddr> {
    let mut vips = current_ingress(service);
    vips.extend(bound.external_ips.iter().copied());
    vips.dedup();
    vips
}

/// A Service's entry for one of its VIPs, from the Service and its EndpointSlices.
fn service_document(
    bound: &Bound,
    service: &Service,
    vip: IpAddr,
    mine: &[&Slice],
    mode: RemoteMode,
) -> Value {
    let spec = service.spec.clone().unwrap_or_default();
    let ports: Vec<Value> = spec
        .ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let target = match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n as u16,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(port_name)) => mine
                    .iter()
                    .flat_map(|s| s.ports.iter().flatten())
                    .find(|sp| sp.name.as_deref() == Some(port_name.as_str()))
                    .and_then(|sp| sp.port)
                    .map_or(p.port as u16, |n| n as u16),
                None => p.port as u16,
            };
            json!({"port": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()), "targetPort": target})
        })
        .collect();
    // Ready endpoints; when none is, the serving ones that are terminating, so connections
    // drain instead of failing (as kube-proxy does).
    let all: Vec<(&str, Option<&str>, bool, bool)> = mine
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            let ready = c.ready.unwrap_or(true);
            let serving_terminating = c.serving.unwrap_or(ready) && c.terminating.unwrap_or(false);
            e.addresses.iter().map(move |a| (a.as_str(), e.node_name.as_deref(), ready, serving_terminating))
        })
        .collect();
    let any_ready = all.iter().any(|e| e.2);
    let mut endpoints: Vec<Value> = all
        .iter()
        .filter(|e| if any_ready { e.2 } else { e.3 })
        .filter_map(|(address, node, _, _)| Some(json!({"address": address, "node": (*node)?})))
        .collect();
    endpoints.sort_by_key(|e| e["address"].as_str().unwrap_or_default().to_owned());
    endpoints.dedup();
    json!({
        "name": bound.service,
        "vip": vip.to_string(),
        "ports": ports,
        "endpoints": endpoints,
        "remoteMode": mode,
        "trafficPolicy": if spec.external_traffic_policy.as_deref() == Some("Local") { "Local" } else { "Cluster" },
    })
}
