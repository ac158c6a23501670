//! The Kubernetes shell: watches LoadBalancerGroups, Services, EndpointSlices and Nodes, turns
//! them into a `Config` for the agent (every agent, the same way), and, on the agent holding
//! the Lease, writes addresses, finalizers, Events and group status.
//!
//! Watches reconnect with backoff. The agent keeps the last config it got, so VRRP failover and
//! forwarding go on unchanged while the API server is away.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::core::v1::{Node, Service},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{
    binding::Refusal,
    changes::{Pending, SliceIndex, Touch},
    cluster::ClusterState,
    crd::LoadBalancerGroup,
    lease::LeaseLock,
    slice::Slice,
    source::{self, Changed, ServiceObjects},
    status,
    trim::Trim,
    writer::StatusWriter,
};
use crate::config::Config;

/// How long the Lease lasts: a leader that stops renewing it is followed after this.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the Lease is renewed or tried (client-go's retryPeriod): a released Lease is
/// taken within this.
const LEADER_TICK: Duration = Duration::from_secs(2);
/// How long after a renewal the leader may still write (client-go's renewDeadline).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How long any request but a watch may take to connect, and then to be answered. kube's
/// client waits for an answer for ever by default: behind a partition a Lease renewal waited
/// on TCP's retransmissions, held the shell's loop throughout (no outage logged), and let go
/// ~25 s after the partition healed (cluster_faults_lab).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The shell's clients, from the environment (kubeconfig or in-cluster): `(watches,
/// requests)`. Watches keep kube's defaults (the watcher has its own idle timeout); every
/// other request gets [`REQUEST_TIMEOUT`], and a request that times out is tried again at the
/// next tick or pass.
pub async fn clients() -> Result<(Client, Client), kube::Error> {
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    let watches = Client::try_from(config.clone())?;
    let mut bounded = config;
    bounded.connect_timeout = Some(REQUEST_TIMEOUT);
    bounded.read_timeout = Some(REQUEST_TIMEOUT);
    Ok((watches, Client::try_from(bounded)?))
}

pub struct Shell {
    /// For the watches.
    pub client: Client,
    /// For the Lease and every write (see [`clients`]).
    pub requests: Client,
    /// For `interfaceFromIP`: which interface this node routes each address through.
    pub netlink: rtnetlink::Handle,
    /// The agent-level settings (interface, listen, data plane) the cluster's groups and
    /// services are added to.
    pub base: Config,
    pub node: String,
    /// Where the Lease lives: the agent's own namespace.
    pub namespace: String,
}

/// A watch into a store of trimmed objects (see [`Trim`]), and what each of its events
/// touched (see [`Touch`]).
fn watch_into<K>(api: Api<K>, touch: fn(&watcher::Event<K>) -> Touch) -> (Store<K>, BoxStream<'static, Touch>)
where
    K: Resource + Trim + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    // A failing watch is retried with backoff; it is reported when it starts failing and
    // when it works again, not at every retry of an outage.
    let mut failing = false;
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(Trim::trim)
        .reflect(writer)
        .map(move |event| match event {
            Ok(event) => {
                if std::mem::take(&mut failing) {
                    info!(kind, "watch working again");
                }
                touch(&event)
            }
            Err(e) => {
                if std::mem::replace(&mut failing, true) {
                    debug!(kind, error = %e, "watch failed again; retrying with backoff");
                } else {
                    warn!(kind, error = %e, "watch failed; retrying with backoff (reported again when it works)");
                }
                Touch::Nothing
            }
        })
        .boxed();
    (reader, stream)
}

fn snapshot<K: Resource + Clone>(store: &Store<K>) -> Vec<std::sync::Arc<K>>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state()
}

/// The touched Services' objects, from the stores.
fn objects_of(
    pending: &Pending,
    services: &Store<Service>,
    slices: &Store<Slice>,
    index: &SliceIndex,
) -> Vec<ServiceObjects> {
    pending
        .services
        .iter()
        .map(|(namespace, name)| ServiceObjects {
            namespace: namespace.clone(),
            name: name.clone(),
            service: services.get(&ObjectRef::new(name).within(namespace)),
            slices: index
                .slices(namespace, name)
                .filter_map(|slice| slices.get(&ObjectRef::new(slice).within(namespace)))
                .collect(),
        })
        .collect()
}

/// What the rest of the agent tells the cluster side.
pub struct FromAgent {
    /// Who this node's VRRP sees as Master of each VIP, by node name (for group status).
    pub owners: watch::Receiver<BTreeMap<std::net::IpAddr, String>>,
    /// The Services this node's data plane has no room for, with why (for their condition
    /// and Events).
    pub refused: watch::Receiver<BTreeMap<String, String>>,
    /// Routers outside a group heard advertising one of its VRIDs: (group, VRID, source).
    pub foreign: watch::Receiver<ForeignRouters>,
    /// Group members impersonated on the segment: (group, member, how).
    pub impersonated: watch::Receiver<Impersonations>,
}

/// See [`FromAgent::foreign`].
pub type ForeignRouters =
    std::collections::BTreeSet<(String, crate::vrrp::family::InstanceId, std::net::IpAddr)>;

/// See [`FromAgent::impersonated`].
pub type Impersonations = std::collections::BTreeSet<(String, std::net::IpAddr, String)>;

impl Shell {
    /// Runs until the agent stops: sends each new config on `configs`, and reports what
    /// `from_agent` says (see [`FromAgent`]).
    /// When `stopping` turns true (a graceful stop), a leader releases its Lease, so another
    /// agent leads within a tick instead of after the Lease's duration, and the shell ends.
    pub async fn run(
        self,
        configs: mpsc::Sender<Config>,
        from_agent: FromAgent,
        mut stopping: watch::Receiver<bool>,
    ) {
        let FromAgent { owners, mut refused, mut foreign, mut impersonated } = from_agent;
        // Foreign routers and impersonations already reported by this agent, each once.
        let mut reported = ForeignRouters::new();
        let mut reported_impersonations = Impersonations::new();
        let (stores, mut changes, _watches) = self.watch();
        let lease = LeaseLock::new(self.requests.clone(), &self.namespace, self.node.clone(), LEASE_DURATION);
        let mut writer = StatusWriter::new(self.requests.clone(), self.node.clone());
        let mut tick = tokio::time::interval(LEADER_TICK);
        // After a long pass, one renewal, not one for every tick missed meanwhile.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when the Lease's reads or writes fail (the API server is out of reach, say).
        let mut unanswered: Option<std::time::Instant> = None;
        let mut state = Passes::default();
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let Some(touch) = change else { return };
                    state.pending.record(touch, &mut state.index);
                    // Handled at once, with every change already queued: a burst is coalesced by
                    // the time a pass takes, not by a fixed wait that every event would pay.
                    while let Ok(touch) = changes.try_recv() {
                        state.pending.record(touch, &mut state.index);
                    }
                }
                Ok(()) = refused.changed() => state.status_due = true,
                // Problems of this node's segment, so every agent reports what it hears, once.
                Ok(()) = foreign.changed() => {
                    let heard = foreign.borrow_and_update().clone();
                    let news = heard.difference(&reported).map(|(group, vrid, source)| {
                        (group.as_str(), foreign_vrid_message(vrid, source))
                    });
                    warn_groups(&writer, "ForeignVrid", news).await;
                    reported = heard;
                    continue;
                }
                Ok(()) = impersonated.changed() => {
                    let heard = impersonated.borrow_and_update().clone();
                    let news = heard.difference(&reported_impersonations).map(|(group, member, how)| {
                        (group.as_str(), impersonation_message(member, how))
                    });
                    warn_groups(&writer, "Impersonation", news).await;
                    reported_impersonations = heard;
                    continue;
                }
                Ok(()) = stopping.changed() => {
                    if *stopping.borrow() {
                        return state.stop(&lease).await;
                    }
                    continue;
                }
                _ = tick.tick() => state.renew(&lease, &mut writer, &mut unanswered).await,
            }
            if !stores.ready() {
                continue;
            }
            let Some((mut cluster, whole)) = self.pass(&stores, &mut state, &mut writer, &configs).await
            else {
                return;
            };
            if state.leading && state.status_due {
                if !whole {
                    cluster.services = snapshot(&stores.services);
                    cluster.slices = snapshot(&stores.slices);
                }
                state.status_due = false;
                self.write_status(cluster, &mut state, &mut writer, &mut refused, &owners).await;
            }
        }
    }

    /// Starts a watch of each kind into its store, each in a task of its own so the stores
    /// follow the API server while the loop is busy: a leader's pass of thousands of writes
    /// otherwise left its own watches unread (an HTTP/1 body is read only as it is polled),
    /// its cache fell behind for good, and every pass planned the same writes again (`cargo
    /// xtask bench control` found it). Returns the stores, their changes, and the tasks.
    fn watch(&self) -> (Stores, mpsc::UnboundedReceiver<Touch>, tokio::task::JoinSet<()>) {
        let (groups, g) = watch_into(Api::<LoadBalancerGroup>::all(self.client.clone()), Touch::of_other);
        let (services, s) = watch_into(Api::<Service>::all(self.client.clone()), Touch::of_service);
        let (slices, e) = watch_into(Api::<Slice>::all(self.client.clone()), Touch::of_slice);
        let (nodes, n) = watch_into(Api::<Node>::all(self.client.clone()), Touch::of_other);
        let (touches, changes) = mpsc::unbounded_channel();
        let mut watches = tokio::task::JoinSet::new();
        for mut stream in [g, s, e, n] {
            let touches = touches.clone();
            watches.spawn(async move {
                while let Some(touch) = stream.next().await {
                    if touches.send(touch).is_err() {
                        return;
                    }
                }
            });
        }
        (Stores { groups, services, slices, nodes }, changes, watches)
    }

    /// One pass: the cluster's state (with the Services and slices when the pass needs them
    /// all), this node's group addresses published, and the changes translated into a config
    /// for the agent. Returns the state and whether it holds every Service and slice, or
    /// `None` once the agent is gone.
    async fn pass(
        &self,
        stores: &Stores,
        state: &mut Passes,
        writer: &mut StatusWriter,
        configs: &mpsc::Sender<Config>,
    ) -> Option<(ClusterState, bool)> {
        let mut cluster = self.cluster_state(stores, &mut state.published).await;
        let changes = std::mem::take(&mut state.pending);
        state.status_due |= changes.all || changes.service_objects;
        // A pass of only changed Services reads them from the stores, and nothing else.
        let whole =
            changes.all || state.leading && state.status_due || state.translator.needs_everything(&cluster);
        if whole {
            cluster.services = snapshot(&stores.services);
            cluster.slices = snapshot(&stores.slices);
        }
        let changed = if changes.all {
            state.index = SliceIndex::of(cluster.slices.iter().map(|s| s.as_ref()));
            Changed::All
        } else if changes.services.is_empty() {
            Changed::Services(Vec::new())
        } else {
            Changed::Services(objects_of(&changes, &stores.services, &stores.slices, &state.index))
        };
        let started = std::time::Instant::now();
        let translated = state.translator.translate_changed(&cluster, &self.base, changed);
        debug!(
            touched = changes.services.len(),
            everything = whole,
            rebuilt = state.translator.rebuilt(),
            elapsed = ?started.elapsed(),
            "cluster objects translated"
        );
        match translated {
            Ok(translation) => {
                report_refusals(&translation.refusals, &state.refusals, writer).await;
                state.refusals = translation.refusals;
                state.unserved = translation.unserved;
                if state.last.as_ref() != Some(&translation.config) {
                    state.last = Some(translation.config.clone());
                    configs.send(translation.config).await.ok()?;
                }
            }
            Err(e) => {
                state.pending.all = true;
                warn!(error = %e, "the cluster's objects give an invalid config; keeping the last one")
            }
        }
        Some((cluster, whole))
    }

    /// The groups and nodes now, with each group interface's route (`interfaceFromIP`) and
    /// link looked up once a pass; this node's addresses on its groups' interfaces published.
    /// Services and slices are left to the pass.
    async fn cluster_state(&self, stores: &Stores, published: &mut Option<GroupAddresses>) -> ClusterState {
        let groups = snapshot(&stores.groups);
        let mut routes = BTreeMap::new();
        for ip in groups.iter().filter_map(|g| g.spec.interface_from_ip) {
            match crate::netdev::route_interface(&self.netlink, ip).await {
                Ok(Some(name)) => {
                    routes.insert(ip, name);
                }
                Ok(None) => {}
                Err(e) => warn!(%ip, error = %e, "looking up the route for interfaceFromIP failed"),
            }
        }
        // For the missing interfaces, and for the addresses this node publishes there.
        let mut links = BTreeMap::new();
        for name in groups.iter().filter_map(|g| g.spec.interface.as_ref()).chain(routes.values()) {
            if !links.contains_key(name)
                && let Ok(link) = crate::netdev::find(&self.netlink, name).await
            {
                links.insert(name.clone(), link);
            }
        }
        let missing_interfaces = groups
            .iter()
            .filter_map(|g| g.spec.interface.as_ref())
            .filter(|name| matches!(links.get(*name), Some(None)))
            .cloned()
            .collect();
        let nodes = snapshot(&stores.nodes);
        self.publish_group_addresses(&groups, &nodes, &routes, &links, published).await;
        ClusterState { groups, services: Vec::new(), slices: Vec::new(), nodes, routes, missing_interfaces }
    }

    /// The leader plans the cluster's status from `cluster` and writes what changed.
    async fn write_status(
        &self,
        cluster: ClusterState,
        state: &mut Passes,
        writer: &mut StatusWriter,
        refused: &mut watch::Receiver<BTreeMap<String, String>>,
        owners: &watch::Receiver<BTreeMap<std::net::IpAddr, String>>,
    ) {
        let Some(config) = &state.last else { return };
        let planned = crate::node_plan::node_plan(config, &self.node);
        let refused = refused.borrow_and_update().clone();
        let mut writes = status::writes(
            &cluster,
            &owners.borrow().clone(),
            &planned,
            &refused,
            &state.unserved,
            &Timestamp::now().to_string(),
        );
        status::keep_written_times(&mut writes, &state.written);
        if writes != status::StatusWrites::default()
            && let Err(e) =
                writer.apply(&writes).await.inspect(|()| state.written.extend(writes.conditions.clone()))
        {
            warn!(error = %e, "writing status failed; retrying on the next change");
        }
    }
}

/// Logs each refusal when it appears, not again with every change. Group problems are this
/// node's own (its interfaces): each agent reports them as Events too. Service problems are
/// the leader's to report.
async fn report_refusals(refusals: &[Refusal], before: &[Refusal], writer: &StatusWriter) {
    if refusals == before {
        return;
    }
    for refusal in refusals.iter().filter(|r| !before.contains(r)) {
        warn!(object = %refusal.service, reason = refusal.reason, "{}", refusal.message);
        if let Some(group) = refusal.service.strip_prefix(super::source::GROUP_REFUSAL_PREFIX)
            && let Err(e) = writer.group_warning(group, refusal.reason, &refusal.message).await
        {
            warn!(error = %e, "publishing an Event failed");
        }
    }
}

fn foreign_vrid_message(vrid: &crate::vrrp::family::InstanceId, source: &std::net::IpAddr) -> String {
    format!(
        "VRID {vrid} is advertised by {source}, which is not a member of this group; its advertisements are \
         dropped. Add the VRID to excludedVrids, or find who sends them"
    )
}

fn impersonation_message(member: &std::net::IpAddr, how: &str) -> String {
    format!(
        "VRRP advertisements with the address of member {member} come {how}: a host on the segment may be \
         impersonating it (VRRPv3 has no authentication)"
    )
}

/// One Warning Event on each group of `news` (group, message), with `reason`.
async fn warn_groups<'g>(writer: &StatusWriter, reason: &str, news: impl Iterator<Item = (&'g str, String)>) {
    for (group, message) in news {
        if let Err(e) = writer.group_warning(group, reason, &message).await {
            warn!(error = %e, "publishing an Event failed");
        }
    }
}

/// Takes or renews the leader Lease: whether this agent leads. An outage (`unanswered`, since
/// when) is logged once, and its end.
async fn try_lead(
    lease: &LeaseLock,
    writer: &mut StatusWriter,
    unanswered: &mut Option<std::time::Instant>,
) -> bool {
    let tried = std::time::Instant::now();
    match lease.try_lead().await {
        Ok(leading) => {
            // client-go's renew deadline: writes stop well before the Lease could pass to
            // another agent.
            writer.lead_until = leading.then(|| tried + RENEW_DEADLINE);
            if let Some(since) = unanswered.take() {
                info!(after = ?since.elapsed(), "the API server answers again");
            }
            leading
        }
        Err(e) => {
            // Once per outage: VRRP and forwarding never wait on the API server.
            if unanswered.is_none() {
                warn!(error = %e, "the leader Lease cannot be read or renewed: not leading; VRRP, \
                    ownership and forwarding carry on with the cluster's last state");
                *unanswered = Some(std::time::Instant::now());
            } else {
                debug!(error = %e, "the leader Lease still cannot be read or renewed");
            }
            false
        }
    }
}

impl Shell {
    /// Publishes this node's addresses on its groups' interfaces: the IPv4 one on each
    /// interface other than the default uplink ([`source::GROUP_ADDRESSES_ANNOTATION`]; a
    /// Node's InternalIP is its default uplink's), and the IPv6 link-local one on every one
    /// ([`source::GROUP_ADDRESSES6_ANNOTATION`]; no Node field has it). The other members learn
    /// them from there. Patched only when the Node says otherwise, and not again until the
    /// watch has shown the last patch.
    async fn publish_group_addresses(
        &self,
        groups: &[std::sync::Arc<LoadBalancerGroup>],
        nodes: &[std::sync::Arc<Node>],
        routes: &BTreeMap<std::net::IpAddr, String>,
        links: &BTreeMap<String, Option<crate::netdev::Interface>>,
        published: &mut Option<GroupAddresses>,
    ) {
        let Some(me) = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(self.node.as_str())) else {
            return;
        };
        let mut addresses = GroupAddresses::default();
        for group in groups.iter().filter(|g| source::selects(g, me)) {
            let interface = match (&group.spec.interface, &group.spec.interface_from_ip) {
                (Some(interface), _) => interface,
                (None, Some(ip)) => match routes.get(ip) {
                    Some(interface) => interface,
                    None => continue,
                },
                (None, None) => continue,
            };
            let Some(Some(link)) = links.get(interface) else { continue };
            let name = group.metadata.name.clone().unwrap_or_default();
            if let Ok(Some(address6)) = crate::netdev::link_local_ipv6(&self.netlink, link.index).await {
                addresses.ipv6.insert(name.clone(), address6);
            }
            if *interface == self.base.interface {
                continue;
            }
            if let Ok(Some(address)) = crate::netdev::primary_ipv4(&self.netlink, link.index).await {
                addresses.ipv4.insert(name, address);
            }
        }
        let on_node =
            GroupAddresses { ipv4: source::published_addresses(me), ipv6: source::published_addresses6(me) };
        // What was published is remembered until the Node shows it: a pass that sees the
        // Node before its watch does (or misses an address for a moment, the Node showing
        // none) then neither patches again nor forgets it (found by the lab once the watches
        // ran beside the loop: the same patch twice).
        if published.as_ref() == Some(&on_node) {
            *published = None;
        }
        if on_node == addresses || published.as_ref() == Some(&addresses) {
            return;
        }
        fn annotation<A: serde::Serialize>(addresses: &BTreeMap<String, A>) -> serde_json::Value {
            if addresses.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::Value::String(serde_json::to_string(addresses).unwrap_or_default())
            }
        }
        let patch = serde_json::json!({"metadata": {"annotations": {
            source::GROUP_ADDRESSES_ANNOTATION: annotation(&addresses.ipv4),
            source::GROUP_ADDRESSES6_ANNOTATION: annotation(&addresses.ipv6),
        }}});
        let api: Api<Node> = Api::all(self.requests.clone());
        match api
            .patch(&self.node, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(ipv4 = ?addresses.ipv4, ipv6 = ?addresses.ipv6, "published this node's addresses on its groups' interfaces");
                *published = Some(addresses);
            }
            Err(e) => {
                warn!(error = %e, "publishing this node's group addresses failed; retrying on the next change")
            }
        }
    }
}

/// This node's addresses on its groups' interfaces, as it publishes them.
#[derive(Debug, Default, PartialEq)]
struct GroupAddresses {
    ipv4: BTreeMap<String, Ipv4Addr>,
    ipv6: BTreeMap<String, std::net::Ipv6Addr>,
}

trait Ready {
    fn is_ready(&self) -> bool;
}

impl<K: Resource + Clone> Ready for Store<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The first list has arrived, so the snapshot is the cluster's, not an empty start.
    fn is_ready(&self) -> bool {
        self.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
    }
}

mod passes;

use passes::{Passes, Stores};

#[cfg(test)]
mod tests;
