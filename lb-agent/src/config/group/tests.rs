use crate::config::Config;

const BASE: &str = "interface: eth0\ngroups:\n  - name: web\n    nodes:\n      - name: n0\n        address: 192.0.2.10\n      - name: n1\n        address: 192.0.2.11\n";

fn err(extra: &str) -> (String, String) {
    let e = Config::parse(&format!("{BASE}{extra}")).expect_err("should be rejected");
    (e.field, e.expected)
}

#[test]
fn a_spread_group_parses_with_defaults() {
    let c = Config::parse(&format!(
        "{BASE}    vips:\n      - address: 198.51.100.10\n        service: default/web\n"
    ))
    .unwrap();
    let g = &c.groups[0];
    assert_eq!(g.advert_interval, std::time::Duration::from_secs(1));
    assert!(g.preempt);
    assert_eq!(g.vips[0].service.as_deref(), Some("default/web"));
    assert_eq!(g.announcements.count, 3);
}

#[test]
fn ipv6_vips_need_every_members_ipv6_address_and_get_an_instance_of_their_own() {
    let (field, expected) = err("    vips:\n      - address: 2001:db8:6::10\n");
    assert_eq!(field, "groups[0].nodes[0].address6");
    assert!(expected.contains("IPv6 address on eth0") && expected.contains("link-local"), "{expected}");

    let dual = BASE
        .replace("address: 192.0.2.10\n", "address: 192.0.2.10\n        address6: fe80::a\n")
        .replace("address: 192.0.2.11\n", "address: 192.0.2.11\n        address6: fe80::b\n")
        + "    vrid: 7\n    priorities: {n0: 200, n1: 100}\n    vips:\n      - address: 198.51.100.10\n      - address: 2001:db8:6::10\n";
    let c = Config::parse(&dual).unwrap();
    let plan = crate::node_plan::node_plan(&c, "n0");
    let instances: Vec<_> =
        plan.instances.iter().map(|i| (i.family, i.vrid, i.vips.clone(), i.peers.clone())).collect();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    use crate::vrrp::family::IpFamily;
    assert_eq!(
        instances,
        vec![
            (IpFamily::V4, 7, [ip("198.51.100.10")].into(), [ip("192.0.2.11")].into()),
            (IpFamily::V6, 7, [ip("2001:db8:6::10")].into(), [ip("fe80::b")].into()),
        ]
    );
    assert_eq!(plan.locals[&("eth0".to_owned(), IpFamily::V6)], ip("fe80::a"));

    // A node no IPv6 VIP may go to needs no IPv6 address (Kubernetes: a member that has
    // not published its link-local address yet).
    let spread = BASE.replace("address: 192.0.2.10\n", "address: 192.0.2.10\n        address6: fe80::a\n")
        + "    vips:\n      - address: 198.51.100.10\n      - {address: 2001:db8:6::10, eligibleNodes: [n0]}\n";
    let c = Config::parse(&spread).unwrap();
    assert!(crate::node_plan::node_plan(&c, "n1").instances.iter().all(|i| i.family == IpFamily::V4));
    let e = Config::parse(&spread.replace("eligibleNodes: [n0]", "eligibleNodes: [n0, n1]")).unwrap_err();
    assert_eq!(e.field, "groups[0].nodes[1].address6");

    let e = Config::parse(&dual.replace("2001:db8:6::10", "fe80::10")).unwrap_err();
    assert_eq!(e.field, "groups[0].vips[1].address");
    assert!(e.expected.contains("not the link-local"), "{e}");
    let global = dual.replace("address6: fe80::b", "address6: 2001:db8::b");
    let e = Config::parse(&global).unwrap_err();
    assert_eq!(e.field, "groups[0].nodes[1].address6");
    assert!(e.expected.contains("link-local") && e.expected.contains("2001:db8::b"), "{e}");
    assert!(Config::parse(&format!("{global}    transport: unicast\n")).is_ok(), "any address for unicast");
    let twice = dual.replace("address6: fe80::b", "address6: fe80::a");
    let e = Config::parse(&twice).unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.expected.contains("listed twice")),
        ("groups[0].nodes[1].address6", true)
    );
}

#[test]
fn intervals_must_be_whole_centiseconds_in_range() {
    assert_eq!(err("    advertInterval: 5ms\n").0, "groups[0].advertInterval");
    assert_eq!(err("    advertInterval: 15ms\n").0, "groups[0].advertInterval");
    assert_eq!(err("    advertInterval: 41s\n").0, "groups[0].advertInterval");
    let (field, expected) = err("    advertInterval: fast\n");
    assert_eq!(field, "groups[0].advertInterval");
    assert!(expected.contains("a duration like 100ms"), "{expected}");
    assert!(Config::parse(&format!("{BASE}    advertInterval: 10ms\n")).is_ok());
}

#[test]
fn garp_refresh_is_off_or_at_least_100ms() {
    let g = |extra: &str| Config::parse(&format!("{BASE}{extra}")).map(|c| c.groups[0].announcements.refresh);
    assert_eq!(g("").unwrap(), std::time::Duration::ZERO, "off by default");
    assert_eq!(g("    garp: {refresh: 30s}\n").unwrap(), std::time::Duration::from_secs(30));
    let (field, expected) = err("    garp: {refresh: 10ms}\n");
    assert_eq!(field, "groups[0].garp.refresh");
    assert!(expected.contains("at least 100ms"), "{expected}");
}

#[test]
fn manual_groups_need_a_vrid_and_every_priority() {
    assert_eq!(err("    vrid: 7\n").0, "groups[0].priorities");
    assert_eq!(err("    priorities: {n0: 200, n1: 100}\n").0, "groups[0].vrid");
    let (field, expected) = err("    vrid: 7\n    priorities: {n0: 200}\n");
    assert_eq!(field, "groups[0].priorities");
    assert!(expected.contains("\"n1\""), "{expected}");
    assert_eq!(err("    vrid: 7\n    priorities: {n0: 200, n1: 0}\n").0, "groups[0].priorities.n1");
    assert_eq!(err("    vrid: 7\n    priorities: {n0: 200, n1: 100, n9: 50}\n").0, "groups[0].priorities.n9");
    assert_eq!(err("    vrid: 0\n    priorities: {n0: 200, n1: 100}\n").0, "groups[0].vrid");
    assert_eq!(
        err("    vrid: 7\n    excludedVrids: [7]\n    priorities: {n0: 200, n1: 100}\n").0,
        "groups[0].vrid"
    );
    assert!(err("    vrid: 300\n    priorities: {n0: 200, n1: 100}\n").1.contains("300"));
}

#[test]
fn eligible_nodes_must_be_members() {
    let yaml = "interface: eth0\ngroups:\n  - name: a\n    nodes:\n      - {name: n0, address: 192.0.2.10}\n    \
                    vips:\n      - {address: 198.51.100.10, eligibleNodes: [n0, n7]}\n";
    let e = Config::parse(yaml).unwrap_err();
    assert_eq!(e.field, "groups[0].vips[0].eligibleNodes[1]");
    assert!(e.expected.contains("\"n7\""), "{e}");
}

#[test]
fn nodes_and_vips_are_unique_and_consistent() {
    let dup = "interface: eth0\ngroups:\n  - name: a\n    nodes:\n      - {name: n0, address: 192.0.2.10}\n      - {name: n0, address: 192.0.2.11}\n";
    assert_eq!(Config::parse(dup).unwrap_err().field, "groups[0].nodes[1].name");
    let moved = format!("{BASE}  - name: b\n    nodes:\n      - {{name: n0, address: 192.0.2.99}}\n");
    let e = Config::parse(&moved).unwrap_err();
    assert_eq!(e.field, "groups[1].nodes[0].address");
    assert!(e.expected.contains("groups[0].nodes[0].address") && e.expected.contains("eth0"), "{e}");
    let shared_vip =
        format!("vips:\n  - address: 198.51.100.10\n{BASE}    vips:\n      - address: 198.51.100.10\n");
    let e = Config::parse(&shared_vip).unwrap_err();
    assert_eq!(e.field, "groups[0].vips[0].address");
    assert!(e.expected.contains("vips[0]"), "{e}");
    assert_eq!(err("    excludedVrids: [0]\n").0, "groups[0].excludedVrids[0]");
    assert_eq!(err("    transport: broadcast\n").0, "groups[0].transport");
}

#[test]
fn groups_on_other_interfaces_take_the_nodes_address_there() {
    let two = format!(
        "{BASE}  - name: b\n    interface: eth1.30\n    nodes:\n      - {{name: n0, address: 10.30.0.10}}\n"
    );
    let c = Config::parse(&two).unwrap();
    assert_eq!(c.groups[1].interface.as_deref(), Some("eth1.30"));
    assert_eq!(c.group_interface(&c.groups[0]), "eth0");
    assert_eq!(c.group_interface(&c.groups[1]), "eth1.30");
    // One address on two interfaces is a mistake, named with both places.
    let same = format!(
        "{BASE}  - name: b\n    interface: eth1\n    nodes:\n      - {{name: n0, address: 192.0.2.10}}\n"
    );
    let e = Config::parse(&same).unwrap_err();
    assert_eq!(e.field, "groups[1].nodes[0].address");
    assert!(e.expected.contains("groups[0].nodes[0].address") && e.expected.contains("eth0"), "{e}");
    let bad = format!(
        "{BASE}  - name: b\n    interface: 'no/slash'\n    nodes:\n      - {{name: n0, address: 10.0.0.1}}\n"
    );
    assert_eq!(Config::parse(&bad).unwrap_err().field, "groups[1].interface");
}

#[test]
fn authentication_names_an_absolute_key_file() {
    let c =
        Config::parse(&format!("{BASE}    authentication: {{keyFile: /etc/lb-agent/keys/edge}}\n")).unwrap();
    let key_file = &c.groups[0].authentication.as_ref().unwrap().key_file;
    assert_eq!(key_file, std::path::Path::new("/etc/lb-agent/keys/edge"));
    let (field, expected) = err("    authentication: {keyFile: keys/edge}\n");
    assert_eq!(field, "groups[0].authentication.keyFile");
    assert!(expected.contains("absolute"), "{expected}");
    assert_eq!(err("    authentication: {key: abc}\n").0, "groups[0].authentication.key");
}

#[test]
fn a_group_on_a_vlan_runs_on_the_vlans_uplink_in_xdp_with_multicast() {
    let vlan = |extra: &str| {
        format!(
            "{BASE}  - name: v30\n    vlan: 30\n{extra}    nodes:\n      - {{name: n0, address: 10.30.0.10}}\n"
        )
    };
    let c = Config::parse(&vlan("")).unwrap();
    assert_eq!(c.group_interface(&c.groups[1]), "eth0.30", "a VLAN of the default interface");
    assert_eq!(c.vlan_uplinks(), [("eth0.30".to_owned(), ("eth0".to_owned(), 30))].into());
    // A node's address on the VLAN is another than on the parent: no clash with 192.0.2.10.
    let c = Config::parse(&vlan("    interface: eth1\n")).unwrap();
    assert_eq!(c.group_interface(&c.groups[1]), "eth1.30");
    for (extra, field, expected) in [
        ("    vlan: 0\n", "groups[1].vlan", "from 1 to 4094, got 0"),
        ("    vlan: 4095\n", "groups[1].vlan", "from 1 to 4094, got 4095"),
        ("    vipMode: both\n", "groups[1].vipMode", "no device there"),
        ("    transport: unicast\n", "groups[1].transport", "multicast"),
    ] {
        let yaml = vlan(extra).replace("    vlan: 30\n    vlan: ", "    vlan: ");
        let e = Config::parse(&yaml).expect_err(extra);
        assert_eq!(e.field, field, "{extra}");
        assert!(e.expected.contains(expected), "{extra}: {}", e.expected);
    }
}
