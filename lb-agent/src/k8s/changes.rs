//! What the watches changed since the last pass, so that a pass translates only the Services
//! an event touched (see `source::Changed`). Pure: the controller feeds it each watch event
//! and reads the stores for the keys it names.
//!
//! An EndpointSlice names its Service by the `kubernetes.io/service-name` label, which a
//! deleted slice may no longer be found by in the store: the index remembers each slice's
//! Service, so that a slice that is deleted or relabelled touches the Service it belonged to.

use std::collections::{BTreeSet, HashMap};

use super::slice::Slice;
use kube::runtime::watcher::Event;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One watch event, as far as the translation cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touch {
    /// A relist, or a change of a group or a node: anything may have changed.
    All,
    /// A Service, by namespace and name.
    Service(String, String),
    /// An EndpointSlice: namespace, name, the Service its label names now (`None` when
    /// deleted or unlabelled).
    Slice { namespace: String, name: String, service: Option<String> },
    /// Nothing to translate (the start of a relist, whose end is `All`).
    Nothing,
}

impl Touch {
    /// A Service watch's event.
    pub fn of_service(event: &Event<k8s_openapi::api::core::v1::Service>) -> Self {
        match event {
            Event::Apply(s) | Event::Delete(s) => Touch::Service(
                s.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                s.metadata.name.clone().unwrap_or_default(),
            ),
            Event::InitDone => Touch::All,
            Event::Init | Event::InitApply(_) => Touch::Nothing,
        }
    }

    /// An EndpointSlice watch's event.
    pub fn of_slice(event: &Event<Slice>) -> Self {
        let slice = |s: &Slice, deleted: bool| Touch::Slice {
            namespace: s.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: s.metadata.name.clone().unwrap_or_default(),
            service: if deleted { None } else { service_of(s).map(str::to_owned) },
        };
        match event {
            Event::Apply(s) => slice(s, false),
            Event::Delete(s) => slice(s, true),
            Event::InitDone => Touch::All,
            Event::Init | Event::InitApply(_) => Touch::Nothing,
        }
    }

    /// A group's or a node's event: only the end of a relist or a change counts.
    pub fn of_other<K>(event: &Event<K>) -> Self {
        match event {
            Event::Apply(_) | Event::Delete(_) | Event::InitDone => Touch::All,
            Event::Init | Event::InitApply(_) => Touch::Nothing,
        }
    }
}

/// The Service an EndpointSlice belongs to, by its label.
pub fn service_of(slice: &Slice) -> Option<&str> {
    slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL).map(String::as_str)
}

/// Each EndpointSlice's Service, and each Service's slices, by namespace.
#[derive(Debug, Default)]
pub struct SliceIndex {
    service_of: HashMap<(String, String), String>,
    slices_of: HashMap<(String, String), BTreeSet<String>>,
}

impl SliceIndex {
    /// The index of `slices` (after a relist).
    pub fn of<'a>(slices: impl IntoIterator<Item = &'a Slice>) -> Self {
        let mut index = Self::default();
        for slice in slices {
            let namespace = slice.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            let name = slice.metadata.name.clone().unwrap_or_default();
            index.set(&namespace, &name, service_of(slice).map(str::to_owned));
        }
        index
    }

    /// Records that slice `namespace/name` belongs to `service` now; returns the Service it
    /// belonged to before, if another.
    fn set(&mut self, namespace: &str, name: &str, service: Option<String>) -> Option<String> {
        let key = (namespace.to_owned(), name.to_owned());
        let before = match &service {
            Some(service) => self.service_of.insert(key, service.clone()),
            None => self.service_of.remove(&key),
        };
        if let Some(before) = &before {
            let of = (namespace.to_owned(), before.clone());
            if let Some(slices) = self.slices_of.get_mut(&of) {
                slices.remove(name);
                if slices.is_empty() {
                    self.slices_of.remove(&of);
                }
            }
        }
        if let Some(service) = service {
            self.slices_of
                .entry((namespace.to_owned(), service.clone()))
                .or_default()
                .insert(name.to_owned());
            return before.filter(|b| *b != service);
        }
        before
    }

    /// The names of Service `namespace/service`'s slices.
    pub fn slices(&self, namespace: &str, service: &str) -> impl Iterator<Item = &str> {
        self.slices_of
            .get(&(namespace.to_owned(), service.to_owned()))
            .into_iter()
            .flatten()
            .map(String::as_str)
    }
}

/// The changes since the last pass.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// Translate everything.
    pub all: bool,
    /// The Services touched, by namespace and name.
    pub services: BTreeSet<(String, String)>,
    /// Whether a Service object itself changed (not only endpoints): the leader's status
    /// (addresses, finalizers, conditions) depends on those, not on endpoints.
    pub service_objects: bool,
}

impl Pending {
    pub fn record(&mut self, touch: Touch, index: &mut SliceIndex) {
        match touch {
            Touch::All => self.all = true,
            Touch::Service(namespace, name) => {
                self.service_objects = true;
                self.services.insert((namespace, name));
            }
            Touch::Slice { namespace, name, service } => {
                if let Some(before) = index.set(&namespace, &name, service.clone()) {
                    self.services.insert((namespace.clone(), before));
                }
                if let Some(service) = service {
                    self.services.insert((namespace, service));
                }
            }
            Touch::Nothing => {}
        }
    }

    /// Whether anything was recorded.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, service: Option<&str>) -> Slice {
        let labels = service.map_or(String::new(), |s| format!(", labels: {{{SERVICE_NAME_LABEL}: {s}}}"));
        serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: ns{labels}}}\naddressType: IPv4\nendpoints: []"
        ))
        .unwrap()
    }

    fn touched(events: &[Touch], index: &mut SliceIndex) -> Pending {
        let mut pending = Pending::default();
        for touch in events {
            pending.record(touch.clone(), index);
        }
        pending
    }

    fn keys(pending: &Pending) -> Vec<(&str, &str)> {
        pending.services.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect()
    }

    #[test]
    fn a_slice_touches_its_service_and_the_one_it_left() {
        let mut index = SliceIndex::of([&slice("web-a", Some("web")), &slice("web-b", Some("web"))]);
        assert_eq!(index.slices("ns", "web").collect::<Vec<_>>(), ["web-a", "web-b"]);

        // An endpoint change in web-a touches web, and only web.
        let p = touched(&[Touch::of_slice(&Event::Apply(slice("web-a", Some("web"))))], &mut index);
        assert_eq!(keys(&p), [("ns", "web")]);
        assert!(!p.all && !p.service_objects, "endpoints only: {p:?}");

        // Relabelled to api: both Services are touched, and the index follows.
        let p = touched(&[Touch::of_slice(&Event::Apply(slice("web-b", Some("api"))))], &mut index);
        assert_eq!(keys(&p), [("ns", "api"), ("ns", "web")]);
        assert_eq!(index.slices("ns", "web").collect::<Vec<_>>(), ["web-a"]);
        assert_eq!(index.slices("ns", "api").collect::<Vec<_>>(), ["web-b"]);

        // Deleted (the event's object may have lost its label): its Service is touched.
        let p = touched(&[Touch::of_slice(&Event::Delete(slice("web-a", None)))], &mut index);
        assert_eq!(keys(&p), [("ns", "web")]);
        assert_eq!(index.slices("ns", "web").count(), 0);
    }

    #[test]
    fn services_relists_groups_and_nodes() {
        let mut index = SliceIndex::default();
        let service: k8s_openapi::api::core::v1::Service =
            serde_yaml::from_str("metadata: {name: web, namespace: shop}").unwrap();
        let p = touched(&[Touch::of_service(&Event::Delete(service.clone()))], &mut index);
        assert_eq!(keys(&p), [("shop", "web")]);
        assert!(p.service_objects && !p.all);
        // A relist counts at its end, when the store holds the new list.
        assert_eq!(Touch::of_service(&Event::Init), Touch::Nothing);
        assert_eq!(Touch::of_service(&Event::InitApply(service)), Touch::Nothing);
        assert_eq!(Touch::of_service(&Event::<k8s_openapi::api::core::v1::Service>::InitDone), Touch::All);
        let node: k8s_openapi::api::core::v1::Node = Default::default();
        assert_eq!(Touch::of_other(&Event::Apply(node)), Touch::All);
        assert!(touched(&[Touch::Nothing], &mut index).is_empty());
    }
}
