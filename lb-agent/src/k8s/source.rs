//! The Kubernetes source: LoadBalancerGroups, Services, EndpointSlices and Nodes in, the same
//! `Config` the standalone YAML gives out. Pure: every agent computes the same config from the
//! same objects, and the planner downstream cannot tell the two sources apart.
//!
//! Groups and services are built as documents and parsed with the config's own types, so they
//! get the same defaults and the same validation as a YAML file.
//!
//! At scale, a watch event must not cost a rebuild of every Service: a [`Translator`] keeps
//! each Service's translation with the objects it was made from, and reuses it while the
//! stores hand out the same objects (a pointer comparison; equal resource versions after a
//! relist) and the groups and their members are unchanged. Each Service is validated alone as
//! it is translated: one that is invalid, or serves a port an earlier Service (by name)
//! serves, is left out and reported, and the rest of the cluster is served.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use foldhash::fast::FixedState;
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use smallvec::SmallVec;

use super::{
    binding::{Bound, Refusal, bind},
    cluster::{ClusterState, current_ingress},
    crd::{LoadBalancerGroup, RemoteMode},
    slice::Slice,
};
use crate::config::{Config, GroupConfig, GroupVip, Protocol, ServiceConfig};

/// The Node annotation where each agent publishes its address on each of its groups'
/// interfaces, as JSON (`{"edge": "10.30.0.10"}`): a group on another interface than the
/// default uplink has its members' addresses from there (the InternalIP is the default
/// uplink's), for the allow-list and unicast.
pub const GROUP_ADDRESSES_ANNOTATION: &str = "lb-agent.io/group-addresses";

/// The Node annotation where each agent publishes its IPv6 link-local address on each of its
/// groups' interfaces, as JSON (`{"edge": "fe80::1"}`): IPv6 adverts are sent from it (RFC 5798
/// §5.1.2.1), and no Node field has it. A member that has not published one owns none of the
/// group's IPv6 VIPs. Its own annotation, so agents that predate it read theirs unchanged.
pub const GROUP_ADDRESSES6_ANNOTATION: &str = "lb-agent.io/group-addresses6";

/// Refusals about a group rather than a Service carry this prefix before the group's name.
pub const GROUP_REFUSAL_PREFIX: &str = "LoadBalancerGroup/";

#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    pub config: Config,
    /// Everything refused, for logs: bindings (which the status plan finds again itself),
    /// groups, and `unserved`.
    pub refusals: Vec<Refusal>,
    /// Services bound to a group but left out of the config: invalid, or a port another
    /// Service serves. For their Events and conditions.
    pub unserved: Vec<Refusal>,
}

/// Builds the config for the node `base.node`, keeping `base`'s agent-level settings
/// (interface, listen, data plane). Returns an error naming the offending object when the
/// result does not validate; the caller then keeps its last good plan.
pub fn translate(state: &ClusterState, base: &Config) -> Result<Translation, String> {
    Translator::default().translate(state, base)
}

/// [`translate`] with memory of the previous pass (see the module's notes).
#[derive(Default)]
pub struct Translator {
    /// Each Service's last translation, by namespace and name (the config's order).
    services: BTreeMap<(String, String), Translated>,
    /// What every translation depends on besides its own objects; when it changes, every
    /// Service is translated afresh.
    context: Option<Context>,
    /// The groups and nodes (their allocations) and default uplink `context` was made from:
    /// while the stores hand out the same objects, a pass reads no Node's annotations.
    context_from: Option<ContextObjects>,
    /// What the assembly of the translations into a config depends on besides them.
    frame: Option<Frame>,
    /// The last pass's result, which a pass that changes only endpoints patches.
    last: Option<Translation>,
    rebuilt: usize,
    /// The agent's default uplink, as the last pass's base named it.
    default_interface: String,
}

/// The groups, the nodes and the default uplink a [`Context`] was made from.
type ContextObjects = (Vec<Arc<LoadBalancerGroup>>, Vec<Arc<Node>>, String);

/// What changed since the last pass, as the watches saw it.
#[derive(Debug)]
pub enum Changed {
    /// Anything (a first pass, a relist, a group or a node): translate from the whole state.
    All,
    /// Only these Services or their EndpointSlices, given with their objects now.
    Services(Vec<ServiceObjects>),
}

/// A Service's objects as the stores hold them now.
#[derive(Clone, Debug)]
pub struct ServiceObjects {
    pub namespace: String,
    pub name: String,
    /// `None`: deleted.
    pub service: Option<Arc<Service>>,
    pub slices: Vec<Arc<Slice>>,
}

/// The groups' published VRIDs and this node's routes: inputs of the groups' configs only.
#[derive(Debug, PartialEq)]
struct Frame {
    vrids: Vec<Option<BTreeMap<String, u8>>>,
    routes: BTreeMap<std::net::IpAddr, String>,
    missing_interfaces: std::collections::BTreeSet<String>,
}

impl Frame {
    fn of(state: &ClusterState) -> Self {
        Self {
            vrids: state.groups.iter().map(|g| g.status.as_ref().map(|s| s.vrids.clone())).collect(),
            routes: state.routes.clone(),
            missing_interfaces: state.missing_interfaces.clone(),
        }
    }
}

/// The groups (names and specs) and each group's members. Group statuses and Node fields
/// that do not make a member (heartbeats, images) are left out, so they cost no rebuild.
#[derive(Debug, PartialEq)]
struct Context {
    groups: Vec<(Option<String>, super::crd::LoadBalancerGroupSpec)>,
    members: Vec<Vec<Member>>,
}

/// A group's member node, with its addresses on the group's interface.
#[derive(Clone, Debug, PartialEq)]
struct Member {
    name: String,
    address: Ipv4Addr,
    /// Its link-local address there, when it published one.
    address6: Option<Ipv6Addr>,
}

impl Context {
    /// A group this node serves on another interface than `default_interface` has as members
    /// only the nodes that published their address there: a Node's InternalIP is another
    /// network's, and one node missing must not make the whole config invalid.
    fn of(state: &ClusterState, default_interface: &str) -> Self {
        let published_only =
            |g: &LoadBalancerGroup| group_interface(g, state).is_ok_and(|i| i != default_interface);
        Self {
            groups: state.groups.iter().map(|g| (g.metadata.name.clone(), g.spec.clone())).collect(),
            members: state.groups.iter().map(|g| members(&state.nodes, g, published_only(g))).collect(),
        }
    }
}

/// One Service's translation, with the objects it was made from. The watch stores hand out
/// the same `Arc` until an object changes, so "unchanged" is a pointer comparison.
struct Translated {
    service: Arc<Service>,
    /// Its EndpointSlices, in name order.
    slices: Vec<Arc<Slice>>,
    bound: Option<Bound>,
    refusals: Vec<Refusal>,
    /// Why it is bound but not served, if it is not.
    unserved: Option<Refusal>,
    /// Its entries in its group's `vips`.
    vips: Vec<GroupVip>,
    configs: Vec<Arc<ServiceConfig>>,
    /// What its configs serve, kept beside them for the pass's conflict check.
    ports: SmallVec<[(IpAddr, u16, Protocol); 2]>,
    /// Where its configs start in the last config's services, when they are there.
    at: Option<usize>,
}

impl Translated {
    /// Whether `next` differs from this only in its services' contents (an endpoint change):
    /// then the last config's services are patched where they are, and nothing else moves.
    fn same_shape(&self, next: &Translated) -> bool {
        self.bound == next.bound
            && self.vips == next.vips
            && self.ports == next.ports
            && self.refusals == next.refusals
            && self.unserved == next.unserved
            && self.configs.len() == next.configs.len()
    }

    /// Neither served nor reported: a Service of no group of ours.
    fn is_foreign(&self) -> bool {
        self.bound.is_none() && self.refusals.is_empty() && self.unserved.is_none()
    }
}

impl Translated {
    /// Whether it was made from these objects: the same allocations, or (after a relist, which
    /// replaces every allocation) the same resource versions. Takes the new allocations over.
    fn made_from(&mut self, service: &Arc<Service>, slices: &[&Arc<Slice>]) -> bool {
        let same = same_object(&self.service, service)
            && self.slices.len() == slices.len()
            && self.slices.iter().zip(slices).all(|(a, b)| same_object(a, b));
        if same && !Arc::ptr_eq(&self.service, service) {
            self.service = service.clone();
        }
        if same && !self.slices.iter().zip(slices).all(|(a, b)| Arc::ptr_eq(a, b)) {
            self.slices = slices.iter().map(|s| Arc::clone(s)).collect();
        }
        same
    }
}

fn same_object<K: kube::Resource>(a: &Arc<K>, b: &Arc<K>) -> bool {
    if Arc::ptr_eq(a, b) {
        return true;
    }
    let (a, b) = (a.meta(), b.meta());
    a.resource_version.is_some()
        && a.resource_version == b.resource_version
        && (&a.uid, &a.namespace, &a.name) == (&b.uid, &b.namespace, &b.name)
}

/// Each group, with its members (from `context`, which was made from `state`), by name.
fn groups_by_name<'a>(state: &'a ClusterState, context: &'a Option<Context>) -> GroupsByName<'a> {
    state
        .groups
        .iter()
        .zip(&context.as_ref().expect("set by translate").members)
        .map(|(g, m)| (g.metadata.name.as_deref().unwrap_or_default(), (g.as_ref(), m.as_slice())))
        .collect()
}

/// Each group, with its members, by name.
type GroupsByName<'a> = HashMap<&'a str, (&'a LoadBalancerGroup, &'a [Member]), FixedState>;

/// A group's VIPs and services, as the pass collects them.
type GroupOutput = (Vec<GroupVip>, Vec<Arc<ServiceConfig>>);

/// A Service's EndpointSlices: most have one, which takes no allocation.
type SlicesOf<'a> = SmallVec<[&'a Arc<Slice>; 1]>;

/// EndpointSlices by the Service they belong to, (namespace, `kubernetes.io/service-name`),
/// each Service's in name order.
fn slices_by_service(slices: &[Arc<Slice>]) -> HashMap<(&str, &str), SlicesOf<'_>, FixedState> {
    let mut index: HashMap<(&str, &str), SlicesOf<'_>, FixedState> =
        HashMap::with_capacity_and_hasher(slices.len(), FixedState::default());
    for slice in slices {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(name) = super::changes::service_of(slice) {
            index.entry((namespace, name)).or_default().push(slice);
        }
    }
    for mine in index.values_mut() {
        if mine.len() > 1 {
            mine.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
    }
    index
}

/// A Service's EndpointSlices from the index.
fn slices_of<'i, 'a>(
    index: &'i HashMap<(&'a str, &'a str), SlicesOf<'a>, FixedState>,
    service: &'a Service,
) -> &'i [&'a Arc<Slice>] {
    let key = (
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default(),
    );
    index.get(&key).map_or(&[], |s| s.as_slice())
}

impl Translator {
    /// As [`translate`], reusing the previous pass's translation of every Service whose
    /// objects are the same ones as then.
    pub fn translate(&mut self, state: &ClusterState, base: &Config) -> Result<Translation, String> {
        self.translate_changed(state, base, Changed::All)
    }

    /// Whether the next pass must see every Service and slice in its state, whatever changed:
    /// the first pass, and any after the groups, their members, VRIDs or routes changed.
    pub fn needs_everything(&self, state: &ClusterState) -> bool {
        self.last.is_none()
            || (!self.context_made_from(state, &self.default_interface)
                && self.context.as_ref() != Some(&Context::of(state, &self.default_interface)))
            || self.frame.as_ref() != Some(&Frame::of(state))
    }

    /// Whether `state`'s groups and nodes are the very objects the context was made from.
    fn context_made_from(&self, state: &ClusterState, default_interface: &str) -> bool {
        self.context_from.as_ref().is_some_and(|(groups, nodes, interface)| {
            interface == default_interface
                && groups.len() == state.groups.len()
                && groups.iter().zip(&state.groups).all(|(a, b)| Arc::ptr_eq(a, b))
                && nodes.len() == state.nodes.len()
                && nodes.iter().zip(&state.nodes).all(|(a, b)| Arc::ptr_eq(a, b))
        })
    }

    /// As [`Translator::translate`], told what changed since the last pass. When only
    /// Services changed and not [`Translator::needs_everything`], `state`'s services and
    /// slices are not read (they may be left empty), and a pass costs what changed: Services
    /// whose objects are new are translated, and when only their endpoints moved, the last
    /// config is patched where they are.
    pub fn translate_changed(
        &mut self,
        state: &ClusterState,
        base: &Config,
        changed: Changed,
    ) -> Result<Translation, String> {
        self.default_interface.clone_from(&base.interface);
        let same_context = self.context_made_from(state, &base.interface) || {
            let context = Context::of(state, &base.interface);
            let same = self.context.as_ref() == Some(&context);
            if !same {
                self.services.clear();
            }
            self.context = Some(context);
            self.context_from = Some((state.groups.clone(), state.nodes.clone(), base.interface.clone()));
            same
        };
        let frame = Frame::of(state);
        let unchanged = same_context && self.frame.as_ref() == Some(&frame);
        self.frame = Some(frame);
        self.rebuilt = 0;
        match changed {
            Changed::Services(objects) if unchanged && self.last.is_some() => {
                self.translate_services(state, base, objects)
            }
            _ => {
                self.last = None;
                let translation = self.translate_with(state, base)?;
                self.last = Some(translation.clone());
                Ok(translation)
            }
        }
    }

    /// The pass for changed Services only (see [`Translator::translate_changed`]).
    fn translate_services(
        &mut self,
        state: &ClusterState,
        base: &Config,
        objects: Vec<ServiceObjects>,
    ) -> Result<Translation, String> {
        let groups_by_name = groups_by_name(state, &self.context);
        // Translated before anything is replaced: a Service that fails leaves the previous
        // pass's translations as they were.
        let mut fresh = Vec::new();
        let mut structural = false;
        for mut objects in objects {
            objects.slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let key = (objects.namespace, objects.name);
            let old = self.services.get_mut(&key);
            let Some(service) = objects.service else {
                structural |= old.is_some_and(|old| !old.is_foreign());
                fresh.push((key, None));
                continue;
            };
            let slices: Vec<&Arc<Slice>> = objects.slices.iter().collect();
            if let Some(old) = old
                && old.made_from(&service, &slices)
            {
                continue;
            }
            let mut next = translate_service(&service, &slices, &state.groups, &groups_by_name)?;
            match self.services.get(&key) {
                Some(old) if old.same_shape(&next) => next.at = old.at,
                Some(old) if old.is_foreign() && next.is_foreign() => {}
                None if next.is_foreign() => {}
                _ => structural = true,
            }
            fresh.push((key, Some(next)));
        }
        self.rebuilt = fresh.len();
        let last = self.last.as_mut().expect("checked by the caller");
        for (key, next) in fresh {
            match next {
                None => {
                    self.services.remove(&key);
                }
                Some(next) => {
                    if let Some(at) = next.at {
                        last.config.services[at..at + next.configs.len()].clone_from_slice(&next.configs);
                    }
                    self.services.insert(key, next);
                }
            }
        }
        if structural {
            // A Service came, went, or changed its addresses, ports or binding: assemble again.
            let translation = self.assemble(state, base)?;
            self.last = Some(translation);
        }
        Ok(self.last.clone().expect("set above"))
    }

    /// How many Services the last pass built afresh rather than reused.
    pub fn rebuilt(&self) -> usize {
        self.rebuilt
    }

    /// The translation, translating afresh only the Services whose objects are not the ones
    /// their last translation was made from.
    fn translate_with(&mut self, state: &ClusterState, base: &Config) -> Result<Translation, String> {
        let slices = slices_by_service(&state.slices);
        let groups_by_name = groups_by_name(state, &self.context);
        let mut current: HashMap<(&str, &str), &Arc<Service>, FixedState> = state
            .services
            .iter()
            .map(|s| {
                let namespace = s.metadata.namespace.as_deref().unwrap_or("default");
                ((namespace, s.metadata.name.as_deref().unwrap_or_default()), s)
            })
            .collect();

        // What changed, translated before anything is replaced: a Service that fails leaves
        // the previous pass's translations as they were.
        let mut removed = Vec::new();
        let mut fresh = Vec::new();
        for ((namespace, name), translated) in &mut self.services {
            match current.remove(&(namespace.as_str(), name.as_str())) {
                None => removed.push((namespace.clone(), name.clone())),
                Some(service) => {
                    let slices = slices_of(&slices, service);
                    if !translated.made_from(service, slices) {
                        let again = translate_service(service, slices, &state.groups, &groups_by_name)?;
                        fresh.push(((namespace.clone(), name.clone()), again));
                    }
                }
            }
        }
        for ((namespace, name), service) in current {
            let again =
                translate_service(service, slices_of(&slices, service), &state.groups, &groups_by_name)?;
            fresh.push(((namespace.to_owned(), name.to_owned()), again));
        }
        self.rebuilt = fresh.len();
        for key in removed {
            self.services.remove(&key);
        }
        self.services.extend(fresh);
        self.assemble(state, base)
    }

    /// The config from every Service's translation, and where each one's services are in it.
    fn assemble(&mut self, state: &ClusterState, base: &Config) -> Result<Translation, String> {
        let groups_by_name = groups_by_name(state, &self.context);
        // Each group's VIPs and services, in Service name order. A VIP shared by Services
        // (`allow-shared-ip`) is one group VIP, the first Service's; a port served twice is
        // the first Service's, and the later one is refused.
        let mut refusals = Vec::new();
        let mut unserved = Vec::new();
        let mut bound: HashMap<&str, GroupOutput, FixedState> = HashMap::default();
        let mut vips_seen: HashSet<IpAddr, FixedState> = HashSet::default();
        let mut served: HashMap<(IpAddr, u16, Protocol), &str, FixedState> =
            HashMap::with_capacity_and_hasher(self.services.len(), FixedState::default());
        for translated in self.services.values() {
            refusals.extend(translated.refusals.iter().cloned());
            unserved.extend(translated.unserved.iter().cloned());
            let Some(b) = &translated.bound else { continue };
            if let Some(((vip, port, protocol), holder)) =
                translated.ports.iter().find_map(|k| served.get(k).map(|holder| (k, *holder)))
            {
                unserved.push(Refusal {
                    service: b.service.clone(),
                    reason: "PortConflict",
                    message: format!("{vip}:{port}/{} is already served for {holder}", protocol.as_str()),
                });
                continue;
            }
            served.extend(translated.ports.iter().map(|k| (*k, b.service.as_str())));
            let (vips, services) = bound.entry(b.group.as_str()).or_default();
            vips.extend(translated.vips.iter().filter(|v| vips_seen.insert(v.address)).cloned());
            services.extend(translated.configs.iter().cloned());
        }

        let mut groups_sorted: Vec<&LoadBalancerGroup> = state.groups.iter().map(Arc::as_ref).collect();
        groups_sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut groups = Vec::new();
        let mut services = Vec::new();
        for group in groups_sorted {
            let name = group.metadata.name.clone().unwrap_or_default();
            let interface = match group_interface(group, state) {
                Ok(interface) => interface,
                Err(refusal) => {
                    refusals.push(Refusal { service: format!("{GROUP_REFUSAL_PREFIX}{name}"), ..refusal });
                    continue;
                }
            };
            let spec = &group.spec;
            let members = groups_by_name.get(name.as_str()).map_or(&[][..], |(_, m)| m);
            if members.is_empty() {
                // No node yet (a selector nobody matches, or another network whose addresses
                // nobody has published): nothing to run, and its Services wait with it.
                continue;
            }
            let nodes: Vec<Value> = members
                .iter()
                .map(|m| match m.address6 {
                    Some(address6) => json!({"name": m.name, "address": m.address, "address6": address6}),
                    None => json!({"name": m.name, "address": m.address}),
                })
                .collect();
            let (vips, mine) = bound.remove(name.as_str()).unwrap_or_default();
            services.extend(mine);
            let document = json!({
                "name": name,
                "interface": interface,
                "nodes": nodes,
                "advertInterval": spec.advert_interval,
                "garp": {"refresh": spec.garp_refresh.as_deref().unwrap_or("0s")},
                "spread": spec.spread,
                "transport": spec.transport,
                "excludedVrids": spec.excluded_vrids,
                "preempt": spec.preempt,
                "vipMode": spec.vip_mode,
                "announce": spec.announce,
                "authentication": spec.authentication,
                // Keep the VRIDs the leader published, so instances are never renumbered.
                "pinnedVrids": group.status.as_ref().map(|s| s.vrids.clone()).unwrap_or_default(),
            });
            let mut group: GroupConfig =
                serde_json::from_value(document).map_err(|e| format!("LoadBalancerGroup {name}: {e}"))?;
            group.vips = vips.into();
            groups.push(group);
        }
        let config = Config { groups, services, ..base.clone() };
        // Each service was validated when it was translated, and conflicts between them were
        // refused above: at 10,000 Services, validating them all again would be most of a pass.
        config.validate_all_but_services().map_err(|e| e.to_string())?;
        refusals.extend(unserved.iter().cloned());
        let positions: HashMap<*const ServiceConfig, usize, FixedState> =
            config.services.iter().enumerate().map(|(i, s)| (Arc::as_ptr(s), i)).collect();
        for translated in self.services.values_mut() {
            translated.at = translated.configs.first().and_then(|c| positions.get(&Arc::as_ptr(c)).copied());
        }
        Ok(Translation { config, refusals, unserved })
    }
}

/// The interface `group` uses on this node, or why it cannot be served here.
pub fn group_interface(group: &LoadBalancerGroup, state: &ClusterState) -> Result<String, Refusal> {
    let spec = &group.spec;
    let interface = match (&spec.interface, &spec.interface_from_ip) {
        (Some(interface), _) if state.missing_interfaces.contains(interface) => {
            Err(format!("this node has no interface {interface}"))
        }
        (Some(interface), _) => Ok(interface.clone()),
        (None, Some(ip)) => {
            state.routes.get(ip).cloned().ok_or_else(|| format!("no route from this node to {ip}"))
        }
        (None, None) => Err("neither interface nor interfaceFromIP is set".to_owned()),
    };
    interface.map_err(|message| Refusal { service: String::new(), reason: "InterfaceNotFound", message })
}

/// One Service's translation from its objects: how it is bound, its group VIPs and its
/// service entries (one per VIP).
fn translate_service(
    service: &Arc<Service>,
    slices: &[&Arc<Slice>],
    all_groups: &[Arc<LoadBalancerGroup>],
    groups: &GroupsByName<'_>,
) -> Result<Translated, String> {
    let (bound, refusals) = bind(service, all_groups);
    let mut translated = Translated {
        service: service.clone(),
        slices: slices.iter().map(|s| Arc::clone(s)).collect(),
        bound: None,
        refusals,
        unserved: None,
        vips: Vec::new(),
        configs: Vec::new(),
        ports: SmallVec::new(),
        at: None,
    };
    let Some(b) = bound else { return Ok(translated) };
    let Some((group, members)) = groups.get(b.group.as_str()) else {
        translated.bound = Some(b);
        return Ok(translated);
    };
    let addresses = service_vips(&b, service);
    // `externalTrafficPolicy: Local`: only members with a ready endpoint may own it.
    let local = service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    for address in &addresses {
        // The VIP's family's EndpointSlices: an IPv6 VIP forwards to IPv6 pods.
        let address_type = if address.is_ipv4() { "IPv4" } else { "IPv6" };
        let mine: Vec<&Slice> =
            slices.iter().map(|s| s.as_ref()).filter(|s| s.address_type == address_type).collect();
        let eligible =
            eligible_members(members, address.is_ipv6(), local.then(|| ready_endpoint_nodes(&mine)));
        translated.vips.push(GroupVip {
            address: *address,
            service: Some(b.service.clone()),
            spread: b.spread,
            eligible_nodes: eligible,
        });
        let document = service_document(&b, service, *address, &mine, group.spec.remote_mode);
        let config: ServiceConfig =
            serde_json::from_value(document).map_err(|e| format!("Service {}: {e}", b.service))?;
        if let Err(e) = config.validate() {
            // Refused alone: the rest of the cluster is served as before.
            translated.vips.clear();
            translated.configs.clear();
            translated.ports.clear();
            translated.unserved = Some(Refusal {
                service: b.service.clone(),
                reason: "InvalidService",
                message: format!("as a service of {address}: {e}"),
            });
            break;
        }
        translated.ports.extend(config.ports.iter().map(|p| (config.vip, p.port, p.protocol)));
        translated.configs.push(Arc::new(config));
    }
    translated.bound = Some(b);
    Ok(translated)
}

/// The members that may own a VIP: for an IPv6 one, those that published their link-local
/// address; under `externalTrafficPolicy: Local`, those of `with_endpoints`. `None`: all.
fn eligible_members(
    members: &[Member],
    ipv6: bool,
    with_endpoints: Option<std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    let restricted = with_endpoints.is_some() || (ipv6 && members.iter().any(|m| m.address6.is_none()));
    restricted.then(|| {
        members
            .iter()
            .filter(|m| !ipv6 || m.address6.is_some())
            .filter(|m| with_endpoints.as_ref().is_none_or(|nodes| nodes.contains(&m.name)))
            .map(|m| m.name.clone())
            .collect()
    })
}

/// The names of the nodes in a group, in order.
pub fn member_names<N: Borrow<Node>>(nodes: &[N], group: &LoadBalancerGroup) -> Vec<String> {
    members(nodes, group, false).into_iter().map(|m| m.name).collect()
}

/// Whether `node` is one of `group`'s.
pub fn selects(group: &LoadBalancerGroup, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    group.spec.node_selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Nodes of `group`, with their addresses for it, in name order: the one the node published
/// for the group ([`GROUP_ADDRESSES_ANNOTATION`]), else (unless `published_only`) its IPv4
/// InternalIP; and the link-local one it published ([`GROUP_ADDRESSES6_ANNOTATION`]).
fn members<N: Borrow<Node>>(nodes: &[N], group: &LoadBalancerGroup, published_only: bool) -> Vec<Member> {
    let name = group.metadata.name.as_deref().unwrap_or_default();
    let mut out: Vec<Member> = nodes
        .iter()
        .map(Borrow::<Node>::borrow)
        .filter(|n| selects(group, n))
        .filter_map(|n| {
            let published = published_addresses(n).remove(name);
            if published_only && published.is_none() {
                return None;
            }
            let address = published.or_else(|| {
                n.status.as_ref()?.addresses.as_ref()?.iter().find_map(|a| {
                    (a.type_ == "InternalIP").then(|| a.address.parse::<Ipv4Addr>().ok()).flatten()
                })
            })?;
            let address6 = published_addresses6(n).remove(name);
            Some(Member { name: n.metadata.name.clone()?, address, address6 })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The addresses `node`'s agent published for its groups; an unreadable annotation is none.
pub fn published_addresses(node: &Node) -> BTreeMap<String, Ipv4Addr> {
    published(node, GROUP_ADDRESSES_ANNOTATION)
}

/// The IPv6 link-local addresses `node`'s agent published for its groups; an unreadable
/// annotation, or an address that is not link-local, is none.
pub fn published_addresses6(node: &Node) -> BTreeMap<String, Ipv6Addr> {
    let mut addresses: BTreeMap<String, Ipv6Addr> = published(node, GROUP_ADDRESSES6_ANNOTATION);
    addresses.retain(|_, a| a.is_unicast_link_local());
    addresses
}

fn published<A: serde::de::DeserializeOwned>(node: &Node, annotation: &str) -> BTreeMap<String, A> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// Nodes with a ready endpoint in a Service's `slices`.
fn ready_endpoint_nodes(slices: &[&Slice]) -> std::collections::BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

/// A Service's VIPs: its LoadBalancer addresses (written by the IPAM leader into
/// `status.loadBalancer.ingress`) and its allowed externalIPs.
fn service_vips(bound: &Bound, service: &Service) -> Vec<IpAddr> {
    let mut vips = current_ingress(service);
    vips.extend(bound.external_ips.iter().copied());
    vips.dedup();
    vips
}

/// A Service's entry for one of its VIPs, from the Service and its EndpointSlices.
fn service_document(
    bound: &Bound,
    service: &Service,
    vip: IpAddr,
    mine: &[&Slice],
    mode: RemoteMode,
) -> Value {
    let spec = service.spec.clone().unwrap_or_default();
    let ports: Vec<Value> = spec
        .ports
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let target = match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n as u16,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(port_name)) => mine
                    .iter()
                    .flat_map(|s| s.ports.iter().flatten())
                    .find(|sp| sp.name.as_deref() == Some(port_name.as_str()))
                    .and_then(|sp| sp.port)
                    .map_or(p.port as u16, |n| n as u16),
                None => p.port as u16,
            };
            json!({"port": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()), "targetPort": target})
        })
        .collect();
    // Ready endpoints; when none is, the serving ones that are terminating, so connections
    // drain instead of failing (as kube-proxy does).
    let all: Vec<(&str, Option<&str>, bool, bool)> = mine
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            let ready = c.ready.unwrap_or(true);
            let serving_terminating = c.serving.unwrap_or(ready) && c.terminating.unwrap_or(false);
            e.addresses.iter().map(move |a| (a.as_str(), e.node_name.as_deref(), ready, serving_terminating))
        })
        .collect();
    let any_ready = all.iter().any(|e| e.2);
    let mut endpoints: Vec<Value> = all
        .iter()
        .filter(|e| if any_ready { e.2 } else { e.3 })
        .filter_map(|(address, node, _, _)| Some(json!({"address": address, "node": (*node)?})))
        .collect();
    endpoints.sort_by_key(|e| e["address"].as_str().unwrap_or_default().to_owned());
    endpoints.dedup();
    json!({
        "name": bound.service,
        "vip": vip.to_string(),
        "ports": ports,
        "endpoints": endpoints,
        "remoteMode": mode,
        "trafficPolicy": if spec.external_traffic_policy.as_deref() == Some("Local") { "Local" } else { "Cluster" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::MAX_ENDPOINTS, node_plan::node_plan, service_plan};
    use std::time::Duration;

    fn objects<T: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<T>> {
        yaml.split("\n---\n").map(|doc| Arc::new(serde_yaml::from_str(doc).unwrap())).collect()
    }

    fn cluster() -> ClusterState {
        ClusterState {
            missing_interfaces: Default::default(),
            routes: Default::default(),
            groups: objects(
                "metadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/28], advertInterval: 10ms, remoteMode: dsr, default: true, allowedExternalIPs: [203.0.113.0/24], nodeSelector: {lb: 'yes'}, authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}}",
            ),
            nodes: objects(
                "metadata: {name: n2, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.12}]}\n---\n\
                 metadata: {name: n0, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.10}]}\n---\n\
                 metadata: {name: n1, labels: {lb: 'yes'}}\nstatus: {addresses: [{type: Hostname, address: n1}, {type: InternalIP, address: 192.0.2.11}]}\n---\n\
                 metadata: {name: worker, labels: {}}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.50}]}",
            ),
            services: objects(
                "metadata: {name: web, namespace: shop, annotations: {lb-agent.io/spread: 'false'}}\nspec: {type: LoadBalancer, ports: [{port: 80, targetPort: http}, {port: 443, targetPort: 8443}], externalIPs: [203.0.113.9, 8.8.8.8]}\n\
                 status: {loadBalancer: {ingress: [{ip: 198.51.100.1}]}}\n---\n\
                 metadata: {name: dns, namespace: kube-system, annotations: {lb-agent.io/group: edge}}\nspec: {type: LoadBalancer, externalTrafficPolicy: Local, ports: [{port: 53, protocol: UDP}]}\n\
                 status: {loadBalancer: {ingress: [{ip: 198.51.100.2}]}}",
            ),
            slices: objects(
                "metadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\n\
                 endpoints: [{addresses: [10.244.1.5], nodeName: n1, conditions: {ready: true}}, {addresses: [10.244.2.7], nodeName: n2}, {addresses: [10.244.2.8], nodeName: n2, conditions: {ready: false, serving: true, terminating: true}}]\n---\n\
                 metadata: {name: dns-a, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\n\
                 endpoints: [{addresses: [10.244.0.9], nodeName: n0}]",
            ),
        }
    }

    const BASE: &str = "interface: eth0\nnode: n0\n";

    /// The standalone YAML that says what `cluster()` says.
    const EQUIVALENT: &str = "
interface: eth0
node: n0
groups:
  - name: edge
    advertInterval: 10ms
    authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}
    nodes:
      - {name: n0, address: 192.0.2.10}
      - {name: n1, address: 192.0.2.11}
      - {name: n2, address: 192.0.2.12}
    vips:
      - {address: 198.51.100.2, service: kube-system/dns, eligibleNodes: [n0]}
      - {address: 198.51.100.1, service: shop/web, spread: false}
      - {address: 203.0.113.9, service: shop/web, spread: false}
services:
  - name: kube-system/dns
    vip: 198.51.100.2
    remoteMode: dsr
    trafficPolicy: Local
    ports: [{port: 53, protocol: UDP, targetPort: 53}]
    endpoints: [{address: 10.244.0.9, node: n0}]
  - name: shop/web
    vip: 198.51.100.1
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}, {port: 443, targetPort: 8443}]
    endpoints: [{address: 10.244.1.5, node: n1}, {address: 10.244.2.7, node: n2}]
  - name: shop/web
    vip: 203.0.113.9
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}, {port: 443, targetPort: 8443}]
    endpoints: [{address: 10.244.1.5, node: n1}, {address: 10.244.2.7, node: n2}]
";

    /// Every node's VRRP plan and both families' data-plane plans are the same from either.
    fn assert_same_plans(from_cluster: &Config, from_yaml: &Config) {
        for node in ["n0", "n1", "n2"] {
            assert_eq!(node_plan(from_cluster, node), node_plan(from_yaml, node), "VRRP plan on {node}");
            assert_eq!(
                service_plan::plan::<lb_common::service::Addr4>(from_cluster, node),
                service_plan::plan(from_yaml, node),
                "IPv4 data plane on {node}"
            );
            assert_eq!(
                service_plan::plan::<lb_common::service::Addr6>(from_cluster, node),
                service_plan::plan(from_yaml, node),
                "IPv6 data plane on {node}"
            );
        }
    }

    #[test]
    fn kubernetes_and_yaml_sources_give_the_same_plan() {
        let base = Config::parse(BASE).unwrap();
        let from_cluster = translate(&cluster(), &base).unwrap();
        assert_same_plans(&from_cluster.config, &Config::parse(EQUIVALENT).unwrap());
        // `Local` policy: only n0 has a dns endpoint, so only n0 may own its VIP.
        let vip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));
        for node in ["n1", "n2"] {
            assert!(
                node_plan(&from_cluster.config, node).instances.iter().all(|i| !i.vips.contains(&vip)),
                "{node}"
            );
        }
        assert!(node_plan(&from_cluster.config, "n0").instances.iter().any(|i| i.vips.contains(&vip)));
        // The refused externalIP is reported, not served.
        assert_eq!(from_cluster.refusals.len(), 1, "{:?}", from_cluster.refusals);
        assert_eq!(from_cluster.refusals[0].reason, "ExternalIPNotAllowed");
    }

    /// `cluster()` made dual-stack: `web` and `dns` get IPv6 addresses and IPv6 pods, and n0
    /// has published no usable link-local address.
    fn dual_stack_cluster() -> ClusterState {
        let mut state = cluster();
        let group = Arc::make_mut(&mut state.groups[0]);
        group.spec.address_pools.push("2001:db8:6::/64".into());
        group.spec.allowed_external_ips.push("2001:db8:7::/64".into());
        for node in &mut state.nodes {
            let address6 = match node.metadata.name.as_deref() {
                Some("n1") => "fe80::a",
                Some("n2") => "fe80::b",
                _ => "not an address",
            };
            let annotation = format!("{{\"edge\": \"{address6}\"}}");
            Arc::make_mut(node).metadata.annotations =
                Some([(GROUP_ADDRESSES6_ANNOTATION.to_owned(), annotation)].into());
        }
        state.services = objects(
            "metadata: {name: web, namespace: shop, annotations: {lb-agent.io/spread: 'false'}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [{port: 80, targetPort: http}], externalIPs: ['2001:db8:7::9']}\n\
             status: {loadBalancer: {ingress: [{ip: 198.51.100.1}, {ip: '2001:db8:6::1'}]}}\n---\n\
             metadata: {name: dns, namespace: kube-system, annotations: {lb-agent.io/group: edge}}\n\
             spec: {type: LoadBalancer, ipFamilies: [IPv6], externalTrafficPolicy: Local, ports: [{port: 53, protocol: UDP}]}\n\
             status: {loadBalancer: {ingress: [{ip: '2001:db8:6::2'}]}}",
        );
        state.slices = objects(
            "metadata: {name: web-4, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\n\
             endpoints: [{addresses: [10.244.1.5], nodeName: n1}]\n---\n\
             metadata: {name: web-6, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv6\nports: [{name: http, port: 8086}]\n\
             endpoints: [{addresses: ['fd00:244:2::7'], nodeName: n2}]\n---\n\
             metadata: {name: dns-6, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv6\n\
             endpoints: [{addresses: ['fd00:244:1::9'], nodeName: n1}, {addresses: ['fd00:244:2::9'], nodeName: n2}]\n---\n\
             metadata: {name: dns-4, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\n\
             endpoints: [{addresses: [10.244.0.9], nodeName: n0}]",
        );
        state
    }

    /// The standalone YAML that says what `dual_stack_cluster()` says: each VIP's endpoints are
    /// of its family, named ports are looked up in that family's slices, and IPv6 VIPs may go
    /// only to members with a link-local address (n0 published garbage).
    const DUAL_STACK_EQUIVALENT: &str = "
interface: eth0
node: n0
groups:
  - name: edge
    advertInterval: 10ms
    authentication: {keyFile: /etc/lb-agent-vrrp-keys/edge}
    nodes:
      - {name: n0, address: 192.0.2.10}
      - {name: n1, address: 192.0.2.11, address6: 'fe80::a'}
      - {name: n2, address: 192.0.2.12, address6: 'fe80::b'}
    vips:
      - {address: '2001:db8:6::2', service: kube-system/dns, eligibleNodes: [n1, n2]}
      - {address: 198.51.100.1, service: shop/web, spread: false}
      - {address: '2001:db8:6::1', service: shop/web, spread: false, eligibleNodes: [n1, n2]}
      - {address: '2001:db8:7::9', service: shop/web, spread: false, eligibleNodes: [n1, n2]}
services:
  - name: kube-system/dns
    vip: '2001:db8:6::2'
    remoteMode: dsr
    trafficPolicy: Local
    ports: [{port: 53, protocol: UDP, targetPort: 53}]
    endpoints: [{address: 'fd00:244:1::9', node: n1}, {address: 'fd00:244:2::9', node: n2}]
  - name: shop/web
    vip: 198.51.100.1
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8080}]
    endpoints: [{address: 10.244.1.5, node: n1}]
  - name: shop/web
    vip: '2001:db8:6::1'
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8086}]
    endpoints: [{address: 'fd00:244:2::7', node: n2}]
  - name: shop/web
    vip: '2001:db8:7::9'
    remoteMode: dsr
    ports: [{port: 80, targetPort: 8086}]
    endpoints: [{address: 'fd00:244:2::7', node: n2}]
";

    #[test]
    fn a_dual_stack_cluster_and_its_yaml_give_the_same_plan() {
        let base = Config::parse(BASE).unwrap();
        let from_cluster = translate(&dual_stack_cluster(), &base).unwrap();
        assert!(from_cluster.refusals.is_empty(), "{:?}", from_cluster.refusals);
        assert_same_plans(&from_cluster.config, &Config::parse(DUAL_STACK_EQUIVALENT).unwrap());
        // n0 runs the IPv4 instance only; an IPv6 one runs where the IPv6 VIPs may go.
        use crate::vrrp::family::IpFamily;
        assert!(node_plan(&from_cluster.config, "n0").instances.iter().all(|i| i.family == IpFamily::V4));
        assert!(node_plan(&from_cluster.config, "n1").instances.iter().any(|i| i.family == IpFamily::V6));
    }

    #[test]
    fn a_node_publishing_its_link_local_address_joins_the_ipv6_side_of_its_group() {
        let base = Config::parse(BASE).unwrap();
        let mut state = dual_stack_cluster();
        let mut translator = Translator::default();
        let eligible = |t: &Translation| -> Vec<Option<Vec<String>>> {
            let vips = &t.config.groups[0].vips;
            vips.iter().filter(|v| v.address.is_ipv6()).map(|v| v.eligible_nodes.clone()).collect()
        };
        let first = translator.translate(&state, &base).unwrap();
        assert!(
            eligible(&first)
                .iter()
                .all(|e| e.as_ref().is_some_and(|nodes| !nodes.contains(&"n0".to_owned())))
        );
        // The same objects again: nothing is read again, nothing rebuilt.
        assert_eq!(translator.translate(&state, &base).unwrap(), first);
        assert_eq!(translator.rebuilt(), 0);
        // n0's Node, a new object, now shows its address: every IPv6 VIP may go to any member
        // (dns's to those with its endpoints).
        let n0 = state.nodes.iter_mut().find(|n| n.metadata.name.as_deref() == Some("n0")).unwrap();
        Arc::make_mut(n0).metadata.annotations =
            Some([(GROUP_ADDRESSES6_ANNOTATION.to_owned(), r#"{"edge": "fe80::c"}"#.to_owned())].into());
        assert!(translator.needs_everything(&state));
        let next = translator.translate(&state, &base).unwrap();
        assert_eq!(
            eligible(&next),
            [Some(vec!["n1".to_owned(), "n2".to_owned()]), None, None],
            "dns's (Local) is still its endpoints' nodes"
        );
        let n0 = next.config.groups[0].nodes.iter().find(|n| n.name == "n0").unwrap();
        assert_eq!(n0.address6, Some("fe80::c".parse().unwrap()));
    }

    #[test]
    fn published_vrids_are_kept() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let first = node_plan(&translate(&state, &base).unwrap().config, "n0");
        let pinned: BTreeMap<String, u8> =
            first.vrids["edge"].keys().enumerate().map(|(i, key)| (key.clone(), 200 + i as u8)).collect();
        assert!(!pinned.is_empty());
        Arc::make_mut(&mut state.groups[0]).status =
            Some(crate::k8s::crd::LoadBalancerGroupStatus { vrids: pinned.clone(), ..Default::default() });
        let second = node_plan(&translate(&state, &base).unwrap().config, "n0");
        assert_eq!(second.vrids["edge"], pinned, "the published VRIDs win over fresh allocation");
        assert!(second.instances.iter().all(|i| i.vrid >= 200));
    }

    #[test]
    fn interface_from_ip_uses_this_nodes_route() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let group = Arc::make_mut(&mut state.groups[0]);
        group.spec.interface = None;
        group.spec.interface_from_ip = Some("192.0.2.1".parse().unwrap());
        let t = translate(&state, &base).unwrap();
        assert!(t.config.groups.is_empty());
        let refusal = t.refusals.iter().find(|r| r.reason == "InterfaceNotFound").expect("a refusal");
        assert_eq!(refusal.service, "LoadBalancerGroup/edge");
        // Another interface than the agent's default uplink is served, on that interface, by
        // the members that published their address there.
        state.routes.insert("192.0.2.1".parse().unwrap(), "eth1".into());
        let t = translate(&state, &base).unwrap();
        assert!(t.config.groups.is_empty(), "no member has published an address on eth1 yet");
        for (i, node) in state.nodes.iter_mut().enumerate() {
            let published = format!(r#"{{"edge": "10.1.0.{}"}}"#, 10 + i);
            Arc::make_mut(node).metadata.annotations =
                Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), published)].into());
        }
        let t = translate(&state, &base).unwrap();
        assert!(t.refusals.iter().all(|r| r.reason != "InterfaceNotFound"), "{:?}", t.refusals);
        assert_eq!(t.config.groups[0].interface.as_deref(), Some("eth1"));
        state.routes.insert("192.0.2.1".parse().unwrap(), "eth0".into());
        assert_eq!(translate(&state, &base).unwrap().config.groups.len(), 1);
    }

    #[test]
    fn a_group_on_a_missing_interface_is_refused_and_the_others_served() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let mut lan: LoadBalancerGroup = (*state.groups[0]).clone();
        lan.metadata.name = Some("lan".into());
        lan.spec.interface = Some("eth0.30".into());
        lan.spec.default = false;
        state.groups.push(Arc::new(lan));
        state.missing_interfaces.insert("eth0.30".into());
        let t = translate(&state, &base).unwrap();
        assert_eq!(t.config.groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), vec!["edge"]);
        let refusal = t.refusals.iter().find(|r| r.reason == "InterfaceNotFound").expect("a refusal");
        assert_eq!(refusal.service, "LoadBalancerGroup/lan");
        assert!(refusal.message.contains("eth0.30"), "{}", refusal.message);
    }

    #[test]
    fn members_of_a_group_on_another_interface_use_their_published_address() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let node = Arc::make_mut(&mut state.nodes[1]);
        node.metadata.annotations =
            Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), r#"{"edge": "10.30.0.11"}"#.to_owned())].into());
        let name = node.metadata.name.clone().unwrap();
        let t = translate(&state, &base).unwrap();
        let address = |t: &Translation| {
            t.config.groups[0].nodes.iter().find(|n| n.name == name).map(|n| n.address).unwrap()
        };
        assert_eq!(address(&t), "10.30.0.11".parse::<Ipv4Addr>().unwrap());
        // Garbage there is no address: the InternalIP stands.
        Arc::make_mut(&mut state.nodes[1]).metadata.annotations =
            Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), "not json".to_owned())].into());
        assert_ne!(address(&translate(&state, &base).unwrap()), "10.30.0.11".parse::<Ipv4Addr>().unwrap());

        // On another interface than the default uplink, only nodes that published an address
        // there are members: a node not yet (or never) up leaves the rest of the config valid.
        Arc::make_mut(&mut state.groups[0]).spec.interface = Some("eth1".into());
        let node = Arc::make_mut(&mut state.nodes[1]);
        node.metadata.annotations =
            Some([(GROUP_ADDRESSES_ANNOTATION.to_owned(), r#"{"edge": "10.30.0.11"}"#.to_owned())].into());
        let t = translate(&state, &base).unwrap();
        let members: Vec<(&str, Ipv4Addr)> =
            t.config.groups[0].nodes.iter().map(|n| (n.name.as_str(), n.address)).collect();
        assert_eq!(members, vec![(name.as_str(), "10.30.0.11".parse().unwrap())]);
    }

    proptest::proptest! {
        /// Kubernetes-shaped inputs of any size and order: every node gets the same config, and
        /// every node's plan agrees on each VIP's instance (VRID) and who ranks where.
        #[test]
        fn every_node_plans_the_same_from_the_same_objects(
            node_count in 1usize..6,
            service_count in 0usize..12,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let base = Config::parse("interface: eth0\nnode: n0\n").unwrap();
            let mut state = ClusterState {
                groups: objects("metadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/24], default: true}"),
                nodes: (0..node_count)
                    .map(|i| serde_yaml::from_str(&format!("metadata: {{name: n{i}}}\nstatus: {{addresses: [{{type: InternalIP, address: 192.0.2.{}}}]}}", 10 + i)).unwrap())
                    .collect(),
                services: (0..service_count)
                    .map(|i| serde_yaml::from_str(&format!(
                        "metadata: {{name: s{i}, namespace: ns}}\nspec: {{type: LoadBalancer, ports: [{{port: 80}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 198.51.100.{}}}]}}}}", i + 1
                    )).unwrap())
                    .collect(),
                ..Default::default()
            };
            let reference = translate(&state, &base).unwrap().config;
            let len = state.services.len().max(1);
            state.services.rotate_left(seed as usize % len);
            state.nodes.reverse();
            let shuffled = translate(&state, &base).unwrap().config;
            proptest::prop_assert_eq!(&shuffled, &reference);

            let mut seen: BTreeMap<IpAddr, (u8, u8, String)> = BTreeMap::new();
            for n in 0..node_count {
                let node = format!("n{n}");
                for instance in node_plan(&reference, &node).instances {
                    for vip in &instance.vips {
                        // The same VRID everywhere, and a distinct priority per node.
                        let entry = seen.entry(*vip).or_insert((instance.vrid, instance.priority, node.clone()));
                        proptest::prop_assert_eq!(entry.0, instance.vrid);
                        if entry.2 != node {
                            proptest::prop_assert_ne!(entry.1, instance.priority);
                        }
                    }
                }
            }
            proptest::prop_assert_eq!(seen.len(), service_count);
        }
    }

    #[test]
    fn a_translator_rebuilds_only_the_services_whose_objects_changed() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let versioned = |state: &mut ClusterState, version: &str| {
            for s in &mut state.services {
                Arc::make_mut(s).metadata.resource_version = Some(version.into());
            }
            for s in &mut state.slices {
                Arc::make_mut(s).metadata.resource_version = Some(version.into());
            }
        };
        versioned(&mut state, "1");
        let mut translator = Translator::default();
        assert_eq!(
            translator.translate(&state, &base).unwrap().config,
            translate(&state, &base).unwrap().config
        );
        assert_eq!(translator.rebuilt(), 2);
        assert_eq!(
            translator.translate(&state, &base).unwrap().config,
            translate(&state, &base).unwrap().config
        );
        assert_eq!(translator.rebuilt(), 0, "nothing changed");

        // One EndpointSlice changes: only its Service is rebuilt, and the result is the
        // whole translation's.
        let web = state.slices.iter_mut().find(|s| s.metadata.name.as_deref() == Some("web-a")).unwrap();
        let web = Arc::make_mut(web);
        web.endpoints[0].addresses = vec!["10.244.1.6".into()];
        web.metadata.resource_version = Some("2".into());
        let incremental = translator.translate(&state, &base).unwrap().config;
        assert_eq!(translator.rebuilt(), 1);
        assert_eq!(incremental, translate(&state, &base).unwrap().config);
        assert!(
            incremental
                .services
                .iter()
                .any(|s| s.endpoints.iter().any(|e| e.address.to_string() == "10.244.1.6"))
        );

        // The same objects relisted (new allocations, the same resource versions): reused.
        for s in &mut state.services {
            *s = Arc::new(Service::clone(s));
        }
        for s in &mut state.slices {
            *s = Arc::new(Slice::clone(s));
        }
        assert_eq!(
            translator.translate(&state, &base).unwrap().config,
            translate(&state, &base).unwrap().config
        );
        assert_eq!(translator.rebuilt(), 0, "a relist of unchanged objects");

        // A group's spec changes (its allowed externalIPs): every Service is bound afresh.
        Arc::make_mut(&mut state.groups[0]).spec.allowed_external_ips = vec![];
        let rebound = translator.translate(&state, &base).unwrap().config;
        assert_eq!(rebound, translate(&state, &base).unwrap().config);
        assert_eq!(translator.rebuilt(), 2);
        // Its status (the leader's VRIDs) is not an input of any Service.
        Arc::make_mut(&mut state.groups[0]).status = Some(Default::default());
        translator.translate(&state, &base).unwrap();
        assert_eq!(translator.rebuilt(), 0);

        // Objects without resource versions are reused only as the same allocation.
        versioned(&mut state, "");
        for s in &mut state.services {
            Arc::make_mut(s).metadata.resource_version = None;
        }
        translator.translate(&state, &base).unwrap();
        assert_eq!(translator.rebuilt(), 2);
        translator.translate(&state, &base).unwrap();
        assert_eq!(translator.rebuilt(), 0);
        for s in &mut state.services {
            *s = Arc::new(Service::clone(s));
        }
        translator.translate(&state, &base).unwrap();
        assert_eq!(translator.rebuilt(), 2);
    }

    /// A Service `s{i}` at 198.51.100.{i}, port `port`, and its EndpointSlice, at version `v`.
    fn numbered(i: u8, port: u16, endpoint: u8, v: u32) -> (Arc<Service>, Arc<Slice>) {
        let service = serde_yaml::from_str(&format!(
            "metadata: {{name: s{i}, namespace: ns, uid: u{i}, resourceVersion: '{v}'}}\n\
             spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\n\
             status: {{loadBalancer: {{ingress: [{{ip: 198.51.100.{}}}]}}}}",
            i % 8 + 1
        ))
        .unwrap();
        let slice = serde_yaml::from_str(&format!(
            "metadata: {{name: s{i}-a, namespace: ns, uid: e{i}, resourceVersion: '{v}', labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [10.244.1.{endpoint}], nodeName: n1}}, {{addresses: [10.244.2.{endpoint}], nodeName: n0}}]"
        ))
        .unwrap();
        (Arc::new(service), Arc::new(slice))
    }

    proptest::proptest! {
        /// Any sequence of Service and EndpointSlice changes, passed as changed Services,
        /// gives what translating the whole state afresh gives: endpoint moves (patched in
        /// place), new and deleted Services, port changes and conflicts (assembled again).
        #[test]
        fn changed_services_give_the_whole_translation(
            steps in proptest::collection::vec((0u8..4, 0u8..12, 1u8..200), 1..40),
        ) {
            let base = Config::parse(BASE).unwrap();
            let mut state = cluster();
            state.services.clear();
            state.slices.clear();
            for i in 0..6 {
                let (service, slice) = numbered(i, 80, 1, 1);
                state.services.push(service);
                state.slices.push(slice);
            }
            let mut translator = Translator::default();
            translator.translate(&state, &base).unwrap();
            for (step, (op, i, x)) in steps.into_iter().enumerate() {
                let version = step as u32 + 2;
                let name = format!("s{i}");
                let at = state.services.iter().position(|s| s.metadata.name.as_deref() == Some(&name));
                let port = at.and_then(|a| state.services[a].spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port as u16)).unwrap_or(80);
                match (op, at) {
                    // An endpoint moves.
                    (0, Some(a)) => state.slices[a] = numbered(i, port, x, version).1,
                    // The Service goes.
                    (1, Some(a)) => {
                        state.services.remove(a);
                        state.slices.remove(a);
                    }
                    // It comes, or changes its port (which may clash with another's).
                    (_, Some(a)) => state.services[a] = numbered(i, 80 + u16::from(x % 3), x, version).0,
                    (_, None) => {
                        let (service, slice) = numbered(i, 80 + u16::from(x % 3), x, version);
                        state.services.push(service);
                        state.slices.push(slice);
                    }
                }
                let objects = ServiceObjects {
                    namespace: "ns".into(),
                    name: name.clone(),
                    service: state.services.iter().find(|s| s.metadata.name.as_deref() == Some(&name)).cloned(),
                    slices: state.slices.iter().filter(|s| s.metadata.name.as_deref() == Some(&format!("{name}-a"))).cloned().collect(),
                };
                // The delta pass reads no services or slices from the state.
                let groups_only = ClusterState { services: vec![], slices: vec![], ..state.clone() };
                let delta = translator.translate_changed(&groups_only, &base, Changed::Services(vec![objects])).unwrap();
                let whole = translate(&state, &base).unwrap();
                proptest::prop_assert_eq!(&delta, &whole, "step {}", step);
                proptest::prop_assert!(translator.rebuilt() <= 1);
            }
        }
    }

    #[test]
    fn a_bad_or_conflicting_service_is_refused_alone() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let service = |name: &str, port: u16| -> Arc<Service> {
            Arc::new(
                serde_yaml::from_str(&format!(
                    "metadata: {{name: {name}, namespace: shop, annotations: {{lb-agent.io/allow-shared-ip: k}}}}\n\
                     spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 198.51.100.1}}]}}}}"
                ))
                .unwrap(),
            )
        };
        // Two more Services share web's address (MetalLB's allow-shared-ip): one on a port of
        // its own, one on web's port 80.
        state.services.push(service("admin", 8443));
        state.services.push(service("web2", 80));
        // One whose endpoints are more than a ring can spread.
        let crowd: Vec<String> = (0..=MAX_ENDPOINTS)
            .map(|i| format!("{{addresses: [10.245.{}.{}], nodeName: n1}}", i / 250, i % 250 + 1))
            .collect();
        state.services.push(Arc::new(serde_yaml::from_str("metadata: {name: crowd, namespace: shop}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.3}]}}").unwrap()));
        state.slices.push(Arc::new(serde_yaml::from_str(&format!("metadata: {{name: crowd-a, namespace: shop, labels: {{kubernetes.io/service-name: crowd}}}}\naddressType: IPv4\nendpoints: [{}]", crowd.join(", "))).unwrap()));

        let t = translate(&state, &base).unwrap();
        let served: Vec<(&str, u16)> = t
            .config
            .services
            .iter()
            .flat_map(|s| s.ports.iter().map(|p| (s.name.as_str(), p.port)))
            .collect();
        assert!(served.contains(&("shop/admin", 8443)) && served.contains(&("shop/web", 80)), "{served:?}");
        assert!(!served.iter().any(|(name, _)| *name == "shop/web2" || *name == "shop/crowd"), "{served:?}");
        let vips: Vec<IpAddr> = t.config.groups[0].vips.iter().map(|v| v.address).collect();
        assert_eq!(
            vips.iter().filter(|v| **v == IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1))).count(),
            1,
            "one group VIP: {vips:?}"
        );
        let refused =
            |name: &str| t.unserved.iter().find(|r| r.service == name).map(|r| (r.reason, r.message.clone()));
        assert_eq!(t.unserved.len(), 2, "{:?}", t.unserved);
        assert!(t.unserved.iter().all(|u| t.refusals.contains(u)), "and logged");
        assert_eq!(
            refused("shop/web2"),
            Some(("PortConflict", "198.51.100.1:80/TCP is already served for shop/web".to_owned()))
        );
        let (reason, message) = refused("shop/crowd").unwrap();
        assert_eq!(reason, "InvalidService");
        assert!(message.contains("endpoints") && message.contains(&MAX_ENDPOINTS.to_string()), "{message}");
    }

    #[test]
    fn a_groups_garp_refresh_reaches_the_config() {
        let base = Config::parse(BASE).unwrap();
        assert_eq!(
            translate(&cluster(), &base).unwrap().config.groups[0].announcements.refresh,
            Duration::ZERO
        );
        let mut state = cluster();
        Arc::make_mut(&mut state.groups[0]).spec.garp_refresh = Some("30s".into());
        let config = translate(&state, &base).unwrap().config;
        assert_eq!(config.groups[0].announcements.refresh, Duration::from_secs(30));
    }

    #[test]
    fn object_order_does_not_matter() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        let first = translate(&state, &base).unwrap().config;
        state.nodes.reverse();
        state.services.reverse();
        state.slices.reverse();
        assert_eq!(translate(&state, &base).unwrap().config, first);
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        for slice in &mut state.slices {
            for e in &mut Arc::make_mut(slice).endpoints {
                if e.conditions.is_none() || e.conditions.as_ref().is_some_and(|c| c.ready != Some(false)) {
                    e.conditions = Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                        ready: Some(false),
                        serving: Some(false),
                        terminating: Some(true),
                    });
                }
            }
        }
        let config = translate(&state, &base).unwrap().config;
        let web = config.services.iter().find(|s| s.name == "shop/web").unwrap();
        assert_eq!(web.endpoints.len(), 1);
        assert_eq!(web.endpoints[0].address, Ipv4Addr::new(10, 244, 2, 8));
    }
}
