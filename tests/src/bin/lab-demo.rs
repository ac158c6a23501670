//! `cargo xtask demo`: a one-node lab in which lb-agent answers ARP for a VIP from XDP.

use std::net::Ipv4Addr;

use lb_lab::{Lab, agent::AGENT_LISTEN};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const VIP_MAC: &str = "02:00:00:00:00:aa";

fn main() {
    let mut lab = Lab::new(1);
    let node = &lab.nodes[0];
    println!(
        "lab {}: switch {}, node {} ({} {}), client {} ({})",
        lab.id,
        lab.switch.name(),
        node.ns.name(),
        node.ip,
        node.mac_string(),
        lab.client.ns.name(),
        lab.client.ip
    );

    lab.enable_native_xdp(0);
    let config = format!(
        "interface: eth0\nxdpMode: auto\nlisten: {AGENT_LISTEN}\nvips:\n  - address: {VIP}\n    mac: {VIP_MAC}\n"
    );
    println!("\nlb-agent config on {}:\n{config}", lab.nodes[0].name);
    let mut agent = lab.start_agent(0, &config);
    agent.wait_ready();
    for line in agent.log_text().lines().filter(|l| l.contains("XDP attached")) {
        println!("agent: {}", line.trim());
    }

    let node_addrs = lab.nodes[0].ns.run_cmd(&["ip", "-4", "-brief", "addr", "show", "eth0"]);
    println!(
        "\nthe node's kernel does not hold the VIP: {}",
        String::from_utf8_lossy(&node_addrs.stdout).trim()
    );

    println!("\nclient$ arping -c 3 {VIP}");
    let replies = lab.client.arping(VIP, 3);
    for mac in &replies {
        println!("  reply from {mac}");
    }

    println!("\nnode$ curl http://{AGENT_LISTEN}/metrics   (lbagent_ samples)");
    for line in agent.metrics().lines().filter(|l| l.starts_with("lbagent_") && !l.ends_with(" 0")) {
        println!("  {line}");
    }

    let ok = replies.len() == 3 && replies.iter().all(|m| m == VIP_MAC);
    drop(agent);
    drop(lab);
    if ok {
        println!("\ndemo ok: XDP answered every ARP request for {VIP} with {VIP_MAC}; lab torn down");
    } else {
        eprintln!("\ndemo FAILED: expected 3 replies from {VIP_MAC}, got {replies:?}");
        std::process::exit(1);
    }
}
