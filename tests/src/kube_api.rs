//! A minimal Kubernetes API server for lab agents run with `--kubernetes`: it lists fixture
//! objects, holds watches open, answers the Lease, and records every write. Plain HTTP on a
//! node's loopback, through a kubeconfig.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{Method, StatusCode, Uri},
    response::Response,
};
use serde_json::{Value, json};

use crate::Netns;

/// A write the agent made: method, path, body.
pub type Write = (String, String, Value);

pub struct KubeApi {
    pub kubeconfig: PathBuf,
    pub writes: Arc<Mutex<Vec<Write>>>,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

type WatchSender = futures::channel::mpsc::UnboundedSender<Result<Bytes, std::convert::Infallible>>;

struct Shared {
    /// Collection path (e.g. `/api/v1/services`) → its items.
    lists: BTreeMap<String, Vec<Value>>,
    writes: Arc<Mutex<Vec<Write>>>,
    /// Open watches, by collection path.
    watches: Mutex<Vec<(String, WatchSender)>>,
}

impl KubeApi {
    /// Serves `lists` on 127.0.0.1:`port` inside `ns`, and writes a kubeconfig for it into `dir`.
    pub fn start(ns: &Netns, dir: &Path, port: u16, lists: BTreeMap<String, Vec<Value>>) -> KubeApi {
        let listener = ns.run(move || {
            let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("binding the fake API");
            l.set_nonblocking(true).unwrap();
            l
        });
        let writes = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(Shared { lists, writes: writes.clone(), watches: Mutex::new(Vec::new()) });
        let kept = shared.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = Router::new().fallback(handle).with_state(shared);
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        let kubeconfig = dir.join(format!("kubeconfig-{}", ns.name()));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: lab, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: lab, user: {{token: lab}}}}]\ncontexts: [{{name: lab, context: {{cluster: lab, user: lab}}}}]\n\
                 current-context: lab\n"
            ),
        )
        .unwrap();
        KubeApi { kubeconfig, writes, shared: kept, stop: Some(stop) }
    }

    /// Sends a watch event (`ADDED`, `MODIFIED`, `DELETED`) for `object` to every open watch on
    /// `path`; returns how many watches got it.
    pub fn push(&self, path: &str, kind: &str, object: Value) -> usize {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let watches = self.shared.watches.lock().unwrap();
        watches
            .iter()
            .filter(|(p, _)| p == path)
            .filter(|(_, tx)| tx.unbounded_send(Ok(Bytes::from(line.clone()))).is_ok())
            .count()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.writes.lock().unwrap().clone()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn handle(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default();
    let reply = |status: StatusCode, value: Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(value.to_string()))
            .unwrap()
    };
    if method == Method::GET && query.contains("watch=true") {
        // The watch stays open; events arrive only through `KubeApi::push`.
        let (tx, rx) = futures::channel::mpsc::unbounded();
        shared.watches.lock().unwrap().push((path, tx));
        return Response::builder().status(StatusCode::OK).body(Body::from_stream(rx)).unwrap();
    }
    if method == Method::GET
        && let Some(items) = shared.lists.get(&path)
    {
        return reply(
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
        );
    }
    if method == Method::GET && path.contains("/leases/") {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        );
    }
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.writes.lock().unwrap().push((method.to_string(), path.clone(), value.clone()));
    let mut echo = value;
    if method == Method::PATCH {
        // A merge patch's nulls delete: the object a server returns has none of them.
        let mut applied = json!({});
        crate::api_server::store::merge_patch(&mut applied, &echo);
        echo = applied;
    }
    if echo["metadata"].is_null() {
        let name = path.rsplit('/').find(|s| *s != "status").unwrap_or("x").to_owned();
        echo["metadata"] = json!({"name": name});
    }
    reply(if method == Method::POST { StatusCode::CREATED } else { StatusCode::OK }, echo)
}
