//! Structured logs (text or JSON, tracing) whose filter can change at run time, through
//! `PUT /loglevel` on the agent's HTTP endpoint, without a restart.

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::{EnvFilter, Registry, fmt, layer::SubscriberExt, reload, util::SubscriberInitExt};

struct Control {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// Installs the global subscriber. An invalid `filter` falls back to `info`.
pub fn init(json: bool, ansi: bool, filter: &str) {
    let (filter, text) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, filter.to_owned()),
        Err(_) => (EnvFilter::new("info"), "info".to_owned()),
    };
    let (layer, handle) = reload::Layer::new(filter);
    let text_layer = (!json).then(|| fmt::layer().with_writer(std::io::stderr).with_ansi(ansi));
    let json_layer = json.then(|| fmt::layer().json().with_writer(std::io::stderr));
    tracing_subscriber::registry().with(layer).with(text_layer).with(json_layer).init();
    let _ = CONTROL.set(Control { handle, current: Mutex::new(text) });
}

/// The filter in force.
pub fn current() -> String {
    CONTROL.get().map(|c| c.current.lock().unwrap().clone()).unwrap_or_default()
}

/// Replaces the filter; the error says what was wrong with it.
pub fn set(filter: &str) -> Result<(), String> {
    let control = CONTROL.get().ok_or("logging is not initialised")?;
    let parsed = EnvFilter::try_new(filter.trim())
        .map_err(|e| format!("expected a tracing filter such as `info` or `info,lb_agent=debug`: {e}"))?;
    // Said under the old filter, so a quieter new one does not hide it.
    tracing::info!(from = %current(), to = filter.trim(), "log filter changed");
    control.handle.reload(parsed).map_err(|e| e.to_string())?;
    *control.current.lock().unwrap() = filter.trim().to_owned();
    Ok(())
}
