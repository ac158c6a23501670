//! Scale with real packets: a node that restarts with thousands of services takes its VIP back
//! only once they are in its maps; an agent killed in the middle of a large sync leaves
//! nothing half-written; and a config larger than the maps is served as far as it fits, with
//! the rest refused and reported.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aya::maps::{Array, HashOfMaps, Map, MapData};
use lb_agent::dataplane::batch;
use lb_common::service::{
    BACKENDS, Backend, Delivery, MAGLEV_RINGS, RingEntry, SERVICES, Service, ServiceKey,
};

use lb_lab::{
    Lab, Process,
    cluster::{LAB_VIP, agent_config, service_config},
    scale::{scale_endpoint, scale_service_items, scale_service_items_at, scale_vip, scale_vips_yaml},
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
    let pins = lb_agent::dataplane::pin_dir(&lab.pin_path(0));
    assert!(!pins.join("SERVICES").exists(), "n0's maps were removed");
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

/// The pinned service maps of `pins`, read back.
struct PinnedMaps {
    services: aya::maps::HashMap<MapData, ServiceKey, Service>,
    backends: Array<MapData, Backend>,
    rings: HashOfMaps<MapData, u32, Array<MapData, RingEntry>>,
}

impl PinnedMaps {
    fn open(pins: &std::path::Path) -> PinnedMaps {
        let pinned =
            |name: &str| MapData::from_pin(pins.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        PinnedMaps {
            services: aya::maps::HashMap::try_from(Map::HashMap(pinned(SERVICES))).unwrap(),
            backends: Array::try_from(Map::Array(pinned(BACKENDS))).unwrap(),
            rings: HashOfMaps::try_from(Map::HashOfMaps(pinned(MAGLEV_RINGS))).unwrap(),
        }
    }

    fn entries(&self) -> Vec<(ServiceKey, Service)> {
        self.services.iter().map(Result::unwrap).collect()
    }

    /// The endpoint addresses service `key`'s ring sends to (every slot checked), or why not.
    fn ring_targets(&self, entry: &Service) -> Result<BTreeSet<Ipv4Addr>, String> {
        let ring = self.rings.get(&entry.ring_id, 0).map_err(|e| format!("ring {}: {e}", entry.ring_id))?;
        let slots: Vec<u32> = batch::read_array(&ring).map_err(|e| e.to_string())?.concat();
        let mut targets = BTreeSet::new();
        for &id in &slots[..entry.ring_size as usize] {
            let backend = self.backends.get(&id, 0).map_err(|e| format!("backend slot {id}: {e}"))?;
            if Delivery::from_u8(backend.delivery).is_none() {
                return Err(format!("slot {id} is empty"));
            }
            targets.insert(Ipv4Addr::from(backend.addr));
        }
        Ok(targets)
    }
}

/// The agent is killed (SIGKILL) in the middle of a sync that rewrites 3,000 rings in place,
/// and restarts with the config it ran before: every service ends up exactly as that config
/// says (no ring left half-rewritten, no slot pointing at a freed backend), and a service that
/// did not change answers throughout.
#[test]
fn a_kill_in_the_middle_of_a_large_sync_leaves_no_service_half_written() {
    const SCALE: usize = 3_000;
    const ENDPOINTS: usize = 4;
    let mut lab = Lab::new(1);
    lab.enable_native_xdp(0);
    lab.add_pod(0);
    let _server: Process = lab.pods[0].serve(TARGET_PORT);
    let web = service_config(&lab, "web", LAB_VIP, 82, TARGET_PORT, "dsr", &[0]);
    let at = |generation: u32| {
        let services = format!("{}{web}", scale_service_items_at(SCALE, ENDPOINTS, generation));
        config(&lab, 0, &services, SCALE, "  keepOnExit: true\n")
    };
    let mut agent = lab.start_agent(0, &at(0));
    agent.wait_ready_within(START_TIMEOUT);
    agent.wait_metric("lbagent_owned_vips", (SCALE + 1) as f64);
    assert!(lab.client.udp_ask(LAB_VIP, 82).starts_with("n0p0"), "{}", agent.log_text());
    let traffic = lab.client.udp_every_5ms(LAB_VIP, 82, 3_000);
    let pins = lb_agent::dataplane::pin_dir(&lab.pin_path(0));

    // Every endpoint of every service changes (same counts, so same ring sizes: rewritten in
    // place). Kill the agent as soon as an entry is marked as being rewritten; should the
    // whole sync slip through between two looks, go back and try again.
    let (mut running, mut killed_mid_sync) = (0, false);
    for _ in 0..5 {
        let next = 1 - running;
        let syncs = |agent: &lb_lab::Agent| agent.log_text().matches("service maps updated").count();
        let before = syncs(&agent);
        std::fs::write(&agent.config, at(next)).unwrap();
        agent.signal(libc::SIGHUP);
        let maps = PinnedMaps::open(&pins);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && syncs(&agent) == before {
            if maps.entries().iter().any(|(_, e)| e.ring_digest == 0) {
                agent.kill();
                killed_mid_sync = true;
                break;
            }
        }
        if killed_mid_sync {
            break;
        }
        running = next;
    }
    assert!(killed_mid_sync, "the sync was never caught in the middle:\n{}", agent.log_text());
    let maps = PinnedMaps::open(&pins);
    let marked = maps.entries().iter().filter(|(_, e)| e.ring_digest == 0).count();
    eprintln!("killed with {marked} rings marked as being rewritten");

    let mut agent = lab.start_agent(0, &at(running));
    agent.wait_ready_within(START_TIMEOUT);
    let entries = maps.entries();
    assert_eq!(entries.len(), SCALE + 2, "one entry per service and port (web has two)");
    for i in 0..SCALE {
        let key = ServiceKey::new(scale_vip(i).octets(), 80, 6);
        let (_, entry) = entries.iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("service {i}"));
        let expected: BTreeSet<Ipv4Addr> =
            (0..ENDPOINTS).map(|e| scale_endpoint(i, e, ENDPOINTS, running)).collect();
        assert_eq!(maps.ring_targets(entry), Ok(expected), "service {i}:\n{}", agent.log_text());
    }
    let (sent, answered) = traffic.join().unwrap();
    assert_eq!(answered, sent, "the unchanged service answered throughout:\n{}", agent.log_text());
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
