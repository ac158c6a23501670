//! `lb-agent run`: validate, attach, apply, serve, and react to signals.
//!
//! Order matters for the operator: everything that can be checked (config, interface, HTTP
//! port) is checked before XDP is attached, so a bad start leaves the node untouched.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
};

use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
};
use tracing::{error, info, warn};

use crate::{
    config::{Config, ConfigError},
    dataplane::{Dataplane, XdpCounters, vips::OwnedSet},
    error::{Error, Result},
    http::{self, HttpState},
    metrics::{Metrics, ResultLabels, XdpLabels},
    netdev::{self, Interface},
};

pub async fn run(config_path: PathBuf) -> Result<()> {
    let config = Config::load(&config_path)?;
    let netlink = netdev::connect()?;
    let interface = netdev::find(&netlink, &config.interface).await?.ok_or_else(|| Error::Config {
        path: config_path.clone(),
        error: ConfigError::new(
            "interface",
            format!("an interface of this node, but {:?} does not exist here", config.interface),
        ),
    })?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::io(format!("listening on {} (listen)", config.listen), e))?;

    let (mut dataplane, counters) = Dataplane::attach(&interface, config.xdp_mode)?;
    let counters = Arc::new(Mutex::new(counters));
    let mut metrics = Metrics::new();
    metrics.register_xdp(counters.clone());
    metrics
        .xdp_attached
        .get_or_create(&XdpLabels { interface: interface.name.clone(), mode: dataplane.mode.as_str() })
        .set(1);
    let state = Arc::new(HttpState { metrics, ready: Default::default() });

    apply(&mut dataplane, &counters, &state, &config)?;
    let server = tokio::spawn(http::serve(listener, state.clone()));
    state.ready.store(true, Ordering::Relaxed);
    info!(config = %config_path.display(), listen = %config.listen, "lb-agent running");

    let mut config = config;
    let result = signals(&config_path, &mut config, &mut dataplane, &counters, &state).await;
    state.ready.store(false, Ordering::Relaxed);
    server.abort();
    dataplane.detach()?;
    result
}

/// Waits for SIGTERM/SIGINT (stop) and SIGHUP (reload).
async fn signals(
    config_path: &Path,
    config: &mut Config,
    dataplane: &mut Dataplane,
    counters: &Mutex<XdpCounters>,
    state: &HttpState,
) -> Result<()> {
    let sig = |kind| signal(kind).map_err(|e| Error::io("installing a signal handler", e));
    let (mut term, mut int, mut hup) =
        (sig(SignalKind::terminate())?, sig(SignalKind::interrupt())?, sig(SignalKind::hangup())?);
    loop {
        tokio::select! {
            _ = term.recv() => { info!("SIGTERM: stopping"); return Ok(()) }
            _ = int.recv() => { info!("SIGINT: stopping"); return Ok(()) }
            _ = hup.recv() => reload(config_path, config, dataplane, counters, state),
        }
    }
}

/// A reload that fails leaves the running config in place: a typo never drops live VIPs.
fn reload(
    config_path: &Path,
    config: &mut Config,
    dataplane: &mut Dataplane,
    counters: &Mutex<XdpCounters>,
    state: &HttpState,
) {
    let count = |result| state.metrics.config_reloads.get_or_create(&ResultLabels { result }).inc();
    let new = match Config::load(config_path) {
        Ok(new) => new,
        Err(e) => {
            error!(error = %e, "SIGHUP: config rejected, keeping the running config");
            count("rejected");
            return;
        }
    };
    for (field, changed) in [
        ("interface", new.interface != config.interface),
        ("xdpMode", new.xdp_mode != config.xdp_mode),
        ("listen", new.listen != config.listen),
    ] {
        if changed {
            warn!(field, "SIGHUP: this field only takes effect on restart; keeping the running value");
        }
    }
    let applied = Config {
        interface: config.interface.clone(),
        xdp_mode: config.xdp_mode,
        listen: config.listen,
        ..new
    };
    match apply(dataplane, counters, state, &applied) {
        Ok(()) => {
            *config = applied;
            count("applied");
        }
        Err(e) => {
            error!(error = %e, "SIGHUP: applying the config failed");
            count("failed");
        }
    }
}

fn apply(
    dataplane: &mut Dataplane,
    counters: &Mutex<XdpCounters>,
    state: &HttpState,
    config: &Config,
) -> Result<()> {
    let desired = owned_set(config, &dataplane.interface);
    let applied = dataplane.set_owned_vips(&desired)?;
    if !applied.is_empty() {
        info!(added = ?applied.added, changed = ?applied.changed, removed = ?applied.removed, "owned VIPs updated");
    }
    if let Ok(mut counters) = counters.lock() {
        counters.retain_vips(|vip| desired.contains_key(vip))?;
    }
    state.metrics.owned_vips.set(desired.len() as i64);
    Ok(())
}

/// Without VRRP every configured VIP is owned, answered with its own MAC or the uplink's.
pub fn owned_set(config: &Config, uplink: &Interface) -> OwnedSet {
    config.vips.iter().map(|v| (v.address, v.mac.unwrap_or(uplink.mac))).collect()
}
