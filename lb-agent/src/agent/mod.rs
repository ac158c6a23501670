//! `lb-agent run`: the agent and its event loop, which only selects and dispatches. One task
//! runs the VRRP router and applies its ownership changes directly, so a failover costs no more
//! than a map update after the timer fires.
//!
//! - `startup`: validate, attach, sync, start VRRP, serve ([`run`]).
//! - `reload`: a new config, its restart-only settings in one table.
//! - `apply`: the ownership decision carried out: maps, leases, addresses, routes, announcements.
//! - `cluster_link`: what `--kubernetes` adds: owners, foreign routers, impersonations.
//! - `snapshot`: the loop's state for `lb-agent status`.

mod apply;
mod cluster_link;
mod reload;
mod snapshot;
mod startup;

pub use startup::run;

use cluster_link::FromCluster;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    announcer::Announcer,
    config::Config,
    dataplane::{Dataplane, XdpCounters},
    error::{Error, Result},
    http::{HttpState, LoopSnapshot},
    key_files::KeyFiles,
    node_plan::NodePlan,
    routes::Routes,
    service_sync::SyncRequest,
    uplinks::Uplinks,
    vip_addresses::VipAddresses,
    vrrp_driver::{self, Vrrp},
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

/// How the agent is stopping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM, SIGINT: withdraw, drain, end.
    Graceful,
    /// SIGUSR2: an upgrade in place. VRRP hands over as in a stop, but the routed VIPs stay,
    /// and the process executes its binary again, which adopts them.
    Restart,
    /// SIGTERM to a pod its DaemonSet replaces (a roll, see `k8s::departure`): as a restart,
    /// but the routed VIPs' device is left for the next agent on the node, and the process
    /// ends.
    Replaced,
}

/// How [`run`] ended.
#[derive(Debug)]
pub enum Exit {
    /// A graceful stop, done.
    Stopped,
    /// Execute this binary again, handing over the routes' keeper (see `routes::keeper`).
    Restart(Option<crate::routes::keeper::Handoff>),
}

/// `--kubernetes`: where the leader Lease lives, and the agent's own pod (`--pod`).
pub struct KubernetesSource {
    pub namespace: String,
    pub pod: Option<String>,
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

/// Runs `f` in `runtime`'s context: the tasks it spawns and the sockets it registers live
/// there (see [`startup::run`]).
pub(super) fn within<T>(runtime: &tokio::runtime::Handle, f: impl FnOnce() -> T) -> T {
    let _entered = runtime.enter();
    f()
}

struct Agent {
    /// What this agent runs: its config, node and plan.
    current: Current,
    netlink: rtnetlink::Handle,
    /// Every interface VIPs are served on, the default uplink first among equals.
    uplinks: Uplinks,
    dataplane: Dataplane,
    counters: Arc<Mutex<XdpCounters>>,
    state: Arc<HttpState>,
    /// `None` once stopping: nothing is claimed through VRRP any more.
    vrrp: Option<Vrrp>,
    /// What the last ownership apply left, to apply the next by difference.
    ownership: Applied,
    /// Gratuitous ARPs and NAs: sent, paced, and refreshed.
    announcing: Announcing,
    /// Holds the routed VIPs' kernel routes, for the node's FRR.
    routes: Routes,
    /// A stop began: a graceful one withdraws the routes while the rest keeps serving; a
    /// restart in place keeps them for the next image.
    stopping: Option<Stop>,
    /// Keeps the VIP addresses on the uplinks (modes `netlink`, `both`) without the loop
    /// waiting on netlink.
    vip_addresses: VipAddresses,
    /// The service-sync task: configs to it, and what it applied.
    service_sync: ServiceSyncLink,
    /// With `--kubernetes`: the cluster side's channels (see [`cluster_link::ClusterLink`]).
    cluster: Option<cluster_link::ClusterLink>,
    /// Requests the loop answers between events.
    inputs: Inputs,
}

/// What this agent runs.
struct Current {
    config_path: PathBuf,
    /// Shared with the sync task: a large config is never copied.
    config: Arc<Config>,
    node: String,
    /// Shared with the pending config's, when that config changed no group.
    plan: Arc<NodePlan>,
    /// The command line's settings, which outrank the config file's on every load.
    overrides: Overrides,
    /// The source of full-NAT and IPIP traffic leaving by the default uplink (the others'
    /// are in the uplink map).
    node_address: Ipv4Addr,
    /// The key files of the plan's authenticating groups, re-read every second.
    keys: KeyFiles,
}

/// What the last ownership apply left.
struct Applied {
    /// VRRP VIPs owned at the last apply: the ones new since then get gratuitous ARPs.
    announced: BTreeSet<IpAddr>,
    /// The router's ownership epoch last applied; `None` forces a full apply.
    applied_epoch: Option<u64>,
    /// The ownership epoch whose leases were last written whole; `None` forces that.
    leases_epoch: Option<Option<u64>>,
    /// Lapsed-lease warnings: a loaded host may lapse often (each is counted).
    lease_log: crate::logging::LogBudget,
    /// The uplink slot of each VIP, as the service maps were last told.
    vip_uplinks: Arc<std::collections::HashMap<IpAddr, u8>>,
    /// Per member: the impersonating advertisements counted so far, when last logged, and the
    /// count then.
    impersonations_seen: BTreeMap<IpAddr, (u64, Option<Instant>, u64)>,
}

impl Applied {
    /// Nothing applied yet: the first apply is a full one.
    fn new(vip_uplinks: Arc<std::collections::HashMap<IpAddr, u8>>) -> Self {
        Applied {
            announced: BTreeSet::new(),
            applied_epoch: None,
            leases_epoch: None,
            lease_log: crate::logging::LogBudget::new(16, 1),
            vip_uplinks,
            impersonations_seen: BTreeMap::new(),
        }
    }
}

/// Announcements of owned VIPs.
struct Announcing {
    /// Sends the gratuitous ARPs and NAs, paced.
    announcer: Announcer,
    /// Owned VIPs by `garp.refresh` period, and when they are next announced again.
    refresh: BTreeMap<Duration, (Instant, Vec<IpAddr>)>,
}

/// The service-sync task's side of the loop.
struct ServiceSyncLink {
    /// Hands each accepted config to the service-sync task.
    requests: watch::Sender<SyncRequest>,
    /// The generation of the last config whose services the sync task has applied.
    applied: watch::Receiver<u64>,
    /// An accepted config waiting for its services to reach the maps before VRRP and the
    /// owned VIPs follow it, so a VIP is never taken before its services: (generation,
    /// config, plan).
    pending: Option<(u64, Arc<Config>, Arc<NodePlan>)>,
    /// A committed plan's slow tidying (counters pruned, uplinks it left detached) waits for
    /// the loop's next turn, after the VRRP timers that fell due meanwhile: see
    /// [`Agent::commit_config`].
    tidy_pending: bool,
}

/// Inputs the loop selects on besides VRRP and signals.
struct Inputs {
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
        let (mut once_a_second, mut heartbeat) = self.loop_ticks();
        loop {
            if self.stopped(stop_by, drain_until) {
                return Ok(());
            }
            if let Some(vrrp) = &mut self.vrrp {
                vrrp.router.idle(Instant::now().into_std());
            }
            let deadline = self.next_deadline(receive_from, drain_until);
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
                    receive_from = self.on_deadline(&mut buf).await;
                }
                () = std::future::ready(()), if self.service_sync.tidy_pending => self.tidy_after_commit(),
                stop = stop_signal(&mut signals.stops), if stop_by.is_none() && !self.asking_departure() => {
                    if let Some(stop) = self.ask_departure(stop) {
                        (drain_until, stop_by) = self.stop_within_bound(stop).await;
                    }
                }
                Some(event) = or_pending(self.cluster.as_mut().map(|c| c.next_event())), if stop_by.is_none() => {
                    match event {
                        FromCluster::Config(config) => self.apply_config(*config).await,
                        FromCluster::Departure(stop) => (drain_until, stop_by) = self.stop_within_bound(stop).await,
                    }
                }
                Ok(()) = self.service_sync.applied.changed(), if self.service_sync.pending.is_some() => {
                    self.on_services_applied().await;
                }
                Some((ifindex, up)) = self.inputs.carrier.recv() => self.on_carrier(ifindex, up),
                _ = heartbeat.tick() => self.routes.alive(),
                _ = once_a_second.tick() => self.once_a_second(),
                Some(reply) = self.inputs.status_requests.recv() => {
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
                            let out = vrrp.router.on_datagram(Instant::now().into_std(), &interface, arrived.datagram(&buf));
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

    /// Whether a stop that began can end: no handover holds VIPs and the drain is over, or the
    /// stop's bound passed.
    fn stopped(&self, stop_by: Option<Instant>, drain_until: Option<Instant>) -> bool {
        let Some(deadline) = stop_by else { return false };
        let handing_over = self.vrrp.as_ref().is_some_and(|v| v.router.handing_over());
        let draining = drain_until.is_some_and(|until| Instant::now() < until);
        let stopped = !(handing_over || draining) || Instant::now() >= deadline;
        if stopped && draining {
            info!("drained: stopping");
        }
        stopped
    }

    /// The loop's next deadline: VRRP's timers, announcements' refresh, the receive tick, the
    /// drain's end.
    fn next_deadline(&self, receive_from: Option<Instant>, drain_until: Option<Instant>) -> Option<Instant> {
        let vrrp_deadline = self.vrrp.as_ref().and_then(|v| v.router.next_deadline()).map(Instant::from_std);
        let announcement_refresh = self.announcing.refresh.values().map(|(at, _)| *at);
        vrrp_deadline.into_iter().chain(announcement_refresh).chain(receive_from).chain(drain_until).min()
    }

    /// A deadline passed: VRRP's timers fire and ownership follows; returns the next receive
    /// tick when datagrams were waiting.
    async fn on_deadline(&mut self, buf: &mut [u8]) -> Option<Instant> {
        // Advertisements that queued up while this loop was busy may reset the timer that just
        // fired: read them first, so a slow moment here never passes for a silent master.
        let received = self.drain_vrrp(buf);
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.on_timer(Instant::now().into_std());
            vrrp.send(&out);
        }
        self.apply_ownership().await;
        self.refresh_announcements(Instant::now());
        received.then(|| Instant::now() + RECEIVE_TICK)
    }

    /// The sync task applied a generation: the pending config, once its services are in the
    /// maps, becomes the running one.
    async fn on_services_applied(&mut self) {
        let applied = *self.service_sync.applied.borrow_and_update();
        if self.service_sync.pending.as_ref().is_some_and(|(generation, _, _)| applied >= *generation) {
            let (_, config, plan) = self.service_sync.pending.take().expect("checked above");
            self.commit_config(config, plan).await;
        }
    }

    /// Impersonations read, reported and logged; key files re-read.
    fn once_a_second(&mut self) {
        self.check_impersonations();
        if self.current.keys.refresh(self.current.plan.key_files.values()) {
            self.reconfigure_vrrp();
        }
    }

    /// Handles the datagrams already waiting on the VRRP sockets, without waiting for more;
    /// true when there were any.
    fn drain_vrrp(&mut self, buf: &mut [u8]) -> bool {
        self.vrrp.as_mut().is_some_and(|vrrp| vrrp.drain(buf))
    }

    /// The loop's two ticks. Once a second: XDP counts impersonating advertisements, which are
    /// read, reported and logged, and key files are re-read. The heartbeat: the routes' keeper
    /// withdraws them when this loop goes unheard (see `routes::keeper`); beats go from here,
    /// the loop that decides, not from a task that might outlive it.
    fn loop_ticks(&self) -> (tokio::time::Interval, tokio::time::Interval) {
        let mut heartbeat = tokio::time::interval(self.current.config.routes.hold_time / 3);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        (tokio::time::interval(Duration::from_secs(1)), heartbeat)
    }

    /// Begins `stop`: the drain's end, if any, and when the loop ends at the latest.
    async fn stop_within_bound(&mut self, stop: Stop) -> (Option<Instant>, Option<Instant>) {
        let drain_until = self.begin_stop(stop).await;
        (drain_until, Some(drain_until.unwrap_or_else(Instant::now).max(Instant::now()) + STOP_BOUND))
    }

    /// SIGTERM/SIGINT: masters resign and hand over, routed VIPs are withdrawn; the loop ends
    /// when the handovers are done and, if routes were held, the drain is over (until then
    /// this node serves the flows the fabric still sends it). Returns the drain's end.
    /// SIGUSR2 (a restart in place): the same, but routed VIPs stay for the next image, so
    /// nothing drains.
    async fn begin_stop(&mut self, stop: Stop) -> Option<Instant> {
        let routed = !self.routes.held().is_empty();
        match stop {
            Stop::Graceful => info!(routed, "stopping: resigning VRRP masters, withdrawing routed VIPs"),
            Stop::Restart => info!(
                routed,
                "SIGUSR2: executing this binary again (an upgrade in place): resigning VRRP masters, \
                 keeping routed VIPs for the next image"
            ),
            Stop::Replaced => info!(
                routed,
                "stopping for a replacement (a DaemonSet roll): resigning VRRP masters, leaving routed \
                 VIPs to the next agent on this node"
            ),
        }
        self.state.ready.store(false, Ordering::Relaxed);
        self.stopping = Some(stop);
        if let Some(cluster) = &self.cluster {
            // The leader hands its Lease over now, not when it expires.
            cluster.stopping.send_replace(true);
        }
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.shutdown(Instant::now().into_std());
            vrrp.send(&out);
        }
        self.ownership.applied_epoch = None;
        self.apply_ownership().await;
        (routed && stop == Stop::Graceful).then(|| Instant::now() + self.current.config.routes.drain)
    }
}

/// The signals the agent acts on, installed first thing in [`run`]: until a handler is
/// installed a signal's default action applies (SIGHUP and SIGTERM end the process without a
/// word), and start-up takes seconds with 50,000 Services. One that arrives during start-up
/// waits here and is acted on as soon as the loop runs, as it would be later: SIGHUP reloads,
/// SIGTERM and SIGINT stop gracefully, SIGUSR2 restarts in place.
struct Signals {
    stops: StopSignals,
    hup: Signal,
}

/// SIGTERM and SIGINT (a graceful stop), SIGUSR2 (a restart in place).
struct StopSignals {
    term: Signal,
    int: Signal,
    usr2: Signal,
}

impl Signals {
    /// Installs the handlers, then lets the signals [`hold_signals`] held through.
    fn install() -> Result<Self> {
        let sig = |kind| signal(kind).map_err(|e| Error::io("installing a signal handler", e));
        let signals = Self {
            stops: StopSignals {
                term: sig(SignalKind::terminate())?,
                int: sig(SignalKind::interrupt())?,
                usr2: sig(SignalKind::user_defined2())?,
            },
            hup: sig(SignalKind::hangup())?,
        };
        set_held(libc::SIG_UNBLOCK);
        Ok(signals)
    }
}

/// Holds SIGTERM, SIGINT, SIGHUP and SIGUSR2 pending until [`Signals::install`] has its
/// handlers: call first thing, before any thread starts (threads inherit the mask, so the
/// runtimes' workers keep them held and they reach the thread that installed the handlers).
/// Without it a signal can be lost at start-up: tokio installs its process-wide handler before
/// its listener subscribes, and a runtime worker that drains the handler's pipe in between
/// broadcasts the signal to nobody (a SIGTERM right after start was ignored, found by the
/// start-up signal lab test in CI). Held, such a signal is delivered once the listener is
/// there; one before that is then a graceful stop, not the default action's sudden exit.
pub fn hold_signals() {
    set_held(libc::SIG_BLOCK);
}

fn set_held(how: libc::c_int) {
    // SAFETY: a sigset built with sigemptyset/sigaddset and passed by pointer to
    // pthread_sigmask, which only reads it; no old mask is asked for.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR2] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// The next stop signal, and the stop it asks for.
async fn stop_signal(stops: &mut StopSignals) -> Stop {
    tokio::select! {
        _ = stops.term.recv() => info!("SIGTERM"),
        _ = stops.int.recv() => info!("SIGINT"),
        _ = stops.usr2.recv() => {
            info!("SIGUSR2");
            return Stop::Restart;
        }
    }
    Stop::Graceful
}

/// SIGTERM or SIGINT; a SIGUSR2 stays pending.
async fn graceful_stop_signal(stops: &mut StopSignals) {
    tokio::select! {
        _ = stops.term.recv() => info!("SIGTERM"),
        _ = stops.int.recv() => info!("SIGINT"),
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
