//! The alerting rules: valid for Prometheus, firing on the failures they name and not on a
//! healthy pair of agents (`promtool test rules`), and shipped identically for plain
//! Prometheus and the Prometheus Operator.

use std::{path::PathBuf, process::Command};

fn monitoring(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring").join(file)
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().expect("promtool (Debian's prometheus package)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_rules_are_valid_and_fire_on_what_they_name() {
    let rules = monitoring("lb-agent.rules.yaml");
    let checked = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS: 12 rules found"), "{checked}");
    let tests = monitoring("lb-agent.rules.test.yaml");
    let tested = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_prometheus_rule_ships_the_same_groups() {
    let read = |file: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(monitoring(file)).unwrap()).unwrap()
    };
    let plain = read("lb-agent.rules.yaml");
    let operator = read("prometheusrule.yaml");
    assert_eq!(operator["kind"], "PrometheusRule");
    assert_eq!(operator["spec"]["groups"], plain["groups"]);
}
