//! Large clusters, written out: lb-agent's services as YAML, and the same Services as kube-proxy
//! would program them in iptables (`iptables-restore` input) and nftables (`nft -f` input).
//!
//! Service `i` has its own VIP from 198.18.0.0/15 (RFC 2544's benchmarking range, never routed
//! here), port 80 → 8080 over TCP, and `endpoints` endpoints with unique addresses in 10.0.0.0/8
//! spread over the nodes `n0`, `n1`, `n2`.

use std::{fmt::Write, net::Ipv4Addr};

/// Service `i`'s VIP.
pub fn scale_vip(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 1));
    Ipv4Addr::from(base + i as u32)
}

/// Endpoint `e` of service `i`; `generation` shifts the address, for changes.
pub fn scale_endpoint(i: usize, e: usize, endpoints: usize, generation: u32) -> Ipv4Addr {
    let index = (i * endpoints + e) as u32 + 1 + generation * 4_000_000;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + index)
}

/// The node an endpoint runs on.
pub fn scale_node(e: usize) -> String {
    format!("n{}", e % 3)
}

/// `vips:` and `services:` YAML for `services` Services (appended to an agent's config head).
pub fn scale_services_yaml(services: usize, endpoints: usize) -> String {
    format!("{}services:\n{}", scale_vips_yaml(services), scale_service_items(services, endpoints))
}

/// The Services' VIPs, as a top-level `vips:` list (answered without VRRP).
pub fn scale_vips_yaml(services: usize) -> String {
    let mut yaml = String::from("vips:\n");
    for i in 0..services {
        let _ = writeln!(yaml, "  - address: {}", scale_vip(i));
    }
    yaml
}

/// The Services, as items of a `services:` list.
pub fn scale_service_items(services: usize, endpoints: usize) -> String {
    scale_service_items_at(services, endpoints, 0)
}

/// The Services with their endpoints of `generation` (same counts, other addresses).
pub fn scale_service_items_at(services: usize, endpoints: usize, generation: u32) -> String {
    let mut yaml = String::with_capacity(services * (80 + endpoints * 40));
    for i in 0..services {
        let _ = write!(
            yaml,
            "  - name: default/svc-{i}\n    vip: {}\n    ports: [{{port: 80, targetPort: 8080}}]\n    endpoints:\n",
            scale_vip(i)
        );
        for e in 0..endpoints {
            let _ = writeln!(
                yaml,
                "      - {{address: {}, node: {}}}",
                scale_endpoint(i, e, endpoints, generation),
                scale_node(e)
            );
        }
    }
    yaml
}

fn chain_id(kind: &str, i: usize, e: usize) -> String {
    // kube-proxy names chains by a hash, 16 base32 characters; the length is what matters.
    format!("KUBE-{kind}-{:016X}", (i as u64) << 20 | e as u64)
}

/// kube-proxy's iptables mode for the same Services: KUBE-SERVICES → KUBE-SVC (random
/// probabilities) → KUBE-SEP (masquerade mark for hairpin, DNAT). 1 + 3 × endpoints rules each.
pub fn kube_proxy_iptables(services: usize, endpoints: usize) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let _ =
        writeln!(chains, "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]");
    chains.push_str(":KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n");
    rules.push_str("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A POSTROUTING -j KUBE-POSTROUTING\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n");
    rules.push_str("-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\n");
    for i in 0..services {
        let svc = chain_id("SVC", i, 0);
        let _ = writeln!(chains, ":{svc} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"default/svc-{i} loadbalancer IP\" -m tcp --dport 80 -j {svc}",
            scale_vip(i)
        );
        for e in 0..endpoints {
            let sep = chain_id("SEP", i, e);
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let left = endpoints - e;
            if left > 1 {
                let _ = writeln!(
                    rules,
                    "-A {svc} -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(rules, "-A {svc} -j {sep}");
            }
            let ep = scale_endpoint(i, e, endpoints, 0);
            let _ = writeln!(rules, "-A {sep} -s {ep}/32 -j KUBE-MARK-MASQ");
            let _ = writeln!(rules, "-A {sep} -p tcp -m tcp -j DNAT --to-destination {ep}:8080");
        }
    }
    chains.push_str(&rules);
    chains.push_str("COMMIT\n");
    chains
}

/// kube-proxy's nftables mode for the same Services: a verdict map on (address, protocol,
/// port), a chain per service picking an endpoint with `numgen random`, a chain per endpoint.
pub fn kube_proxy_nftables(services: usize, endpoints: usize) -> String {
    let mut nft = String::from("table ip kube-proxy {\n");
    nft.push_str("  chain mark-for-masquerade { meta mark set meta mark or 0x4000; }\n");
    // Chains before the map whose verdicts name them.
    for i in 0..services {
        for e in 0..endpoints {
            let ep = scale_endpoint(i, e, endpoints, 0);
            let _ = writeln!(
                nft,
                "  chain endpoint-{i}-{e} {{ ip saddr {ep} jump mark-for-masquerade; meta l4proto tcp dnat to {ep}:8080; }}"
            );
        }
        let _ = write!(nft, "  chain service-{i} {{ numgen random mod {endpoints} vmap {{ ");
        for e in 0..endpoints {
            let sep = if e + 1 < endpoints { ", " } else { "" };
            let _ = write!(nft, "{e} : goto endpoint-{i}-{e}{sep}");
        }
        nft.push_str(" }; }\n");
    }
    nft.push_str(
        "  map service-ips {\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {\n",
    );
    for i in 0..services {
        let sep = if i + 1 < services { "," } else { "" };
        let _ = writeln!(nft, "      {} . tcp . 80 : goto service-{i}{sep}", scale_vip(i));
    }
    nft.push_str("    }\n  }\n");
    nft.push_str("  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }\n");
    nft.push_str(
        "  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n",
    );
    nft.push_str("}\n");
    nft
}

/// The same Services as a cluster holds them, for the Kubernetes source: one group `edge`
/// whose pool is the VIP range, nodes `n0`–`n2`, and per Service a LoadBalancer Service (its
/// VIP in `status`) and one EndpointSlice, each with resource version `1`.
pub fn scale_cluster(services: usize, endpoints: usize) -> lb_agent::k8s::cluster::ClusterState {
    use serde_json::{from_value, json};
    let group = json!({
        "metadata": {"name": "edge", "resourceVersion": "1"},
        "spec": {"interface": "eth0", "addressPools": ["198.18.0.0/15"], "default": true, "advertInterval": "1s"},
    });
    let nodes = (0..3).map(|n| {
        json!({
            "metadata": {"name": format!("n{n}"), "resourceVersion": "1"},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("192.0.2.{}", 10 + n)}]},
        })
    });
    let mut state = lb_agent::k8s::cluster::ClusterState {
        groups: vec![std::sync::Arc::new(from_value(group).expect("a group"))],
        nodes: nodes.map(|n| std::sync::Arc::new(from_value(n).expect("a node"))).collect(),
        ..Default::default()
    };
    for i in 0..services {
        let service = json!({
            "metadata": {"name": format!("svc-{i}"), "namespace": "default", "resourceVersion": "1"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": scale_vip(i).to_string()}]}},
        });
        state.services.push(std::sync::Arc::new(from_value(service).expect("a service")));
        let slice = (0..endpoints).map(|e| scale_endpoint_json(i, e, endpoints, 0)).collect();
        state.slices.push(std::sync::Arc::new(scale_slice(i, slice, 1)));
    }
    state
}

/// Endpoint `e` of Service `i` as an EndpointSlice lists it.
pub fn scale_endpoint_json(i: usize, e: usize, endpoints: usize, generation: u32) -> serde_json::Value {
    serde_json::json!({
        "addresses": [scale_endpoint(i, e, endpoints, generation).to_string()],
        "nodeName": scale_node(e),
        "conditions": {"ready": true},
    })
}

/// Service `i`'s EndpointSlice with `endpoints`, at resource version `version`.
pub fn scale_slice(i: usize, endpoints: Vec<serde_json::Value>, version: u64) -> lb_agent::k8s::slice::Slice {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("svc-{i}-abcde"),
            "namespace": "default",
            "resourceVersion": version.to_string(),
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
        },
        "addressType": "IPv4",
        "ports": [{"port": 8080}],
        "endpoints": endpoints,
    }))
    .expect("an EndpointSlice")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_the_expected_sizes() {
        let rules = kube_proxy_iptables(3, 10);
        let count = rules.lines().filter(|l| l.starts_with("-A KUBE-S")).count();
        assert_eq!(count, 3 * 31, "1 + 3 × endpoints rules per service");
        let nft = kube_proxy_nftables(3, 10);
        assert_eq!(nft.matches("chain endpoint-").count(), 30);
        let yaml = scale_services_yaml(3, 10);
        assert_eq!(yaml.matches("node: n").count(), 30);
        assert_ne!(scale_endpoint(0, 9, 10, 0), scale_endpoint(1, 0, 10, 0));
        assert_ne!(scale_endpoint(0, 0, 10, 0), scale_endpoint(0, 0, 10, 1));
    }
}
