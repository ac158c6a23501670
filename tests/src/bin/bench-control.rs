//! `cargo xtask bench control`: what three `--kubernetes` agents cost the API server and the
//! node at rest, with N Services × 10 endpoints. Prints the book's table
//! (docs/src/benchmarks.md).
//!
//! Method: the lab API server (tests/src/api_server, with the DaemonSet's RBAC for the agents)
//! on the segment holds one LoadBalancerGroup, three Nodes, and N Services with their
//! addresses and an EndpointSlice each. Three release agents start; once each has all N
//! Services in its maps, and the leader has written its finalizers and conditions (no write for
//! 10 s), every request for the next 60 s is counted, by agent and by what it asked. Then each
//! agent's RSS (`VmRSS`, with the reflector's stores of every Service and slice, and the plan).
//! Targets: only watches and Lease renewals at rest; RSS ≤ 256 MiB at 10,000 Services.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use lb_lab::{
    Agent, Lab,
    agent::{AGENT_LISTEN, rss_kib},
    cluster_api::{api_server_on, node_object, start_kubernetes_agent},
    scale::{scale_endpoint_json, scale_vip},
};
use serde_json::json;

const ENDPOINTS: usize = 10;
const AT_REST: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only N`: one size, to look into one row.
    let only =
        args.iter().position(|a| a == "--only").map(|i| args[i + 1].parse::<usize>().expect("--only N"));
    let sizes = match only {
        Some(n) => vec![n],
        None if quick => vec![1_000],
        None => vec![1_000, 10_000],
    };
    println!("| Services × 10 | agent | API requests per minute at rest | what they were | agent RSS |");
    println!("|---|---|---|---|---|");
    for n in sizes {
        eprintln!("== {n} Services × {ENDPOINTS} endpoints, three agents");
        for row in measure(n) {
            println!("{row}");
        }
    }
}

fn measure(services: usize) -> Vec<String> {
    let lab = Lab::new(3);
    let (_api_host, api) = api_server_on(&lab);
    api.put(json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge"},
                   "spec": {"interface": "eth0", "addressPools": ["198.18.0.0/15"], "advertInterval": "1s", "default": true}}));
    for n in &lab.nodes {
        api.put(node_object(n));
    }
    let loaded = Instant::now();
    for i in 0..services {
        api.put(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": scale_vip(i).to_string()}]}}}));
        let endpoints: Vec<_> = (0..ENDPOINTS).map(|e| scale_endpoint_json(i, e, ENDPOINTS, 0)).collect();
        api.put(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": format!("svc-{i}-abcde"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "ports": [{"port": 8080}], "endpoints": endpoints}));
    }
    eprintln!("   objects stored in {:?}", loaded.elapsed());

    let capacity = if services * ENDPOINTS > 131_072 {
        format!("dataplane:\n  capacity: {{backends: {}}}\n", (services * ENDPOINTS).next_power_of_two())
    } else {
        String::new()
    };
    let base = format!("interface: eth0\nxdpMode: skb\nlisten: {AGENT_LISTEN}\n{capacity}");
    let agents: Vec<Agent> = (0..3).map(|i| start_kubernetes_agent(&lab, &api, i, &base, &[])).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    for agent in &agents {
        while agent
            .try_get("/metrics")
            .is_none_or(|m| lb_lab::metric(&m, "lbagent_services") != Some(services as f64))
        {
            assert!(
                Instant::now() < deadline,
                "the agent never had all {services} Services:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    eprintln!("   every agent has the {services} Services in its maps after {:?}", started.elapsed());
    // The leader's first pass writes a finalizer and a condition per Service: wait it out.
    loop {
        let last = api.writes().iter().filter(|w| w.resource != "leases").map(|w| w.at).max();
        if last.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
            break;
        }
        if Instant::now() > started + Duration::from_secs(120) {
            eprintln!("   the leader's writes have not settled after 120 s: counting anyway");
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("   writes settled after {:?}; counting for {AT_REST:?}", started.elapsed());
    let from = Instant::now();
    std::thread::sleep(AT_REST);
    let requests: Vec<_> =
        api.requests().into_iter().filter(|r| r.at > from && r.client != "admin").collect();
    let leader = api
        .get("coordination.k8s.io/v1", "Lease", "lb-agent", "lb-agent-leader")
        .and_then(|l| l.pointer("/spec/holderIdentity").and_then(|h| h.as_str()).map(str::to_owned));
    agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let name = &lab.nodes[i].name;
            let mine: Vec<_> = requests.iter().filter(|r| &r.client == name).collect();
            let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
            for r in &mine {
                let what = if r.path.contains("/leases/") {
                    format!("Lease {}", r.verb)
                } else {
                    format!("{} {}", r.verb, r.path)
                };
                *kinds.entry(what).or_default() += 1;
            }
            let per_minute = mine.len() as f64 * 60.0 / AT_REST.as_secs_f64();
            let what: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} × {n}")).collect();
            let role = if leader.as_deref() == Some(name) { "leader" } else { "follower" };
            format!(
                "| {services} | {name} ({role}) | {per_minute:.0} | {} | {} MiB |",
                what.join(", "),
                rss_kib(agent.pid()) / 1024
            )
        })
        .collect()
}
