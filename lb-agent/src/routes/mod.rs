//! Routed VIPs' shell: hands the VIPs this node serves in `announce: bgp` and `bgpOwner` groups
//! to the node's routing daemon as kernel routes, which FRR (or BIRD) redistributes to the
//! fabric.
//!
//! - [`keeper`]: the process that holds the routes' device, so they end when the agent is
//!   killed or goes unheard.
//! - [`sessions`]: the node's BGP sessions, counted for the metrics.
//!
//! Each route points into a TUN device that only the keeper holds: when the agent's process
//! ends in any way (SIGKILL, a crash, the OOM killer), or stops sending heartbeats for
//! `routes.holdTime` (frozen), the keeper exits, the kernel deletes the device with its routes,
//! and FRR withdraws them. A graceful stop withdraws first and then drains (see the agent). The
//! device also catches what the kernel would route to a VIP (traffic XDP passes on, e.g. to a
//! port no Service exposes): it is dropped there, never sent back to the fabric.
//!
//! The task applies the latest wanted set by difference, on the background runtime: the VRRP
//! loop never waits on netlink. A failed change is retried every second.

pub mod keeper;
pub mod sessions;

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use futures::TryStreamExt;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rtnetlink::{
    Handle, LinkUnspec, RouteMessageBuilder,
    packet_route::route::{RouteMessage, RouteProtocol},
};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use crate::config::RoutesConfig;
use keeper::{Handoff, Keeper};

/// Why routes went: the ownership decision changed (a lost election, a VIP this node is no
/// longer eligible for, a group it left), or the agent is stopping. (A third reason, `unheard`,
/// is the keeper's: see [`keeper`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Changed,
    Stopping,
}

impl Why {
    fn as_str(self) -> &'static str {
        match self {
            Why::Changed => "changed",
            Why::Stopping => "stopping",
        }
    }
}

/// Routes the keeper took with it when the agent went unheard for `routes.holdTime`.
const UNHEARD: &str = "unheard";
/// Routes gone with a keeper that something else ended (a signal, the OOM killer).
const KEEPER_LOST: &str = "keeper_lost";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone)]
pub struct RouteMetrics {
    routed: Gauge,
    withdrawals: Family<ReasonLabels, Counter>,
    failures: Counter,
}

impl RouteMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let routed = Gauge::default();
        registry.register(
            "routed_vips",
            "VIPs this node routes to its routing daemon for the fabric (announce bgp, bgpOwner)",
            routed.clone(),
        );
        let withdrawals = Family::<ReasonLabels, Counter>::default();
        for reason in [Why::Changed.as_str(), Why::Stopping.as_str(), UNHEARD, KEEPER_LOST] {
            let _ = withdrawals.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "route_withdrawals",
            "Routed VIPs withdrawn, by reason (changed: the ownership decision; stopping: a graceful stop; \
             unheard: the agent sent no heartbeat for routes.holdTime; keeper_lost: the routes' keeper \
             was ended from outside)",
            withdrawals.clone(),
        );
        let failures = Counter::default();
        registry.register(
            "route_failures",
            "Route changes the kernel refused (retried every second)",
            failures.clone(),
        );
        registry.register_collector(Box::new(sessions::SessionCollector));
        Self { routed, withdrawals, failures }
    }
}

/// The handle the agent keeps: the wanted routes go in, the task applies them.
pub struct Routes {
    wanted: watch::Sender<(BTreeSet<IpAddr>, Why)>,
    /// The set last applied whole, for [`Routes::settled`].
    applied: watch::Receiver<BTreeSet<IpAddr>>,
    /// The event loop's heartbeats, passed on to the keeper.
    alive: watch::Sender<u64>,
    /// Asks the task to end, its routes left to this process's next image or the next agent.
    departures: mpsc::Sender<Departure>,
}

/// How the routes outlive this agent (see [`keeper`]).
enum Departure {
    /// To this process's next image (SIGUSR2): the keeper, handed over.
    Exec(oneshot::Sender<Option<Handoff>>),
    /// To the next agent on this node (a DaemonSet roll): the device, left persistent.
    Replacement(oneshot::Sender<()>),
}

impl Routes {
    /// Starts the task on the current runtime. The device is made only once a route is wanted,
    /// so a node without routed groups has none; or it is `adopted` from this process's
    /// previous image, or taken over from the agent this one replaces, with the routes it
    /// holds.
    pub fn spawn(
        settings: RoutesConfig,
        netlink: Handle,
        metrics: RouteMetrics,
        adopted: Option<Handoff>,
    ) -> Routes {
        let (wanted, wanted_rx) = watch::channel((BTreeSet::new(), Why::Changed));
        let (applied_tx, applied) = watch::channel(BTreeSet::new());
        let (alive, alive_rx) = watch::channel(0);
        let (departures, departures_rx) = mpsc::channel(1);
        let inputs = Inputs { wanted: wanted_rx, alive: alive_rx, departures: departures_rx };
        tokio::spawn(apply_loop(settings, netlink, metrics, inputs, applied_tx, adopted));
        Routes { wanted, applied, alive, departures }
    }

    /// Ends the task, its routes left in place, and returns their keeper for this process's
    /// next image (none when no route is held).
    pub async fn hand_over(&self) -> Option<Handoff> {
        let (reply, handoff) = oneshot::channel();
        self.departures.send(Departure::Exec(reply)).await.ok()?;
        handoff.await.ok().flatten()
    }

    /// Ends the task, its device and routes left for the agent that replaces this one on the
    /// node (a DaemonSet roll).
    pub async fn leave(&self) {
        let (reply, left) = oneshot::channel();
        if self.departures.send(Departure::Replacement(reply)).await.is_ok() {
            let _ = left.await;
        }
    }

    /// A heartbeat from the event loop: sent at least every third of `routes.holdTime`, or the
    /// keeper withdraws the routes (see [`keeper`]).
    pub fn alive(&self) {
        self.alive.send_modify(|beats| *beats = beats.wrapping_add(1));
    }

    /// The routes to hold from now; `why` says why any not in it went.
    pub fn set(&self, routes: BTreeSet<IpAddr>, why: Why) {
        self.wanted.send_if_modified(|current| {
            let changed = current.0 != routes;
            *current = (routes, why);
            changed
        });
    }

    /// The routes held now, as last applied.
    pub fn held(&self) -> BTreeSet<IpAddr> {
        self.applied.borrow().clone()
    }

    /// Waits (at most `timeout`) until the kernel holds exactly the wanted routes.
    pub async fn settled(&self, timeout: Duration) {
        let mut applied = self.applied.clone();
        let wanted = self.wanted.borrow().0.clone();
        let _ = tokio::time::timeout(timeout, applied.wait_for(|held| *held == wanted)).await;
    }
}

/// What woke the apply loop.
enum Wake {
    Wanted,
    Heartbeat,
    KeeperEnded(std::io::Result<std::process::ExitStatus>),
    Depart(Departure),
}

/// What the apply loop hears from [`Routes`].
struct Inputs {
    wanted: watch::Receiver<(BTreeSet<IpAddr>, Why)>,
    alive: watch::Receiver<u64>,
    departures: mpsc::Receiver<Departure>,
}

/// The device: its keeper (see [`keeper`]) and its interface index.
struct Device {
    keeper: Keeper,
    index: u32,
}

async fn apply_loop(
    settings: RoutesConfig,
    netlink: Handle,
    metrics: RouteMetrics,
    inputs: Inputs,
    applied: watch::Sender<BTreeSet<IpAddr>>,
    adopted: Option<Handoff>,
) {
    let Inputs { mut wanted, mut alive, mut departures } = inputs;
    let (mut device, mut held) = adopt_device(&netlink, &settings, adopted, alive.clone()).await;
    metrics.routed.set(held.len() as i64);
    applied.send_replace(held.clone());
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The keeper withdrew the routes because the event loop went unheard: they come back only
    // once it is heard again (a loop stuck while this task runs must not flap them).
    let mut unheard = false;
    loop {
        let wake = tokio::select! {
            changed = wanted.changed() => match changed {
                Ok(()) => Wake::Wanted,
                Err(_) => return,
            },
            _ = retry.tick(), if failing => Wake::Wanted,
            // Only while a lapse is waiting for the loop to be heard again (below).
            Ok(()) = alive.changed(), if unheard => Wake::Heartbeat,
            status = keeper_ended(device.as_mut()) => Wake::KeeperEnded(status),
            Some(departure) = departures.recv() => Wake::Depart(departure),
        };
        match wake {
            Wake::Depart(departure) => return depart(device, departure).await,
            Wake::Wanted => {}
            Wake::Heartbeat => unheard = false,
            Wake::KeeperEnded(status) => {
                // The keeper exits with 1 when the agent went unheard; anything else ended it
                // from outside (a signal, the OOM killer).
                unheard = matches!(&status, Ok(s) if s.code() == Some(1));
                // Beats from before the lapse do not count: wait for a new one.
                alive.borrow_and_update();
                count_keeper_end(status, unheard, &held, &settings, &metrics);
                device = None;
                held.clear();
            }
        }
        let (routes, why) = wanted.borrow_and_update().clone();
        if device.is_none() && !routes.is_empty() && !unheard {
            match make_device(&netlink, &settings, alive.clone()).await {
                Ok((made, found)) => {
                    device = Some(made);
                    held = found;
                }
                Err(e) => {
                    metrics.failures.inc();
                    if !failing {
                        error!(device = %settings.device, error = %e, "creating the routed VIPs' device failed (routes.device): no VIP is routed");
                    }
                    failing = true;
                    continue;
                }
            }
        }
        let Some(Device { index, .. }) = &device else {
            // Nothing wanted, or waiting to hear the loop again: nothing to retry.
            failing = false;
            metrics.routed.set(held.len() as i64);
            applied.send_replace(held.clone());
            continue;
        };
        let ok = sync_routes((&netlink, &settings, &metrics), *index, &mut held, &routes, why, failing).await;
        if !ok {
            metrics.failures.inc();
        } else if failing {
            info!(routed = held.len(), "routed VIPs in place again");
        }
        failing = !ok;
        metrics.routed.set(held.len() as i64);
        applied.send_replace(held.clone());
    }
}

/// Logs and counts the routes a keeper took with it when it ended (`unheard`: it withdrew them
/// because this agent's loop went unheard).
fn count_keeper_end(
    status: std::io::Result<std::process::ExitStatus>,
    unheard: bool,
    held: &BTreeSet<IpAddr>,
    settings: &RoutesConfig,
    metrics: &RouteMetrics,
) {
    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
    let reason = if held.is_empty() {
        // Nothing was routed (a stop's withdrawal already went, or none was wanted).
        debug!(%status, "the routes' keeper ended with no route held");
        UNHEARD
    } else if unheard {
        error!(
            %status,
            withdrawn = held.len(),
            hold = ?settings.hold_time,
            "this agent went unheard for longer than routes.holdTime (frozen?): its routes' \
             keeper withdrew them; routing them again"
        );
        UNHEARD
    } else {
        error!(%status, withdrawn = held.len(), "the routes' keeper was ended from outside, and the routes with it; routing them again");
        KEEPER_LOST
    };
    metrics.withdrawals.get_or_create(&ReasonLabels { reason }).inc_by(held.len() as u64);
}

/// Withdraws the held routes no longer wanted (counted with `why`) and adds the wanted ones
/// not held; whether every change went through.
async fn sync_routes(
    (netlink, settings, metrics): (&Handle, &RoutesConfig, &RouteMetrics),
    index: u32,
    held: &mut BTreeSet<IpAddr>,
    routes: &BTreeSet<IpAddr>,
    why: Why,
    failing: bool,
) -> bool {
    let mut ok = true;
    for vip in held.clone().difference(routes) {
        match netlink.route().del(route(*vip, index, settings.protocol)).execute().await {
            // Already gone counts as withdrawn.
            Ok(()) | Err(rtnetlink::Error::NetlinkError(_)) => {
                held.remove(vip);
                metrics.withdrawals.get_or_create(&ReasonLabels { reason: why.as_str() }).inc();
            }
            Err(e) => {
                ok = false;
                warn!(%vip, error = %e, "withdrawing a VIP's route failed");
            }
        }
    }
    for vip in routes.difference(&held.clone()) {
        match netlink.route().add(route(*vip, index, settings.protocol)).replace().execute().await {
            Ok(()) => {
                held.insert(*vip);
            }
            Err(e) => {
                ok = false;
                if !failing {
                    warn!(%vip, error = %e, "routing a VIP failed (retried every second)");
                }
            }
        }
    }
    ok
}

/// Resolves when the device's keeper has ended; never without a device.
async fn keeper_ended(device: Option<&mut Device>) -> std::io::Result<std::process::ExitStatus> {
    match device {
        Some(device) => device.keeper.ended().await,
        None => std::future::pending().await,
    }
}

/// `<vip>/32` (or `/128`) into the device, with the agent's protocol number.
fn route(vip: IpAddr, index: u32, protocol: u8) -> RouteMessage {
    let protocol = RouteProtocol::from(protocol);
    match vip {
        IpAddr::V4(v4) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
            .destination_prefix(v4, 32)
            .output_interface(index)
            .protocol(protocol)
            .build(),
        IpAddr::V6(v6) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
            .destination_prefix(v6, 128)
            .output_interface(index)
            .protocol(protocol)
            .build(),
    }
}

/// Has a keeper make the TUN device `settings.device` (or attach to the one the agent this one
/// replaced left), and brings it up; the routes it holds already. IPv6 is turned on for it
/// where the namespace has it off by default (for `/128` routes).
async fn make_device(
    netlink: &Handle,
    settings: &RoutesConfig,
    alive: watch::Receiver<u64>,
) -> std::io::Result<(Device, BTreeSet<IpAddr>)> {
    let name = settings.device.as_str();
    let keeper = Keeper::spawn(name, (settings.hold_time, settings.restart_window), alive).await?;
    let (index, held) = device_routes(netlink, settings).await?;
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "0");
    netlink
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| std::io::Error::other(format!("bringing {name} up: {e}")))?;
    if held.is_empty() {
        info!(device = name, hold = ?settings.hold_time, "routed VIPs' device made: its routes end with this process, or when it goes unheard for routes.holdTime");
    } else {
        info!(
            device = name,
            routed = held.len(),
            "took over the routed VIPs' device the agent this one replaced left, with its routes: they stay until this agent's first decision"
        );
    }
    Ok((Device { keeper, index }, held))
}

/// Ends the apply loop, its routes left in place: its keeper (if it has one) goes to this
/// process's next image, or its device to the next agent on this node.
async fn depart(device: Option<Device>, departure: Departure) {
    match departure {
        Departure::Exec(reply) => {
            let handoff = match device {
                Some(device) => device
                    .keeper
                    .hand_over()
                    .await
                    .inspect_err(|e| error!(error = %e, "handing the routes' keeper over failed: the routes end with this image"))
                    .ok(),
                None => None,
            };
            let _ = reply.send(handoff);
        }
        Departure::Replacement(reply) => {
            if let Some(device) = device {
                match device.keeper.leave().await {
                    Ok(()) => info!(
                        "the routed VIPs' device and its routes are left for the agent that replaces this one"
                    ),
                    Err(e) => {
                        error!(error = %e, "leaving the routed VIPs' device to the next agent failed: its routes end with this agent")
                    }
                }
            }
            let _ = reply.send(());
        }
    }
}

/// The device and routes this process's previous image handed over (an upgrade in place), or
/// that the agent this one replaces left on the node (a roll), if any: a keeper that cannot be
/// adopted ends, and its routes are made again.
async fn adopt_device(
    netlink: &Handle,
    settings: &RoutesConfig,
    handoff: Option<Handoff>,
    alive: watch::Receiver<u64>,
) -> (Option<Device>, BTreeSet<IpAddr>) {
    let Some(handoff) = handoff else {
        return take_over_left_device(netlink, settings, alive).await;
    };
    let adopted = async {
        let keeper = Keeper::adopt(handoff, alive)?;
        let (index, held) = device_routes(netlink, settings).await?;
        Ok::<_, std::io::Error>((Device { keeper, index }, held))
    };
    match adopted.await {
        Ok((device, held)) => {
            info!(device = %settings.device, routed = held.len(), "adopted the routes' keeper of this process's previous image: its routes stay");
            (Some(device), held)
        }
        Err(e) => {
            error!(device = %settings.device, error = %e, "adopting the routes' keeper failed: its routes end, and are made again");
            (None, BTreeSet::new())
        }
    }
}

/// At start, a device of this name that exists already is one a replaced agent left (or
/// another process holds, which is refused): taken over at once, so that its routes end with
/// this agent from now on, and the node's routing daemon (which waits for it) can start.
async fn take_over_left_device(
    netlink: &Handle,
    settings: &RoutesConfig,
    alive: watch::Receiver<u64>,
) -> (Option<Device>, BTreeSet<IpAddr>) {
    match crate::netdev::find(netlink, &settings.device).await {
        Ok(Some(_)) => {}
        Ok(None) => return (None, BTreeSet::new()),
        Err(e) => {
            warn!(device = %settings.device, error = %e, "looking for a routed VIPs' device left by a replaced agent failed");
            return (None, BTreeSet::new());
        }
    }
    match make_device(netlink, settings, alive).await {
        Ok((device, held)) => (Some(device), held),
        Err(e) => {
            error!(device = %settings.device, error = %e, "taking over the routed VIPs' device failed (routes.device): no VIP is routed");
            (None, BTreeSet::new())
        }
    }
}

/// The device's interface index, and the VIPs routed into it (a keeper adopted or a device
/// taken over holds some already).
async fn device_routes(
    netlink: &Handle,
    settings: &RoutesConfig,
) -> std::io::Result<(u32, BTreeSet<IpAddr>)> {
    let name = &settings.device;
    let index = crate::netdev::find(netlink, name)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .ok_or_else(|| std::io::Error::other(format!("{name} is gone")))?
        .index;
    let held = routes_into(netlink, index, settings.protocol)
        .await
        .map_err(|e| std::io::Error::other(format!("listing the routes into {name}: {e}")))?;
    Ok((index, held))
}

/// The VIPs routed into the device `index` with the agent's protocol, both families.
async fn routes_into(
    netlink: &Handle,
    index: u32,
    protocol: u8,
) -> Result<BTreeSet<IpAddr>, rtnetlink::Error> {
    use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};
    let mut vips = BTreeSet::new();
    let dumps = [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ];
    for dump in dumps {
        let mut replies = std::pin::pin!(netlink.route().get(dump).execute());
        while let Some(reply) = replies.try_next().await? {
            if reply.header.protocol != RouteProtocol::from(protocol) {
                continue;
            }
            let into_device =
                reply.attributes.iter().any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index));
            let destination = reply.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
                RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
                _ => None,
            });
            if let (true, Some(vip)) = (into_device, destination) {
                vips.insert(vip);
            }
        }
    }
    Ok(vips)
}
