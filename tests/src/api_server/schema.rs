//! What the server knows about each kind: where it is served, whether it has a status
//! subresource, how server-side apply merges its lists, and how an object is validated
//! (built-in kinds by deserializing into their k8s-openapi type, as the real server's decoder
//! refuses what does not fit; the LoadBalancerGroup against the CRD's openAPIV3Schema, with
//! its defaults applied).

use serde_json::{Map, Value};

/// One served resource.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub status: bool,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub static KINDS: &[Kind] = &[
    Kind { group: "", version: "v1", resource: "services", kind: "Service", namespaced: true, status: true },
    Kind { group: "", version: "v1", resource: "nodes", kind: "Node", namespaced: false, status: true },
    Kind { group: "", version: "v1", resource: "secrets", kind: "Secret", namespaced: true, status: false },
    Kind { group: "", version: "v1", resource: "events", kind: "Event", namespaced: true, status: false },
    Kind { group: "", version: "v1", resource: "pods", kind: "Pod", namespaced: true, status: true },
    Kind {
        group: "apps",
        version: "v1",
        resource: "controllerrevisions",
        kind: "ControllerRevision",
        namespaced: true,
        status: false,
    },
    Kind {
        group: "discovery.k8s.io",
        version: "v1",
        resource: "endpointslices",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        resource: "leases",
        kind: "Lease",
        namespaced: true,
        status: false,
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        resource: "events",
        kind: "Event",
        namespaced: true,
        status: false,
    },
    Kind {
        group: "lb-agent.io",
        version: "v1alpha1",
        resource: "loadbalancergroups",
        kind: "LoadBalancerGroup",
        namespaced: false,
        status: true,
    },
];

pub fn find(group: &str, version: &str, resource: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.group == group && k.version == version && k.resource == resource)
}

/// How server-side apply treats a list (`x-kubernetes-list-type`): replaced whole, a set of
/// scalars, or a map keyed by some of its items' fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListType {
    Atomic,
    Set,
    Map(&'static [&'static str]),
}

/// The list type at `path` (field names from the object's root; list items are not named).
/// Lists not in the table are atomic, as the CRD's lists are (it sets no list type) and as
/// the core types' lists are unless their OpenAPI says otherwise.
pub fn list_type(kind: &Kind, path: &[&str]) -> ListType {
    match (kind.kind, path) {
        (_, ["metadata", "finalizers"]) => ListType::Set,
        (_, ["metadata", "ownerReferences"]) => ListType::Map(&["uid"]),
        ("Service", ["status", "conditions"]) => ListType::Map(&["type"]),
        ("Service", ["spec", "ports"]) => ListType::Map(&["port", "protocol"]),
        ("Node", ["status", "conditions"]) => ListType::Map(&["type"]),
        ("Node", ["status", "addresses"]) => ListType::Map(&["type"]),
        _ => ListType::Atomic,
    }
}

/// Checks `object` as the real server would before storing it, and fills in the CRD's
/// defaults. The error names the field and what was expected.
pub fn validate(kind: &Kind, object: &mut Value, crd_schema: Option<&Value>) -> Result<(), String> {
    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return Err("metadata.name: Required value".into());
    }
    if kind.kind == "LoadBalancerGroup" {
        let schema = crd_schema.ok_or("no CRD schema loaded for LoadBalancerGroup")?;
        apply_defaults(schema, object);
        let checked = json_schema(schema);
        let validator = jsonschema::validator_for(&checked).map_err(|e| format!("the CRD's schema: {e}"))?;
        let errors: Vec<String> =
            validator.iter_errors(object).map(|e| format!("{}: {}", e.instance_path(), e)).collect();
        return if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) };
    }
    macro_rules! typed {
        ($t:ty) => {
            serde_json::from_value::<$t>(object.clone()).map(|_| ()).map_err(|e| e.to_string())
        };
    }
    use k8s_openapi::api::{apps, coordination, core, discovery, events};
    match (kind.group, kind.kind) {
        ("", "Service") => {
            typed!(core::v1::Service)?;
            // As the real server's Service validation: ports are required but for a headless
            // or ExternalName Service (an apply that would create a bare Service fails here).
            let spec = object.get("spec");
            let exempt = spec.is_some_and(|s| s["type"] == "ExternalName" || s["clusterIP"] == "None");
            let ports = spec.and_then(|s| s["ports"].as_array()).is_some_and(|p| !p.is_empty());
            if exempt || ports { Ok(()) } else { Err("spec.ports: Required value".into()) }
        }
        ("", "Node") => typed!(core::v1::Node),
        ("", "Secret") => typed!(core::v1::Secret),
        ("", "Event") => typed!(core::v1::Event),
        ("", "Pod") => typed!(core::v1::Pod),
        (_, "ControllerRevision") => typed!(apps::v1::ControllerRevision),
        (_, "EndpointSlice") => typed!(discovery::v1::EndpointSlice),
        (_, "Lease") => typed!(coordination::v1::Lease),
        (_, "Event") => typed!(events::v1::Event),
        _ => Ok(()),
    }
}

/// The CRD schema as JSON Schema: `nullable: true` admits null; the Kubernetes extensions
/// (CEL rules, list types, preserve-unknown-fields) are left out, since JSON Schema has no
/// word for them (the real server would also run the CEL rules).
fn json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if key.starts_with("x-kubernetes-") || key == "nullable" {
                    continue;
                }
                out.insert(key.clone(), json_schema(value));
            }
            if map.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(t)) = map.get("type")
            {
                out.insert("type".into(), serde_json::json!([t, "null"]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(json_schema).collect()),
        other => other.clone(),
    }
}

/// Structural defaulting: a property with a `default` that the object lacks gets it, in every
/// object the schema reaches (as the real server does on every write and read).
fn apply_defaults(schema: &Value, object: &mut Value) {
    match object {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (key, property) in properties {
                    if !map.contains_key(key)
                        && let Some(default) = property.get("default")
                    {
                        map.insert(key.clone(), default.clone());
                    }
                    if let Some(value) = map.get_mut(key) {
                        apply_defaults(property, value);
                    }
                }
            }
            if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for value in map.values_mut() {
                    apply_defaults(additional, value);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    apply_defaults(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// The LoadBalancerGroup's openAPIV3Schema from `deploy/crds`.
pub fn crd_schema(crd_yaml: &str) -> Result<Value, String> {
    let crd: Value = serde_yaml::from_str(crd_yaml).map_err(|e| format!("the CRD file: {e}"))?;
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .cloned()
        .ok_or_else(|| "the CRD has no spec.versions[0].schema.openAPIV3Schema".into())
}
