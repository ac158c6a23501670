//! The objects, their resource versions and the change log that watches read, with
//! kube-apiserver's rules for writes: optimistic concurrency (409 on a stale
//! resourceVersion), status subresources (a main write keeps the stored status, a status
//! write changes nothing else), finalizers (a delete marks, the last finalizer removed
//! deletes), generation bumped by spec changes, and a log that can be compacted (a watch from
//! before it is 410 Gone).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::{Value, json};

use super::{
    apply,
    schema::{self, Kind},
};

/// (group, resource, namespace or "", name)
pub type Key = (&'static str, &'static str, String, String);

#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: &'static Kind,
    pub namespace: String,
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub kind_of_change: &'static str,
    pub object: Value,
}

/// An error the server answers with: HTTP code, reason and message, as a `Status`.
#[derive(Clone, Debug)]
pub struct Failure {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into() }
    }

    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

static UIDS: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
pub struct Store {
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
    pub log: Vec<Arc<Change>>,
    /// Changes at or below this resource version are no longer in the log.
    pub compacted: u64,
    /// The LoadBalancerGroup CRD's schema.
    pub crd_schema: Option<Value>,
}

pub fn key(kind: &'static Kind, namespace: &str, name: &str) -> Key {
    (kind.group, kind.resource, namespace.to_owned(), name.to_owned())
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn not_found(kind: &Kind, name: &str) -> Failure {
    let resource = if kind.group.is_empty() {
        kind.resource.to_owned()
    } else {
        format!("{}.{}", kind.resource, kind.group)
    };
    Failure::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
}

fn rv_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// How a write reaches an object.
pub enum Write<'a> {
    /// PUT: the whole object.
    Replace(Value),
    /// A JSON merge patch (and strategic merge patch, which for the fields lb-agent's
    /// writers touch merges the same way).
    Merge(Value),
    /// Server-side apply.
    Apply { config: Value, manager: &'a str, force: bool },
}

impl Store {
    pub fn get(&self, kind: &'static Kind, namespace: &str, name: &str) -> Result<Value, Failure> {
        self.objects.get(&key(kind, namespace, name)).cloned().ok_or_else(|| not_found(kind, name))
    }

    /// Objects of `kind` (in `namespace` if given), by namespace and name.
    pub fn list(&self, kind: &'static Kind, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((g, r, ns, _), _)| {
                *g == kind.group && *r == kind.resource && namespace.is_none_or(|n| n == ns)
            })
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn record(
        &mut self,
        kind: &'static Kind,
        namespace: &str,
        change: &'static str,
        object: Value,
    ) -> Arc<Change> {
        let change = Arc::new(Change {
            rv: self.rv,
            kind,
            namespace: namespace.to_owned(),
            kind_of_change: change,
            object,
        });
        self.log.push(change.clone());
        change
    }

    fn next_rv(&mut self, object: &mut Value) {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    /// Drops the log up to now: a watch or a list continuing from before gets 410 Gone.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.log.clear();
    }

    pub fn create(
        &mut self,
        kind: &'static Kind,
        namespace: &str,
        mut object: Value,
        manager: &str,
    ) -> Result<(Value, Arc<Change>), Failure> {
        if !object.is_object() {
            return Err(Failure::new(400, "BadRequest", "the body is not an object"));
        }
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        let meta = object.as_object_mut().unwrap().entry("metadata").or_insert_with(|| json!({}));
        if meta.get("name").and_then(Value::as_str).is_none_or(str::is_empty)
            && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        {
            let suffix = UIDS.fetch_add(1, Ordering::Relaxed);
            meta["name"] = json!(format!("{prefix}{suffix:05x}"));
        }
        if kind.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(ns) if ns != namespace => {
                    return Err(Failure::new(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => meta["namespace"] = json!(namespace),
            }
        }
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        if self.objects.contains_key(&key(kind, namespace, &name)) {
            return Err(Failure::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.resource),
            ));
        }
        if kind.status
            && let Some(map) = object.as_object_mut()
        {
            // Status is the controller's: a create never sets it.
            map.remove("status");
        }
        let meta = &mut object["metadata"];
        meta["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", UIDS.fetch_add(1, Ordering::Relaxed)));
        meta["creationTimestamp"] = json!(now());
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("managedFields");
            m.remove("resourceVersion");
        }
        schema::validate(kind, &mut object, self.crd_schema.as_ref()).map_err(|e| invalid(kind, &name, e))?;
        apply::record_update(kind, &json!({"metadata": {}}), &mut object, manager, "", &now());
        self.next_rv(&mut object);
        self.objects.insert(key(kind, namespace, &name), object.clone());
        let change = self.record(kind, namespace, "ADDED", object.clone());
        Ok((object, change))
    }

    /// A PUT, merge patch or apply to the object or its `status` subresource.
    pub fn write(
        &mut self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        subresource: &str,
        write: Write,
        manager: &str,
    ) -> Result<(Value, Arc<Change>), Failure> {
        let status = subresource == "status";
        if status && !kind.status {
            return Err(Failure::new(
                404,
                "NotFound",
                format!("{} has no status subresource", kind.resource),
            ));
        }
        let existing = self.objects.get(&key(kind, namespace, name)).cloned();
        let Some(old) = existing else {
            // Only an apply to the object itself creates it.
            if let Write::Apply { config, manager, force } = write
                && !status
            {
                let mut object = config.clone();
                object["metadata"]["name"] = json!(name);
                let (created, _) =
                    self.create(kind, namespace, json!({"metadata": {"name": name}}), manager)?;
                self.objects.remove(&key(kind, namespace, name));
                self.log.pop();
                let mut applied = apply::apply(kind, &created, &object, manager, "", force, &now())
                    .map_err(|e| Failure::new(409, "Conflict", e))?;
                if kind.status
                    && let Some(map) = applied.as_object_mut()
                {
                    map.remove("status");
                }
                schema::validate(kind, &mut applied, self.crd_schema.as_ref())
                    .map_err(|e| invalid(kind, name, e))?;
                self.next_rv(&mut applied);
                self.objects.insert(key(kind, namespace, name), applied.clone());
                let change = self.record(kind, namespace, "ADDED", applied.clone());
                return Ok((applied, change));
            }
            return Err(not_found(kind, name));
        };
        let body_rv = match &write {
            Write::Replace(v) | Write::Merge(v) | Write::Apply { config: v, .. } => {
                rv_of(v).map(str::to_owned)
            }
        };
        if let Some(rv) = body_rv
            && Some(rv.as_str()) != rv_of(&old)
        {
            return Err(Failure::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    kind.resource
                ),
            ));
        }
        let applied = matches!(write, Write::Apply { .. });
        let mut new = match write {
            Write::Replace(v) => v,
            Write::Merge(patch) => {
                let mut merged = old.clone();
                merge_patch(&mut merged, &patch);
                merged
            }
            Write::Apply { config, manager, force } => {
                let mut config = config;
                restrict(kind, &mut config, status);
                apply::apply(kind, &old, &config, manager, subresource, force, &now())
                    .map_err(|e| Failure::new(409, "Conflict", e))?
            }
        };
        // What the write may change: a status write only status, a main write all but status.
        if kind.status {
            if status {
                let status_value = new.get("status").cloned();
                let managed = new.pointer("/metadata/managedFields").cloned();
                new = old.clone();
                match status_value {
                    Some(s) => new["status"] = s,
                    None => {
                        new.as_object_mut().unwrap().remove("status");
                    }
                }
                if let Some(m) = managed {
                    new["metadata"]["managedFields"] = m;
                }
            } else {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(map) = new.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
            }
        }
        // Fields the server owns.
        new["apiVersion"] = json!(kind.api_version());
        new["kind"] = json!(kind.kind);
        for field in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"] {
            match old["metadata"].get(field) {
                Some(v) => new["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        if !status && old.get("spec") != new.get("spec") {
            new["metadata"]["generation"] = json!(old["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
        }
        if !applied {
            // An update's ownership is the server's to compute, whatever the body says.
            new["metadata"]["managedFields"] =
                old.pointer("/metadata/managedFields").cloned().unwrap_or(json!([]));
            apply::record_update(kind, &old, &mut new, manager, subresource, &now());
        }
        schema::validate(kind, &mut new, self.crd_schema.as_ref()).map_err(|e| invalid(kind, name, e))?;
        // Compared without resourceVersion and the managers' timestamps.
        let comparable = |v: &Value| {
            let mut v = v.clone();
            if let Some(m) = v["metadata"].as_object_mut() {
                m.remove("resourceVersion");
                if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
                    for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                        e.remove("time");
                    }
                }
            }
            v
        };
        let same = comparable(&old) == comparable(&new);
        if same {
            // A write that changes nothing is not a change: no new resourceVersion, no event.
            let change = Arc::new(Change {
                rv: self.rv,
                kind,
                namespace: namespace.to_owned(),
                kind_of_change: "",
                object: old.clone(),
            });
            return Ok((old, change));
        }
        self.next_rv(&mut new);
        let finalized = new.pointer("/metadata/deletionTimestamp").is_some()
            && new.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
        if finalized {
            self.objects.remove(&key(kind, namespace, name));
            let change = self.record(kind, namespace, "DELETED", new.clone());
            return Ok((new, change));
        }
        self.objects.insert(key(kind, namespace, name), new.clone());
        let change = self.record(kind, namespace, "MODIFIED", new.clone());
        Ok((new, change))
    }

    /// A delete: objects with finalizers are only marked (deletionTimestamp) until the last
    /// finalizer goes.
    pub fn delete(
        &mut self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<(Value, Arc<Change>), Failure> {
        let mut object = self.get(kind, namespace, name)?;
        let finalizers =
            object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if finalizers {
            if object.pointer("/metadata/deletionTimestamp").is_none() {
                object["metadata"]["deletionTimestamp"] = json!(now());
                object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                self.next_rv(&mut object);
                self.objects.insert(key(kind, namespace, name), object.clone());
                let change = self.record(kind, namespace, "MODIFIED", object.clone());
                return Ok((object, change));
            }
            let change = Arc::new(Change {
                rv: self.rv,
                kind,
                namespace: namespace.into(),
                kind_of_change: "",
                object: object.clone(),
            });
            return Ok((object, change));
        }
        self.objects.remove(&key(kind, namespace, name));
        self.next_rv(&mut object);
        let change = self.record(kind, namespace, "DELETED", object.clone());
        Ok((object, change))
    }
}

fn invalid(kind: &Kind, name: &str, error: String) -> Failure {
    Failure::new(422, "Invalid", format!("{}.{} \"{name}\" is invalid: {error}", kind.kind, kind.group))
}

/// An apply to the object itself leaves status alone; one to `/status`, everything else.
fn restrict(kind: &Kind, config: &mut Value, status: bool) {
    let Some(map) = config.as_object_mut() else { return };
    if status {
        map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "status"));
    } else if kind.status {
        map.remove("status");
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().unwrap();
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}
