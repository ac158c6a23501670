//! Start-up: validate, attach, sync the services, start VRRP, serve. Everything that can be
//! checked (config, interface, HTTP port, VRRP socket) is checked before XDP is attached, so a
//! bad start leaves the node untouched.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use tokio::{
    net::TcpListener,
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    announcer::Announcer,
    config::{Config, ConfigError},
    dataplane::Dataplane,
    error::{Error, Result},
    http::{self, HttpState, StatusSource},
    k8s::controller::{ForeignRouters, FromAgent, Impersonations},
    key_files::{self, KeyFiles},
    metrics::{Metrics, XdpLabels},
    netdev,
    node_plan::node_plan,
    routes::{RouteMetrics, Routes},
    service_sync::{ServiceSync, SyncMetrics, SyncRequest},
    uplinks::{self, Uplinks},
    vip_addresses::VipAddresses,
    vrrp::{family::IpFamily, metrics::VrrpMetrics, router::Router},
    vrrp_driver::Vrrp,
};

use super::{
    Agent, Announcing, Applied, Current, Inputs, KubernetesSource, Overrides, ServiceSyncLink, Signals,
    cluster_link::ClusterLink, stop_signal,
};

/// Runs the agent on the calling thread's current-thread runtime, which then holds only the
/// VRRP loop: its sockets and timers. Everything else (the service-sync task, HTTP, the
/// cluster side, netlink, announcements) runs on `background`, so none of it delays an
/// advertisement, and an advertisement wakes one thread and no other (a multi-thread
/// runtime's worker hand-offs cost a loop that wakes thousands of times a second more than
/// the VRRP work itself).
pub async fn run(
    config_path: PathBuf,
    node_override: Option<String>,
    overrides: Overrides,
    kubernetes: Option<KubernetesSource>,
    background: tokio::runtime::Handle,
) -> Result<()> {
    let mut signals = Signals::install()?;
    let mut config = Config::load(&config_path)?;
    overrides.apply(&mut config);
    let node = node_name(&config, node_override);
    let mut cluster = None;
    // Services the data plane has no room for, by name, for the cluster's status.
    let (refused_tx, refused_rx) = watch::channel(BTreeMap::new());
    if let Some(source) = kubernetes {
        // The client's buffer task runs where it is made.
        let (client, requests) = background
            .spawn(crate::k8s::controller::clients())
            .await
            .map_err(|e| Error::io("starting the Kubernetes client", std::io::Error::other(e)))?
            .map_err(Error::Kube)?;
        let (configs_tx, configs_rx) = mpsc::channel(4);
        let (owners_tx, owners_rx) = watch::channel(BTreeMap::new());
        let (foreign_tx, foreign_rx) = watch::channel(ForeignRouters::new());
        let (impersonated_tx, impersonated_rx) = watch::channel(Impersonations::new());
        let mut base = config.clone();
        base.node = Some(node.clone());
        let shell = crate::k8s::controller::Shell {
            client,
            requests,
            netlink: within(&background, netdev::connect)?,
            base,
            node: node.clone(),
            namespace: source.namespace,
        };
        let from_agent = FromAgent {
            owners: owners_rx,
            refused: refused_rx,
            foreign: foreign_rx,
            impersonated: impersonated_rx,
        };
        let (stopping_tx, stopping_rx) = watch::channel(false);
        let mut link = ClusterLink {
            configs: configs_rx,
            owners: owners_tx,
            foreign: foreign_tx,
            impersonated: impersonated_tx,
            stopping: stopping_tx,
            shell: background.spawn(shell.run(configs_tx, from_agent, stopping_rx)),
        };
        info!("waiting for the cluster's groups and services");
        let first = tokio::select! {
            first = link.configs.recv() => Some(first),
            () = stop_signal(&mut signals.term, &mut signals.int) => None,
        };
        let Some(first) = first else {
            info!("stopped before the cluster's first config: nothing was attached");
            link.finish().await;
            return Ok(());
        };
        config = first
            .ok_or_else(|| Error::io("watching the cluster", std::io::Error::other("the watch ended")))?;
        cluster = Some(link);
    }
    let netlink = within(&background, netdev::connect)?;
    let config_error = |field: &str, expected: String| Error::Config {
        path: config_path.clone(),
        error: ConfigError::new(field, expected),
    };
    let plan = node_plan(&config, &node);
    if cluster.is_none() {
        // A key file named in the config file is part of it: a mistake stops the start. From
        // the cluster, the group waits for its Secret on this node instead (see key_files).
        check_key_files(&config, &node).map_err(|(field, expected)| config_error(&field, expected))?;
    }
    let mut keys = KeyFiles::default();
    keys.refresh(plan.key_files.values());
    let mut uplinks = Uplinks::default();
    uplinks.by_name = uplinks::resolve(&netlink, &config, &plan, &BTreeSet::new())
        .await?
        .map_err(|e| config_error(&e.field, e.expected))?;
    let node_address = uplinks.by_name[&config.interface].node_address;
    let listen = config.listen;
    let listener = background
        .spawn(TcpListener::bind(listen))
        .await
        .map_err(std::io::Error::other)
        .flatten()
        .map_err(|e| Error::io(format!("listening on {listen} (listen)"), e))?;
    let (admin, admin_ino) = within(&background, || http::bind_admin(&config.admin_socket)).map_err(|e| {
        Error::io(format!("listening on the admin socket {} (adminSocket)", config.admin_socket.display()), e)
    })?;

    let mut metrics = Metrics::new();
    let mut vrrp = Vrrp::new(Router::new(plan.locals.clone(), VrrpMetrics::register(&mut metrics.registry)));
    let route_metrics = RouteMetrics::register(&mut metrics.registry);
    let index = |name: &str| uplinks.get(name).map(|u| u.interface.index);
    vrrp.sockets = vrrp.open_missing(&plan, index).map_err(|((interface, family), expected)| {
        config_error(&node_address_field(&config, &node, &interface, family), expected)
    })?;

    let names: Vec<&str> = uplinks.by_name.keys().map(String::as_str).collect();
    let (mut dataplane, counters, service_maps) =
        Dataplane::load(&names, config.xdp_mode, &config.dataplane.pin_path, &config.dataplane)?;
    for uplink in uplinks.by_name.values() {
        attach(&mut dataplane, &metrics.xdp_attached, &uplink.interface)?;
    }
    dataplane.detach_strays()?;
    write_uplink_map(&mut uplinks, &mut dataplane)?;
    let counters = Arc::new(Mutex::new(counters));
    // The first sync completes before anything is announced ready; later ones run beside VRRP.
    let config = Arc::new(config);
    let vip_uplinks = uplinks.vip_slots(&config, &plan);
    let request = SyncRequest {
        config: config.clone(),
        node: node.clone(),
        node_address,
        vip_uplinks: vip_uplinks.clone(),
        generation: 0,
    };
    let sync_metrics = SyncMetrics {
        syncs: metrics.service_syncs.clone(),
        errors: metrics.errors.clone(),
        seconds: metrics.service_sync_seconds.clone(),
        services: metrics.services.clone(),
        backends: metrics.backends.clone(),
        refused: metrics.services_refused.clone(),
        map_bytes: metrics.map_bytes.clone(),
        snat_ports: metrics.snat_ports.clone(),
        snat_expired: metrics.snat_expired.clone(),
    };
    let mut sync =
        ServiceSync::new(service_maps, netlink.clone(), counters.clone(), sync_metrics, refused_tx);
    // No VIP before its services: VRRP starts only once the maps hold them.
    sync.apply(&request).await?;
    let services_applied = sync.applied();
    let (services, requests) = watch::channel(request);
    let sync_task = within(&background, || sync.spawn(requests));
    metrics.register_xdp(counters.clone());
    let (status_requests_tx, status_requests) = mpsc::channel(8);
    let default_mode = dataplane.uplinks().get(&config.interface).map_or("none", |a| a.mode.as_str());
    let status = StatusSource {
        node: node.clone(),
        interface: config.interface.clone(),
        xdp_mode: default_mode,
        requests: status_requests_tx,
        counters: counters.clone(),
    };
    let state = Arc::new(HttpState { metrics, ready: Default::default(), status });

    let carrier = within(&background, netdev::watch_carrier)?;
    let vip_addresses = within(&background, || VipAddresses::spawn(netlink.clone()));
    let routes = within(&background, || Routes::spawn(config.routes.clone(), netlink.clone(), route_metrics));
    let mut agent = Agent {
        current: Current { config_path, config, node, plan: Arc::new(plan), overrides, node_address, keys },
        netlink,
        uplinks,
        dataplane,
        counters,
        state: state.clone(),
        vrrp: Some(vrrp),
        ownership: Applied {
            announced: BTreeSet::new(),
            applied_epoch: None,
            leases_epoch: None,
            lease_log: crate::logging::LogBudget::new(16, 1),
            vip_uplinks,
            impersonations_seen: BTreeMap::new(),
        },
        announcing: Announcing { announcer: within(&background, Announcer::spawn), refresh: BTreeMap::new() },
        routes,
        stopping: false,
        vip_addresses,
        service_sync: ServiceSyncLink { requests: services, applied: services_applied, pending: None },
        cluster,
        inputs: Inputs { status_requests, carrier },
    };
    // Impersonations counted before this agent started (the map is pinned) are not news.
    for seen in agent.dataplane.impersonations() {
        agent.ownership.impersonations_seen.insert(seen.source, (seen.adverts, None, seen.adverts));
    }
    // A crashed earlier run may have left VIP addresses behind: start from none, and have
    // them gone before VRRP starts and readiness is reported (the kernel would answer ARP for
    // a VIP another node owns).
    agent.apply_ownership().await;
    agent.prune_vip_counters();
    agent.vip_addresses.flush(Duration::from_secs(2)).await;
    agent.log_plan();
    agent.reconfigure_vrrp();
    if let Some(vrrp) = &mut agent.vrrp {
        let out = vrrp.router.start(Instant::now().into_std());
        vrrp.send(&out);
    }
    agent.apply_ownership().await;

    let server = background.spawn(http::serve(listener, state.clone()));
    let admin_server = background.spawn(http::serve_admin(admin, state.clone()));
    state.ready.store(true, Ordering::Relaxed);
    info!(config = %agent.current.config_path.display(), node = %agent.current.node, listen = %agent.current.config.listen, "lb-agent running");

    let result = agent.event_loop(&mut signals).await;
    if let Some(cluster) = agent.cluster.take() {
        cluster.finish().await;
    }
    sync_task.abort();
    state.ready.store(false, Ordering::Relaxed);
    server.abort();
    admin_server.abort();
    http::remove_admin(&agent.current.config.admin_socket, admin_ino);
    agent.ownership.applied_epoch = None;
    agent.vrrp = None;
    agent.stopping = true;
    agent.apply_ownership().await;
    agent.routes.settled(Duration::from_secs(2)).await;
    agent.vip_addresses.flush(Duration::from_secs(2)).await;
    if agent.current.config.dataplane.keep_on_exit {
        agent.dataplane.keep();
    } else {
        agent.dataplane.remove()?;
    }
    result
}

/// Every key file of a group this node is in reads and parses: else its field and the problem.
pub(super) fn check_key_files(config: &Config, node: &str) -> std::result::Result<(), (String, String)> {
    for (g, group) in config.groups.iter().enumerate() {
        let Some(auth) = &group.authentication else { continue };
        if group.nodes.iter().any(|n| n.name == node) {
            key_files::read(&auth.key_file).map_err(|e| {
                (format!("groups[{g}].authentication.keyFile"), format!("a usable key file: {e}"))
            })?;
        }
    }
    Ok(())
}

/// Attaches the data plane to `interface` and says so in `lbagent_xdp_attached`.
pub(super) fn attach(
    dataplane: &mut Dataplane,
    attached: &prometheus_client::metrics::family::Family<
        XdpLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    interface: &crate::netdev::Interface,
) -> Result<()> {
    let mode = dataplane.attach(interface)?.mode.as_str();
    attached.get_or_create(&XdpLabels { interface: interface.name.clone(), mode }).set(1);
    Ok(())
}

/// Gives every uplink the agent has a slot and writes the uplink map from them.
pub(super) fn write_uplink_map(uplinks: &mut Uplinks, dataplane: &mut Dataplane) -> Result<()> {
    let names: Vec<String> = uplinks.by_name.keys().cloned().collect();
    uplinks.slots.assign(names.iter().map(String::as_str));
    dataplane.set_uplinks(&uplinks.entries(), &uplinks.entries6())
}

/// Runs `f` in `runtime`'s context: the tasks it spawns and the sockets it registers live
/// there (see [`run`]).
pub(super) fn within<T>(runtime: &tokio::runtime::Handle, f: impl FnOnce() -> T) -> T {
    let _entered = runtime.enter();
    f()
}

/// The config path of this node's address of `family` on `interface`, e.g.
/// `groups[0].nodes[2].address` (`address6` for IPv6).
pub(super) fn node_address_field(config: &Config, node: &str, interface: &str, family: IpFamily) -> String {
    let field = match family {
        IpFamily::V4 => "address",
        IpFamily::V6 => "address6",
    };
    config
        .groups
        .iter()
        .enumerate()
        .filter(|(_, group)| config.group_interface(group) == interface)
        .find_map(|(g, group)| {
            let n = group.nodes.iter().position(|n| n.name == node)?;
            Some(format!("groups[{g}].nodes[{n}].{field}"))
        })
        .unwrap_or_else(|| format!("groups[].nodes[].{field}"))
}

pub(super) fn node_name(config: &Config, node_override: Option<String>) -> String {
    node_override
        .or_else(|| config.node.clone())
        .or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_default()
}

impl Agent {
    pub(super) fn log_plan(&self) {
        let member =
            self.current.config.groups.iter().any(|g| g.nodes.iter().any(|n| n.name == self.current.node));
        if !self.current.config.groups.is_empty() && !member {
            warn!(node = %self.current.node, "this node is in no group's nodes: it serves no group's VIPs (check `node` or --node)");
        }
        for spec in &self.current.plan.instances {
            info!(group = %spec.group, interface = %spec.interface, instance = %spec.id(), priority = spec.priority, vips = spec.vips.len(), "VRRP instance planned");
        }
        for (group, vip, reason) in &self.current.plan.unplaced {
            warn!(group, %vip, reason, "VIP could not be placed");
        }
    }
}
