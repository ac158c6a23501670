//! The service-map shell: turns each accepted config into a change of the map contents and
//! applies it, in a task of its own, so map writes and netlink round trips never hold up VRRP
//! (a backup stalled for three advertisement intervals would wrongly take over).
//!
//! Each request carries a generation; the task publishes the last one applied, so the agent
//! can hold back VIPs whose services are not in the maps yet.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::Duration,
};

use lb_common::service::{Addr4, Addr6, Address, Settings};
use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tracing::{debug, error, info, warn};

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use crate::{
    config::Config,
    dataplane::{
        ServiceMaps, ServiceMapsByFamily, XdpCounters,
        neighbors::NextHops,
        services::{RefusedService, SyncReport, entry},
    },
    error::Result,
    map_contents::IncrementalContents,
    metrics::{ErrorLabels, LIMITS, LimitLabels, MapLabels, ResultLabels},
};

/// How often full NAT's idle source ports are looked for.
const SNAT_EXPIRY_EVERY: Duration = Duration::from_secs(10);

/// How often endpoints' next hops are re-resolved: well inside the kernel's neighbour
/// garbage-collection time (`gc_stale_time`, 60 s by default).
const NEIGHBOR_REFRESH: Duration = Duration::from_secs(20);

/// What to apply: the config's services as seen from `node`.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    pub config: Arc<Config>,
    pub node: String,
    pub node_address: Ipv4Addr,
    /// The uplink slot each VIP is served on (absent: any), shared while it is unchanged.
    pub vip_uplinks: Arc<std::collections::HashMap<IpAddr, u8>>,
    /// Increases with every request; published once applied.
    pub generation: u64,
}

impl SyncRequest {
    /// The first request, generation 0.
    pub fn first(
        config: Arc<Config>,
        node: String,
        node_address: Ipv4Addr,
        vip_uplinks: Arc<std::collections::HashMap<IpAddr, u8>>,
    ) -> Self {
        SyncRequest { config, node, node_address, vip_uplinks, generation: 0 }
    }
}

/// The metrics a sync updates.
#[derive(Clone)]
pub struct SyncMetrics {
    pub syncs: Family<ResultLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub seconds: prometheus_client::metrics::histogram::Histogram,
    pub services: Gauge,
    pub backends: Gauge,
    pub refused: Family<LimitLabels, Gauge>,
    pub with_reply_entries: Gauge,
    pub map_bytes: Family<MapLabels, Gauge>,
    pub snat_ports: Gauge,
    pub snat_expired: prometheus_client::metrics::counter::Counter,
}

/// One family's maps and the contents that follow the config into them.
struct FamilySync<A: Address> {
    maps: ServiceMaps<A>,
    contents: IncrementalContents<A>,
}

impl<A: Address> FamilySync<A> {
    fn new(maps: ServiceMaps<A>) -> Self {
        Self { maps, contents: IncrementalContents::default() }
    }

    /// Plans `request` for this family and applies it; tells `counters` the slots when they
    /// moved (or `remap`).
    fn apply(
        &mut self,
        request: &SyncRequest,
        counters: &Mutex<XdpCounters>,
        remap: bool,
    ) -> Result<SyncReport> {
        let delta = self.contents.update(&request.config, &request.node);
        let moved = self.maps.set_vip_uplinks(request.vip_uplinks.clone())?;
        if moved > 0 {
            debug!(services = moved, "services moved to another uplink");
        }
        let report = self.maps.apply_delta(&delta)?;
        let slots_moved =
            report.backends_added + report.backends_removed + report.services_added + report.services_removed
                > 0;
        if (slots_moved || remap)
            && let Ok(mut counters) = counters.lock()
        {
            counters.set_backends(self.maps.backends());
            counters.set_vip_slots::<A>(self.maps.vip_slots());
        }
        for (key, service) in delta.services.iter().filter_map(|(k, s)| Some((k, s.as_ref()?))) {
            if service.backends.is_empty() {
                warn!(service = %service.name, entry = %entry(key), "no usable endpoint: its traffic is dropped");
            }
        }
        Ok(report)
    }
}

pub struct ServiceSync {
    v4: FamilySync<Addr4>,
    v6: FamilySync<Addr6>,
    netlink: rtnetlink::Handle,
    counters: Arc<Mutex<XdpCounters>>,
    metrics: SyncMetrics,
    next_hops: NextHops,
    /// Refused services last logged, so each refusal is logged once.
    refused: Vec<RefusedService>,
    /// The refused services by config name (`namespace/name` from Kubernetes), with why.
    refused_names: watch::Sender<BTreeMap<String, String>>,
    /// The generation of the last request applied (or failed: it was tried).
    applied: watch::Sender<u64>,
    /// Whether the counters know the slots yet: a restarted agent adopts pinned backends and
    /// VIP slots without adding any, and its first sync must still tell the counters.
    counters_mapped: bool,
}

impl ServiceSync {
    pub fn new(
        maps: ServiceMapsByFamily,
        netlink: rtnetlink::Handle,
        counters: Arc<Mutex<XdpCounters>>,
        metrics: SyncMetrics,
        refused_names: watch::Sender<BTreeMap<String, String>>,
    ) -> Self {
        Self {
            refused_names,
            v4: FamilySync::new(maps.v4),
            v6: FamilySync::new(maps.v6),
            netlink,
            counters,
            metrics,
            next_hops: NextHops::default(),
            refused: Vec::new(),
            applied: watch::channel(0).0,
            counters_mapped: false,
        }
    }

    /// The generation of the last request applied.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Plans and applies `request`, then resolves new endpoints' next hops.
    pub async fn apply(&mut self, request: &SyncRequest) -> Result<SyncReport> {
        let started = std::time::Instant::now();
        let result = self.apply_inner(request);
        self.metrics.seconds.observe(started.elapsed().as_secs_f64());
        let label = if result.is_ok() { "applied" } else { "failed" };
        self.metrics.syncs.get_or_create(&ResultLabels { result: label }).inc();
        if let Err(e) = &result {
            self.metrics
                .errors
                .get_or_create(&ErrorLabels { during: "service_sync", error: e.metric_label() })
                .inc();
        }
        self.applied.send_replace(request.generation);
        if let Err(e) = self.v4.maps.remove_retired_rings().and_then(|()| self.v6.maps.remove_retired_rings())
        {
            warn!(error = %e, "removing replaced Maglev rings failed; they are retried on the next sync");
        }
        self.resolve_next_hops().await;
        result
    }

    fn apply_inner(&mut self, request: &SyncRequest) -> Result<SyncReport> {
        let started = std::time::Instant::now();
        let ports = request.config.dataplane.snat_ports;
        self.v4.maps.set_settings(Settings {
            node_addr: request.node_address.octets(),
            snat_port_min: ports.first,
            snat_port_max: ports.last,
        })?;
        let remap = !self.counters_mapped;
        let mut report = self.v4.apply(request, &self.counters, remap)?;
        report.add(self.v6.apply(request, &self.counters, remap)?);
        self.counters_mapped = true;
        let elapsed = started.elapsed();
        let services = self.v4.maps.service_count() + self.v6.maps.service_count();
        self.metrics.services.set(services as i64);
        self.metrics.backends.set((self.v4.maps.backends().len() + self.v6.maps.backends().len()) as i64);
        let with_reply_entries =
            self.v4.maps.services_with_reply_entries() + self.v6.maps.services_with_reply_entries();
        self.metrics.with_reply_entries.set(with_reply_entries as i64);
        let counts = SyncCounts::from(&report);
        if report.is_empty() {
            debug!(services, ?elapsed, "service maps already up to date");
        } else {
            info!(?counts, services, ?elapsed, "service maps updated");
        }
        self.report_refusals(&report.refused);
        // Both families report MAGLEV_RINGS (their own rings in the one map): summed.
        let mut memory: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (map, bytes) in self.v4.maps.memory().into_iter().chain(self.v6.maps.memory()) {
            *memory.entry(map).or_default() += bytes;
        }
        for (map, bytes) in memory {
            self.metrics.map_bytes.get_or_create(&MapLabels { map }).set(bytes as i64);
        }
        Ok(report)
    }

    /// Logs each refusal once, and keeps the refused-services gauge.
    fn report_refusals(&mut self, refused: &[RefusedService]) {
        for r in refused.iter().filter(|r| !self.refused.contains(r)) {
            warn!(service = %r.name, entry = %r.entry, reason = %r.refusal, "service refused: the data plane is full; the other services keep forwarding");
        }
        for r in self.refused.iter().filter(|r| !refused.contains(r)) {
            info!(service = %r.name, entry = %r.entry, "a refused service fits now, or is gone");
        }
        for limit in LIMITS {
            let count = refused.iter().filter(|r| r.refusal.what == limit).count();
            self.metrics.refused.get_or_create(&LimitLabels { limit }).set(count as i64);
        }
        self.refused = refused.to_vec();
        let names: BTreeMap<String, String> =
            refused.iter().map(|r| (r.name.clone(), format!("{}: {}", r.entry, r.refusal))).collect();
        self.refused_names.send_if_modified(|current| {
            let changed = *current != names;
            *current = names;
            changed
        });
    }

    /// Removes full NAT's source ports idle past `idle`, and exports how many are held.
    pub fn expire_snat(&mut self, idle: Duration) {
        let now = crate::dataplane::leases::monotonic_ns();
        let expired = self.v4.maps.expire_snat(now, idle).and_then(|four| {
            let six = self.v6.maps.expire_snat(now, idle)?;
            Ok(crate::dataplane::snat::Expiry {
                kept: four.kept + six.kept,
                removed: four.removed + six.removed,
            })
        });
        match expired {
            Ok(expiry) => {
                self.metrics.snat_ports.set(expiry.kept as i64);
                self.metrics.snat_expired.inc_by(expiry.removed as u64);
                if expiry.removed > 0 {
                    debug!(
                        removed = expiry.removed,
                        kept = expiry.kept,
                        "idle full-NAT source ports released"
                    );
                }
            }
            Err(e) => warn!(error = %e, "releasing idle full-NAT source ports failed; retried shortly"),
        }
    }

    async fn resolve_next_hops(&mut self) {
        let (mut added, mut removed) = self.v4.maps.take_address_changes();
        let (added6, removed6) = self.v6.maps.take_address_changes();
        added.extend(added6);
        removed.extend(removed6);
        if added.is_empty() && removed.is_empty() {
            return;
        }
        if let Err(e) = self.next_hops.update(&self.netlink, &added, &removed).await {
            warn!(error = %e, "resolving endpoints' next hops failed");
        }
    }

    /// Applies every later request (the latest wins when several arrive at once) and keeps
    /// next hops resolved, until the sender goes away.
    pub fn spawn(mut self, mut requests: watch::Receiver<SyncRequest>) -> JoinHandle<()> {
        tokio::spawn(async move {
            // Start-up already resolved them: the first refresh is one period away.
            let mut refresh = tokio::time::interval_at(Instant::now() + NEIGHBOR_REFRESH, NEIGHBOR_REFRESH);
            refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut expiry = tokio::time::interval(SNAT_EXPIRY_EVERY);
            expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    changed = requests.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let request = requests.borrow_and_update().clone();
                        if let Err(e) = self.apply(&request).await {
                            error!(error = %e, "updating the service maps failed; the previous services stay in force");
                        }
                    }
                    _ = refresh.tick() => {
                        if let Err(e) = self.next_hops.refresh(&self.netlink).await {
                            warn!(error = %e, "refreshing endpoints' next hops failed");
                        }
                    }
                    _ = expiry.tick() => {
                        let idle = requests.borrow().config.dataplane.snat_idle_timeout;
                        self.expire_snat(idle);
                    }
                }
            }
        })
    }
}

/// A [`SyncReport`] without its list of refused services, for the log.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
struct SyncCounts {
    services_added: usize,
    services_changed: usize,
    services_removed: usize,
    rings_written: usize,
    backends_added: usize,
    backends_removed: usize,
    local_endpoints_changed: usize,
    refused: usize,
}

impl From<&SyncReport> for SyncCounts {
    fn from(r: &SyncReport) -> Self {
        Self {
            services_added: r.services_added,
            services_changed: r.services_changed,
            services_removed: r.services_removed,
            rings_written: r.rings_written,
            backends_added: r.backends_added,
            backends_removed: r.backends_removed,
            local_endpoints_changed: r.local_endpoints_changed,
            refused: r.refused.len(),
        }
    }
}
