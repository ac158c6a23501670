//! One Kubernetes API server for a whole lab: every agent and the test itself talk to it over
//! HTTP with their normal kube clients, and it behaves as kube-apiserver does for what
//! lb-agent uses:
//! - list (with limit and continue) and watch with resource versions; a watch or continue
//!   from before a compaction is 410 Gone; bookmarks when asked for;
//! - status subresources; JSON merge patches; server-side apply with field managers
//!   ([`apply`]); 409 on a stale resourceVersion or an unforced apply conflict;
//! - deletes that wait for finalizers; generation; validation ([`schema`]: the CRD's schema,
//!   the built-in kinds' types);
//! - RBAC from `deploy/rbac.yaml` for the agents' identity ([`rbac`]): anything it does not
//!   allow is 403;
//! - faults a test turns on: down (connections refused, watches cut), slow, 429.
//!
//! It records every request and every write, with the leader Lease's holder and term at the
//! time of the write.

pub mod apply;
pub mod rbac;
pub mod schema;
pub mod store;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::Response,
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use self::{
    rbac::{Attributes, Authorizer},
    schema::Kind,
    store::{Change, Failure, Store, Write as StoreWrite},
};
use crate::Netns;

/// The namespace and name of the agents' leader Lease (`lb-agent/src/k8s/lease.rs`).
pub const LEASE: (&str, &str) = ("lb-agent", "lb-agent-leader");
/// The agents' ServiceAccount, as RBAC sees it.
pub const AGENT_USER: &str = "system:serviceaccount:lb-agent:lb-agent";

/// One request the server answered.
#[derive(Clone, Debug)]
pub struct Request {
    pub at: Instant,
    /// The kubeconfig's client name (`admin` for the test's own).
    pub client: String,
    pub verb: String,
    pub path: String,
    pub code: u16,
}

/// One write that changed an object.
#[derive(Clone, Debug)]
pub struct Write {
    pub at: Instant,
    pub client: String,
    pub verb: String,
    /// `services/status`, `leases`, …
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The leader Lease's holder and `leaseTransitions` when the write was made.
    pub lease: Option<(String, i64)>,
    pub object: Value,
}

#[derive(Clone, Debug, Default)]
struct Faults {
    down: bool,
    delay: Duration,
    /// Requests still to be answered 429.
    throttle: usize,
}

struct Inner {
    store: Mutex<Store>,
    changes: broadcast::Sender<Arc<Change>>,
    faults: Mutex<Faults>,
    /// Bumped when the server goes down or watches are cut: open watches end.
    cut: tokio::sync::watch::Sender<u64>,
    up: tokio::sync::watch::Sender<bool>,
    agents: Authorizer,
    /// token → client name
    tokens: Mutex<BTreeMap<String, String>>,
    requests: Mutex<Vec<Request>>,
    writes: Mutex<Vec<Write>>,
    bookmark_every: Duration,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("reading {}: {e}", full.display()))
}

impl ApiServer {
    /// Serves on `addr`, inside `ns` when given (else in the test's own namespace), with the
    /// CRD and the RBAC manifests from `deploy/`.
    pub fn start(ns: Option<&Netns>, addr: SocketAddr) -> ApiServer {
        let agents =
            Authorizer::for_user(&repo_file("deploy/rbac.yaml"), AGENT_USER).expect("the RBAC manifests");
        let crd = schema::crd_schema(&repo_file("deploy/crds/loadbalancergroups.yaml")).expect("the CRD");
        let store = Store { crd_schema: Some(crd), ..Store::default() };
        let (changes, _) = broadcast::channel(1 << 16);
        let inner = Arc::new(Inner {
            store: Mutex::new(store),
            changes,
            faults: Mutex::default(),
            cut: tokio::sync::watch::channel(0).0,
            up: tokio::sync::watch::channel(true).0,
            agents,
            tokens: Mutex::new([("admin".to_owned(), "admin".to_owned())].into()),
            requests: Mutex::default(),
            writes: Mutex::default(),
            bookmark_every: Duration::from_secs(60),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let served = inner.clone();
        let ns_name = ns.map(|n| n.name().to_owned());
        std::thread::spawn(move || {
            let serve = move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(serve_until(served, addr, stopped, bound_tx));
            };
            match ns_name {
                Some(name) => crate::run_in(&name, serve),
                None => serve(),
            }
        });
        let addr = bound_rx.recv().expect("the API server bound its address");
        ApiServer { addr, inner, stop: Some(stop) }
    }

    /// Writes a kubeconfig for client `name` into `dir`: an agent's (its requests are checked
    /// against the RBAC manifests) or, with `admin`, one RBAC does not restrict.
    pub fn kubeconfig(&self, dir: &Path, name: &str, admin: bool) -> PathBuf {
        let token = if admin { "admin".to_owned() } else { format!("agent-{name}") };
        self.inner.tokens.lock().unwrap().insert(token.clone(), name.to_owned());
        let path = dir.join(format!("kubeconfig-{name}"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: lab, cluster: {{server: 'http://{}'}}}}]\n\
                 users: [{{name: {name}, user: {{token: {token}}}}}]\ncontexts: [{{name: lab, context: {{cluster: lab, user: {name}}}}}]\n\
                 current-context: lab\n",
                self.addr
            ),
        )
        .unwrap();
        path
    }

    /// A kube client for client `name` (see [`ApiServer::kubeconfig`]), for tests that talk to
    /// the server as the agents do.
    pub async fn client(&self, name: &str, admin: bool) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = std::env::temp_dir().join(format!("lb-api-{}-{}", std::process::id(), self.addr.port()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = self.kubeconfig(&dir, name, admin);
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("reading the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client config");
        kube::Client::try_from(config).expect("a client")
    }

    /// Creates or replaces `object` as an admin would (validated; watches see it).
    pub fn put(&self, object: Value) -> Value {
        let kind = kind_of(&object).unwrap_or_else(|| panic!("no served kind for {object}"));
        let namespace =
            object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_owned();
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut store = self.inner.store.lock().unwrap();
        let status = object.get("status").cloned().filter(|_| kind.status);
        let stored = match store.get(kind, &namespace, &name) {
            Ok(_) => store.write(kind, &namespace, &name, "", StoreWrite::Replace(object.clone()), "admin"),
            Err(_) => store.create(kind, &namespace, object.clone(), "admin"),
        };
        // Status goes through its subresource, as a controller's would; watches see both.
        let result = match (stored, status) {
            (Ok((_, change)), Some(status)) => {
                publish(&self.inner, change);
                store.write(
                    kind,
                    &namespace,
                    &name,
                    "status",
                    StoreWrite::Merge(json!({"status": status})),
                    "admin",
                )
            }
            (stored, _) => stored,
        };
        drop(store);
        match result {
            Ok((object, change)) => {
                publish(&self.inner, change);
                object
            }
            Err(f) => panic!("storing {name}: {}", f.message),
        }
    }

    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let kind = kind_named(api_version, kind)?;
        self.inner.store.lock().unwrap().get(kind, namespace, name).ok()
    }

    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let kind = kind_named(api_version, kind).expect("a served kind");
        let result = self.inner.store.lock().unwrap().delete(kind, namespace, name);
        if let Ok((_, change)) = result {
            publish(&self.inner, change);
        }
    }

    /// The server refuses connections and cuts every watch (`true`), or serves again.
    pub fn set_down(&self, down: bool) {
        self.inner.faults.lock().unwrap().down = down;
        self.inner.up.send_replace(!down);
        if down {
            self.inner.cut.send_modify(|n| *n += 1);
        }
    }

    /// Every request waits `delay` before it is handled.
    pub fn set_delay(&self, delay: Duration) {
        self.inner.faults.lock().unwrap().delay = delay;
    }

    /// The next `requests` requests (`usize::MAX`: all, until 0 is set) are answered 429 Too
    /// Many Requests with Retry-After: 1, as under API priority and fairness when the agents'
    /// flow is out of seats.
    pub fn throttle(&self, requests: usize) {
        self.inner.faults.lock().unwrap().throttle = requests;
    }

    /// Ends every open watch and compacts the log: a watch resumed from a resourceVersion
    /// seen before is 410 Gone, and the client must list again.
    pub fn expire_watches(&self) {
        self.inner.store.lock().unwrap().compact();
        self.inner.cut.send_modify(|n| *n += 1);
    }

    pub fn requests(&self) -> Vec<Request> {
        self.inner.requests.lock().unwrap().clone()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.inner.writes.lock().unwrap().clone()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.store.lock().unwrap().rv
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.inner.cut.send_modify(|n| *n += 1);
    }
}

/// Tells the open watches about `change`, unless the write changed nothing.
fn publish(inner: &Inner, change: Arc<Change>) {
    if !change.kind_of_change.is_empty() {
        let _ = inner.changes.send(change);
    }
}

fn kind_of(object: &Value) -> Option<&'static Kind> {
    kind_named(object["apiVersion"].as_str()?, object["kind"].as_str()?)
}

fn kind_named(api_version: &str, kind: &str) -> Option<&'static Kind> {
    schema::KINDS.iter().find(|k| k.api_version() == api_version && k.kind == kind)
}

/// Serves while up; while down the listener is closed (connections are refused) and bound
/// again when the server comes back.
async fn serve_until(
    inner: Arc<Inner>,
    addr: SocketAddr,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    bound: std::sync::mpsc::Sender<SocketAddr>,
) {
    let mut addr = addr;
    let mut up = inner.up.subscribe();
    loop {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("binding the API server");
        addr = listener.local_addr().unwrap();
        let _ = bound.send(addr);
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let mut going_down = up.clone();
        // As kube-apiserver (Go sets TCP_NODELAY): a watch is a stream of small writes, and
        // with Nagle each one after an unread stretch waits for the client's delayed ACK, so a
        // watch that fell behind could never catch up (~50 events a second).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = going_down.wait_for(|up| !*up).await;
        });
        tokio::select! {
            _ = serving => {}
            _ = &mut stopped => return,
        }
        tokio::select! {
            _ = up.wait_for(|up| *up) => {}
            _ = &mut stopped => return,
        }
    }
}

/// The parts of an API path.
struct Target {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: String,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (*r, None, ""),
        [r, n] => (*r, Some((*n).to_owned()), ""),
        [r, n, s] => (*r, Some((*n).to_owned()), *s),
        _ => return None,
    };
    let kind = schema::find(group, version, resource)?;
    if kind.namespaced != namespace.is_some() && name.is_some() {
        return None;
    }
    Some(Target { kind, namespace, name, subresource: subresource.to_owned() })
}

fn query_map(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(code: u16, value: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Body::from(value.to_string()))
        .unwrap()
}

fn failure(f: &Failure) -> Response {
    json_response(f.code, &f.status())
}

/// Who sent the request, from its bearer token.
fn client_of(inner: &Inner, headers: &HeaderMap) -> Option<String> {
    let token = headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?;
    inner.tokens.lock().unwrap().get(token).cloned()
}

/// The field manager of a write: the query's, else the user agent's first word (as the real
/// server derives it).
fn manager_of(query: &BTreeMap<String, String>, headers: &HeaderMap) -> String {
    query.get("fieldManager").cloned().unwrap_or_else(|| {
        headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or("unknown")
            .to_owned()
    })
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let faults = {
        let mut faults = inner.faults.lock().unwrap();
        let now = faults.clone();
        if faults.throttle != usize::MAX {
            faults.throttle = faults.throttle.saturating_sub(1);
        }
        now
    };
    if !faults.delay.is_zero() {
        tokio::time::sleep(faults.delay).await;
    }
    let client = client_of(&inner, &headers);
    let query = query_map(&uri);
    let path = uri.path().to_owned();
    let watch = method == Method::GET && matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let target = parse_path(&path);
    let verb = match (&method, &target) {
        (&Method::GET, Some(t)) if t.name.is_some() => "get",
        (&Method::GET, _) if watch => "watch",
        (&Method::GET, _) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "unknown",
    };
    let response = if faults.down {
        // Caught between going down and the listener closing: as a server shutting down.
        failure(&Failure::new(503, "ServiceUnavailable", "the server is shutting down"))
    } else if faults.throttle > 0 {
        let mut r =
            failure(&Failure::new(429, "TooManyRequests", "too many requests, please try again later"));
        r.headers_mut().insert("retry-after", "1".parse().unwrap());
        r
    } else {
        match (client.as_deref(), target) {
            (None, _) => failure(&Failure::new(401, "Unauthorized", "Unauthorized")),
            (Some(_), None) => failure(&Failure::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            )),
            (Some(client), Some(target)) => {
                let resource = if target.subresource.is_empty() {
                    target.kind.resource.to_owned()
                } else {
                    format!("{}/{}", target.kind.resource, target.subresource)
                };
                let attributes = Attributes {
                    verb,
                    group: target.kind.group,
                    resource: resource.clone(),
                    namespace: target.namespace.as_deref(),
                    name: target.name.as_deref(),
                };
                let admin = client == "admin";
                if !admin && !inner.agents.allows(&attributes) {
                    let scope = match &target.namespace {
                        Some(ns) => format!(" in the namespace \"{ns}\""),
                        None => " at the cluster scope".to_owned(),
                    };
                    failure(&Failure::new(
                        403,
                        "Forbidden",
                        format!(
                            "{resource} \"{}\" is forbidden: User \"{AGENT_USER}\" cannot {verb} resource \"{resource}\" in API group \"{}\"{scope}",
                            target.name.as_deref().unwrap_or_default(),
                            target.kind.group
                        ),
                    ))
                } else {
                    serve(&inner, client, verb, &resource, target, &query, &headers, &body).await
                }
            }
        }
    };
    inner.requests.lock().unwrap().push(Request {
        at: Instant::now(),
        client: client.unwrap_or_default(),
        verb: verb.to_owned(),
        path: path.clone(),
        code: response.status().as_u16(),
    });
    response
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    inner: &Arc<Inner>,
    client: &str,
    verb: &str,
    resource: &str,
    target: Target,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let kind = target.kind;
    let namespace = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let manager = manager_of(query, headers);
    let parse_body = || -> Result<Value, Failure> {
        serde_json::from_slice(body)
            .or_else(|_| serde_yaml::from_slice(body))
            .map_err(|e| Failure::new(400, "BadRequest", format!("the request body: {e}")))
    };
    let result: Result<(Value, Option<Arc<Change>>), Failure> = match verb {
        "get" => inner.store.lock().unwrap().get(kind, &namespace, &name).map(|v| (v, None)),
        "list" => return list(inner, kind, target.namespace.as_deref(), query),
        "watch" => return watch(inner, kind, target.namespace, query),
        "create" => parse_body().and_then(|object| {
            inner.store.lock().unwrap().create(kind, &namespace, object, &manager).map(|(v, c)| (v, Some(c)))
        }),
        "update" => parse_body().and_then(|object| {
            let mut store = inner.store.lock().unwrap();
            store.write(kind, &namespace, &name, &target.subresource, StoreWrite::Replace(object), &manager).map(|(v, c)| (v, Some(c)))
        }),
        "patch" => parse_body().and_then(|patch| {
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
            let write = if content_type.starts_with("application/apply-patch") {
                let Some(manager) = query.get("fieldManager") else {
                    return Err(Failure::new(400, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
                };
                let force = query.get("force").is_some_and(|f| f == "true");
                return inner
                    .store
                    .lock()
                    .unwrap()
                    .write(kind, &namespace, &name, &target.subresource, StoreWrite::Apply { config: patch, manager, force }, manager)
                    .map(|(v, c)| (v, Some(c)));
            } else if content_type.starts_with("application/merge-patch") || content_type.starts_with("application/strategic-merge-patch") {
                StoreWrite::Merge(patch)
            } else {
                return Err(Failure::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format: {content_type}")));
            };
            inner.store.lock().unwrap().write(kind, &namespace, &name, &target.subresource, write, &manager).map(|(v, c)| (v, Some(c)))
        }),
        "delete" => inner.store.lock().unwrap().delete(kind, &namespace, &name).map(|(v, c)| (v, Some(c))),
        _ => Err(Failure::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")),
    };
    match result {
        Err(f) => failure(&f),
        Ok((object, change)) => {
            if let Some(change) = change.filter(|c| !c.kind_of_change.is_empty()) {
                let lease = {
                    let store = inner.store.lock().unwrap();
                    store
                        .get(schema::find("coordination.k8s.io", "v1", "leases").unwrap(), LEASE.0, LEASE.1)
                        .ok()
                        .map(|l| {
                            (
                                l.pointer("/spec/holderIdentity")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_owned(),
                                l.pointer("/spec/leaseTransitions").and_then(Value::as_i64).unwrap_or(0),
                            )
                        })
                };
                inner.writes.lock().unwrap().push(Write {
                    at: Instant::now(),
                    client: client.to_owned(),
                    verb: verb.to_owned(),
                    resource: resource.to_owned(),
                    namespace: namespace.clone(),
                    name: object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or(&name)
                        .to_owned(),
                    lease,
                    object: object.clone(),
                });
                publish(inner, change);
            }
            json_response(if verb == "create" { 201 } else { 200 }, &object)
        }
    }
}

/// Whether `object` matches the request's label and field selectors (equality forms).
fn selected(object: &Value, query: &BTreeMap<String, String>) -> bool {
    let labels = object.pointer("/metadata/labels");
    let label_ok = query.get("labelSelector").is_none_or(|s| {
        s.split(',').filter(|t| !t.is_empty()).all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels.and_then(|l| l.get(k)).and_then(Value::as_str) != Some(v)
            } else if let Some((k, v)) = term.split_once('=') {
                labels.and_then(|l| l.get(k.trim_end_matches('='))).and_then(Value::as_str) == Some(v)
            } else {
                labels.and_then(|l| l.get(term)).is_some()
            }
        })
    });
    let field_ok = query.get("fieldSelector").is_none_or(|s| {
        s.split(',').filter(|t| !t.is_empty()).all(|term| {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            let v = v.trim_start_matches('=');
            let pointer = format!("/{}", k.replace('.', "/"));
            object.pointer(&pointer).and_then(Value::as_str) == Some(v)
        })
    });
    label_ok && field_ok
}

fn list(
    inner: &Inner,
    kind: &'static Kind,
    namespace: Option<&str>,
    query: &BTreeMap<String, String>,
) -> Response {
    let store = inner.store.lock().unwrap();
    let items: Vec<Value> = store.list(kind, namespace).into_iter().filter(|o| selected(o, query)).collect();
    // A continue token is the list's resourceVersion and the offset reached.
    let (rv, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, offset) = token.split_once(':').unwrap_or(("0", "0"));
            let rv: u64 = rv.parse().unwrap_or(0);
            if rv < store.compacted {
                return failure(&Failure::new(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, offset.parse::<usize>().unwrap_or(0))
        }
        None => (store.rv, 0),
    };
    let limit =
        query.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let page: Vec<Value> = items.iter().skip(offset).take(limit).cloned().collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if offset + page.len() < items.len() {
        metadata["continue"] = json!(format!("{rv}:{}", offset + page.len()));
        metadata["remainingItemCount"] = json!(items.len() - offset - page.len());
    }
    json_response(
        200,
        &json!({"apiVersion": kind.api_version(), "kind": format!("{}List", kind.kind), "metadata": metadata, "items": page}),
    )
}

fn watch(
    inner: &Arc<Inner>,
    kind: &'static Kind,
    namespace: Option<String>,
    query: &BTreeMap<String, String>,
) -> Response {
    let line = |kind_of_change: &str, object: &Value| {
        Bytes::from(format!("{}\n", json!({"type": kind_of_change, "object": object})))
    };
    let matches = move |change: &Change, namespace: &Option<String>| {
        (change.kind.group, change.kind.resource) == (kind.group, kind.resource)
            && namespace.as_ref().is_none_or(|n| *n == change.namespace)
    };
    let since: Option<u64> =
        query.get("resourceVersion").filter(|v| !v.is_empty() && *v != "0").and_then(|v| v.parse().ok());
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).map(Duration::from_secs);
    let query = query.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let stream = |rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>| {
        Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        }))
    };
    // The backlog and the subscription are taken under one lock: nothing falls between them.
    let (backlog, mut live, mut last) = {
        let store = inner.store.lock().unwrap();
        let live = inner.changes.subscribe();
        match since {
            Some(rv) if rv < store.compacted => {
                let gone = Failure::new(
                    410,
                    "Expired",
                    format!("too old resource version: {rv} ({})", store.compacted),
                );
                let _ = tx.send(line("ERROR", &gone.status()));
                return Response::builder().status(200).body(stream(rx)).unwrap();
            }
            Some(rv) => {
                let backlog: Vec<Bytes> = store
                    .log
                    .iter()
                    .filter(|c| c.rv > rv && matches(c, &namespace) && selected(&c.object, &query))
                    .map(|c| line(c.kind_of_change, &c.object))
                    .collect();
                (backlog, live, store.rv)
            }
            None => {
                let backlog = store
                    .list(kind, namespace.as_deref())
                    .iter()
                    .filter(|o| selected(o, &query))
                    .map(|o| line("ADDED", o))
                    .collect();
                (backlog, live, store.rv)
            }
        }
    };
    for l in backlog {
        let _ = tx.send(l);
    }
    let mut cut = inner.cut.subscribe();
    cut.mark_unchanged();
    let mut up = inner.up.subscribe();
    let every = inner.bookmark_every;
    let inner = inner.clone();
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(3600)));
        tokio::pin!(deadline);
        let mut bookmark = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                change = live.recv() => match change {
                    Ok(c) if c.rv > last && matches(&c, &namespace) && selected(&c.object, &query) => {
                        last = c.rv;
                        if tx.send(line(c.kind_of_change, &c.object)).is_err() { return }
                    }
                    Ok(_) => {}
                    // Too slow a reader: the real server ends such a watch too.
                    Err(_) => return,
                },
                _ = bookmark.tick(), if bookmarks => {
                    let rv = inner.store.lock().unwrap().rv;
                    let mark = json!({"apiVersion": kind.api_version(), "kind": kind.kind, "metadata": {"resourceVersion": rv.to_string()}});
                    if tx.send(line("BOOKMARK", &mark)).is_err() { return }
                }
                _ = cut.changed() => return,
                // A watch that slipped in while the server was going down ends too.
                _ = up.wait_for(|up| !*up) => return,
                _ = &mut deadline => return,
                () = tx.closed() => return,
            }
        }
    });
    Response::builder().status(200).header("content-type", "application/json").body(stream(rx)).unwrap()
}
