//! The service-map shell: turns each accepted config into a data-plane plan and applies it,
//! in a task of its own, so map writes and netlink round trips never hold up VRRP (a backup
//! stalled for three advertisement intervals would wrongly take over).

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use lb_common::service::Settings;
use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tracing::{debug, error, info, warn};

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use crate::{
    config::Config,
    dataplane::{ServiceMaps, XdpCounters, neighbors, services::SyncReport},
    error::Result,
    metrics::ResultLabels,
    service_plan,
};

/// How often endpoints' next hops are re-resolved: well inside the kernel's neighbour
/// garbage-collection time (`gc_stale_time`, 60 s by default).
const NEIGHBOR_REFRESH: Duration = Duration::from_secs(20);

/// What to apply: the config's services as seen from `node`.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    pub config: Arc<Config>,
    pub node: String,
    pub node_address: Ipv4Addr,
}

/// The metrics a sync updates.
#[derive(Clone)]
pub struct SyncMetrics {
    pub syncs: Family<ResultLabels, Counter>,
    pub seconds: prometheus_client::metrics::histogram::Histogram,
    pub services: Gauge,
    pub backends: Gauge,
}

pub struct ServiceSync {
    maps: ServiceMaps,
    netlink: rtnetlink::Handle,
    counters: Arc<Mutex<XdpCounters>>,
    metrics: SyncMetrics,
    /// Every endpoint address in the maps, whose next hops are kept resolved.
    endpoints: BTreeSet<Ipv4Addr>,
}

impl ServiceSync {
    pub fn new(
        maps: ServiceMaps,
        netlink: rtnetlink::Handle,
        counters: Arc<Mutex<XdpCounters>>,
        metrics: SyncMetrics,
    ) -> Self {
        Self { maps, netlink, counters, metrics, endpoints: BTreeSet::new() }
    }

    /// Plans and applies `request`, then resolves the endpoints' next hops.
    pub async fn apply(&mut self, request: &SyncRequest) -> Result<SyncReport> {
        let started = std::time::Instant::now();
        let result = self.apply_inner(request).await;
        self.metrics.seconds.observe(started.elapsed().as_secs_f64());
        let label = if result.is_ok() { "applied" } else { "failed" };
        self.metrics.syncs.get_or_create(&ResultLabels { result: label }).inc();
        result
    }

    async fn apply_inner(&mut self, request: &SyncRequest) -> Result<SyncReport> {
        let started = std::time::Instant::now();
        let plan = service_plan::plan(&request.config, &request.node);
        let ports = request.config.dataplane.snat_ports;
        self.maps.set_settings(Settings {
            node_addr: request.node_address.octets(),
            snat_port_min: ports.first,
            snat_port_max: ports.last,
        })?;
        let report = self.maps.apply(&plan)?;
        self.metrics.services.set(plan.services.len() as i64);
        self.metrics.backends.set(self.maps.backends().len() as i64);
        if let Ok(mut counters) = self.counters.lock() {
            counters.set_backends(self.maps.backends().clone());
        }
        let elapsed = started.elapsed();
        if report.is_empty() {
            debug!(services = plan.services.len(), ?elapsed, "service maps already up to date");
        } else {
            info!(?report, services = plan.services.len(), ?elapsed, "service maps updated");
        }
        for (key, service) in &plan.services {
            if service.backends.is_empty() {
                warn!(
                    service = %service.name,
                    vip = %Ipv4Addr::from(key.vip),
                    port = u16::from_be_bytes(key.port),
                    "no usable endpoint: its traffic is dropped"
                );
            }
        }
        self.endpoints = plan.backends().iter().map(|b| Ipv4Addr::from(b.addr)).collect();
        self.warm_neighbors().await;
        Ok(report)
    }

    async fn warm_neighbors(&self) {
        if self.endpoints.is_empty() {
            return;
        }
        if let Err(e) = neighbors::warm(&self.netlink, &self.endpoints).await {
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
                    _ = refresh.tick() => self.warm_neighbors().await,
                }
            }
        })
    }
}
