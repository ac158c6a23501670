//! An EndpointSlice as every agent keeps it: read from the API server straight into the fields
//! the translation uses (addresses, conditions, node, ports), in the EndpointSlice's own shape,
//! so the store holds ~60 bytes per endpoint instead of k8s-openapi's ~330 (its `targetRef`,
//! hints, topology and hostname, never read, are not even parsed). At 10,000 Services of ten
//! endpoints that is ~27 MB less on every node. Pure.

use k8s_openapi::{
    api::discovery::v1::{EndpointConditions, EndpointPort},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Serialize};

// The Resource derive below names it bare.
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// See the module: `discovery.k8s.io/v1` EndpointSlice, the fields the agent reads.
#[derive(kube::Resource, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[resource(inherit = "EndpointSlice")]
#[serde(rename_all = "camelCase")]
pub struct Slice {
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN`.
    pub address_type: String,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    pub ports: Option<Vec<EndpointPort>>,
}

/// One endpoint of a [`Slice`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default)]
    pub addresses: Vec<String>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn is_read_from_an_endpoint_slice_with_what_the_translation_uses() {
        let slice: Slice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true}, "nodeName": "n0",
                "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "shop", "uid": "u"},
                "hints": {"forZones": [{"name": "a"}]}, "zone": "a", "hostname": "web-1"}]
        }))
        .unwrap();
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints.len(), 1);
        let endpoint = &slice.endpoints[0];
        assert_eq!(endpoint.addresses, ["10.0.0.1"]);
        assert_eq!(endpoint.node_name.as_deref(), Some("n0"));
        assert_eq!(endpoint.conditions.as_ref().and_then(|c| c.ready), Some(true));
        assert_eq!(slice.ports.unwrap()[0].name.as_deref(), Some("http"));
        // The API it is watched at is EndpointSlice's.
        assert_eq!(Slice::kind(&()), "EndpointSlice");
        assert_eq!(Slice::api_version(&()), "discovery.k8s.io/v1");
        assert_eq!(Slice::plural(&()), "endpointslices");
    }

    #[test]
    fn a_slice_with_no_endpoints_field_has_none() {
        let slice: Slice =
            serde_json::from_value(json!({"addressType": "IPv6", "metadata": {"name": "empty"}})).unwrap();
        assert!(slice.endpoints.is_empty());
    }

    #[test]
    fn an_endpoint_is_a_fraction_of_k8s_openapis() {
        let kept = std::mem::size_of::<Endpoint>();
        let full = std::mem::size_of::<k8s_openapi::api::discovery::v1::Endpoint>();
        assert!(kept * 4 < full, "kept {kept} bytes, k8s-openapi's {full}");
    }
}
