//! Server-side apply and field ownership, as kube-apiserver's structured-merge-diff does it
//! for what lb-agent writes:
//! - each manager owns the fields it last applied (`metadata.managedFields`, FieldsV1);
//! - applying a field another manager owns with a different value is a 409 conflict, unless
//!   forced, which takes the field over; the same value is shared;
//! - a field the applier owned and no longer applies is removed, unless someone else owns it;
//! - lists merge by their type: atomic ones are replaced, sets and maps merge item by item
//!   (so applying "no finalizer" removes only the applier's own finalizer);
//! - an update (PUT, merge patch) takes over the fields it changed.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::schema::{Kind, ListType, list_type};

/// One step into an object: a field, a map-list item by its keys, or a set-list value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Field(String),
    /// The item's key fields, as canonical JSON (fields sorted).
    Key(String),
    Value(String),
}

pub type Path = Vec<Step>;

/// Fields the server manages itself, never owned by anyone.
fn untracked(path: &[String]) -> bool {
    matches!(path, [a] if a == "apiVersion" || a == "kind")
        || matches!(path, [m, f] if m == "metadata" && matches!(f.as_str(),
            "name" | "namespace" | "uid" | "resourceVersion" | "generation" | "creationTimestamp" | "managedFields" | "deletionTimestamp"))
}

fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&map[*k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        other => other.to_string(),
    }
}

fn item_key(item: &Value, keys: &[&str]) -> String {
    let mut map = Map::new();
    for k in keys {
        map.insert((*k).to_owned(), item.get(*k).cloned().unwrap_or(Value::Null));
    }
    canonical(&Value::Object(map))
}

/// Every path `value` sets: leaves, and each map-list item itself.
pub fn paths(kind: &Kind, value: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    walk(kind, value, &mut Vec::new(), &mut Vec::new(), &mut out);
    out
}

fn walk(kind: &Kind, value: &Value, names: &mut Vec<String>, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    let Value::Object(map) = value else { return };
    for (field, child) in map {
        names.push(field.clone());
        if untracked(names) {
            names.pop();
            continue;
        }
        prefix.push(Step::Field(field.clone()));
        match child {
            Value::Object(inner) if !inner.is_empty() => walk(kind, child, names, prefix, out),
            Value::Array(items) => {
                let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
                match list_type(kind, &names_ref) {
                    ListType::Atomic => {
                        out.insert(prefix.clone());
                    }
                    ListType::Set => {
                        for item in items {
                            let mut p = prefix.clone();
                            p.push(Step::Value(canonical(item)));
                            out.insert(p);
                        }
                    }
                    ListType::Map(keys) => {
                        for item in items {
                            prefix.push(Step::Key(item_key(item, keys)));
                            out.insert(prefix.clone());
                            // Item fields are not named: their list types are not looked up.
                            let mut item_names = Vec::new();
                            walk(kind, item, &mut item_names, prefix, out);
                            prefix.pop();
                        }
                    }
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
        names.pop();
    }
}

/// The value at `path`, if any.
pub fn get<'a>(value: &'a Value, path: &[Step]) -> Option<&'a Value> {
    let Some((step, rest)) = path.split_first() else { return Some(value) };
    let next = match step {
        Step::Field(f) => value.get(f)?,
        Step::Key(k) => {
            let key: Value = serde_json::from_str(k).ok()?;
            let keys: Vec<&str> = key.as_object()?.keys().map(String::as_str).collect();
            value.as_array()?.iter().find(|item| item_key(item, &keys) == *k)?
        }
        Step::Value(v) => value.as_array()?.iter().find(|item| canonical(item) == *v)?,
    };
    get(next, rest)
}

fn remove(value: &mut Value, path: &[Step]) {
    let Some((step, rest)) = path.split_first() else { return };
    if rest.is_empty() {
        match (step, value) {
            (Step::Field(f), Value::Object(map)) => {
                map.remove(f);
            }
            (Step::Key(k), Value::Array(items)) => {
                let key: Value = serde_json::from_str(k).unwrap_or(Value::Null);
                let keys: Vec<String> =
                    key.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                items.retain(|item| item_key(item, &keys) != *k);
            }
            (Step::Value(v), Value::Array(items)) => items.retain(|item| canonical(item) != *v),
            _ => {}
        }
        return;
    }
    let next = match step {
        Step::Field(f) => value.get_mut(f),
        Step::Key(k) => {
            let key: Value = serde_json::from_str(k).unwrap_or(Value::Null);
            let keys: Vec<String> = key.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            value.as_array_mut().and_then(|items| items.iter_mut().find(|item| item_key(item, &keys) == *k))
        }
        Step::Value(_) => None,
    };
    if let Some(next) = next {
        remove(next, rest);
    }
}

/// `config` merged into `into` by list type.
fn merge(kind: &Kind, names: &mut Vec<String>, into: &mut Value, config: &Value) {
    match (into, config) {
        (Value::Object(target), Value::Object(source)) => {
            for (field, value) in source {
                names.push(field.clone());
                match target.get_mut(field) {
                    Some(existing) if !value.is_null() => merge(kind, names, existing, value),
                    _ => {
                        target.insert(field.clone(), value.clone());
                    }
                }
                names.pop();
            }
        }
        (target @ Value::Array(_), Value::Array(source)) => {
            let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
            let Value::Array(items) = target else { unreachable!() };
            match list_type(kind, &names_ref) {
                ListType::Atomic => *items = source.clone(),
                ListType::Set => {
                    for v in source {
                        if !items.contains(v) {
                            items.push(v.clone());
                        }
                    }
                }
                ListType::Map(keys) => {
                    for v in source {
                        let k = item_key(v, keys);
                        match items.iter_mut().find(|item| item_key(item, keys) == k) {
                            Some(existing) => merge(kind, &mut Vec::new(), existing, v),
                            None => items.push(v.clone()),
                        }
                    }
                }
            }
        }
        (target, source) => *target = source.clone(),
    }
}

/// A `managedFields` entry, decoded.
#[derive(Clone, Debug)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub subresource: String,
    pub api_version: String,
    pub fields: BTreeSet<Path>,
}

pub fn entries(object: &Value) -> Vec<Entry> {
    let Some(Value::Array(list)) = object.pointer("/metadata/managedFields") else { return Vec::new() };
    list.iter()
        .map(|e| Entry {
            manager: e["manager"].as_str().unwrap_or_default().to_owned(),
            operation: e["operation"].as_str().unwrap_or_default().to_owned(),
            subresource: e["subresource"].as_str().unwrap_or_default().to_owned(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

fn store_entries(object: &mut Value, entries: &[Entry], now: &str) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                               "time": now, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)});
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn step_name(step: &Step) -> String {
    match step {
        Step::Field(f) => format!("f:{f}"),
        Step::Key(k) => format!("k:{k}"),
        Step::Value(v) => format!("v:{v}"),
    }
}

pub fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for (i, step) in path.iter().enumerate() {
            let child = node.entry(step_name(step)).or_insert_with(|| json!({}));
            node = child.as_object_mut().expect("tries hold objects");
            if i + 1 == path.len() && matches!(step, Step::Key(_)) {
                node.insert(".".into(), json!({}));
            }
        }
    }
    Value::Object(root)
}

pub fn from_fields_v1(trie: &Value) -> BTreeSet<Path> {
    fn go(node: &Map<String, Value>, prefix: &mut Path, out: &mut BTreeSet<Path>) {
        for (name, child) in node {
            if name == "." {
                out.insert(prefix.clone());
                continue;
            }
            let step = match name.split_at(2) {
                ("f:", f) => Step::Field(f.to_owned()),
                ("k:", k) => Step::Key(k.to_owned()),
                ("v:", v) => Step::Value(v.to_owned()),
                _ => continue,
            };
            prefix.push(step);
            match child.as_object() {
                Some(inner) if !inner.is_empty() => go(inner, prefix, out),
                _ => {
                    out.insert(prefix.clone());
                }
            }
            prefix.pop();
        }
    }
    let mut out = BTreeSet::new();
    if let Some(map) = trie.as_object() {
        go(map, &mut Vec::new(), &mut out);
    }
    out
}

fn describe(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Field(f) => format!(".{f}"),
            Step::Key(k) => format!("[{k}]"),
            Step::Value(v) => format!("[={v}]"),
        })
        .collect()
}

/// Server-side apply of `config` by `manager` onto `current` (an empty object for a create).
/// A conflict's error lists each field and its owner, as the real server's message does.
pub fn apply(
    kind: &Kind,
    current: &Value,
    config: &Value,
    manager: &str,
    subresource: &str,
    force: bool,
    now: &str,
) -> Result<Value, String> {
    let applied = paths(kind, config);
    let mut owners = entries(current);
    let mut conflicts = Vec::new();
    for entry in owners.iter_mut().filter(|e| !(e.manager == manager && e.subresource == subresource)) {
        let taken: Vec<Path> = entry
            .fields
            .intersection(&applied)
            .filter(|p| !matches!(p.last(), Some(Step::Key(_))) && get(current, p) != get(config, p))
            .cloned()
            .collect();
        if force {
            for p in &taken {
                entry.fields.remove(p);
            }
        } else {
            conflicts.extend(
                taken.iter().map(|p| format!("conflict with \"{}\": {}", entry.manager, describe(p))),
            );
        }
    }
    if !conflicts.is_empty() {
        return Err(format!("Apply failed with {} conflicts: {}", conflicts.len(), conflicts.join("; ")));
    }
    let mine = owners
        .iter()
        .position(|e| e.manager == manager && e.subresource == subresource && e.operation == "Apply");
    let previously = mine.map(|i| owners[i].fields.clone()).unwrap_or_default();
    let others: BTreeSet<Path> = owners
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .flat_map(|(_, e)| e.fields.iter().cloned())
        .collect();
    let mut object = current.clone();
    // Longest first, so an item goes after its fields were considered.
    let mut dropped: Vec<&Path> =
        previously.iter().filter(|p| !applied.contains(*p) && !others.contains(*p)).collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        remove(&mut object, p);
    }
    merge(kind, &mut Vec::new(), &mut object, config);
    let entry = Entry {
        manager: manager.to_owned(),
        operation: "Apply".into(),
        subresource: subresource.to_owned(),
        api_version: kind.api_version(),
        fields: applied,
    };
    match mine {
        Some(i) => owners[i] = entry,
        None => owners.push(entry),
    }
    store_entries(&mut object, &owners, now);
    Ok(object)
}

/// After an update (PUT, merge patch) by `manager`: it owns every field it changed, which
/// no one else owns any longer, and fields it removed are no one's.
pub fn record_update(kind: &Kind, old: &Value, new: &mut Value, manager: &str, subresource: &str, now: &str) {
    let before = paths(kind, old);
    let after = paths(kind, new);
    let changed: BTreeSet<Path> = after.iter().filter(|p| get(old, p) != get(new, p)).cloned().collect();
    let gone: BTreeSet<Path> = before.difference(&after).cloned().collect();
    let mut owners = entries(old);
    for entry in &mut owners {
        entry.fields.retain(|p| !changed.contains(p) && !gone.contains(p));
    }
    if !changed.is_empty() {
        match owners
            .iter_mut()
            .find(|e| e.manager == manager && e.subresource == subresource && e.operation == "Update")
        {
            Some(entry) => entry.fields.extend(changed),
            None => owners.push(Entry {
                manager: manager.to_owned(),
                operation: "Update".into(),
                subresource: subresource.to_owned(),
                api_version: kind.api_version(),
                fields: changed,
            }),
        }
    }
    store_entries(new, &owners, now);
}
