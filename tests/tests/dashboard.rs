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

/// Every `lbagent_…` name in `expr`, as its metric family.
fn families_in(expr: &str, names: &mut BTreeSet<String>) {
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

/// Every metric family the dashboard's queries use.
fn dashboard_families() -> BTreeSet<String> {
    let dashboard: serde_json::Value = serde_json::from_str(&deploy("grafana/lb-agent.json")).unwrap();
    let mut names = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            families_in(target["expr"].as_str().unwrap(), &mut names);
        }
    }
    names
}

/// Every metric family the alerting rules use.
fn rule_families() -> BTreeSet<String> {
    let rules: serde_yaml::Value = serde_yaml::from_str(&deploy("monitoring/lb-agent.rules.yaml")).unwrap();
    let mut names = BTreeSet::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            families_in(rule["expr"].as_str().unwrap(), &mut names);
        }
    }
    names
}

#[test]
fn every_metric_on_the_dashboard_and_in_the_rules_is_exported() {
    let mut families = dashboard_families();
    assert!(families.len() >= 15, "{families:?}");
    let rules = rule_families();
    assert!(rules.len() >= 7, "{rules:?}");
    families.extend(rules);

    let mut lab = Lab::new(2);
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    let pod = lab.add_pod(1);
    let _server = lab.pods[pod].serve(8080);
    let services = service_config(&lab, "web", LAB_VIP, 80, 8080, "dsr", &[pod]);
    let agents: Vec<_> = (0..2)
        .map(|i| {
            let mut a = lab.start_agent(i, &agent_config(&lab, i, &services));
            a.wait_ready();
            a
        })
        .collect();
    agents[0].wait_metric("lbagent_owned_vips", 1.0);
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
    let missing: Vec<&String> = families.iter().filter(|f| !exported.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the rules use metrics the agent does not export: {missing:?}\n{text}"
    );
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
