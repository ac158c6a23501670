//! The ARP responder with real packets: a client arpings VIPs across the lab's switch, and the
//! agent on node n0 answers from XDP.

use std::{net::Ipv4Addr, time::Duration};

use lb_lab::{
    Agent, Lab,
    packet::{arp_frame, arp_replies, arp_request, send_and_capture},
};

const VIP_A: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP_B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 11);
const NOT_A_VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 99);
const VIP_A_MAC: &str = "02:00:00:00:00:aa";

fn config(mode: &str, vips: &[(Ipv4Addr, Option<&str>)]) -> String {
    let mut yaml =
        format!("interface: eth0\nxdpMode: {mode}\nlisten: {}\nvips:\n", lb_lab::agent::AGENT_LISTEN);
    for (vip, mac) in vips {
        yaml.push_str(&format!("  - address: {vip}\n"));
        if let Some(mac) = mac {
            yaml.push_str(&format!("    mac: {mac}\n"));
        }
    }
    yaml
}

fn start(lab: &mut Lab, mode: &str) -> Agent {
    if mode == "native" {
        lab.enable_native_xdp(0);
    }
    let mut agent = lab.start_agent(0, &config(mode, &[(VIP_A, Some(VIP_A_MAC)), (VIP_B, None)]));
    agent.wait_ready();
    agent
}

fn vip_in_the_map_is_answered_with_its_mac_and_counted(mode: &str) {
    let mut lab = Lab::new(1);
    let agent = start(&mut lab, mode);
    assert!(agent.log_text().contains(&format!("mode=\"{mode}\"")), "{}", agent.log_text());

    assert_eq!(lab.client.arping(VIP_A, 3), vec![VIP_A_MAC; 3], "VIP A answers with its own MAC");
    let node_mac = lab.nodes[0].mac_string();
    assert_eq!(
        lab.client.arping(VIP_B, 2),
        vec![node_mac.as_str(); 2],
        "VIP B answers with the uplink's MAC"
    );

    assert_eq!(agent.metric(r#"lbagent_arp_replies_total{vip="198.51.100.10"}"#), 3.0);
    assert_eq!(agent.metric(r#"lbagent_arp_replies_total{vip="198.51.100.11"}"#), 2.0);
    assert_eq!(agent.metric(r#"lbagent_xdp_reason_packets_total{reason="arp_replied"}"#), 5.0);
    assert_eq!(agent.metric(r#"lbagent_xdp_packets_total{action="tx"}"#), 5.0);
    // arping pads its requests, and a reply keeps the request's length.
    let tx_bytes = agent.metric(r#"lbagent_xdp_bytes_total{action="tx"}"#);
    assert!(tx_bytes % 5.0 == 0.0 && (42.0..=60.0).contains(&(tx_bytes / 5.0)), "tx bytes {tx_bytes}");
    assert_eq!(agent.metric(r#"lbagent_xdp_packets_total{action="aborted"}"#), 0.0);
    assert_eq!(agent.metric("lbagent_owned_vips"), 2.0);
}

#[test]
fn native_mode_answers_owned_vips() {
    vip_in_the_map_is_answered_with_its_mac_and_counted("native");
}

#[test]
fn skb_mode_answers_owned_vips() {
    vip_in_the_map_is_answered_with_its_mac_and_counted("skb");
}

#[test]
fn a_vip_removed_by_reload_is_no_longer_answered() {
    let mut lab = Lab::new(1);
    let agent = start(&mut lab, "native");
    assert_eq!(lab.client.arping(VIP_A, 1).len(), 1);

    std::fs::write(&agent.config, config("native", &[(VIP_B, None)])).unwrap();
    agent.signal(libc::SIGHUP);
    agent.wait_metric(r#"lbagent_config_reloads_total{result="applied"}"#, 1.0);
    // Taken once its services are in the maps: the sync task runs beside the loop.
    agent.wait_metric("lbagent_owned_vips", 1.0);

    assert!(lab.client.arping(VIP_A, 3).is_empty(), "the removed VIP must go unanswered");
    assert_eq!(lab.client.arping(VIP_B, 1).len(), 1, "the kept VIP is still answered");
    assert_eq!(agent.metric(r#"lbagent_xdp_reason_packets_total{reason="arp_not_owned"}"#), 3.0);
    // Its per-VIP counter goes with it; the kept VIP's stays.
    assert!(!agent.metrics().contains(r#"vip="198.51.100.10""#));
    assert_eq!(agent.metric(r#"lbagent_arp_replies_total{vip="198.51.100.11"}"#), 1.0);
}

#[test]
fn a_rejected_reload_keeps_the_running_vips() {
    let mut lab = Lab::new(1);
    let agent = start(&mut lab, "native");
    std::fs::write(&agent.config, "interface: eth0\nvips:\n  - address: 198.51.100.300\n").unwrap();
    agent.signal(libc::SIGHUP);
    agent.wait_metric(r#"lbagent_config_reloads_total{result="rejected"}"#, 1.0);
    assert_eq!(agent.metric(r#"lbagent_errors_total{during="config_reload",error="config"}"#), 1.0);
    assert!(agent.log_text().contains("vips[0].address"), "{}", agent.log_text());
    assert_eq!(lab.client.arping(VIP_A, 1), vec![VIP_A_MAC]);
}

#[test]
fn addresses_not_in_the_map_are_left_to_the_kernel() {
    let mut lab = Lab::new(1);
    let agent = start(&mut lab, "native");

    assert!(lab.client.arping(NOT_A_VIP, 3).is_empty(), "nobody owns {NOT_A_VIP}");
    // The node's own address is answered by the kernel, after XDP passed the request.
    let node_ip = lab.nodes[0].ip;
    assert_eq!(lab.client.arping(node_ip, 2), vec![lab.nodes[0].mac_string(); 2]);

    assert_eq!(agent.metric(r#"lbagent_xdp_reason_packets_total{reason="arp_not_owned"}"#), 5.0);
    assert_eq!(agent.metric(r#"lbagent_xdp_packets_total{action="tx"}"#), 0.0);
    assert_eq!(agent.metric(r#"lbagent_xdp_reason_packets_total{reason="arp_replied"}"#), 0.0);
}

#[test]
fn malformed_frames_are_passed_counted_and_never_answered() {
    let mut lab = Lab::new(1);
    let agent = start(&mut lab, "native");
    let client = &lab.client;
    let good = arp_request(client.mac, client.ip, VIP_A);
    let mut bad_hlen = good.clone();
    bad_hlen[18] = 8;
    let mut broadcast_sender = good.clone();
    broadcast_sender[22..28].copy_from_slice(&[0xff; 6]);
    let mut truncated = good.clone();
    truncated.truncate(30);
    let hostile = vec![bad_hlen, broadcast_sender, truncated];

    let captured = send_and_capture(client.ns.name(), "eth0", hostile, Duration::from_millis(300));
    assert!(arp_replies(&captured).is_empty(), "no reply to a malformed request: {captured:?}");
    // veth pads nothing, so the truncated frame arrives as 30 bytes and is counted as such.
    assert_eq!(agent.metric(r#"lbagent_xdp_reason_packets_total{reason="malformed_arp"}"#), 3.0);

    // …and the responder still works afterwards, now checked byte for byte.
    let captured = send_and_capture(client.ns.name(), "eth0", vec![good], Duration::from_millis(300));
    let expected_mac = [0x02, 0, 0, 0, 0, 0xaa];
    assert_eq!(arp_replies(&captured), vec![(expected_mac, VIP_A, client.mac, client.ip)]);
    let reply = captured.iter().find(|f| f.len() >= 42 && f[12..14] == [8, 6]).unwrap();
    assert_eq!(reply[..42], arp_frame(2, client.mac, expected_mac, VIP_A, client.mac, client.ip)[..]);
}
