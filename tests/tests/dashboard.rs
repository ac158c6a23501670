//! The Grafana dashboard and the alerting rules only use metrics a running agent exports, and
//! the PodMonitor scrapes the port the DaemonSet names.

use std::{collections::BTreeSet, path::Path, time::Duration};

use lb_lab::{
    Lab,
    cluster::{LAB_VIP, agent_config, service_config},
};

fn deploy(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(file)).unwrap()
}

/// Every metric family (`lbagent_…`, without `_total`, `_bucket`…) that `queries` use.
fn families(queries: &[String]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for expr in queries {
        for (start, _) in expr.match_indices("lbagent_") {
            let name: String =
                expr[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name)
                .to_owned();
            names.insert(family);
        }
    }
    names
}

/// The IPv6 VIP beside the lab VIP, so that the IPv6 instance and NDP counters have data too.
const VIP6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10);

/// Two agents in a lab, one DSR Service to a pod on n1 behind the lab VIP (owned by n0), and an
/// IPv6 VIP in the same group, their metrics served on every address (Prometheus scrapes them
/// from the client's namespace).
fn two_agents_serving_a_vip() -> (Lab, lb_lab::Process, Vec<lb_lab::Agent>) {
    let mut lab = Lab::new(2);
    lab.enable_ipv6();
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    let pod = lab.add_pod(1);
    let server = lab.pods[pod].serve(8080);
    let services = service_config(&lab, "web", LAB_VIP, 80, 8080, "dsr", &[pod]);
    let agents: Vec<_> = (0..2)
        .map(|i| {
            let mut config =
                agent_config(&lab, i, &services).replace(lb_lab::agent::AGENT_LISTEN, "0.0.0.0:9105");
            for node in &lab.nodes {
                let address = format!("        address: {}\n", node.ip);
                config =
                    config.replace(&address, &format!("{address}        address6: {}\n", node.link_local()));
            }
            let vip = format!("      - address: {LAB_VIP}\n");
            config = config.replace(&vip, &format!("{vip}      - address: {VIP6}\n"));
            let mut a = lab.start_agent(i, &config);
            a.wait_ready();
            a
        })
        .collect();
    agents[0].wait_metric("lbagent_owned_vips", 2.0);
    (lab, server, agents)
}

#[test]
fn every_metric_on_the_dashboard_and_in_the_rules_is_exported() {
    let mut used = families(&dashboard_queries());
    assert!(used.len() >= 15, "{used:?}");
    let rules = families(&rule_queries());
    assert!(rules.len() >= 7, "{rules:?}");
    used.extend(rules);

    let (lab, _server, agents) = two_agents_serving_a_vip();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while lab.client.session(LAB_VIP, 80).is_none() {
        assert!(std::time::Instant::now() < deadline, "no traffic through the VIP");
    }
    let text = agents[0].metrics();
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = used.iter().filter(|f| !exported.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the rules use metrics the agent does not export: {missing:?}\n{text}"
    );
}

/// Every query the dashboard charts, with Grafana's `$__rate_interval` made concrete.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(&deploy("grafana/lb-agent.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let targets = panels.iter().flat_map(|p| p["targets"].as_array().unwrap());
    targets.map(|t| t["expr"].as_str().unwrap().replace("$__rate_interval", "30s")).collect()
}

/// Every rule's expression without its threshold (`… > 0`), so that a healthy cluster still
/// gives a result: the series the alert watches.
fn rule_queries() -> Vec<String> {
    let rules: serde_yaml::Value = serde_yaml::from_str(&deploy("monitoring/lb-agent.rules.yaml")).unwrap();
    let mut queries = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let expr = rule["expr"].as_str().unwrap().trim();
            let bare = [">=", "<=", "==", "!=", ">", "<"].iter().find_map(|op| {
                let (head, tail) = expr.rsplit_once(op)?;
                tail.trim().parse::<f64>().is_ok().then(|| head.trim_end().to_owned())
            });
            queries.push(bare.unwrap_or_else(|| expr.to_owned()));
        }
    }
    queries
}

/// A real Prometheus (Debian's) in the client's namespace scrapes two agents every second and
/// loads the alerting rules: every dashboard query and every rule's expression returns data,
/// not just names that exist.
#[test]
fn a_real_prometheus_gets_data_for_every_dashboard_and_rule_query() {
    let (lab, _server, _agents) = two_agents_serving_a_vip();

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/lb-agent.rules.yaml");
    let config = lab.path("prometheus.yml");
    let prometheus_yml = [
        "global: {scrape_interval: 1s, evaluation_interval: 1s}".to_owned(),
        format!("rule_files: ['{}']", rules.display()),
        "scrape_configs:".to_owned(),
        "  - job_name: lb-agent".to_owned(),
        "    static_configs:".to_owned(),
        format!("      - targets: ['{}:9105', '{}:9105']", lab.nodes[0].ip, lab.nodes[1].ip),
    ];
    std::fs::write(&config, prometheus_yml.join("\n") + "\n").unwrap();
    let (storage, log) = (lab.path("prometheus-data"), lab.path("prometheus.log"));
    lab.client.ns.run_cmd(&["ip", "link", "set", "lo", "up"]);
    let _prometheus = lab.client.spawn(&[
        "sh",
        "-c",
        &format!(
            "exec prometheus --config.file={} --storage.tsdb.path={} --web.listen-address=127.0.0.1:9090 >{} 2>&1",
            config.display(),
            storage.display(),
            log.display()
        ),
    ]);

    let query = |expr: &str| -> serde_json::Value {
        let out = lab.client.ns.output(&[
            "curl",
            "-s",
            "-G",
            "http://127.0.0.1:9090/api/v1/query",
            "--data-urlencode",
            &format!("query={expr}"),
        ]);
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    };
    let mut waiting: Vec<String> = dashboard_queries().into_iter().chain(rule_queries()).collect();
    assert!(waiting.len() >= 25, "{waiting:?}");
    let mut last = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !waiting.is_empty() && std::time::Instant::now() < deadline {
        // Traffic through the VIP, so rates over the last 30 s have something to show.
        let _ = lab.client.session(LAB_VIP, 80);
        let _ = lab.client.ndisc(VIP6);
        waiting.retain(|expr| {
            let answer = query(expr);
            let has_data = answer["status"] == "success"
                && answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty());
            last.insert(expr.clone(), answer);
            !has_data
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    let unanswered: Vec<String> = waiting.iter().map(|e| format!("{e}\n  → {}", last[e])).collect();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(unanswered.is_empty(), "queries without data:\n{}\nprometheus:\n{log}", unanswered.join("\n"));
}

#[test]
fn the_pod_monitor_scrapes_the_daemonsets_metrics_port() {
    let monitor: serde_yaml::Value = serde_yaml::from_str(&deploy("monitoring/podmonitor.yaml")).unwrap();
    assert_eq!(monitor["kind"], "PodMonitor");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let daemonset: serde_yaml::Value = serde_yaml::from_str(&deploy("daemonset.yaml")).unwrap();
    let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["name"], endpoint["port"]);
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"], daemonset["spec"]["template"]["metadata"]["labels"],
        "the selector matches the agent's pods"
    );
}
