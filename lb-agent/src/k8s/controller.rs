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
    changes::{Pending, SliceIndex, Touch},
    cluster::ClusterState,
    crd::LoadBalancerGroup,
    lease::LeaseLock,
    slice::Slice,
    source::{self, Changed, ServiceObjects, Translator},
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
        let (groups, g) = watch_into(Api::<LoadBalancerGroup>::all(self.client.clone()), Touch::of_other);
        let (services, s) = watch_into(Api::<Service>::all(self.client.clone()), Touch::of_service);
        let (slices, e) = watch_into(Api::<Slice>::all(self.client.clone()), Touch::of_slice);
        let (nodes, n) = watch_into(Api::<Node>::all(self.client.clone()), Touch::of_other);
        // The watches run in tasks of their own, so the stores follow the API server while this
        // loop is busy: a leader's pass of thousands of writes otherwise left its own watches
        // unread (an HTTP/1 body is read only as it is polled), its cache fell behind for good,
        // and every pass planned the same writes again (`cargo xtask bench control` found it).
        let (touches, mut changes) = mpsc::unbounded_channel();
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
        drop(touches);
        let lease = LeaseLock::new(self.requests.clone(), &self.namespace, self.node.clone(), LEASE_DURATION);
        let mut writer = StatusWriter::new(self.requests.clone(), self.node.clone());
        let mut tick = tokio::time::interval(LEADER_TICK);
        // After a long pass, one renewal, not one for every tick missed meanwhile.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading = false;
        // The Service conditions written while leading (see status::keep_written_times).
        let mut written = status::Written::new();
        // Since when the Lease's reads or writes fail (the API server is out of reach, say).
        let mut unanswered: Option<std::time::Instant> = None;
        let mut last: Option<Config> = None;
        let mut refusals = Vec::new();
        // The group addresses last patched onto this node, until the watch shows them.
        let mut published = None;
        let mut unserved = Vec::new();
        let mut translator = Translator::default();
        let mut index = SliceIndex::default();
        // Until a pass succeeds, and after one fails, the next one translates everything.
        let mut pending = Pending { all: true, ..Pending::default() };
        // Whether the leader's status may have changed since it was last planned.
        let mut status_due = true;
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let Some(touch) = change else { return };
                    pending.record(touch, &mut index);
                    // Handled at once, with every change already queued: a burst is coalesced by
                    // the time a pass takes, not by a fixed wait that every event would pay.
                    while let Ok(touch) = changes.try_recv() {
                        pending.record(touch, &mut index);
                    }
                }
                Ok(()) = refused.changed() => status_due = true,
                Ok(()) = foreign.changed() => {
                    // A problem of this node's segment, so every agent reports what it hears.
                    let heard = foreign.borrow_and_update().clone();
                    for (group, vrid, source) in heard.difference(&reported) {
                        let message = format!(
                            "VRID {vrid} is advertised by {source}, which is not a member of this group; its \
                             advertisements are dropped. Add the VRID to excludedVrids, or find who sends them"
                        );
                        if let Err(e) = writer.group_warning(group, "ForeignVrid", &message).await {
                            warn!(error = %e, "publishing an Event failed");
                        }
                    }
                    reported = heard;
                    continue;
                }
                Ok(()) = impersonated.changed() => {
                    let heard = impersonated.borrow_and_update().clone();
                    for (group, member, how) in heard.difference(&reported_impersonations) {
                        let message = format!(
                            "VRRP advertisements with the address of member {member} come {how}: a host on the \
                             segment may be impersonating it (VRRPv3 has no authentication)"
                        );
                        if let Err(e) = writer.group_warning(group, "Impersonation", &message).await {
                            warn!(error = %e, "publishing an Event failed");
                        }
                    }
                    reported_impersonations = heard;
                    continue;
                }
                Ok(()) = stopping.changed() => {
                    if !*stopping.borrow() {
                        continue;
                    }
                    if leading {
                        match lease.release().await {
                            Ok(()) => info!("stopping: leader Lease released"),
                            Err(e) => warn!(error = %e, "releasing the leader Lease failed; it expires instead"),
                        }
                    }
                    return;
                }
                _ = tick.tick() => {
                    status_due = true;
                    let was = leading;
                    let tried = std::time::Instant::now();
                    leading = match lease.try_lead().await {
                        Ok(leading) => {
                            // client-go's renew deadline: writes stop well before the Lease
                            // could pass to another agent.
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
                                unanswered = Some(std::time::Instant::now());
                            } else {
                                debug!(error = %e, "the leader Lease still cannot be read or renewed");
                            }
                            false
                        }
                    };
                    if leading != was {
                        info!(leading, "leader Lease");
                        // Another leader may have written since.
                        written.clear();
                    }
                }
            }
            let ready = [groups.is_ready(), services.is_ready(), slices.is_ready(), nodes.is_ready()];
            if ready.contains(&false) {
                continue;
            }
            let groups_now = snapshot(&groups);
            let mut routes = BTreeMap::new();
            for ip in groups_now.iter().filter_map(|g| g.spec.interface_from_ip) {
                match crate::netdev::route_interface(&self.netlink, ip).await {
                    Ok(Some(name)) => {
                        routes.insert(ip, name);
                    }
                    Ok(None) => {}
                    Err(e) => warn!(%ip, error = %e, "looking up the route for interfaceFromIP failed"),
                }
            }
            // Each group interface's link, looked up once a pass: for the missing ones, and for
            // the addresses this node publishes there.
            let mut links = BTreeMap::new();
            for name in groups_now.iter().filter_map(|g| g.spec.interface.as_ref()).chain(routes.values()) {
                if !links.contains_key(name)
                    && let Ok(link) = crate::netdev::find(&self.netlink, name).await
                {
                    links.insert(name.clone(), link);
                }
            }
            let missing_interfaces = groups_now
                .iter()
                .filter_map(|g| g.spec.interface.as_ref())
                .filter(|name| matches!(links.get(*name), Some(None)))
                .cloned()
                .collect();
            let nodes_now = snapshot(&nodes);
            self.publish_group_addresses(&groups_now, &nodes_now, &routes, &links, &mut published).await;
            let changes = std::mem::take(&mut pending);
            status_due |= changes.all || changes.service_objects;
            let mut state = ClusterState {
                groups: groups_now,
                services: Vec::new(),
                slices: Vec::new(),
                nodes: nodes_now,
                routes,
                missing_interfaces,
            };
            // A pass of only changed Services reads them from the stores, and nothing else.
            let whole = changes.all || leading && status_due || translator.needs_everything(&state);
            if whole {
                state.services = snapshot(&services);
                state.slices = snapshot(&slices);
            }
            let changed = if changes.all {
                index = SliceIndex::of(state.slices.iter().map(|s| s.as_ref()));
                Changed::All
            } else if changes.services.is_empty() {
                Changed::Services(Vec::new())
            } else {
                Changed::Services(objects_of(&changes, &services, &slices, &index))
            };
            let started = std::time::Instant::now();
            let translated = translator.translate_changed(&state, &self.base, changed);
            debug!(
                touched = changes.services.len(),
                everything = whole,
                rebuilt = translator.rebuilt(),
                elapsed = ?started.elapsed(),
                "cluster objects translated"
            );
            match translated {
                Ok(translation) => {
                    // Each refusal is reported when it appears, not again with every change.
                    let changed = translation.refusals != refusals;
                    for refusal in translation.refusals.iter().filter(|r| changed && !refusals.contains(r)) {
                        warn!(object = %refusal.service, reason = refusal.reason, "{}", refusal.message);
                        // Group problems are this node's own (its interfaces): each agent
                        // reports them. Service problems are the leader's to report.
                        if let Some(group) = refusal.service.strip_prefix(super::source::GROUP_REFUSAL_PREFIX)
                            && let Err(e) =
                                writer.group_warning(group, refusal.reason, &refusal.message).await
                        {
                            warn!(error = %e, "publishing an Event failed");
                        }
                    }
                    refusals = translation.refusals;
                    unserved = translation.unserved;
                    if last.as_ref() != Some(&translation.config) {
                        last = Some(translation.config.clone());
                        if configs.send(translation.config).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    pending.all = true;
                    warn!(error = %e, "the cluster's objects give an invalid config; keeping the last one")
                }
            }
            if !(leading && status_due) {
                continue;
            }
            if !whole {
                state.services = snapshot(&services);
                state.slices = snapshot(&slices);
            }
            status_due = false;
            if leading && let Some(config) = &last {
                let planned = crate::node_plan::node_plan(config, &self.node);
                let refused = refused.borrow_and_update().clone();
                let mut plan = status::plan(
                    &state,
                    &owners.borrow().clone(),
                    &planned,
                    &refused,
                    &unserved,
                    &Timestamp::now().to_string(),
                );
                status::keep_written_times(&mut plan, &written);
                if plan != status::StatusPlan::default()
                    && let Err(e) =
                        writer.apply(&plan).await.inspect(|()| written.extend(plan.conditions.clone()))
                {
                    warn!(error = %e, "writing status failed; retrying on the next change");
                }
            }
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

#[cfg(test)]
mod tests {
    //! The whole shell against a mock API server (tower-test): lists answered from fixtures,
    //! watches left open, the first Service list failing (a watch error, retried with backoff),
    //! and every write recorded.

    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    fn list(kind: &str, api_version: &str, items: Value) -> Value {
        json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {"resourceVersion": "1"}, "items": items})
    }

    type Writes = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// The fixture group's spec.
    fn edge_spec() -> Value {
        json!({"interface": "eth0", "addressPools": ["198.51.100.0/29"], "default": true, "advertInterval": "10ms"})
    }

    /// What the mock API server lists: the group `edge`'s spec and the objects of each kind.
    struct Fixture {
        edge: Value,
        services: Value,
        slices: Value,
        nodes: Value,
    }

    impl Fixture {
        /// `web` holding 198.51.100.1 with a pod on n1, `new` without an address, nodes n0, n1.
        fn new(edge: Value) -> Self {
            Fixture {
                edge,
                services: json!([
                    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop", "finalizers": ["lb-agent.io/ipam"]},
                     "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080}]},
                     "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}},
                    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "new", "namespace": "shop"},
                     "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}}
                ]),
                slices: json!([{
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                    "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                    "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "n1"}]}]),
                nodes: json!([
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0"}, "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}},
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.11"}]}}
                ]),
            }
        }
    }

    async fn api_server(
        mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
        writes: Writes,
        fixture: Fixture,
    ) {
        let Fixture { edge, services, slices, nodes } = fixture;
        let mut open_watches = Vec::new();
        let mut service_lists = 0;
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().to_string();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
                .unwrap_or(Value::Null);
            if query.contains("watch=true") {
                open_watches.push(send);
                continue;
            }
            let reply = |status: u16, v: Value| {
                Response::builder().status(status).body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
            };
            let response = match (method.as_str(), path.as_str()) {
                ("GET", "/apis/lb-agent.io/v1alpha1/loadbalancergroups") => reply(
                    200,
                    list(
                        "LoadBalancerGroup",
                        "lb-agent.io/v1alpha1",
                        json!([{
                    "apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge", "generation": 1},
                    "spec": edge}]),
                    ),
                ),
                ("GET", "/api/v1/services") => {
                    service_lists += 1;
                    if service_lists == 1 {
                        reply(
                            500,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd is sad", "code": 500}),
                        )
                    } else {
                        reply(200, list("Service", "v1", services.clone()))
                    }
                }
                ("GET", "/apis/discovery.k8s.io/v1/endpointslices") => {
                    reply(200, list("EndpointSlice", "discovery.k8s.io/v1", slices.clone()))
                }
                ("GET", "/api/v1/nodes") => reply(200, list("Node", "v1", nodes.clone())),
                ("GET", p) if p.ends_with("/leases/lb-agent-leader") => reply(
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
                ),
                ("POST", p) if p.ends_with("/leases") => reply(201, body),
                (method, path) => {
                    writes.lock().unwrap().push((method.to_owned(), path.to_owned(), body.clone()));
                    // The object as a server returns it: a merge patch's nulls deleted (a Node
                    // with a null annotation does not parse, and the write would read as failed).
                    fn without_nulls(v: Value) -> Value {
                        match v {
                            Value::Object(map) => Value::Object(
                                map.into_iter()
                                    .filter(|(_, v)| !v.is_null())
                                    .map(|(k, v)| (k, without_nulls(v)))
                                    .collect(),
                            ),
                            other => other,
                        }
                    }
                    let mut echo = without_nulls(body);
                    if echo["metadata"].is_null() {
                        echo["metadata"] = json!({"name": "x", "namespace": "shop"});
                    }
                    reply(200, echo)
                }
            };
            send.send_response(response);
        }
    }

    /// What the agent's side holds of a running shell: its configs, and its reports.
    struct AgentSide {
        configs: mpsc::Receiver<Config>,
        _owners: watch::Sender<BTreeMap<std::net::IpAddr, String>>,
        refused: watch::Sender<BTreeMap<String, String>>,
        foreign: watch::Sender<ForeignRouters>,
        impersonated: watch::Sender<Impersonations>,
    }

    /// Runs the shell of node n0 (default uplink eth0) against the mock API server listing
    /// `fixture`; its recorded writes go to `writes`.
    fn run_shell(fixture: Fixture, writes: &Writes) -> AgentSide {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(api_server(handle, writes.clone(), fixture));
        let shell = Shell {
            client: Client::new(service.clone(), "default"),
            requests: Client::new(service, "default"),
            netlink: crate::netdev::connect().unwrap(),
            base: Config::parse("interface: eth0\nnode: n0\n").unwrap(),
            node: "n0".into(),
            namespace: "lb-agent".into(),
        };
        let (tx, configs) = mpsc::channel(4);
        let (_owners, owners) = watch::channel(BTreeMap::new());
        let (refused, refused_rx) = watch::channel(BTreeMap::new());
        let (foreign, foreign_rx) = watch::channel(ForeignRouters::new());
        let (impersonated, impersonated_rx) = watch::channel(Impersonations::new());
        let from_agent =
            FromAgent { owners, refused: refused_rx, foreign: foreign_rx, impersonated: impersonated_rx };
        tokio::spawn(shell.run(tx, from_agent, watch::channel(false).1));
        AgentSide { configs, _owners, refused, foreign, impersonated }
    }

    /// The first Event with `reason` posted after the first `before` writes (waits up to 10 s).
    async fn event_after(writes: &Writes, before: usize, reason: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen: Vec<_> = writes.lock().unwrap()[before..].to_vec();
            if let Some((_, _, event)) =
                seen.iter().find(|(m, p, b)| m == "POST" && p.contains("/events") && b["reason"] == reason)
            {
                return event.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "no {reason} Event: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn the_cluster_becomes_a_config_and_the_leader_writes_status() {
        let writes: Writes = Arc::default();
        let mut agent = run_shell(Fixture::new(edge_spec()), &writes);
        let (refused_tx, foreign_tx, impersonated_tx) =
            (agent.refused.clone(), agent.foreign.clone(), agent.impersonated.clone());

        let config = tokio::time::timeout(Duration::from_secs(20), agent.configs.recv())
            .await
            .expect("a config in time")
            .unwrap();
        let group = &config.groups[0];
        assert_eq!(group.name, "edge");
        assert_eq!(group.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["n0", "n1"]);
        assert_eq!(group.vips.iter().map(|v| v.address.to_string()).collect::<Vec<_>>(), ["198.51.100.1"]);
        assert_eq!(config.services[0].endpoints[0].address, Ipv4Addr::new(10, 244, 1, 5));

        // The leader allocates the next free address to the new Service, after its finalizer.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen = writes.lock().unwrap().clone();
            let finalizer =
                seen.iter().position(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new");
            let status = seen
                .iter()
                .position(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new/status");
            if let (Some(f), Some(s)) = (finalizer, status) {
                assert!(f < s, "the finalizer comes first: {seen:#?}");
                assert_eq!(seen[s].2["status"]["loadBalancer"]["ingress"][0]["ip"], "198.51.100.2");
                assert!(
                    seen.iter().any(|(_, p, b)| p.ends_with("/loadbalancergroups/edge/status")
                        && b["status"]["vipCount"] == 2),
                    "{seen:#?}"
                );
                // web's address is already right: only its new condition is written.
                let web: Vec<_> = seen
                    .iter()
                    .filter(|(_, p, _)| p == "/api/v1/namespaces/shop/services/web/status")
                    .collect();
                assert!(web.iter().all(|(_, _, b)| b["status"]["loadBalancer"].is_null()), "{web:#?}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no status writes: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // This node's data plane has no room for web: without any cluster change, the leader
        // sets web's condition to False (CapacityExceeded) and records a Warning Event on it.
        let before = writes.lock().unwrap().len();
        let reason =
            "198.51.100.1:80/TCP: the data plane holds at most 1 services (dataplane.capacity.services)";
        refused_tx.send_replace(BTreeMap::from([("shop/web".to_owned(), reason.to_owned())]));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen: Vec<_> = writes.lock().unwrap()[before..].to_vec();
            let condition = seen.iter().find_map(|(m, p, b)| {
                let conditions = b["status"]["conditions"].as_array()?;
                (m == "PATCH" && p == "/api/v1/namespaces/shop/services/web/status")
                    .then_some(conditions.clone())
            });
            let event = seen.iter().find(|(m, p, b)| {
                m == "POST"
                    && p.contains("/events")
                    && b["reason"] == "CapacityExceeded"
                    && b["type"] == "Warning"
            });
            if let (Some(conditions), Some((_, _, event))) = (condition, event) {
                let served = conditions.iter().find(|c| c["type"] == "lb-agent.io/Served").unwrap();
                assert_eq!(
                    (served["status"].as_str(), served["reason"].as_str()),
                    (Some("False"), Some("CapacityExceeded"))
                );
                assert_eq!(served["message"], reason);
                assert_eq!(event["regarding"]["name"], "web", "{event:#}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no refusal written: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // A router outside the group advertises its VRID: a Warning Event on the group,
        // naming the VRID and the source, once.
        let before = writes.lock().unwrap().len();
        let rogue: std::net::IpAddr = "192.0.2.66".parse().unwrap();
        let vrid = crate::vrrp::family::InstanceId::v4(10);
        foreign_tx.send_replace(ForeignRouters::from([("edge".to_owned(), vrid, rogue)]));
        let event = event_after(&writes, before, "ForeignVrid").await;
        assert_eq!(
            (event["type"].as_str(), event["regarding"]["kind"].as_str()),
            (Some("Warning"), Some("LoadBalancerGroup"))
        );
        assert_eq!(event["regarding"]["name"], "edge");
        let note = event["note"].as_str().unwrap();
        assert!(
            note.contains("VRID 10") && note.contains("192.0.2.66") && note.contains("excludedVrids"),
            "{note}"
        );
        foreign_tx.send_replace(ForeignRouters::from([("edge".to_owned(), vrid, rogue)]));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again =
            writes.lock().unwrap()[before..].iter().filter(|(_, _, b)| b["reason"] == "ForeignVrid").count();
        assert_eq!(again, 1, "reported once");

        // A member impersonated on the segment: one Warning Event on its group, saying how.
        let before = writes.lock().unwrap().len();
        let member: std::net::IpAddr = "192.0.2.11".parse().unwrap();
        let how = "from MAC 02:1b:00:00:00:cc while it is at 02:00:00:00:00:11".to_owned();
        impersonated_tx.send_replace(Impersonations::from([("edge".to_owned(), member, how.clone())]));
        let event = event_after(&writes, before, "Impersonation").await;
        assert_eq!(
            (event["type"].as_str(), event["regarding"]["name"].as_str()),
            (Some("Warning"), Some("edge"))
        );
        let note = event["note"].as_str().unwrap();
        assert!(note.contains("192.0.2.11") && note.contains(&how), "{note}");
    }

    /// A group on another interface than the default uplink: the config runs it there, and
    /// this node publishes its address on that interface on its Node, once, for the others.
    #[tokio::test]
    async fn a_group_on_another_interface_publishes_this_nodes_address_there() {
        let writes: Writes = Arc::default();
        // `lo` is the one interface every test host has, with 127.0.0.1.
        let mut edge = edge_spec();
        edge["interface"] = json!("lo");
        let mut agent = run_shell(Fixture::new(edge), &writes);
        let config = tokio::time::timeout(Duration::from_secs(20), agent.configs.recv())
            .await
            .expect("a config")
            .unwrap();
        // No member has published an address on `lo` yet (the mock's watch never shows the
        // patch): the group waits, and the rest of the config is valid.
        assert!(config.groups.is_empty(), "{:?}", config.groups);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let patches = loop {
            let seen = writes.lock().unwrap().clone();
            let patches: Vec<Value> = seen
                .iter()
                .filter(|(m, p, _)| m == "PATCH" && p == "/api/v1/nodes/n0")
                .map(|(_, _, b)| b.clone())
                .collect();
            if !patches.is_empty() {
                break patches;
            }
            assert!(tokio::time::Instant::now() < deadline, "no Node patch: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            patches[0],
            json!({"metadata": {"annotations": {
                source::GROUP_ADDRESSES_ANNOTATION: "{\"edge\":\"127.0.0.1\"}",
                // `lo` has no link-local address.
                source::GROUP_ADDRESSES6_ANNOTATION: null,
            }}})
        );
        // Not patched again while the watch has not shown it (the mock never does).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let again =
            writes.lock().unwrap().iter().filter(|(m, p, _)| m == "PATCH" && p == "/api/v1/nodes/n0").count();
        assert_eq!(again, 1);
    }

    /// A dual-stack cluster: a group with pools of both families, members that published their
    /// link-local addresses, a Service holding one address of each family with pods of each,
    /// and a new `RequireDualStack` one. The config serves both families, and the leader gives
    /// the new Service the lowest free address of each, primary family first.
    #[tokio::test]
    async fn a_dual_stack_service_is_served_and_allocated_in_both_families() {
        let writes: Writes = Arc::default();
        let mut edge = edge_spec();
        edge["addressPools"] = json!(["198.51.100.0/29", "2001:db8:6::/125"]);
        let mut fixture = Fixture::new(edge);
        fixture.services = json!([
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop", "finalizers": ["lb-agent.io/ipam"]},
             "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
                      "ports": [{"port": 80, "targetPort": 8080}]},
             "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"ip": "2001:db8:6::1"}]}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "new", "namespace": "shop"},
             "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack",
                      "ports": [{"port": 443}]}}
        ]);
        fixture.slices = json!([
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
             "metadata": {"name": "web-4", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
             "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "n1"}]},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv6",
             "metadata": {"name": "web-6", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
             "endpoints": [{"addresses": ["fd00:244:1::5"], "nodeName": "n1"}]}
        ]);
        for (i, node) in fixture.nodes.as_array_mut().unwrap().iter_mut().enumerate() {
            node["metadata"]["annotations"] =
                json!({source::GROUP_ADDRESSES6_ANNOTATION: format!("{{\"edge\":\"fe80::{i}\"}}")});
        }
        let mut agent = run_shell(fixture, &writes);
        let config = tokio::time::timeout(Duration::from_secs(20), agent.configs.recv())
            .await
            .expect("a config in time")
            .unwrap();
        let group = &config.groups[0];
        let members: Vec<(&str, Option<String>)> =
            group.nodes.iter().map(|n| (n.name.as_str(), n.address6.map(|a| a.to_string()))).collect();
        assert_eq!(members, [("n0", Some("fe80::".to_owned())), ("n1", Some("fe80::1".to_owned()))]);
        let vips: Vec<String> = group.vips.iter().map(|v| v.address.to_string()).collect();
        assert_eq!(vips, ["198.51.100.1", "2001:db8:6::1"]);
        let served: Vec<(String, String)> = config
            .services
            .iter()
            .map(|s| (s.vip.to_string(), s.endpoints.iter().map(|e| e.address.to_string()).collect()))
            .collect();
        assert_eq!(
            served,
            [
                ("198.51.100.1".to_owned(), "10.244.1.5".to_owned()),
                ("2001:db8:6::1".to_owned(), "fd00:244:1::5".to_owned())
            ]
        );

        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen = writes.lock().unwrap().clone();
            let status = seen
                .iter()
                .find(|(m, p, _)| m == "PATCH" && p == "/api/v1/namespaces/shop/services/new/status");
            if let Some((_, _, body)) = status {
                assert_eq!(
                    *body,
                    json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [
                        {"ip": "2001:db8:6::2", "ipMode": "VIP"}, {"ip": "198.51.100.2", "ipMode": "VIP"}
                    ]}}})
                );
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no address for new: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
