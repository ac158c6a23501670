//! Structured logs (text or JSON, tracing) whose filter can change at run time, through
//! `PUT /loglevel` on the agent's HTTP endpoint, without a restart.

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::{EnvFilter, Registry, fmt, layer::SubscriberExt, reload, util::SubscriberInitExt};

struct Control {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// kube's client logs every failed request at ERROR, each retry of each watch during an API
/// server outage: the agent reports failures itself, once per outage (see
/// `k8s::controller`), so that line is off unless a filter names `kube_client`.
const QUIET_KUBE: &str = "kube_client::client::builder=off";

fn parse(filter: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    let mut parsed = EnvFilter::try_new(filter)?;
    if !filter.contains("kube_client") {
        parsed = parsed.add_directive(QUIET_KUBE.parse()?);
    }
    Ok(parsed)
}

/// Installs the global subscriber. An invalid `filter` falls back to `info`.
pub fn init(json: bool, ansi: bool, filter: &str) {
    let (filter, text) = match parse(filter) {
        Ok(f) => (f, filter.to_owned()),
        Err(_) => (parse("info").expect("a valid filter"), "info".to_owned()),
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
    let parsed = parse(filter.trim())
        .map_err(|e| format!("expected a tracing filter such as `info` or `info,lb_agent=debug`: {e}"))?;
    // Said under the old filter, so a quieter new one does not hide it.
    tracing::info!(from = %current(), to = filter.trim(), "log filter changed");
    control.handle.reload(parsed).map_err(|e| e.to_string())?;
    *control.current.lock().unwrap() = filter.trim().to_owned();
    Ok(())
}

/// A token bucket for a log line that can come in storms (a VRRP transition, a lapsed
/// lease): up to `burst` lines at once, then `per_second`; what it holds back is counted and
/// reported with the next line it lets through, so nothing is lost from the logs but lines.
#[derive(Clone, Debug)]
pub struct LogBudget {
    burst: f64,
    per_second: f64,
    tokens: f64,
    refilled: Option<std::time::Instant>,
    held_back: u64,
}

impl LogBudget {
    pub const fn new(burst: u32, per_second: u32) -> Self {
        Self {
            burst: burst as f64,
            per_second: per_second as f64,
            tokens: burst as f64,
            refilled: None,
            held_back: 0,
        }
    }

    /// `Some(lines held back since the last one)` when a line may be logged at `now`.
    pub fn allow(&mut self, now: std::time::Instant) -> Option<u64> {
        if let Some(at) = self.refilled {
            let earned = now.saturating_duration_since(at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.refilled = Some(now);
        if self.tokens < 1.0 {
            self.held_back += 1;
            return None;
        }
        self.tokens -= 1.0;
        Some(std::mem::take(&mut self.held_back))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::LogBudget;

    #[test]
    fn kube_clients_request_errors_are_off_unless_a_filter_names_kube_client() {
        assert!(super::parse("info").unwrap().to_string().contains(super::QUIET_KUBE));
        assert!(!super::parse("info,kube_client=debug").unwrap().to_string().contains(super::QUIET_KUBE));
    }

    #[test]
    fn a_budget_lets_a_burst_through_then_its_rate_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut budget = LogBudget::new(3, 2);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!([0, 0, 0].map(|ms| budget.allow(at(ms))), [Some(0); 3]);
        assert_eq!(budget.allow(at(100)), None);
        assert_eq!(budget.allow(at(200)), None);
        // Half a second earns one line, which reports the two held back.
        assert_eq!(budget.allow(at(500)), Some(2));
        assert_eq!(budget.allow(at(600)), None);
        // Refilled to the burst, never beyond.
        assert_eq!((0..3).map(|_| budget.allow(at(60_000))).collect::<Vec<_>>(), [Some(1), Some(0), Some(0)]);
        assert_eq!(budget.allow(at(60_000)), None);
    }
}
