//! Two listeners. On the network (`listen`): `/metrics`, `/healthz` and `/readyz`, read-only,
//! for Prometheus and the kubelet's probes. On a Unix socket (`adminSocket`, mode 0600):
//! `/status` (the topology) and `/loglevel` (GET the filter, PUT a new one), for an operator on
//! the node, so nothing that reveals the topology or changes state is reachable over TCP.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::net::{TcpListener, UnixListener};

use crate::metrics::Metrics;

pub struct HttpState {
    pub metrics: Metrics,
    /// Set once XDP is attached and the config applied; cleared when shutting down.
    pub ready: AtomicBool,
    /// What `/status` reports: VRRP as the agent loop last published it, counters read now.
    pub status: StatusSource,
}

/// The parts of `/status` that come from the agent loop.
pub struct StatusSource {
    pub node: String,
    pub interface: String,
    pub xdp_mode: &'static str,
    /// Asks the agent loop for its VRRP instances and uplinks.
    pub requests: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<LoopSnapshot>>,
    pub counters: Arc<std::sync::Mutex<crate::dataplane::XdpCounters>>,
}

/// What the agent loop answers `/status` with.
#[derive(Clone, Debug, Default)]
pub struct LoopSnapshot {
    pub instances: Vec<InstanceSnapshot>,
    pub uplinks: Vec<crate::status::UplinkStatus>,
    pub routed: Vec<crate::status::RoutedStatus>,
}

/// One VRRP instance as the agent loop saw it.
#[derive(Clone, Debug)]
pub struct InstanceSnapshot {
    pub status: crate::status::InstanceStatus,
    pub last_advert: Option<std::time::Instant>,
}

/// What the network listener serves: read-only, and nothing about the topology.
pub fn public_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state)
}

/// What the admin socket serves.
pub fn admin_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/loglevel", get(|| async { format!("{}\n", crate::logging::current()) }).put(set_log_level))
        .with_state(state)
}

pub async fn serve(listener: TcpListener, state: Arc<HttpState>) -> std::io::Result<()> {
    axum::serve(listener, public_router(state)).await
}

pub async fn serve_admin(listener: UnixListener, state: Arc<HttpState>) -> std::io::Result<()> {
    axum::serve(listener, admin_router(state)).await
}

/// Binds the admin socket at `path`: its directory is made if missing, a socket left by an
/// earlier agent is replaced, and only the owner (root) may connect. Returns the listener and
/// the socket's inode, so that the agent removes it on exit only if no newer agent replaced it.
pub fn bind_admin(path: &std::path::Path) -> std::io::Result<(UnixListener, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "something other than a socket is there",
            ));
        }
        Err(_) => {}
    }
    // Connecting needs write permission on the socket, which the usual umask (022) already
    // leaves to the owner alone; 0600 says so whatever the umask was.
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok((listener, std::fs::metadata(path)?.ino()))
}

/// Removes the admin socket at `path` if it is still the one with inode `ino`.
pub fn remove_admin(path: &std::path::Path, ino: u64) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(path).is_ok_and(|m| m.ino() == ino) {
        let _ = std::fs::remove_file(path);
    }
}

async fn metrics(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn status(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    let source = &state.status;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let snapshot = match source.requests.send(reply).await {
        Ok(()) => answer.await.unwrap_or_default(),
        Err(_) => LoopSnapshot::default(),
    };
    let instances = snapshot
        .instances
        .iter()
        .map(|i| {
            let mut s = i.status.clone();
            s.advert_age_ms = i.last_advert.map(|t| t.elapsed().as_millis() as u64);
            s
        })
        .collect();
    let backends = match source.counters.lock().map(|c| c.snapshot()) {
        Ok(Ok(snapshot)) => snapshot
            .backends
            .iter()
            .map(|(b, c)| crate::status::BackendStatus {
                backend: b.endpoint.to_string(),
                delivery: lb_common::service::Delivery::from_u8(b.delivery)
                    .map_or("none", |d| d.label())
                    .to_owned(),
                packets: c.packets,
                bytes: c.bytes,
            })
            .collect(),
        _ => Vec::new(),
    };
    let body = crate::status::AgentStatus {
        node: source.node.clone(),
        interface: source.interface.clone(),
        xdp_mode: source.xdp_mode.to_owned(),
        uplinks: snapshot.uplinks,
        instances,
        routed: snapshot.routed,
        backends,
    };
    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_string(&body).unwrap_or_default())
}

async fn set_log_level(body: String) -> impl IntoResponse {
    match crate::logging::set(&body) {
        Ok(()) => (StatusCode::OK, format!("{}\n", crate::logging::current())),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

async fn ready(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
