//! `cargo xtask demo`: the main job in a lab. Three nodes elect the VIP's owner with VRRP; two
//! pods (on n1 and n2) serve a Service through the VIP; the client's connections are spread
//! over the pods from XDP (DSR: the pods see the client's address and answer it directly);
//! then the owner fails hard and the connections carry on through the new owner.

use std::time::{Duration, Instant};

use lb_lab::{
    Lab,
    cluster::{LAB_VIP as VIP, agent_config_advertising_every, service_config},
};

const TARGET_PORT: u16 = 8080;

fn main() {
    let mut lab = Lab::new(3);
    for node in 0..3 {
        lab.enable_native_xdp(node);
    }
    let pods = [lab.add_pod(1), lab.add_pod(2)];
    let _servers: Vec<_> = pods.iter().map(|&p| lab.pods[p].serve(TARGET_PORT)).collect();
    println!("lab {}: nodes n0 n1 n2 on 192.0.2.0/24, client 192.0.2.100", lab.id);
    for &p in &pods {
        println!("  pod {} at {} on {}", lab.pods[p].name, lab.pods[p].ip, lab.nodes[lab.pods[p].node].name);
    }
    let services = [
        service_config(&lab, "default/web", VIP, 80, TARGET_PORT, "dsr", &pods),
        service_config(&lab, "default/api", VIP, 81, TARGET_PORT, "fullNat", &pods),
    ]
    .concat();
    println!("\nservices (every node reads the same):\n{services}");

    let mut agents: Vec<_> = (0..3)
        .map(|i| {
            // Alone on the machine, the demo shows the failover speed of 20 ms adverts.
            let mut agent = lab.start_agent(i, &agent_config_advertising_every(&lab, i, &services, 20));
            agent.wait_ready();
            agent
        })
        .collect();
    agents[0].wait_metric("lbagent_owned_vips", 1.0);
    println!("VRRP: n0 (priority 200) is master of {VIP}");

    let mut failures = Vec::new();
    let mut sessions = Vec::new();
    println!("\nclient: 6 TCP connections to {VIP}:80 (DSR)");
    for _ in 0..6 {
        match lab.client.session(VIP, 80) {
            Some(s) => {
                println!("  answered by {:<5} which saw the client as {}", s.pod(), s.seen_client());
                sessions.push(s);
            }
            None => failures.push("a DSR connection failed".to_owned()),
        }
    }
    match lab.client.session(VIP, 81) {
        Some(s) => {
            println!("client: {VIP}:81 (full NAT) answered by {}, which saw {}", s.pod(), s.seen_client())
        }
        None => failures.push("the full-NAT connection failed".to_owned()),
    }
    println!("client: UDP to {VIP}:80 answered: {}", lab.client.udp_ask(VIP, 80));

    println!("\nn0 fails hard: its switch port goes down, its agent is killed");
    lab.cut(0);
    agents[0].kill();
    let started = Instant::now();
    agents[1].wait_metric("lbagent_owned_vips", 1.0);
    println!("VRRP: n1 took {VIP} over after {} ms", started.elapsed().as_millis());
    for (i, s) in sessions.iter_mut().enumerate() {
        let pod = s.pod().to_owned();
        match s.echo("still there?", Duration::from_secs(5)) {
            Some(answer) if answer.starts_with(&pod) => println!("  connection {i} still answered by {pod}"),
            other => failures.push(format!("connection {i} to {pod} broke: {other:?}")),
        }
    }

    println!("\nn1's XDP paths (lbagent_xdp_reason_packets_total):");
    for line in
        agents[1].metrics().lines().filter(|l| l.starts_with("lbagent_xdp_reason") && !l.ends_with(" 0"))
    {
        println!("  {line}");
    }
    drop(agents);
    drop(lab);
    if failures.is_empty() {
        println!(
            "\ndemo ok: connections spread over both pods from XDP and survived the VIP owner's failure; lab torn down"
        );
    } else {
        eprintln!("\ndemo FAILED:\n  {}", failures.join("\n  "));
        std::process::exit(1);
    }
}
