//! Prometheus metrics, prefixed `lbagent_`. XDP counters are read from the maps at scrape time
//! by a collector, so they are never stale and cost nothing between scrapes.

use std::sync::{Arc, Mutex};

use lb_common::{
    counters::{Reason, XDP_ACTION_COUNT, action_label},
    service::Delivery,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::Gauge,
        histogram::Histogram,
    },
    registry::Registry,
};
use tracing::warn;

use crate::dataplane::XdpCounters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// An error: where it happened, and its [`crate::error::Error::metric_label`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub during: &'static str,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XdpLabels {
    pub interface: String,
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: &'static str,
}

/// The limits a service can be refused by, as `dataplane.capacity` names them: the values
/// of [`LimitLabels`].
pub const LIMITS: [&str; 3] = ["services", "backends", "localEndpoints"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VridLabels {
    pub vrid: u8,
    pub family: &'static str,
}

impl VridLabels {
    pub fn of(id: crate::vrrp::family::InstanceId) -> Self {
        Self { vrid: id.vrid, family: id.family.as_str() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// A group member's address (this node's own included).
    pub member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    pub map: &'static str,
}

/// The agent's own metrics; the XDP collector is registered beside them.
pub struct Metrics {
    pub registry: Registry,
    pub owned_vips: Gauge,
    pub config_reloads: Family<ResultLabels, Counter>,
    pub xdp_attached: Family<XdpLabels, Gauge>,
    pub service_syncs: Family<ResultLabels, Counter>,
    pub service_sync_seconds: Histogram,
    pub services: Gauge,
    pub backends: Gauge,
    pub services_refused: Family<LimitLabels, Gauge>,
    pub services_with_reply_entries: Gauge,
    pub map_bytes: Family<MapLabels, Gauge>,
    pub snat_ports: Gauge,
    pub snat_expired: Counter,
    pub lease_expiries: Family<VridLabels, Counter>,
    pub impersonations: Family<MemberLabels, Counter>,
    pub authentication_keys: Family<GroupLabels, Gauge>,
    pub errors: Family<ErrorLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lbagent");
        let r = &mut registry;
        // Label sets that exist from the start, so a dashboard sees zeros rather than nothing.
        let config_reloads = Family::<ResultLabels, Counter>::default();
        for result in ["applied", "rejected"] {
            let _ = config_reloads.get_or_create(&ResultLabels { result });
        }
        let service_syncs = Family::<ResultLabels, Counter>::default();
        for result in ["applied", "failed"] {
            let _ = service_syncs.get_or_create(&ResultLabels { result });
        }
        let services_refused = Family::<LimitLabels, Gauge>::default();
        for limit in LIMITS {
            let _ = services_refused.get_or_create(&LimitLabels { limit });
        }
        Self {
            owned_vips: registered(r, "owned_vips", Gauge::default()),
            config_reloads: registered(r, "config_reloads", config_reloads),
            xdp_attached: registered(r, "xdp_attached", Family::<XdpLabels, Gauge>::default()),
            service_syncs: registered(r, "service_syncs", service_syncs),
            service_sync_seconds: registered(
                r,
                "service_sync_seconds",
                Histogram::new([0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0]),
            ),
            services: registered(r, "services", Gauge::default()),
            backends: registered(r, "backends", Gauge::default()),
            services_refused: registered(r, "services_refused", services_refused),
            services_with_reply_entries: registered(r, "services_with_reply_entries", Gauge::default()),
            snat_ports: registered(r, "snat_ports", Gauge::default()),
            snat_expired: registered(r, "snat_expired", Counter::default()),
            map_bytes: registered(r, "bpf_map_bytes", Family::<MapLabels, Gauge>::default()),
            lease_expiries: registered(r, "vip_lease_expiries", Family::<VridLabels, Counter>::default()),
            impersonations: registered(
                r,
                "vrrp_impersonated_adverts",
                Family::<MemberLabels, Counter>::default(),
            ),
            authentication_keys: registered(
                r,
                "vrrp_authentication_keys",
                Family::<GroupLabels, Gauge>::default(),
            ),
            errors: registered(r, "errors", Family::<ErrorLabels, Counter>::default()),
            registry,
        }
    }

    pub fn register_xdp(&mut self, counters: Arc<Mutex<XdpCounters>>) {
        self.registry.register_collector(Box::new(XdpCollector { counters }));
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug)]
struct XdpCollector {
    counters: Arc<Mutex<XdpCounters>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VipLabel {
    vip: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
    delivery: &'static str,
}

impl Collector for XdpCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = match self.counters.lock().map(|c| c.snapshot()) {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                warn!(error = %e, "reading XDP counters failed; omitting them from this scrape");
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        let actions: Vec<_> = (0..XDP_ACTION_COUNT)
            .map(|a| (ActionLabel { action: action_label(a) }, snapshot.actions[a as usize]))
            .collect();
        let reasons: Vec<_> =
            Reason::ALL.iter().map(|r| (ReasonLabel { reason: r.label() }, snapshot.reason(*r))).collect();

        counter_family(
            &mut encoder,
            "xdp_packets",
            "Packets by XDP action",
            actions.iter().map(|(l, c)| (l, c.packets)),
        )?;
        counter_family(
            &mut encoder,
            "xdp_bytes",
            "Bytes by XDP action",
            actions.iter().map(|(l, c)| (l, c.bytes)),
        )?;
        counter_family(
            &mut encoder,
            "xdp_reason_packets",
            "Packets by the path the XDP program took",
            reasons.iter().map(|(l, c)| (l, c.packets)),
        )?;
        encode_per_vip(&mut encoder, &snapshot)?;
        encode_per_backend(&mut encoder, &snapshot)
    }
}

/// Per VIP: ARP replies and Neighbor Advertisements, packets and bytes to its services.
fn encode_per_vip(
    encoder: &mut DescriptorEncoder,
    snapshot: &crate::dataplane::counters::CounterSnapshot,
) -> Result<(), std::fmt::Error> {
    let answers = |ipv6: bool| -> Vec<_> {
        snapshot
            .vips
            .iter()
            .filter(|(vip, _)| vip.is_ipv6() == ipv6)
            .map(|(vip, s)| (VipLabel { vip: vip.to_string() }, s.arp_replies))
            .collect()
    };
    counter_family(
        encoder,
        "arp_replies",
        "ARP replies sent from XDP, per IPv4 VIP",
        answers(false).iter().map(|(l, v)| (l, *v)),
    )?;
    counter_family(
        encoder,
        "neighbor_advertisements",
        "Neighbor Advertisements sent from XDP in answer to solicitations, per IPv6 VIP",
        answers(true).iter().map(|(l, v)| (l, *v)),
    )?;
    let vip_traffic: Vec<_> =
        snapshot.vips.iter().map(|(vip, s)| (VipLabel { vip: vip.to_string() }, *s)).collect();
    counter_family(
        encoder,
        "vip_packets",
        "Packets to a VIP's services, per VIP",
        vip_traffic.iter().map(|(l, s)| (l, s.packets)),
    )?;
    counter_family(
        encoder,
        "vip_bytes",
        "Bytes to a VIP's services, per VIP",
        vip_traffic.iter().map(|(l, s)| (l, s.bytes)),
    )?;
    Ok(())
}

/// Per backend: packets and bytes forwarded.
fn encode_per_backend(
    encoder: &mut DescriptorEncoder,
    snapshot: &crate::dataplane::counters::CounterSnapshot,
) -> Result<(), std::fmt::Error> {
    let backends: Vec<_> = snapshot
        .backends
        .iter()
        .map(|(b, c)| {
            let delivery = Delivery::from_u8(b.delivery).map_or("none", Delivery::label);
            (BackendLabel { backend: b.endpoint.to_string(), delivery }, *c)
        })
        .collect();
    counter_family(
        encoder,
        "backend_packets",
        "Packets forwarded to each backend (endpoint address and port)",
        backends.iter().map(|(l, c)| (l, c.packets)),
    )?;
    counter_family(
        encoder,
        "backend_bytes",
        "Bytes forwarded to each backend",
        backends.iter().map(|(l, c)| (l, c.bytes)),
    )
}

/// Each of the agent's own metrics (prefixed `lbagent_`) and its help text.
const HELP: &[(&str, &str)] = &[
    ("config_reloads", "Config reloads on SIGHUP, by result"),
    ("owned_vips", "VIPs in the XDP owned-VIP map"),
    ("xdp_attached", "1 while the XDP program is attached to the interface"),
    ("service_syncs", "Updates of the service maps from a config, by result"),
    ("service_sync_seconds", "How long an update of the service maps took (plan, map writes, next hops)"),
    ("services", "Service entries (VIP, port, protocol) in the data plane"),
    ("backends", "Backends (endpoint and delivery) in the data plane"),
    (
        "services_refused",
        "Service entries left out of the data plane because a map is full, by the capacity setting that was reached",
    ),
    (
        "services_with_reply_entries",
        "Service entries whose local flows keep reply entries (REPLY_NAT) rather than being verified by the connection table: a local endpoint of theirs lists four other services already, or ENDPOINT_SERVICES is full",
    ),
    (
        "snat_ports",
        "Full-NAT source ports held by flows (never evicted; released when idle past dataplane.snatIdleTimeout)",
    ),
    ("snat_expired", "Full-NAT source ports released as idle"),
    (
        "bpf_map_bytes",
        "Kernel memory of the service maps (memlock), by map; MAGLEV_RINGS includes every ring",
    ),
    (
        "vip_lease_expiries",
        "Leases on owned VIPs found run out before the agent renewed them (it was stalled, frozen or not running): the data plane stopped claiming those VIPs meanwhile",
    ),
    (
        "vrrp_impersonated_adverts",
        "VRRP advertisements that impersonate a group member: its address from another MAC while its own is live (seen by XDP), or this node's address from another host",
    ),
    (
        "vrrp_authentication_keys",
        "Keys loaded for each group of this node's that authenticates VRRP; 0 means its key file was never readable, and its instances do not run here",
    ),
    (
        "errors",
        "Errors the agent recovered from, by what it was doing (during: config_reload, service_sync) and kind (error)",
    ),
];

/// `metric`, registered under `name` with its [`HELP`].
fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    metric: M,
) -> M {
    let help = HELP.iter().find(|(n, _)| *n == name).map_or("", |(_, help)| *help);
    debug_assert!(!help.is_empty(), "metric {name} has no help in HELP");
    registry.register(name, help, metric.clone());
    metric
}

fn counter_family<'a, L: EncodeLabelSet + 'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (&'a L, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family =
        encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
    for (labels, value) in values {
        ConstCounter::new(value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_its_help() {
        // `registered` asserts each metric's help (in debug builds, as tests run).
        let text = Metrics::new().encode().unwrap();
        assert!(
            text.contains("# HELP lbagent_config_reloads Config reloads on SIGHUP, by result."),
            "{text}"
        );
        let names: std::collections::BTreeSet<&str> = HELP.iter().map(|(name, _)| *name).collect();
        assert_eq!(names.len(), HELP.len(), "a metric listed twice in HELP");
    }
}
