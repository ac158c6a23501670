//! The Kubernetes source: LoadBalancerGroups, Services, EndpointSlices and Nodes in, the same
//! `Config` the standalone YAML gives out. Pure: every agent computes the same config from the
//! same objects, and nothing downstream can tell the two sources apart.
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
//!
//! Here: the translator and the groups. Beside it: `members` (a group's nodes and their
//! published addresses), `service` (one Service's translation).

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

mod members;
mod service;

use members::{eligible_members, members};
pub use members::{group_interface, member_names, published_addresses, published_addresses6, selects};
use service::translate_service;

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
    /// Everything refused, for logs: bindings (which the status writes find again themselves),
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
            let members = groups_by_name.get(name.as_str()).map_or(&[][..], |(_, m)| m);
            if members.is_empty() {
                // No node yet (a selector nobody matches, or another network whose addresses
                // nobody has published): nothing to run, and its Services wait with it.
                continue;
            }
            let (vips, mine) = bound.remove(name.as_str()).unwrap_or_default();
            services.extend(mine);
            groups.push(group_config(group, &name, interface, members, vips)?);
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

/// A group's config, built as a document and parsed with the config's own types, so it gets
/// the YAML's defaults and validation.
fn group_config(
    group: &LoadBalancerGroup,
    name: &str,
    interface: String,
    members: &[Member],
    vips: Vec<GroupVip>,
) -> Result<GroupConfig, String> {
    let spec = &group.spec;
    let nodes: Vec<Value> = members
        .iter()
        .map(|m| match m.address6 {
            Some(address6) => json!({"name": m.name, "address": m.address, "address6": address6}),
            None => json!({"name": m.name, "address": m.address}),
        })
        .collect();
    let document = json!({
        "name": name,
        "interface": interface,
        "vlan": spec.vlan,
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
    let mut config: GroupConfig =
        serde_json::from_value(document).map_err(|e| format!("LoadBalancerGroup {name}: {e}"))?;
    config.vips = vips.into();
    Ok(config)
}

#[cfg(test)]
mod tests;
