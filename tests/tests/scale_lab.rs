//! Scale with real packets: a node that restarts with thousands of services takes its VIP back
//! only once they are in its maps, and a config larger than the maps is served as far as it
//! fits, with the rest refused and reported.

use std::time::{Duration, Instant};

use lb_lab::{
    Lab, Process,
    cluster::{LAB_VIP, agent_config, service_config},
    scale::{scale_service_items, scale_vips_yaml},
};

const TARGET_PORT: u16 = 8080;
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The lab config for node `me` with `services` (list items), the scale VIPs and `dataplane`.
fn config(lab: &Lab, me: usize, services: &str, scale: usize, dataplane: &str) -> String {
    let vips = if scale > 0 { scale_vips_yaml(scale) } else { String::new() };
    format!("{}{vips}dataplane:\n{dataplane}", agent_config(lab, me, services))
}

#[test]
fn the_preferred_node_restarts_cold_with_thousands_of_services_and_no_reply_is_lost() {
    const SCALE: usize = 3_000;
    let mut lab = Lab::new(2);
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    lab.add_pod(1);
    let _server: Process = lab.pods[0].serve(TARGET_PORT);
    // The watched service sorts after the 3,000 others (198.51.100.10 > 198.18.x.y), so it is
    // the last one a cold sync writes.
    let services = format!(
        "{}{}",
        scale_service_items(SCALE, 4),
        service_config(&lab, "web", LAB_VIP, 82, TARGET_PORT, "dsr", &[0])
    );
    // keepOnExit: false, so n0 comes back with empty maps, as after a reboot.
    let dataplane = "  keepOnExit: false\n";
    let mut n1 = lab.start_agent(1, &config(&lab, 1, &services, SCALE, dataplane));
    n1.wait_ready_within(START_TIMEOUT);
    let mut n0 = lab.start_agent(0, &config(&lab, 0, &services, SCALE, dataplane));
    n0.wait_ready_within(START_TIMEOUT);
    n0.wait_metric("lbagent_owned_vips", (SCALE + 1) as f64);
    let first = lab.client.udp_ask(LAB_VIP, 82);
    assert!(first.starts_with("n1p0"), "{first:?}\n{}", n0.log_text());

    let traffic = lab.client.udp_every_5ms(LAB_VIP, 82, 2_000);
    std::thread::sleep(Duration::from_millis(500));
    n0.signal(libc::SIGTERM);
    assert!(n0.wait_exit(Duration::from_secs(10)).success());
    assert!(!lab.pin_path(0).join("v1").join("SERVICES").exists(), "n0's maps were removed");
    let restarted = Instant::now();
    let mut n0 = lab.start_agent(0, &config(&lab, 0, &services, SCALE, dataplane));
    n0.wait_ready_within(START_TIMEOUT);
    n0.wait_metric("lbagent_owned_vips", (SCALE + 1) as f64);
    let took_back = restarted.elapsed();

    let (sent, answered) = traffic.join().unwrap();
    let log = n0.log_text();
    assert_eq!(
        answered, sent,
        "replies lost while n0 restarted ({took_back:?} to take the VIP back):\n{log}"
    );
    // The restarted agent wrote every service before VRRP made it master again.
    let restart = log.rfind("XDP attached").expect("the restart's log");
    let synced = log[restart..].find("service maps updated").expect("a sync after the restart");
    let master = log[restart..].find("owned VIPs updated").expect("the VIP taken back");
    assert!(synced < master, "{}", &log[restart..]);
    assert!(log[restart..].contains(&format!("services={}", SCALE + 2)), "{}", &log[restart..]);
}

#[test]
fn a_config_beyond_capacity_is_served_as_far_as_it_fits_and_the_rest_is_refused() {
    let mut lab = Lab::new(1);
    lab.enable_native_xdp(0);
    lab.add_pod(0);
    let _server = lab.pods[0].serve(TARGET_PORT);
    let service = |lab: &Lab, name: &str, port: u16| {
        service_config(lab, name, LAB_VIP, port, TARGET_PORT, "fullNat", &[0])
    };
    // Each service is a TCP and a UDP entry: room for two services of three.
    let dataplane = "  capacity: {services: 4}\n";
    let all = format!("{}{}{}", service(&lab, "a", 81), service(&lab, "b", 82), service(&lab, "c", 83));
    let mut agent = lab.start_agent(0, &config(&lab, 0, &all, 0, dataplane));
    agent.wait_ready();
    agent.wait_metric("lbagent_owned_vips", 1.0);

    assert!(lab.client.udp_ask(LAB_VIP, 81).starts_with("n0p0"), "{}", agent.log_text());
    assert!(lab.client.udp_ask(LAB_VIP, 82).starts_with("n0p0"), "{}", agent.log_text());
    assert_eq!(lab.client.udp_ask(LAB_VIP, 83), "", "c does not fit");
    assert_eq!(agent.metric("lbagent_services_refused{limit=\"services\"}"), 2.0);
    assert_eq!(agent.metric("lbagent_services"), 4.0);
    assert!(agent.metric("lbagent_bpf_map_bytes{map=\"MAGLEV_RINGS\"}") > 0.0);
    let log = agent.log_text();
    assert!(
        log.contains("service refused")
            && log.contains("service=c")
            && log.contains("dataplane.capacity.services"),
        "{log}"
    );

    // Removing a makes room: c is served after the reload, b never stopped.
    let without_a = format!("{}{}", service(&lab, "b", 82), service(&lab, "c", 83));
    std::fs::write(&agent.config, config(&lab, 0, &without_a, 0, dataplane)).unwrap();
    agent.signal(libc::SIGHUP);
    agent.wait_metric("lbagent_services_refused{limit=\"services\"}", 0.0);
    assert!(lab.client.udp_ask(LAB_VIP, 83).starts_with("n0p0"), "{}", agent.log_text());
    assert!(lab.client.udp_ask(LAB_VIP, 82).starts_with("n0p0"));
    assert!(agent.try_get("/healthz").is_some(), "the agent kept running");
}
