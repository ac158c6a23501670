//! `cargo xtask bench scale`: programming a large cluster, lb-agent against kube-proxy's
//! iptables and nftables shapes, in one run. Prints the book's table (docs/src/benchmarks.md).
//!
//! Method, for N Services × 10 endpoints (one VIP and one TCP port each):
//! - **Cold start.** lb-agent (release) starts in a lab node with a standalone config of the N
//!   Services and fresh pins; the time runs from spawn to `/readyz` (config parsed, XDP
//!   attached, every service in the maps, VRRP started). The map-programming part alone is the
//!   sync's own `elapsed` from its log. The peers load the same Services, shaped as kube-proxy
//!   writes them, into an empty network namespace: `iptables-restore` (Debian's nf_tables
//!   backend), `iptables-legacy-restore`, and `nft -f`. Repetitions alternate the four
//!   (A B C D A B C D …); medians are reported.
//! - **One endpoint change.** 1,000 changes, one at a time, each replacing one endpoint of one
//!   Service in the parsed config, through the agent's own planner and map writer on real BPF
//!   maps: from the changed config to the maps, p50 and p99. Then the same 1,000 changes at once
//!   (one coalesced sync, as a watch burst is), and the SIGHUP path end to end (YAML parse
//!   included) on the running agent, median of 10.
//! - **One watch event.** The same N Services as Kubernetes objects (a Service and an
//!   EndpointSlice each); 1,000 times, one EndpointSlice is replaced (an endpoint moved, a new
//!   resource version), and the time runs from there through what the controller hands the
//!   Kubernetes source (the touched Service's objects, the groups and nodes), its translation, the controller's and the agent's
//!   comparisons with the last config, the planner and the map writer to the maps, p50 and p99.
//! - **Memory.** The agent's RSS after the cold start, and the kernel memory of every map it
//!   pinned (fdinfo `memlock`).

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use aya::{EbpfLoader, maps::MapData};
use lb_agent::{
    config::Config,
    dataplane::{EMBEDDED_OBJECT, PINNED_MAPS, ServiceMaps, batch, map_sizes, pin_dir},
    k8s::{
        cluster::ClusterState,
        source::{Changed, ServiceObjects, Translator, translate},
    },
    map_contents::IncrementalContents,
};
use lb_lab::{
    Agent, Lab, Netns,
    agent::{AGENT_LISTEN, rss_kib},
    bench::median,
    scale::{
        kube_proxy_iptables, kube_proxy_nftables, scale_cluster, scale_endpoint, scale_endpoint_json,
        scale_node, scale_services_yaml, scale_slice,
    },
};

const ENDPOINTS: usize = 10;
const CHANGES: usize = 1000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only N`: one size (to repeat a row).
    let only: Option<usize> =
        args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)?.parse().ok());
    let sizes: Vec<usize> = match only {
        Some(n) => vec![n],
        None if quick => vec![1_000],
        None => vec![1_000, 10_000, 20_000],
    };
    if args.iter().any(|a| a == "--watch-only") {
        // Only the watch-event measurement, for working on the Kubernetes path.
        for n in sizes {
            let (p50, p99) = watch_event_changes(n);
            println!("{n} services: watch event → maps p50 {} p99 {}", ms(p50), ms(p99));
        }
        return;
    }
    let lab = Lab::new(1);
    println!(
        "| Services × 10 | lb-agent start → ready | lb-agent maps programmed | iptables-restore | iptables-legacy-restore | nft -f | lb-agent ÷ iptables-restore | change p50 / p99 | 1,000 changes at once | 1,000 one by one | SIGHUP (parse included) | watch event → maps p50 / p99 | agent RSS | BPF maps |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        // Three alternating repetitions; one at 20,000, where iptables-restore takes ~45 s.
        let reps = if quick || n > 10_000 { 1 } else { 3 };
        eprintln!("== {n} services × {ENDPOINTS} endpoints, {reps} repetition(s)");
        let r = measure(&lab, n, reps);
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} / {} | {} | {} | {} | {} / {} | {} MiB | {} MiB |",
            r.services,
            ms(r.start),
            ms(r.programmed),
            ms(r.iptables),
            ms(r.legacy),
            if r.nft.is_zero() { "not run".into() } else { ms(r.nft) },
            r.start.as_secs_f64() / r.iptables.as_secs_f64(),
            ms(r.p50),
            ms(r.p99),
            ms(r.burst),
            ms(r.sequential),
            ms(r.sighup),
            ms(r.watch_p50),
            ms(r.watch_p99),
            r.rss_kib / 1024,
            r.map_bytes / (1 << 20),
        );
    }
}

struct Row {
    services: usize,
    start: Duration,
    programmed: Duration,
    iptables: Duration,
    legacy: Duration,
    nft: Duration,
    p50: Duration,
    p99: Duration,
    burst: Duration,
    sequential: Duration,
    sighup: Duration,
    watch_p50: Duration,
    watch_p99: Duration,
    rss_kib: u64,
    map_bytes: u64,
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 { format!("{ms:.2} ms") } else { format!("{ms:.0} ms") }
}

/// The agent's settings; beyond the default capacity (131,072 backends, 65,536 local
/// endpoints, a third of the endpoints being on this node), room for all of them.
fn head(node: &str, services: usize) -> String {
    let mut head = format!("node: {node}\ninterface: eth0\nxdpMode: skb\nlisten: {AGENT_LISTEN}\n");
    let endpoints = services * ENDPOINTS;
    if endpoints > 131_072 {
        let (backends, local) = (endpoints.next_power_of_two(), (endpoints / 3 + 1).next_power_of_two());
        head.push_str(&format!(
            "dataplane:\n  capacity: {{backends: {backends}, localEndpoints: {local}}}\n"
        ));
    }
    head
}

fn measure(lab: &Lab, n: usize, reps: usize) -> Row {
    let yaml = format!("{}{}", head("n0", n), scale_services_yaml(n, ENDPOINTS));
    let config_path = lab.path(&format!("scale-{n}.yaml"));
    std::fs::write(&config_path, &yaml).expect("writing the scale config");
    let iptables = lab.path(&format!("scale-{n}.iptables"));
    std::fs::write(&iptables, kube_proxy_iptables(n, ENDPOINTS)).expect("writing the iptables rules");
    let nft = lab.path(&format!("scale-{n}.nft"));
    std::fs::write(&nft, kube_proxy_nftables(n, ENDPOINTS)).expect("writing the nftables rules");

    let (mut starts, mut programmed, mut ipt, mut legacy, mut nfts) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut last_agent = None;
    for rep in 0..reps {
        drop(last_agent.take());
        let (agent, start, sync) = cold_start(lab, &config_path);
        assert_eq!(agent.metric("lbagent_services"), n as f64, "every service programmed, none refused");
        eprintln!("  rep {rep}: lb-agent ready in {start:?} (maps {sync:?})");
        starts.push(start);
        programmed.push(sync);
        last_agent = Some(agent);
        let id = format!("{}-scale{rep}", lab.id);
        ipt.push(load_rules(&format!("{id}a"), &["iptables-restore"], &iptables));
        legacy.push(load_rules(&format!("{id}b"), &["iptables-legacy-restore"], &iptables));
        // `nft -f` grows faster than linearly here (184 s for 10,000 Services): once per size,
        // and not beyond 10,000.
        if rep == 0 && n <= 10_000 {
            nfts.push(load_rules(&format!("{id}c"), &["nft", "-f", "-"], &nft));
        }
        eprintln!(
            "  rep {rep}: iptables-restore {:?}, legacy {:?}, nft {:?}",
            ipt.last().unwrap(),
            legacy.last().unwrap(),
            nfts.last()
        );
    }
    let agent = last_agent.expect("at least one repetition");
    let rss_kib = rss_kib(agent.pid());
    let map_bytes = pinned_map_bytes(lab, &agent);
    let sighup = sighup_changes(&agent, &yaml, &config_path);
    drop(agent);
    let (p50, p99, burst, sequential) = in_process_changes(&yaml, n);
    let (watch_p50, watch_p99) = watch_event_changes(n);
    Row {
        services: n,
        start: median(starts).unwrap_or_default(),
        programmed: median(programmed).unwrap_or_default(),
        iptables: median(ipt).unwrap_or_default(),
        legacy: median(legacy).unwrap_or_default(),
        nft: median(nfts).unwrap_or_default(),
        p50,
        p99,
        burst,
        sequential,
        sighup,
        watch_p50,
        watch_p99,
        rss_kib,
        map_bytes,
    }
}

/// Starts the agent on fresh pins; returns it, spawn → ready, and the sync's own time.
fn cold_start(lab: &Lab, config: &std::path::Path) -> (Agent, Duration, Duration) {
    let pins = lab.pin_path(0);
    let _ = std::fs::remove_dir_all(&pins);
    let log = lab.path("scale-agent.log");
    let _ = std::fs::remove_file(&log);
    let started = Instant::now();
    let mut agent = Agent::spawn(&lab.nodes[0].ns, config.to_owned(), log, pins);
    agent.wait_ready_within(Duration::from_secs(300));
    let ready = started.elapsed();
    let text = agent.log_text();
    let sync = text
        .lines()
        .find(|l| l.contains("service maps updated"))
        .and_then(|l| l.split(" elapsed=").nth(1))
        .and_then(|v| parse_debug_duration(v.split_whitespace().next()?))
        .unwrap_or_else(|| panic!("no sync time in the log:\n{text}"));
    (agent, ready, sync)
}

/// `12.3ms`, `1.2s`, `800µs`, as `Duration`'s Debug writes them.
fn parse_debug_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (value, unit) = s.split_at(split);
    let value: f64 = value.parse().ok()?;
    let seconds = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" | "us" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// Loads a rules file into a fresh, empty namespace; returns how long the loader took.
fn load_rules(ns_name: &str, argv: &[&str], file: &std::path::Path) -> Duration {
    let ns = Netns::create(ns_name.to_owned());
    let input = std::fs::File::open(file).expect("opening the rules");
    let started = Instant::now();
    let out = ns.command(argv).stdin(input).stdout(Stdio::null()).stderr(Stdio::piped()).output().unwrap();
    let took = started.elapsed();
    assert!(out.status.success(), "{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    took
}

/// Kernel memory of the agent's pinned maps, plus its rings (from its own metric).
fn pinned_map_bytes(lab: &Lab, agent: &Agent) -> u64 {
    let dir = pin_dir(&lab.pin_path(0));
    let mut pinned = 0;
    for name in PINNED_MAPS.iter().filter(|m| **m != lb_common::service::MAGLEV_RINGS) {
        let bytes = MapData::from_pin(dir.join(name)).ok().and_then(|m| batch::memlock(m.fd())).unwrap_or(0);
        eprintln!("  map {name}: {:.1} MiB", bytes as f64 / f64::from(1 << 20));
        pinned += bytes;
    }
    let rings = agent.metric("lbagent_bpf_map_bytes{map=\"MAGLEV_RINGS\"}") as u64;
    eprintln!("  map MAGLEV_RINGS with its rings: {:.1} MiB", rings as f64 / f64::from(1 << 20));
    pinned + rings
}

/// SIGHUP with one endpoint changed, end to end, median of 10.
fn sighup_changes(agent: &Agent, yaml: &str, path: &std::path::Path) -> Duration {
    let mut times = Vec::new();
    for k in 0..10u32 {
        let old = format!("address: {}, node: {}", scale_endpoint(0, 0, ENDPOINTS, 0), scale_node(0));
        let new = format!("address: {}, node: {}", scale_endpoint(0, 0, ENDPOINTS, k + 1), scale_node(0));
        std::fs::write(path, yaml.replacen(&old, &new, 1)).expect("writing the changed config");
        let before = agent.metric("lbagent_service_syncs_total{result=\"applied\"}");
        let started = Instant::now();
        agent.signal(libc::SIGHUP);
        while agent.metric("lbagent_service_syncs_total{result=\"applied\"}") <= before {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no sync after SIGHUP:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        times.push(started.elapsed());
    }
    median(times).unwrap_or_default()
}

/// The service maps, unpinned, sized as `config` says (keep the object alive beside them).
fn service_maps(config: &Config) -> (aya::Ebpf, ServiceMaps) {
    let mut loader = EbpfLoader::new();
    for (name, size) in map_sizes(&config.dataplane) {
        loader.map_max_entries(name, size);
    }
    let mut ebpf = loader.load(EMBEDDED_OBJECT).expect("loading the BPF object");
    let maps = ServiceMaps::take(&mut ebpf, None, None).expect("the service maps");
    (ebpf, maps)
}

/// Endpoint changes as watch events (see the module's notes): p50 and p99.
fn watch_event_changes(n: usize) -> (Duration, Duration) {
    let mut state = scale_cluster(n, ENDPOINTS);
    let base = Config::parse(&head("n0", n)).expect("the agent's settings");
    let (_ebpf, mut maps) = service_maps(&base);
    let mut translator = Translator::default();
    let started = Instant::now();
    let config = translator.translate(&state, &base).expect("the cluster's config").config;
    eprintln!("  kubernetes: first translation of {n} services {:?}", started.elapsed());
    let started = Instant::now();
    translate(&state, &base).expect("the cluster's config");
    eprintln!("  kubernetes: a translation from scratch {:?}", started.elapsed());
    let mut planner = IncrementalContents::default();
    let report = maps.apply_delta(&planner.update(&config, "n0")).expect("the first sync");
    assert_eq!(report.services_added, n, "one entry per Service");
    let mut last = config;

    let mut times = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let (service, moved) = ((k * 7919) % n, k % ENDPOINTS);
        let endpoints = (0..ENDPOINTS)
            .map(|e| scale_endpoint_json(service, e, ENDPOINTS, u32::from(e == moved)))
            .collect();
        state.slices[service] = std::sync::Arc::new(scale_slice(service, endpoints, k as u64 + 2));
        let started = Instant::now();
        // As the controller does: the event names the slice's Service, whose objects come from
        // the stores; groups and nodes are snapshot.
        let touched = Changed::Services(vec![ServiceObjects {
            namespace: "default".into(),
            name: format!("svc-{service}"),
            service: Some(state.services[service].clone()),
            slices: vec![state.slices[service].clone()],
        }]);
        let frame = ClusterState {
            groups: state.groups.clone(),
            nodes: state.nodes.clone(),
            routes: state.routes.clone(),
            ..ClusterState::default()
        };
        assert!(!translator.needs_everything(&frame));
        let config =
            translator.translate_changed(&frame, &base, touched).expect("the cluster's config").config;
        // The controller passes on a config that differs from its last; the agent keeps its
        // VRRP plan when the groups are unchanged.
        assert!(config != last && config.groups == last.groups && config.vips == last.vips);
        let sent = config.clone();
        last = config;
        let report = maps.apply_delta(&planner.update(&sent, "n0")).expect("a change");
        times.push(started.elapsed());
        maps.remove_retired_rings().expect("removing the replaced ring");
        assert_eq!((report.services_changed, translator.rebuilt()), (1, 1), "change {k}");
    }
    times.sort();
    (times[CHANGES / 2], times[CHANGES * 99 / 100])
}

/// Endpoint changes through the agent's planner and map writer, on real maps in this process.
fn in_process_changes(yaml: &str, n: usize) -> (Duration, Duration, Duration, Duration) {
    let mut config = Config::parse(yaml).expect("the scale config");
    let (_ebpf, mut maps) = service_maps(&config);
    let mut planner = IncrementalContents::default();
    maps.apply_delta(&planner.update(&config, "n0")).expect("the first sync");

    let change = |config: &mut Config, k: usize, generation: u32| {
        let service = (k * 7919) % n;
        let endpoint = k % ENDPOINTS;
        std::sync::Arc::make_mut(&mut config.services[service]).endpoints[endpoint].address =
            scale_endpoint(service, endpoint, ENDPOINTS, generation).into();
    };
    let mut times = Vec::with_capacity(CHANGES);
    let all = Instant::now();
    for k in 0..CHANGES {
        change(&mut config, k, 1);
        let started = Instant::now();
        let report = maps.apply_delta(&planner.update(&config, "n0")).expect("a change");
        times.push(started.elapsed());
        maps.remove_retired_rings().expect("removing the replaced ring");
        assert_eq!((report.services_changed, report.refused.len()), (1, 0), "change {k}");
    }
    let sequential = all.elapsed();
    times.sort();
    let (p50, p99) = (times[CHANGES / 2], times[CHANGES * 99 / 100]);
    for k in 0..CHANGES {
        change(&mut config, k, 2);
    }
    let started = Instant::now();
    let report = maps.apply_delta(&planner.update(&config, "n0")).expect("a burst");
    maps.remove_retired_rings().expect("removing the replaced rings");
    let burst = started.elapsed();
    assert!(report.services_changed > 0 && report.refused.is_empty(), "the burst");
    (p50, p99, burst, sequential)
}
