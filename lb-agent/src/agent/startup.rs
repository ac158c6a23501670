//! Start-up: validate, attach, sync the services, start VRRP, serve. Everything that can be
//! checked (config, interface, HTTP port, VRRP socket) is checked before XDP is attached, so a
//! bad start leaves the node untouched.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use futures::FutureExt;
use tokio::{
    net::TcpListener,
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    announcer::Announcer,
    config::{Config, ConfigError},
    dataplane::{Dataplane, ServiceMapsByFamily, XdpCounters},
    error::{Error, Result},
    http::{self, HttpState, StatusSource},
    key_files::{self, KeyFiles},
    metrics::{Metrics, XdpLabels},
    netdev,
    node_plan::{NodePlan, node_plan},
    routes::{RouteMetrics, Routes, keeper::Handoff},
    service_sync::{ServiceSync, SyncMetrics, SyncRequest},
    uplinks::{self, Uplinks},
    vip_addresses::VipAddresses,
    vrrp::{family::IpFamily, metrics::VrrpMetrics, router::Router},
    vrrp_driver::Vrrp,
};

use super::{
    Agent, Announcing, Applied, Current, Exit, Inputs, KubernetesSource, Overrides, ServiceSyncLink, Signals,
    Stop, cluster_link::ClusterLink, within,
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
    adopted: Option<Handoff>,
) -> Result<Exit> {
    let mut signals = Signals::install()?;
    let mut config = Config::load(&config_path)?;
    overrides.apply(&mut config);
    let node = node_name(&config, node_override);
    // Services the data plane has no room for, by name, for the cluster's status.
    let (refused_tx, refused_rx) = watch::channel(BTreeMap::new());
    let Some((config, cluster)) =
        source(config, &node, kubernetes, refused_rx, &background, &mut signals).await?
    else {
        return Ok(Exit::Stopped);
    };
    let config_error = |field: &str, expected: String| Error::Config {
        path: config_path.clone(),
        error: ConfigError::new(field, expected),
    };
    let netlink = within(&background, netdev::connect)?;
    let plan = node_plan(&config, &node);
    let keys = read_key_files(&config, &node, &plan, cluster.is_none())
        .map_err(|(f, expected)| config_error(&f, expected))?;
    let mut uplinks = Uplinks::default();
    uplinks.by_name = uplinks::resolve(&netlink, &config, &plan, &BTreeSet::new())
        .await?
        .map_err(|e| config_error(&e.field, e.expected))?;
    let node_address = uplinks.by_name[&config.interface].node_address;
    let (listener, admin, admin_ino) = listen(&config, &background).await?;
    let mut metrics = Metrics::new();
    let mut vrrp = Vrrp::new(Router::new(plan.locals.clone(), VrrpMetrics::register(&mut metrics.registry)));
    let index = |name: &str| uplinks.get(name).map(Uplinks::vrrp_link);
    vrrp.sockets = vrrp.open_missing(&plan, index).map_err(|((interface, family), expected)| {
        config_error(&node_address_field(&config, &node, &interface, family), expected)
    })?;
    let route_metrics = RouteMetrics::register(&mut metrics.registry);
    let (dataplane, counters, service_maps) = load_dataplane(&config, &plan, &mut uplinks, &metrics)?;
    let config = Arc::new(config);
    let vip_uplinks = uplinks.vip_slots(&config, &plan);
    let sync =
        ServiceSync::new(service_maps, netlink.clone(), counters.clone(), sync_metrics(&metrics), refused_tx);
    let request = SyncRequest::first(config.clone(), node.clone(), node_address, vip_uplinks.clone());
    let (service_sync, sync_task) = first_sync(sync, request, &background).await?;
    metrics.register_xdp(counters.clone());
    let (state, status_requests) = http_state(metrics, &node, &config, &dataplane, &counters);
    let mut agent = Agent {
        // Spawned first: they borrow the config and netlink handle the agent then takes.
        routes: within(&background, || {
            Routes::spawn(config.routes.clone(), netlink.clone(), route_metrics, adopted)
        }),
        vip_addresses: within(&background, || VipAddresses::spawn(netlink.clone())),
        current: Current { config_path, config, node, plan: Arc::new(plan), overrides, node_address, keys },
        netlink,
        uplinks,
        dataplane,
        counters,
        state: state.clone(),
        vrrp: Some(vrrp),
        ownership: Applied::new(vip_uplinks),
        announcing: Announcing { announcer: within(&background, Announcer::spawn), refresh: BTreeMap::new() },
        stopping: None,
        service_sync,
        cluster,
        inputs: Inputs { status_requests, carrier: within(&background, netdev::watch_carrier)? },
    };
    agent.start().await;
    let serving = Serving::start(listener, admin, admin_ino, sync_task, state, &background);
    info!(config = %agent.current.config_path.display(), node = %agent.current.node, listen = %agent.current.config.listen, "lb-agent running");
    let result = agent.event_loop(&mut signals).await;
    if let Some(cluster) = agent.cluster.take() {
        cluster.finish().await;
    }
    serving.end(&agent.current.config.admin_socket);
    let exit = agent.release().await?;
    result.map(|()| exit)
}

/// The config to start with: the file's, or with `--kubernetes` the cluster's first, once its
/// side runs (`None`: a stop signal came first, and nothing was attached).
async fn source(
    config: Config,
    node: &str,
    kubernetes: Option<KubernetesSource>,
    refused: watch::Receiver<BTreeMap<String, String>>,
    background: &tokio::runtime::Handle,
    signals: &mut Signals,
) -> Result<Option<(Config, Option<ClusterLink>)>> {
    let Some(source) = kubernetes else { return Ok(Some((config, None))) };
    let connected = ClusterLink::connect(source, &config, node, refused, background, signals).await?;
    Ok(connected.map(|(link, first)| (first, Some(link))))
}

/// The HTTP side and the service-sync task while the agent runs.
struct Serving {
    state: Arc<HttpState>,
    tasks: [tokio::task::JoinHandle<()>; 3],
    admin_ino: u64,
}

impl Serving {
    /// Serves metrics and the admin socket, and reports ready.
    fn start(
        listener: TcpListener,
        admin: tokio::net::UnixListener,
        admin_ino: u64,
        sync_task: tokio::task::JoinHandle<()>,
        state: Arc<HttpState>,
        background: &tokio::runtime::Handle,
    ) -> Self {
        let server = background.spawn(http::serve(listener, state.clone()).map(|_| ()));
        let admin_server = background.spawn(http::serve_admin(admin, state.clone()).map(|_| ()));
        state.ready.store(true, Ordering::Relaxed);
        Serving { state, tasks: [sync_task, server, admin_server], admin_ino }
    }

    /// Stops serving and syncing: not ready, the admin socket removed.
    fn end(self, admin_socket: &std::path::Path) {
        for task in &self.tasks {
            task.abort();
        }
        self.state.ready.store(false, Ordering::Relaxed);
        http::remove_admin(admin_socket, self.admin_ino);
    }
}

/// The key files of the plan's authenticating groups, read. A key file named in the config
/// file is part of it: a mistake stops the start (`standalone`). From the cluster, the group
/// waits for its Secret on this node instead (see key_files).
fn read_key_files(
    config: &Config,
    node: &str,
    plan: &NodePlan,
    standalone: bool,
) -> std::result::Result<KeyFiles, (String, String)> {
    if standalone {
        check_key_files(config, node)?;
    }
    let mut keys = KeyFiles::default();
    keys.refresh(plan.key_files.values());
    Ok(keys)
}

/// The first sync of the services, before anything is announced ready (no VIP before its
/// services: VRRP starts only once the maps hold them); later ones run in the task it returns,
/// beside VRRP.
async fn first_sync(
    mut sync: ServiceSync,
    request: SyncRequest,
    background: &tokio::runtime::Handle,
) -> Result<(ServiceSyncLink, tokio::task::JoinHandle<()>)> {
    sync.apply(&request).await?;
    let applied = sync.applied();
    let (requests, receiver) = watch::channel(request);
    let task = within(background, || sync.spawn(receiver));
    Ok((ServiceSyncLink { requests, applied, pending: None, tidy_pending: false }, task))
}

/// The metrics listener (`listen`) and the admin socket (`adminSocket`), bound on `background`.
async fn listen(
    config: &Config,
    background: &tokio::runtime::Handle,
) -> Result<(TcpListener, tokio::net::UnixListener, u64)> {
    let listen = config.listen;
    let listener = background
        .spawn(TcpListener::bind(listen))
        .await
        .map_err(std::io::Error::other)
        .flatten()
        .map_err(|e| Error::io(format!("listening on {listen} (listen)"), e))?;
    let (admin, admin_ino) = within(background, || http::bind_admin(&config.admin_socket)).map_err(|e| {
        Error::io(format!("listening on the admin socket {} (adminSocket)", config.admin_socket.display()), e)
    })?;
    Ok((listener, admin, admin_ino))
}

/// The data plane loaded (pins adopted), attached to every uplink, strays detached and the
/// uplink map written.
fn load_dataplane(
    config: &Config,
    plan: &NodePlan,
    uplinks: &mut Uplinks,
    metrics: &Metrics,
) -> Result<(Dataplane, Arc<Mutex<XdpCounters>>, ServiceMapsByFamily)> {
    let devices = uplinks.devices();
    let names: Vec<&str> = devices.iter().map(String::as_str).collect();
    let (mut dataplane, counters, service_maps) =
        Dataplane::load(&names, config.xdp_mode, &config.dataplane.pin_path, &config.dataplane)?;
    for uplink in uplinks.by_name.values() {
        attach(&mut dataplane, &metrics.xdp_attached, &uplink.interface)?;
    }
    dataplane.detach_strays()?;
    dataplane.convert_earlier_flows();
    let migrating = dataplane.migrating_flow_tables();
    if !migrating.is_empty() {
        tokio::spawn(crate::dataplane::flow_tables::end_migrations(
            migrating,
            crate::dataplane::flow_tables::MIGRATION_WINDOW,
        ));
    }
    write_uplink_map(uplinks, &mut dataplane, plan)?;
    Ok((dataplane, Arc::new(Mutex::new(counters)), service_maps))
}

/// What the HTTP side serves (metrics, readiness, `/status`), and the loop's end of the
/// status requests.
fn http_state(
    metrics: Metrics,
    node: &str,
    config: &Config,
    dataplane: &Dataplane,
    counters: &Arc<Mutex<XdpCounters>>,
) -> (Arc<HttpState>, mpsc::Receiver<tokio::sync::oneshot::Sender<super::LoopSnapshot>>) {
    let (requests, status_requests) = mpsc::channel(8);
    let default_mode = dataplane.uplinks().get(&config.interface).map_or("none", |a| a.mode.as_str());
    let status = StatusSource {
        node: node.to_owned(),
        interface: config.interface.clone(),
        xdp_mode: default_mode,
        requests,
        counters: counters.clone(),
    };
    (Arc::new(HttpState { metrics, ready: Default::default(), status }), status_requests)
}

/// The service-sync task's share of the agent's metrics.
fn sync_metrics(metrics: &Metrics) -> SyncMetrics {
    SyncMetrics {
        syncs: metrics.service_syncs.clone(),
        errors: metrics.errors.clone(),
        seconds: metrics.service_sync_seconds.clone(),
        services: metrics.services.clone(),
        backends: metrics.backends.clone(),
        refused: metrics.services_refused.clone(),
        with_reply_entries: metrics.services_with_reply_entries.clone(),
        map_bytes: metrics.map_bytes.clone(),
        snat_ports: metrics.snat_ports.clone(),
        snat_expired: metrics.snat_expired.clone(),
    }
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

/// Attaches the data plane to `interface` and says so in `lbagent_xdp_attached`; true when it
/// was not attached there yet (an interface already attached, a VLAN's parent for another of
/// its uplinks, keeps its programs).
pub(super) fn attach(
    dataplane: &mut Dataplane,
    attached: &prometheus_client::metrics::family::Family<
        XdpLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    interface: &crate::netdev::Interface,
) -> Result<bool> {
    if dataplane.uplinks().contains_key(&interface.name) {
        return Ok(false);
    }
    let mode = dataplane.attach(interface)?.mode.as_str();
    attached.get_or_create(&XdpLabels { interface: interface.name.clone(), mode }).set(1);
    Ok(true)
}

/// Gives every uplink the agent has a slot and writes the uplink map from them.
pub(super) fn write_uplink_map(
    uplinks: &mut Uplinks,
    dataplane: &mut Dataplane,
    plan: &NodePlan,
) -> Result<()> {
    let names: Vec<String> = uplinks.by_name.keys().cloned().collect();
    uplinks.slots.assign(names.iter().map(String::as_str));
    dataplane.set_uplinks(&uplinks.entries(), &uplinks.entries6(), &uplinks.own_vrrp6(plan))
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
    /// From nothing owned to VRRP running: leftovers of a crashed run cleared first.
    async fn start(&mut self) {
        // Impersonations counted before this agent started (the map is pinned) are not news.
        for seen in self.dataplane.impersonations() {
            self.ownership.impersonations_seen.insert(seen.source, (seen.adverts, None, seen.adverts));
        }
        // A crashed earlier run may have left VIP addresses behind: start from none, and have
        // them gone before VRRP starts and readiness is reported (the kernel would answer ARP
        // for a VIP another node owns).
        self.apply_ownership().await;
        self.prune_vip_counters();
        self.vip_addresses.flush(Duration::from_secs(2)).await;
        self.log_plan();
        self.reconfigure_vrrp();
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.start(Instant::now().into_std());
            vrrp.send(&out);
        }
        self.apply_ownership().await;
    }

    /// After the loop: nothing owned through VRRP any more, VIP addresses gone, and the data
    /// plane kept pinned (`dataplane.keepOnExit`) or removed. A graceful stop leaves nothing
    /// routed; a restart in place keeps the routes and the data plane for the next image, and a
    /// replacement for the next agent on the node.
    async fn release(mut self) -> Result<Exit> {
        self.ownership.applied_epoch = None;
        self.vrrp = None;
        let stop = *self.stopping.get_or_insert(Stop::Graceful);
        self.apply_ownership().await;
        self.routes.settled(Duration::from_secs(2)).await;
        self.vip_addresses.flush(Duration::from_secs(2)).await;
        match stop {
            Stop::Restart => {
                let handoff = self.routes.hand_over().await;
                self.dataplane.keep();
                return Ok(Exit::Restart(handoff));
            }
            // The next agent serves what the fabric still routes here from the pinned data plane.
            Stop::Replaced => {
                self.routes.leave().await;
                self.dataplane.keep();
                return Ok(Exit::Stopped);
            }
            Stop::Graceful => {}
        }
        if self.current.config.dataplane.keep_on_exit {
            self.dataplane.keep();
            Ok(Exit::Stopped)
        } else {
            self.dataplane.remove().map(|()| Exit::Stopped)
        }
    }

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
