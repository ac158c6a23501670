//! `lb-agent run`: validate, attach, run VRRP, apply ownership, serve, and react to signals.
//!
//! Order matters for the operator: everything that can be checked (config, interface, HTTP
//! port, VRRP socket) is checked before XDP is attached, so a bad start leaves the node
//! untouched. One task runs the VRRP router and applies its ownership changes directly, so a
//! failover costs no more than a map update after the timer fires.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use tokio::{
    net::TcpListener,
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::{debug, error, info, warn};

use crate::{
    announcer::{Announcement, Announcer},
    config::{Config, ConfigError},
    dataplane::{Dataplane, XdpCounters, leases},
    error::{Error, Result},
    http::{self, HttpState, InstanceSnapshot, LoopSnapshot, StatusSource},
    k8s::controller::{ForeignRouters, FromAgent, Impersonations},
    key_files::{self, KeyFiles},
    metrics::{GroupLabels, MemberLabels, Metrics, ResultLabels, VridLabels, XdpLabels},
    netdev,
    node_plan::{NodePlan, node_plan},
    ownership::{self, UplinkView, Wanted},
    routes::{self, RouteMetrics, Routes},
    service_sync::{ServiceSync, SyncMetrics, SyncRequest},
    uplinks::{self, Uplinks},
    vip_addresses::{ByInterface, VipAddresses},
    vrrp::{
        family::Family,
        metrics::VrrpMetrics,
        router::{InstanceSpec, Router},
    },
    vrrp_driver::{self, Vrrp, drop_off_loop},
};

/// After a datagram, the next ones are read this much later, all at once: a group of many
/// instances at 10 ms puts thousands of advertisements a second on the segment, and a
/// wake-up for each cost more than the VRRP work (8 nodes × 56 instances: 6–7 % of a core
/// an agent against 5 % with the tick, in `cargo xtask bench vrrp-load`). Timers are never delayed
/// (their branch reads what queued first), so only the reaction to a datagram can come this
/// late: a backup's Master_Down_Timer restarts at most this much after the advertisement
/// that restarts it, and a quiet segment (one advertisement per interval) sees no delay.
const RECEIVE_TICK: Duration = Duration::from_millis(2);

/// How long a stopping agent waits for its VRRP handovers before leaving anyway.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// `--kubernetes`: where the leader Lease lives.
pub struct KubernetesSource {
    pub namespace: String,
}

/// Settings from the command line, which outrank the config file's.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--pin-path`: several agents on one host, as in the lab.
    pub pin_path: Option<PathBuf>,
    /// `--admin-socket`.
    pub admin_socket: Option<PathBuf>,
}

impl Overrides {
    fn apply(&self, config: &mut Config) {
        if let Some(pin_path) = &self.pin_path {
            config.dataplane.pin_path = pin_path.clone();
        }
        if let Some(socket) = &self.admin_socket {
            config.admin_socket = socket.clone();
        }
    }
}

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
    let (mut cluster_configs, mut owners, mut foreign, mut impersonated) = (None, None, None, None);
    // Services the data plane has no room for, by name, for the cluster's status.
    let (refused_tx, refused_rx) = watch::channel(BTreeMap::new());
    if let Some(source) = kubernetes {
        // The client's buffer task runs where it is made.
        let client = background
            .spawn(kube::Client::try_default())
            .await
            .map_err(|e| Error::io("starting the Kubernetes client", std::io::Error::other(e)))?
            .map_err(Error::Kube)?;
        let (configs_tx, mut configs_rx) = mpsc::channel(4);
        let (owners_tx, owners_rx) = watch::channel(BTreeMap::new());
        let (foreign_tx, foreign_rx) = watch::channel(ForeignRouters::new());
        let (impersonated_tx, impersonated_rx) = watch::channel(Impersonations::new());
        let mut base = config.clone();
        base.node = Some(node.clone());
        let shell = crate::k8s::controller::Shell {
            client,
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
        background.spawn(shell.run(configs_tx, from_agent));
        info!("waiting for the cluster's groups and services");
        config = tokio::select! {
            first = configs_rx.recv() => {
                first.ok_or_else(|| Error::io("watching the cluster", std::io::Error::other("the watch ended")))?
            }
            () = stop_signal(&mut signals.term, &mut signals.int) => {
                info!("stopped before the cluster's first config: nothing was attached");
                return Ok(());
            }
        };
        (cluster_configs, owners, foreign, impersonated) =
            (Some(configs_rx), Some(owners_tx), Some(foreign_tx), Some(impersonated_tx));
    }
    let netlink = within(&background, netdev::connect)?;
    let config_error = |field: &str, expected: String| Error::Config {
        path: config_path.clone(),
        error: ConfigError::new(field, expected),
    };
    let plan = node_plan(&config, &node);
    if cluster_configs.is_none() {
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
        config_path,
        config,
        node,
        plan: Arc::new(plan),
        netlink,
        carrier,
        uplinks,
        dataplane,
        counters,
        state: state.clone(),
        vrrp: Some(vrrp),
        announced: BTreeSet::new(),
        announcer: within(&background, Announcer::spawn),
        routes,
        stopping: false,
        garp_refresh: BTreeMap::new(),
        vip_addresses,
        applied_epoch: None,
        leases_epoch: None,
        lease_log: crate::logging::LogBudget::new(16, 1),
        node_address,
        vip_uplinks,
        services,
        services_applied,
        pending: None,
        overrides,
        cluster_configs,
        owners,
        foreign,
        impersonated,
        impersonations_seen: BTreeMap::new(),
        keys,
        status_requests,
    };
    // Impersonations counted before this agent started (the map is pinned) are not news.
    for seen in agent.dataplane.impersonations() {
        agent.impersonations_seen.insert(seen.source, (seen.adverts, None, seen.adverts));
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
    info!(config = %agent.config_path.display(), node = %agent.node, listen = %agent.config.listen, "lb-agent running");

    let result = agent.event_loop(&mut signals).await;
    sync_task.abort();
    state.ready.store(false, Ordering::Relaxed);
    server.abort();
    admin_server.abort();
    http::remove_admin(&agent.config.admin_socket, admin_ino);
    agent.applied_epoch = None;
    agent.vrrp = None;
    agent.stopping = true;
    agent.apply_ownership().await;
    agent.routes.settled(Duration::from_secs(2)).await;
    agent.vip_addresses.flush(Duration::from_secs(2)).await;
    if agent.config.dataplane.keep_on_exit {
        agent.dataplane.keep();
    } else {
        agent.dataplane.remove()?;
    }
    result
}

/// Every key file of a group this node is in reads and parses: else its field and the problem.
fn check_key_files(config: &Config, node: &str) -> std::result::Result<(), (String, String)> {
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
fn attach(
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
fn write_uplink_map(uplinks: &mut Uplinks, dataplane: &mut Dataplane) -> Result<()> {
    let names: Vec<String> = uplinks.by_name.keys().cloned().collect();
    uplinks.slots.assign(names.iter().map(String::as_str));
    dataplane.set_uplinks(&uplinks.entries(), &uplinks.entries6())
}

/// Runs `f` in `runtime`'s context: the tasks it spawns and the sockets it registers live
/// there (see [`run`]).
fn within<T>(runtime: &tokio::runtime::Handle, f: impl FnOnce() -> T) -> T {
    let _entered = runtime.enter();
    f()
}

/// The config path of this node's address of `family` on `interface`, e.g.
/// `groups[0].nodes[2].address` (`address6` for IPv6).
fn node_address_field(config: &Config, node: &str, interface: &str, family: Family) -> String {
    let field = match family {
        Family::V4 => "address",
        Family::V6 => "address6",
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

fn node_name(config: &Config, node_override: Option<String>) -> String {
    node_override
        .or_else(|| config.node.clone())
        .or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_default()
}

struct Agent {
    config_path: PathBuf,
    /// Shared with the sync task: a large config is never copied.
    config: Arc<Config>,
    node: String,
    /// Shared with the pending config's, when that config changed no group.
    plan: Arc<NodePlan>,
    netlink: rtnetlink::Handle,
    /// Every interface VIPs are served on, the default uplink first among equals.
    uplinks: Uplinks,
    dataplane: Dataplane,
    counters: Arc<Mutex<XdpCounters>>,
    state: Arc<HttpState>,
    /// `None` once stopping: nothing is claimed through VRRP any more.
    vrrp: Option<Vrrp>,
    /// VRRP VIPs owned at the last apply: the ones new since then get gratuitous ARPs.
    announced: BTreeSet<IpAddr>,
    /// Sends the gratuitous ARPs and NAs, paced.
    announcer: Announcer,
    /// Holds the routed VIPs' kernel routes, for the node's FRR.
    routes: Routes,
    /// A graceful stop began: routes are withdrawn while the rest keeps serving.
    stopping: bool,
    /// Owned VIPs by `garp.refresh` period, and when they are next announced again.
    garp_refresh: BTreeMap<Duration, (Instant, Vec<IpAddr>)>,
    /// Keeps the VIP addresses on the uplinks (modes `netlink`, `both`) without the loop
    /// waiting on netlink.
    vip_addresses: VipAddresses,
    /// The router's ownership epoch last applied; `None` forces a full apply.
    applied_epoch: Option<u64>,
    /// The ownership epoch whose leases were last written whole; `None` forces that.
    leases_epoch: Option<Option<u64>>,
    /// Lapsed-lease warnings: a loaded host may lapse often (each is counted).
    lease_log: crate::logging::LogBudget,
    /// The source of full-NAT and IPIP traffic leaving by the default uplink (the others'
    /// are in the uplink map).
    node_address: Ipv4Addr,
    /// The uplink slot of each VIP, as the service maps were last told.
    vip_uplinks: Arc<std::collections::HashMap<IpAddr, u8>>,
    /// Hands each accepted config to the service-sync task.
    services: watch::Sender<SyncRequest>,
    /// The generation of the last config whose services the sync task has applied.
    services_applied: watch::Receiver<u64>,
    /// An accepted config waiting for its services to reach the maps before VRRP and the
    /// owned VIPs follow it, so a VIP is never taken before its services: (generation,
    /// config, plan).
    pending: Option<(u64, Arc<Config>, Arc<NodePlan>)>,
    /// The command line's settings, which outrank the config file's on every load.
    overrides: Overrides,
    /// With `--kubernetes`: configs built from the cluster.
    cluster_configs: Option<mpsc::Receiver<Config>>,
    /// With `--kubernetes`: who this node sees as Master of each VIP, for group status.
    owners: Option<watch::Sender<BTreeMap<IpAddr, String>>>,
    /// With `--kubernetes`: routers outside a group heard on its VRIDs, for Events.
    foreign: Option<watch::Sender<ForeignRouters>>,
    /// With `--kubernetes`: members impersonated on the segment, for Events.
    impersonated: Option<watch::Sender<Impersonations>>,
    /// Per member: the impersonating advertisements counted so far, when last logged, and the
    /// count then.
    impersonations_seen: BTreeMap<IpAddr, (u64, Option<Instant>, u64)>,
    /// The key files of the plan's authenticating groups, re-read every second.
    keys: KeyFiles,
    /// `/status` asking for the VRRP instances, answered between events.
    status_requests: mpsc::Receiver<tokio::sync::oneshot::Sender<LoopSnapshot>>,
    /// The interfaces' carrier changes: (ifindex, link up).
    carrier: mpsc::UnboundedReceiver<(u32, bool)>,
}

impl Agent {
    async fn event_loop(&mut self, signals: &mut Signals) -> Result<()> {
        let mut buf = vec![0u8; 65_536];
        // Which VRRP socket is read first next time (see `VrrpSocket::recv_any`).
        let mut turn = 0;
        let mut stop_by: Option<Instant> = None;
        // After a graceful stop withdrew routes: serve until then.
        let mut drain_until: Option<Instant> = None;
        // While set, datagrams wait in their sockets until then (see RECEIVE_TICK).
        let mut receive_from: Option<Instant> = None;
        // XDP counts impersonating advertisements; they are read, reported and logged this
        // often, and key files re-read.
        let mut once_a_second = tokio::time::interval(Duration::from_secs(1));
        // The routes' keeper withdraws them when this loop goes unheard (see `routes::keeper`);
        // beats go from here, the loop that decides, not from a task that might outlive it.
        let mut heartbeat = tokio::time::interval(self.config.routes.hold_time / 3);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(deadline) = stop_by {
                let handing_over = self.vrrp.as_ref().is_some_and(|v| v.router.handing_over());
                let draining = drain_until.is_some_and(|until| Instant::now() < until);
                if !(handing_over || draining) || Instant::now() >= deadline {
                    if draining {
                        info!("drained: stopping");
                    }
                    return Ok(());
                }
            }
            if let Some(vrrp) = &mut self.vrrp {
                vrrp.router.idle(Instant::now().into_std());
            }
            let vrrp_deadline =
                self.vrrp.as_ref().and_then(|v| v.router.next_deadline()).map(Instant::from_std);
            let garp_refresh = self.garp_refresh.values().map(|(at, _)| *at);
            let deadline =
                vrrp_deadline.into_iter().chain(garp_refresh).chain(receive_from).chain(drain_until).min();
            // Busy sockets are read on a tick: until it, this thread sleeps outside epoll, where
            // every advertisement that arrives would wake it. Nothing else shares the thread
            // (see `run`), and the sleep ends at the next deadline.
            if receive_from.is_some()
                && let Some(wait) = deadline.and_then(|d| d.checked_duration_since(Instant::now()))
            {
                std::thread::sleep(wait);
            }
            tokio::select! {
                // The VRRP timer first: after a freeze, every branch is ready at once, and the
                // lapse of this master's lease must be seen as such (the loop was waiting when
                // it ran out), not after other work has made the loop look merely busy.
                biased;
                _ = or_pending(deadline.map(tokio::time::sleep_until)) => {
                    // Advertisements that queued up while this loop was busy may reset the
                    // timer that just fired: read them first, so a slow moment here never
                    // passes for a silent master.
                    let received = self.drain_vrrp(&mut buf);
                    receive_from = received.then(|| Instant::now() + RECEIVE_TICK);
                    if let Some(vrrp) = &mut self.vrrp {
                        let out = vrrp.router.on_timer(Instant::now().into_std());
                        vrrp.send(&out);
                    }
                    self.apply_ownership().await;
                    self.refresh_garps(Instant::now());
                }
                _ = stop_signal(&mut signals.term, &mut signals.int), if stop_by.is_none() => {
                    drain_until = self.begin_stop().await;
                    stop_by = Some(drain_until.unwrap_or_else(Instant::now).max(Instant::now()) + STOP_BOUND);
                }
                Some(config) = or_pending(self.cluster_configs.as_mut().map(|rx| rx.recv())), if stop_by.is_none() => {
                    self.apply_config(config).await;
                }
                Ok(()) = self.services_applied.changed(), if self.pending.is_some() => {
                    let applied = *self.services_applied.borrow_and_update();
                    if self.pending.as_ref().is_some_and(|(generation, _, _)| applied >= *generation) {
                        let (_, config, plan) = self.pending.take().expect("checked above");
                        self.commit_config(config, plan).await;
                    }
                }
                Some((ifindex, up)) = self.carrier.recv() => self.on_carrier(ifindex, up),
                _ = heartbeat.tick() => self.routes.alive(),
                _ = once_a_second.tick() => {
                    self.check_impersonations();
                    if self.keys.refresh(self.plan.key_files.values()) {
                        self.reconfigure_vrrp();
                    }
                }
                Some(reply) = self.status_requests.recv() => {
                    let _ = reply.send(LoopSnapshot {
                        instances: self.instance_snapshot(),
                        uplinks: self.uplink_snapshot(),
                        routed: self.routed_snapshot(),
                    });
                }
                _ = signals.hup.recv() => {
                    let started = Instant::now();
                    self.reload().await;
                    debug!(elapsed = ?started.elapsed(), "SIGHUP handled");
                }
                ((interface, family), received) = or_pending(vrrp_driver::receive(&self.vrrp, &mut turn, &mut buf)), if receive_from.is_none() => {
                    match received {
                        Ok(arrived) => {
                            let vrrp = self.vrrp.as_mut().expect("recv only completes with VRRP running");
                            let datagram = arrived.datagram(&buf);
                            let out = vrrp.router.on_datagram(Instant::now().into_std(), &interface, datagram);
                            vrrp.send(&out);
                            receive_from = Some(Instant::now() + RECEIVE_TICK);
                            self.apply_ownership().await;
                        }
                        Err(e) => warn!(%interface, %family, error = %e, "receiving VRRP failed"),
                    }
                }
            }
        }
    }

    /// Handles the datagrams already waiting on the VRRP sockets, without waiting for more;
    /// true when there were any.
    fn drain_vrrp(&mut self, buf: &mut [u8]) -> bool {
        self.vrrp.as_mut().is_some_and(|vrrp| vrrp.drain(buf))
    }

    /// SIGTERM/SIGINT: masters resign and hand over, routed VIPs are withdrawn; the loop ends
    /// when the handovers are done and, if routes were held, the drain is over (until then
    /// this node serves the flows the fabric still sends it). Returns the drain's end.
    async fn begin_stop(&mut self) -> Option<Instant> {
        let routed = !self.routes.held().is_empty();
        info!(routed, "stopping: resigning VRRP masters, withdrawing routed VIPs");
        self.state.ready.store(false, Ordering::Relaxed);
        self.stopping = true;
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.shutdown(Instant::now().into_std());
            vrrp.send(&out);
        }
        self.applied_epoch = None;
        self.apply_ownership().await;
        routed.then(|| Instant::now() + self.config.routes.drain)
    }

    /// SIGHUP. A config that fails to validate leaves everything running as it was.
    async fn reload(&mut self) {
        if self.cluster_configs.is_some() {
            warn!(
                "SIGHUP ignored: with --kubernetes the cluster is the source of groups and services; restart to change agent settings"
            );
            return;
        }
        let new = match Config::load(&self.config_path) {
            Ok(mut new) => {
                self.overrides.apply(&mut new);
                new
            }
            Err(e) => {
                error!(error = %e, "SIGHUP: config rejected, keeping the running config");
                self.count_reload("rejected");
                return;
            }
        };
        if let Err((field, expected)) = check_key_files(&new, &self.node) {
            let error = ConfigError::new(field, expected);
            error!(%error, "SIGHUP: config rejected, keeping the running config");
            self.count_reload("rejected");
            return;
        }
        self.apply_config(new).await;
    }

    fn count_reload(&self, result: &'static str) {
        self.state.metrics.config_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// A new config, from the file (SIGHUP) or the cluster: applied by difference, or
    /// rejected whole with the running one kept.
    async fn apply_config(&mut self, new: Config) {
        // An endpoint change (most cluster events) leaves groups and VIPs as they were: their
        // plan is kept, and nothing VRRP runs is touched.
        let (latest, latest_plan) =
            self.pending.as_ref().map_or((&self.config, &self.plan), |(_, config, plan)| (config, plan));
        let plan_kept = new.groups == latest.groups && new.vips == latest.vips;
        let new_plan = if plan_kept { latest_plan.clone() } else { Arc::new(node_plan(&new, &self.node)) };
        let restart_needed = [
            ("interface", new.interface != self.config.interface),
            ("xdpMode", new.xdp_mode != self.config.xdp_mode),
            ("listen", new.listen != self.config.listen),
            ("adminSocket", new.admin_socket != self.config.admin_socket),
            ("node", new.node != self.config.node),
            ("nodeAddress", new.node_address != self.config.node_address),
            ("dataplane.pinPath", new.dataplane.pin_path != self.config.dataplane.pin_path),
            ("dataplane.capacity", new.dataplane.capacity != self.config.dataplane.capacity),
            ("routes.device", new.routes.device != self.config.routes.device),
            ("routes.protocol", new.routes.protocol != self.config.routes.protocol),
            ("routes.holdTime", new.routes.hold_time != self.config.routes.hold_time),
        ];
        for (field, changed) in restart_needed {
            if changed {
                warn!(field, "this only takes effect on restart; keeping the running value");
            }
        }
        for (interface, address) in &new.node_addresses {
            if self.uplinks.get(interface).is_some_and(|u| u.node_address != *address) {
                warn!(field = %format!("nodeAddresses.{interface}"), "this only takes effect on restart; keeping the running value");
            }
        }
        // New uplinks are attached and their VRRP sockets opened now, so that a config this
        // node cannot serve is refused whole; uplinks it leaves go once it has handed over.
        let slots_before = self.uplinks.slots.clone();
        if let Err(error) = self.add_uplinks(&new, &new_plan).await {
            error!(%error, "config rejected, keeping the running config");
            self.count_reload("rejected");
            return;
        }
        let mut dataplane = new.dataplane.clone();
        dataplane.pin_path = self.config.dataplane.pin_path.clone();
        dataplane.capacity = self.config.dataplane.capacity;
        let routes = crate::config::RoutesConfig { drain: new.routes.drain, ..self.config.routes.clone() };
        let config = Arc::new(Config {
            routes,
            interface: self.config.interface.clone(),
            xdp_mode: self.config.xdp_mode,
            listen: self.config.listen,
            admin_socket: self.config.admin_socket.clone(),
            node: self.config.node.clone(),
            node_address: self.config.node_address,
            dataplane,
            ..new
        });
        let generation = self.services.borrow().generation + 1;
        // An endpoint change (most cluster events) keeps the VIPs and their uplinks: the map
        // of 10,000 VIPs is not rebuilt, and the sync task sees the same one.
        if !plan_kept || self.uplinks.slots != slots_before {
            self.vip_uplinks = self.uplinks.vip_slots(&config, &new_plan);
        }
        self.services.send_replace(SyncRequest {
            config: config.clone(),
            node: self.node.clone(),
            node_address: self.node_address,
            vip_uplinks: self.vip_uplinks.clone(),
            generation,
        });
        self.pending = Some((generation, config, new_plan));
        self.count_reload("applied");
    }

    /// Resolves and attaches the uplinks `plan` adds, opens the VRRP sockets it needs, and
    /// gives the new uplinks slots. On an error nothing is left added.
    async fn add_uplinks(&mut self, config: &Config, plan: &NodePlan) -> std::result::Result<(), String> {
        let known: BTreeSet<String> = self.uplinks.by_name.keys().cloned().collect();
        let found = uplinks::resolve(&self.netlink, config, plan, &known)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let index =
            |name: &str| found.get(name).or_else(|| self.uplinks.get(name)).map(|u| u.interface.index);
        let sockets = match &self.vrrp {
            Some(vrrp) => vrrp.open_missing(plan, index).map_err(|((interface, family), expected)| {
                ConfigError::new(node_address_field(config, &self.node, &interface, family), expected)
                    .to_string()
            })?,
            None => BTreeMap::new(),
        };
        let mut attached = Vec::new();
        for (name, uplink) in &found {
            match attach(&mut self.dataplane, &self.state.metrics.xdp_attached, &uplink.interface) {
                Ok(()) => attached.push(name.clone()),
                Err(e) => {
                    for name in attached {
                        drop_off_loop(self.dataplane.detach(&name));
                    }
                    return Err(format!("attaching XDP to {name}: {}", crate::error::with_causes(&e)));
                }
            }
        }
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.sockets.extend(sockets);
        }
        if found.is_empty() {
            return Ok(());
        }
        self.uplinks.by_name.extend(found);
        if let Err(e) = write_uplink_map(&mut self.uplinks, &mut self.dataplane) {
            error!(error = %e, "writing the uplink map failed");
        }
        Ok(())
    }

    /// Detaches from the uplinks the plan no longer uses, once their VIPs are gone from them.
    fn retire_uplinks(&mut self) {
        let leaving: Vec<String> =
            self.uplinks.by_name.keys().filter(|n| !self.plan.uplinks.contains(*n)).cloned().collect();
        if leaving.is_empty() {
            return;
        }
        for name in &leaving {
            let mode = self.dataplane.mode_of(name);
            self.state.metrics.xdp_attached.remove(&XdpLabels { interface: name.clone(), mode });
            match self.dataplane.detach(name) {
                Ok(links) => drop_off_loop(links),
                Err(e) => error!(interface = %name, error = %e, "detaching XDP failed"),
            }
            self.uplinks.by_name.remove(name);
        }
        info!(interfaces = %leaving.join(", "), "no group uses these uplinks any more: detached");
        if let Err(e) = write_uplink_map(&mut self.uplinks, &mut self.dataplane) {
            error!(error = %e, "writing the uplink map failed");
        }
    }

    /// Brings the VRRP instances to the plan. Each instance's lease-expiry counter starts at
    /// zero, so that its first expiry is an increase Prometheus can see.
    fn reconfigure_vrrp(&mut self) {
        for spec in &self.plan.instances {
            let _ = self.state.metrics.lease_expiries.get_or_create(&VridLabels::of(spec.id()));
            for member in spec.peers.iter().chain(self.plan.locals.values()) {
                let _ = self
                    .state
                    .metrics
                    .impersonations
                    .get_or_create(&MemberLabels { member: member.to_string() });
            }
        }
        self.keys.refresh(self.plan.key_files.values());
        let specs = self.keyed_instances();
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.reconfigure(Instant::now().into_std(), specs);
            vrrp.send(&out);
        }
    }

    /// The plan's instances with their groups' keys; those of a group whose key file was never
    /// readable are left out (their absence is logged by [`KeyFiles`] and exported).
    fn keyed_instances(&self) -> Vec<InstanceSpec> {
        for (group, path) in &self.plan.key_files {
            let loaded = self.keys.keys(path).map_or(0, |k| k.key_ids().len());
            self.state
                .metrics
                .authentication_keys
                .get_or_create(&GroupLabels { group: group.clone() })
                .set(loaded as i64);
        }
        self.plan
            .instances
            .iter()
            .filter_map(|spec| match self.plan.key_files.get(&spec.group) {
                None => Some(spec.clone()),
                Some(path) => Some(InstanceSpec { keys: Some(self.keys.keys(path)?), ..spec.clone() }),
            })
            .collect()
    }

    /// Follows a config whose services are in the maps: VRRP instances and owned VIPs.
    async fn commit_config(&mut self, config: Arc<Config>, plan: Arc<NodePlan>) {
        self.config = config;
        if Arc::ptr_eq(&plan, &self.plan) {
            return;
        }
        let started = Instant::now();
        self.plan = plan;
        self.log_plan();
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.router.set_locals(self.plan.locals.clone());
        }
        self.reconfigure_vrrp();
        let reconfigured = started.elapsed();
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.close_unused_sockets(&self.plan);
        }
        self.applied_epoch = None;
        self.apply_ownership().await;
        self.prune_vip_counters();
        let applied = started.elapsed();
        self.retire_uplinks();
        debug!(?reconfigured, ?applied, retired = ?started.elapsed(), "new plan committed");
    }

    /// Makes the data plane and the uplink's addresses match who owns what now. Cheap when
    /// nothing changed: most events are advertisements that change no ownership (they only
    /// move a lease).
    async fn apply_ownership(&mut self) {
        if let Some(vrrp) = &mut self.vrrp {
            let again: Vec<IpAddr> = vrrp.router.take_reannouncements().into_iter().collect();
            self.announce(again);
        }
        self.renew_leases();
        self.publish_foreign();
        let epoch = self.vrrp.as_ref().map(|v| v.router.ownership_epoch());
        if epoch.is_some() && epoch == self.applied_epoch {
            return;
        }
        self.applied_epoch = epoch;
        self.publish_owners();
        let claims = self.vrrp.as_ref().map(|v| v.router.claims()).unwrap_or_default();
        let uplinks: BTreeMap<String, UplinkView> = self
            .uplinks
            .by_name
            .iter()
            .map(|(name, u)| {
                (name.clone(), UplinkView { mac: u.interface.mac, slot: self.uplinks.slots.for_vips(name) })
            })
            .collect();
        let mut wanted = ownership::wanted(&self.config, &self.plan, &uplinks, &claims);
        if self.stopping {
            wanted = wanted.withdrawn();
        }
        let Wanted { xdp, kernel, listening, vrrp_owned, routes } = wanted;
        let why = if self.stopping { routes::Why::Stopping } else { routes::Why::Changed };
        self.routes.set(routes, why);
        match self.dataplane.set_owned_vips(&xdp) {
            Ok(applied) if !applied.is_empty() => {
                // Counts at info: a transition of a thousand-VIP instance is not a thousand
                // addresses in the log. Which ones, at debug.
                debug!(added = ?applied.added, changed = ?applied.changed, removed = ?applied.removed, "owned VIPs");
                info!(
                    added = applied.added.len(),
                    changed = applied.changed.len(),
                    removed = applied.removed.len(),
                    owned = xdp.len(),
                    "owned VIPs updated"
                );
            }
            Ok(_) => {}
            Err(e) => error!(error = %e, "updating the owned-VIP map failed"),
        }
        self.state.metrics.owned_vips.set(xdp.len() as i64);

        let newly_owned: Vec<IpAddr> = vrrp_owned.difference(&self.announced).copied().collect();
        self.announcer.withdraw(self.announced.difference(&vrrp_owned).copied().collect());
        self.announced = vrrp_owned;
        self.vip_addresses.set(self.with_ifindex(kernel), self.with_ifindex(listening));
        self.announce(newly_owned);
        self.schedule_garp_refresh(Instant::now());
    }

    /// Drops the per-VIP counters of VIPs the config no longer has (after a new plan: it walks
    /// the counter maps, too slow for every ownership change).
    fn prune_vip_counters(&self) {
        let configured: BTreeSet<IpAddr> =
            self.config.vips.iter().map(|v| v.address).chain(self.plan.vips.keys().copied()).collect();
        if let Ok(mut counters) = self.counters.lock()
            && let Err(e) = counters.retain_vips(|vip| configured.contains(vip))
        {
            warn!(error = %e, "pruning per-VIP counters failed");
        }
    }

    /// `by_name` with each uplink's ifindex; uplinks the agent does not have are left out.
    fn with_ifindex<A>(&self, by_name: BTreeMap<String, BTreeSet<A>>) -> ByInterface<A> {
        by_name
            .into_iter()
            .filter_map(|(name, set)| Some((name.clone(), (self.uplinks.get(&name)?.interface.index, set))))
            .collect()
    }

    /// Writes each claimed VRID's lease deadline where it moved (after every advertisement sent
    /// as master), and counts the leases that had run out before they were renewed. All of
    /// them when ownership changed; otherwise only the instances the router names.
    fn renew_leases(&mut self) {
        let (now, now_ns) = (std::time::Instant::now(), leases::monotonic_ns());
        let to_ns = |until| leases::to_monotonic_ns(until, now, now_ns);
        let epoch = self.vrrp.as_ref().map(|v| v.router.ownership_epoch());
        let renewed = self.vrrp.as_mut().map(|v| v.router.take_renewed()).unwrap_or_default();
        let lapsed: Result<Vec<u16>> = if self.leases_epoch != Some(epoch) {
            self.leases_epoch = Some(epoch);
            let deadlines = self.vrrp.as_ref().map(|v| v.router.lease_deadlines()).unwrap_or_default();
            let deadlines: BTreeMap<u16, u64> =
                deadlines.into_iter().map(|(id, until)| (id.lease_slot(), to_ns(until))).collect();
            self.dataplane.set_leases(&deadlines, now_ns).map(|r| r.lapsed)
        } else {
            let mut lapsed = Vec::new();
            let mut result = Ok(());
            for id in renewed {
                let until = self.vrrp.as_ref().and_then(|v| v.router.lease_deadline(id));
                let slot = id.lease_slot();
                match self.dataplane.renew_lease(slot, until.map_or(0, to_ns), now_ns) {
                    Ok(true) => lapsed.push(slot),
                    Ok(false) => {}
                    Err(e) => result = Err(e),
                }
            }
            result.map(|()| lapsed)
        };
        match lapsed {
            Ok(lapsed) => {
                for slot in lapsed {
                    if let Some(held_back) = self.lease_log.allow(now) {
                        warn!(
                            lease = slot,
                            held_back,
                            "a VIP lease ran out before the agent renewed it (the agent was stalled, frozen or \
                             not running): the data plane stopped claiming its VIPs meanwhile"
                        );
                    }
                    let Some(id) = crate::vrrp::family::InstanceId::from_lease_slot(slot) else { continue };
                    self.state.metrics.lease_expiries.get_or_create(&VridLabels::of(id)).inc();
                }
            }
            Err(e) => {
                // Rewrite them all on the next event.
                self.leases_epoch = None;
                error!(error = %e, "renewing the VIP leases failed");
            }
        }
    }

    /// The VRRP instances as `/status` shows them.
    fn instance_snapshot(&self) -> Vec<InstanceSnapshot> {
        let Some(vrrp) = &self.vrrp else { return Vec::new() };
        let adverts: BTreeMap<_, Option<std::time::Instant>> = vrrp.router.last_adverts().collect();
        let now_ns = leases::monotonic_ns();
        vrrp.router
            .instances()
            .map(|(spec, instance)| InstanceSnapshot {
                status: crate::status::InstanceStatus {
                    group: spec.group.clone(),
                    interface: spec.interface.clone(),
                    vrid: spec.vrid,
                    family: spec.family.as_str().to_owned(),
                    state: instance.state().as_str().to_owned(),
                    priority: spec.priority,
                    master: instance.master().map(|m| m.to_string()),
                    advert_age_ms: None,
                    lease_ms: self
                        .dataplane
                        .lease_remaining(spec.id().lease_slot(), now_ns)
                        .map(|d| d.as_millis() as u64),
                    vips: spec.vips.iter().map(IpAddr::to_string).collect(),
                },
                last_advert: adverts.get(&spec.id()).copied().flatten(),
            })
            .collect()
    }

    /// The routed VIPs as `/status` shows them: what the kernel holds now.
    fn routed_snapshot(&self) -> Vec<crate::status::RoutedStatus> {
        self.routes
            .held()
            .into_iter()
            .map(|vip| {
                let settings = self.plan.vips.get(&vip);
                crate::status::RoutedStatus {
                    vip: vip.to_string(),
                    group: settings.map(|s| s.group.clone()).unwrap_or_default(),
                    announce: settings.map_or("", |s| s.announce.as_str()).to_owned(),
                }
            })
            .collect()
    }

    /// The uplinks as `/status` shows them.
    fn uplink_snapshot(&self) -> Vec<crate::status::UplinkStatus> {
        self.uplinks
            .by_name
            .iter()
            .map(|(name, uplink)| crate::status::UplinkStatus {
                interface: name.clone(),
                xdp_mode: self.dataplane.mode_of(name).to_owned(),
                node_address: uplink.node_address.to_string(),
            })
            .collect()
    }

    /// Who this node sees as Master of each VIP, by node name, for the leader's group status.
    fn publish_owners(&self) {
        let (Some(owners), Some(vrrp)) = (&self.owners, &self.vrrp) else { return };
        let names: BTreeMap<IpAddr, String> = self
            .config
            .groups
            .iter()
            .flat_map(|g| g.nodes.iter())
            .flat_map(|n| {
                let v6 = n.address6.map(|a| (IpAddr::V6(a), n.name.clone()));
                [(IpAddr::V4(n.address), n.name.clone())].into_iter().chain(v6)
            })
            .collect();
        let mut seen = BTreeMap::new();
        for (spec, instance) in vrrp.router.instances() {
            if let Some(name) = instance.master().and_then(|m| names.get(&m)) {
                seen.extend(spec.vips.iter().map(|vip| (*vip, name.clone())));
            }
        }
        owners.send_if_modified(|current| {
            let changed = *current != seen;
            *current = seen;
            changed
        });
    }

    /// The uplink lost or regained its link. Back up, this node announces what it owns again:
    /// while it was cut off, a backup took over and the clients and switches followed it, and
    /// VRRP alone may not bring them back (when the backup hears this master first, it yields
    /// without this master ever hearing it).
    fn on_carrier(&mut self, ifindex: u32, up: bool) {
        let Some((name, _)) = self.uplinks.by_name.iter().find(|(_, u)| u.interface.index == ifindex) else {
            return;
        };
        if !up {
            warn!(interface = %name, "the uplink lost its link");
            return;
        }
        let on_it = |vip: &&IpAddr| self.plan.vips.get(*vip).is_some_and(|s| s.interface == *name);
        let owned: Vec<IpAddr> = self.announced.iter().filter(on_it).copied().collect();
        info!(interface = %name, owned = owned.len(), "the uplink has its link again: announcing the owned VIPs");
        self.announce(owned);
    }

    /// Routers outside a group heard advertising its VRIDs, for the cluster side's Events.
    /// The router only ever adds to them, so a count tells whether anything is new.
    fn publish_foreign(&self) {
        let (Some(foreign), Some(vrrp)) = (&self.foreign, &self.vrrp) else { return };
        if vrrp.router.foreign_routers().count() == foreign.borrow().len() {
            return;
        }
        let heard: ForeignRouters =
            vrrp.router.foreign_routers().map(|(group, id, source)| (group.to_owned(), id, source)).collect();
        foreign.send_replace(heard);
    }

    /// Advertisements that impersonate a member, as XDP counted them (a member's address from
    /// another MAC while its own is live, or this node's address from anywhere): counted,
    /// logged once a minute per member while they go on, and (with `--kubernetes`) passed on
    /// for an Event on the group.
    fn check_impersonations(&mut self) {
        let now = Instant::now();
        let mut heard: Vec<(String, IpAddr, String, u64)> = Vec::new();
        for seen in self.dataplane.impersonations() {
            let own = self.plan.locals.values().any(|local| *local == seen.source);
            let member_of = |i: &&crate::vrrp::router::InstanceSpec| own || i.peers.contains(&seen.source);
            let Some(group) = self.plan.instances.iter().find(member_of).map(|i| i.group.clone()) else {
                continue;
            };
            let how = if own {
                format!("from MAC {}, another host (this node's own address)", seen.other_mac)
            } else {
                format!("from MAC {} while it is at {}", seen.other_mac, seen.mac)
            };
            heard.push((group, seen.source, how, seen.adverts));
        }
        let mut counts: BTreeMap<IpAddr, u64> = BTreeMap::new();
        for (_, member, _, adverts) in &heard {
            *counts.entry(*member).or_default() += adverts;
        }
        for (member, total) in counts {
            let (counted, logged, at_log) = self.impersonations_seen.entry(member).or_insert((0, None, 0));
            if total <= *counted {
                continue;
            }
            self.state
                .metrics
                .impersonations
                .get_or_create(&MemberLabels { member: member.to_string() })
                .inc_by(total - *counted);
            *counted = total;
            if logged.is_none_or(|at| now >= at + crate::vrrp::router::FOREIGN_LOG_EVERY) {
                let how: Vec<&str> = heard.iter().filter(|h| h.1 == member).map(|h| h.2.as_str()).collect();
                warn!(
                    %member,
                    adverts = total - *at_log,
                    how = how.join("; "),
                    "VRRP advertisements with a member's address come from elsewhere: a host on the segment may \
                     be impersonating it (VRRPv3 has no authentication)"
                );
                *logged = Some(now);
                *at_log = total;
            }
        }
        if let Some(tx) = &self.impersonated {
            let set: Impersonations = heard.into_iter().map(|(g, m, how, _)| (g, m, how)).collect();
            if *tx.borrow() != set {
                tx.send_replace(set);
            }
        }
    }

    /// Gratuitous ARPs (unsolicited NAs for IPv6) for VIPs just taken, in the background so the
    /// loop never waits on them.
    fn announce(&self, vips: Vec<IpAddr>) {
        let bursts: Vec<(IpAddr, u32, Duration)> = vips
            .into_iter()
            .filter_map(|vip| self.plan.vips.get(&vip).map(|s| (vip, s.garp.count, s.garp.interval)))
            .filter(|(_, count, _)| *count > 0)
            .collect();
        self.send_garps(bursts);
    }

    /// Groups the owned VIPs by their group's `garp.refresh` period (after an ownership
    /// change); a new period's first refresh is one period away, since taking over has its own
    /// burst.
    fn schedule_garp_refresh(&mut self, now: Instant) {
        if self.config.groups.iter().all(|g| g.garp.refresh.is_zero()) {
            self.garp_refresh.clear();
            return;
        }
        let mut by_period: BTreeMap<Duration, Vec<IpAddr>> = BTreeMap::new();
        for vip in &self.announced {
            if let Some(settings) = self.plan.vips.get(vip)
                && !settings.garp.refresh.is_zero()
            {
                by_period.entry(settings.garp.refresh).or_default().push(*vip);
            }
        }
        let previous = std::mem::take(&mut self.garp_refresh);
        self.garp_refresh = by_period
            .into_iter()
            .map(|(period, vips)| {
                let next = previous.get(&period).map_or(now + period, |(next, _)| *next);
                (period, (next, vips))
            })
            .collect();
    }

    /// `garp.refresh`: while Master, one gratuitous ARP per owned VIP every period.
    fn refresh_garps(&mut self, now: Instant) {
        let mut due = Vec::new();
        for (period, (next, vips)) in &mut self.garp_refresh {
            if *next <= now {
                *next = now + *period;
                due.extend(vips.iter().map(|vip| (*vip, 1, Duration::ZERO)));
            }
        }
        self.send_garps(due);
    }

    /// Has the announcer send `count` gratuitous ARPs for each VIP, `pause` apart, out of the
    /// VIP's group's uplink (paced, in the background: see [`crate::announcer`]).
    fn send_garps(&self, bursts: Vec<(IpAddr, u32, Duration)>) {
        let announcements = bursts
            .into_iter()
            .filter_map(|(vip, count, pause)| {
                let interface = self.plan.vips.get(&vip).map_or(&self.config.interface, |s| &s.interface);
                let uplink = self.uplinks.get(interface)?;
                Some(Announcement {
                    vip,
                    count,
                    pause,
                    socket: uplink.garp.clone(),
                    mac: uplink.interface.mac,
                })
            })
            .collect();
        self.announcer.announce(announcements);
    }

    fn log_plan(&self) {
        let member = self.config.groups.iter().any(|g| g.nodes.iter().any(|n| n.name == self.node));
        if !self.config.groups.is_empty() && !member {
            warn!(node = %self.node, "this node is in no group's nodes: it serves no group's VIPs (check `node` or --node)");
        }
        for spec in &self.plan.instances {
            info!(group = %spec.group, interface = %spec.interface, instance = %spec.id(), priority = spec.priority, vips = spec.vips.len(), "VRRP instance planned");
        }
        for (group, vip, reason) in &self.plan.unplaced {
            warn!(group, %vip, reason, "VIP could not be placed");
        }
    }
}

/// The signals the agent acts on, installed first thing in [`run`]: until a handler is
/// installed a signal's default action applies (SIGHUP and SIGTERM end the process without a
/// word), and start-up takes seconds with 50,000 Services. One that arrives during start-up
/// waits here and is acted on as soon as the loop runs, as it would be later: SIGHUP reloads,
/// SIGTERM and SIGINT stop gracefully.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        let sig = |kind| signal(kind).map_err(|e| Error::io("installing a signal handler", e));
        Ok(Self {
            term: sig(SignalKind::terminate())?,
            int: sig(SignalKind::interrupt())?,
            hup: sig(SignalKind::hangup())?,
        })
    }
}

async fn stop_signal(term: &mut Signal, int: &mut Signal) {
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = int.recv() => info!("SIGINT"),
    }
}

/// `future`'s output, or never when there is none: a `select!` branch that is off (no
/// deadline, no cluster source, no VRRP socket).
async fn or_pending<F: std::future::Future>(future: Option<F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}
