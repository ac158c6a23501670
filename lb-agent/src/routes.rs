//! Routed VIPs' shell: hands the VIPs this node serves in `announce: bgp` and `bgpOwner` groups
//! to the node's routing daemon as kernel routes, which FRR (or BIRD) redistributes to the
//! fabric.
//!
//! Each route points into a TUN device the agent creates and holds open. Nothing else keeps the
//! device: when the agent's process ends in any way (SIGKILL, a crash, the OOM killer) the
//! kernel deletes it with its routes, and FRR withdraws them at once. A graceful stop withdraws
//! first and then drains (see the agent). The device also catches what the kernel would route
//! to a VIP (traffic XDP passes on, e.g. to a port no Service exposes): it is dropped there,
//! never sent back to the fabric.
//!
//! The task applies the latest wanted set by difference, on the background runtime: the VRRP
//! loop never waits on netlink. A failed change is retried every second.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rtnetlink::{
    Handle, LinkUnspec, RouteMessageBuilder,
    packet_route::route::{RouteMessage, RouteProtocol},
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::RoutesConfig;

/// Why routes went: the ownership decision changed (a lost election, a VIP this node is no
/// longer eligible for, a group it left), or the agent is stopping.
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
        for why in [Why::Changed, Why::Stopping] {
            let _ = withdrawals.get_or_create(&ReasonLabels { reason: why.as_str() });
        }
        registry.register(
            "route_withdrawals",
            "Routed VIPs withdrawn, by reason (changed: the ownership decision; stopping: a graceful stop)",
            withdrawals.clone(),
        );
        let failures = Counter::default();
        registry.register(
            "route_failures",
            "Route changes the kernel refused (retried every second)",
            failures.clone(),
        );
        Self { routed, withdrawals, failures }
    }
}

/// The handle the agent keeps: the wanted routes go in, the task applies them.
pub struct Routes {
    wanted: watch::Sender<(BTreeSet<IpAddr>, Why)>,
    /// The set last applied whole, for [`Routes::settled`].
    applied: watch::Receiver<BTreeSet<IpAddr>>,
}

impl Routes {
    /// Starts the task on the current runtime. The device is made only once a route is wanted,
    /// so a node without routed groups has none.
    pub fn spawn(settings: RoutesConfig, netlink: Handle, metrics: RouteMetrics) -> Routes {
        let (wanted, wanted_rx) = watch::channel((BTreeSet::new(), Why::Changed));
        let (applied_tx, applied) = watch::channel(BTreeSet::new());
        tokio::spawn(apply_loop(settings, netlink, metrics, wanted_rx, applied_tx));
        Routes { wanted, applied }
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

async fn apply_loop(
    settings: RoutesConfig,
    netlink: Handle,
    metrics: RouteMetrics,
    mut wanted: watch::Receiver<(BTreeSet<IpAddr>, Why)>,
    applied: watch::Sender<BTreeSet<IpAddr>>,
) {
    let mut device: Option<(OwnedFd, u32)> = None;
    let mut held: BTreeSet<IpAddr> = BTreeSet::new();
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { return },
            _ = retry.tick(), if failing => {}
        }
        let (routes, why) = wanted.borrow_and_update().clone();
        if device.is_none() && !routes.is_empty() {
            match make_device(&netlink, &settings.device).await {
                Ok(made) => device = Some(made),
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
        let Some((_, index)) = &device else { continue };
        let mut ok = true;
        for vip in held.clone().difference(&routes) {
            match netlink.route().del(route(*vip, *index, settings.protocol)).execute().await {
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
            match netlink.route().add(route(*vip, *index, settings.protocol)).replace().execute().await {
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

/// Creates the TUN device `name`, held by the returned descriptor, and brings it up. IPv6 is
/// turned on for it where the namespace has it off by default (for `/128` routes).
async fn make_device(netlink: &Handle, name: &str) -> std::io::Result<(OwnedFd, u32)> {
    let find =
        async || crate::netdev::find(netlink, name).await.map_err(|e| std::io::Error::other(e.to_string()));
    if find().await?.is_some() {
        return Err(std::io::Error::other(format!(
            "an interface named {name} exists already (another agent's?)"
        )));
    }
    let fd = open_tun(name)?;
    let index = find()
        .await?
        .ok_or_else(|| std::io::Error::other(format!("{name} vanished after it was made")))?
        .index;
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "0");
    netlink
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| std::io::Error::other(format!("bringing {name} up: {e}")))?;
    info!(device = name, "routed VIPs' device made: its routes end with this process");
    Ok((fd, index))
}

/// `TUNSETIFF` (`_IOW('T', 202, int)`) and its flags, from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// A new, non-persistent TUN device named `name`: the kernel removes it when the descriptor
/// closes.
fn open_tun(name: &str) -> std::io::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!("{name:?} is longer than an interface name may be")));
    }
    // SAFETY: a NUL-terminated path and flags; the result is checked.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid ifreq.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which lives across the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut request) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}
