//! `/metrics`, `/healthz`, `/readyz`, and `/loglevel` (GET the filter, PUT a new one).

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
use tokio::net::TcpListener;

use crate::metrics::Metrics;

pub struct HttpState {
    pub metrics: Metrics,
    /// Set once XDP is attached and the config applied; cleared when shutting down.
    pub ready: AtomicBool,
}

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/loglevel", get(|| async { format!("{}\n", crate::logging::current()) }).put(set_log_level))
        .with_state(state)
}

pub async fn serve(listener: TcpListener, state: Arc<HttpState>) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
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
