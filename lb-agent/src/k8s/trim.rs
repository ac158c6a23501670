//! What the watch stores keep of each object: what the agent reads, not what the API server
//! sends. Pure.
//!
//! Every agent holds every Service, EndpointSlice and Node of the cluster. As sent, most of
//! each is bookkeeping the agent never reads: `managedFields` (one entry per field manager,
//! each a tree of every field it owns), `kubectl`'s last-applied copy of the whole object,
//! owner references, and a Node's image list (often its largest part). EndpointSlices are
//! parsed into the fields read in the first place ([`Slice`]).
//! Dropped before the stores, as kube-runtime's `WatchStreamExt::modify` is meant for.
//! Whatever is written back (finalizers, conditions, annotations) is written by server-side
//! apply or a merge patch of its own fields, never from a stored object, so nothing dropped
//! here is ever written back empty.

use k8s_openapi::{
    api::core::v1::{Node, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{crd::LoadBalancerGroup, slice::Slice};

/// `kubectl apply`'s copy of the last applied object, in an annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object as the stores keep it.
pub trait Trim {
    fn trim(&mut self);
}

fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.owner_references = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

impl Trim for Service {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
    }
}

impl Trim for Slice {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
    }
}

impl Trim for Node {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        if let Some(status) = self.status.as_mut() {
            status.images = None;
            status.volumes_attached = None;
            status.volumes_in_use = None;
        }
    }
}

impl Trim for LoadBalancerGroup {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_keeps_its_addresses_and_labels_and_drops_its_images() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n0", "labels": {"zone": "a"}, "managedFields": [{"manager": "kubelet"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                       "images": [{"names": ["registry/app@sha256:0"], "sizeBytes": 1}]}
        }))
        .unwrap();
        node.trim();
        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!(node.metadata.labels.unwrap().get("zone").map(String::as_str), Some("a"));
        let status = node.status.unwrap();
        assert_eq!(status.images, None);
        assert_eq!(status.addresses.unwrap()[0].address, "192.0.2.1");
    }

    #[test]
    fn a_service_keeps_its_spec_status_finalizers_and_annotations() {
        let mut service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "finalizers": ["lb-agent.io/ipam"],
                "annotations": {LAST_APPLIED: "{}", "lb-agent.io/allow-shared-ip": "k"},
                "managedFields": [{"manager": "lb-agent"}]},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.1"}]}}
        }))
        .unwrap();
        let mut expected = service.clone();
        service.trim();
        expected.metadata.managed_fields = None;
        expected.metadata.annotations.as_mut().unwrap().remove(LAST_APPLIED);
        assert_eq!(service, expected);
        assert!(service.metadata.annotations.unwrap().contains_key("lb-agent.io/allow-shared-ip"));
    }
}
