//! How routed VIPs (groups with `announce: bgp` or `bgpOwner`) reach the node's routing daemon.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, check_interface_name, group::duration};

/// The agent routes each VIP it serves into a device of its own (`ip route add <vip>/32 dev
/// <device> proto <protocol>`); the node's FRR redistributes those kernel routes to the fabric.
/// The device lives as long as the agent is heard from: when the agent dies, or sends no
/// heartbeat for `holdTime`, the kernel deletes it and its routes, and FRR withdraws them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoutesConfig {
    /// The device the VIP routes point into (a TUN device the agent creates and holds).
    #[serde(default = "default_device")]
    pub device: String,
    /// The routes' protocol number, for the routing daemon's filters and for `ip route show
    /// proto`: 1–255, not one the kernel or FRR uses for its own routes.
    #[serde(default = "default_protocol")]
    pub protocol: u8,
    /// After a graceful stop withdraws the routes, how long the agent keeps serving the flows
    /// still arriving while the fabric moves them to the other nodes.
    #[serde(default = "default_drain", deserialize_with = "duration")]
    pub drain: Duration,
    /// How long the agent may go unheard (frozen, its event loop stuck) before its routes are
    /// withdrawn: the bound on a frozen agent's announcements.
    #[serde(default = "default_hold_time", deserialize_with = "duration")]
    pub hold_time: Duration,
    /// How long the routes outlast an agent that re-executes itself (SIGUSR2, an upgrade in
    /// place) before the new image is heard from: the bound on announcements kept for an
    /// upgrade that never comes back up.
    #[serde(default = "default_restart_window", deserialize_with = "duration")]
    pub restart_window: Duration,
}

impl Default for RoutesConfig {
    fn default() -> Self {
        Self {
            device: default_device(),
            protocol: default_protocol(),
            drain: default_drain(),
            hold_time: default_hold_time(),
            restart_window: default_restart_window(),
        }
    }
}

fn default_device() -> String {
    "lb-vips".to_owned()
}

/// Unused by the kernel (below 5 and 16-ish), by FRR (186–198) and by BIRD (12).
fn default_protocol() -> u8 {
    200
}

fn default_drain() -> Duration {
    Duration::from_secs(3)
}

/// Well past any pause of a healthy agent (a reload of 10,000 Services blocks its loop for about
/// half a second), and short beside the minute a supervisor takes to kill a stopped process.
fn default_hold_time() -> Duration {
    Duration::from_secs(3)
}

/// Past a start-up with 50,000 Services (a few seconds), short beside the time a routing
/// daemon keeps a dead peer's routes under BGP graceful restart (120 s by default).
fn default_restart_window() -> Duration {
    Duration::from_secs(30)
}

/// Heartbeats go every third of the hold time, so one late beat is never a lapse; under a
/// second, a busy host's scheduling alone could withdraw the routes.
const HOLD_TIME_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(60);

impl RoutesConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_interface_name("routes.device", &self.device)?;
        // The kernel's own (unspec, redirect, kernel, boot, static) and FRR's (186-198: zebra
        // would take them for its own routes and delete them at start).
        if self.protocol <= 4 || (186..=198).contains(&self.protocol) {
            return Err(ConfigError::new(
                "routes.protocol",
                format!(
                    "a protocol number no one else uses (5-185 or 199-255; 200 by default), got {}",
                    self.protocol
                ),
            ));
        }
        if self.drain > Duration::from_secs(300) {
            return Err(ConfigError::new("routes.drain", format!("at most 5m, got {:?}", self.drain)));
        }
        if !HOLD_TIME_RANGE.contains(&self.hold_time) {
            return Err(ConfigError::new(
                "routes.holdTime",
                format!("a duration from 1s to 1m, got {:?}", self.hold_time),
            ));
        }
        if self.restart_window < self.hold_time || self.restart_window > Duration::from_secs(300) {
            return Err(ConfigError::new(
                "routes.restartWindow",
                format!(
                    "a duration from routes.holdTime ({:?}) to 5m, got {:?}",
                    self.hold_time, self.restart_window
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;

    fn routes(yaml: &str) -> Result<super::RoutesConfig, crate::config::ConfigError> {
        Config::parse(&format!("interface: eth0\n{yaml}")).map(|c| c.routes)
    }

    #[test]
    fn defaults_and_overrides() {
        let r = routes("").unwrap();
        assert_eq!((r.device.as_str(), r.protocol), ("lb-vips", 200));
        assert_eq!((r.drain, r.hold_time), (Duration::from_secs(3), Duration::from_secs(3)));
        assert_eq!(r.restart_window, Duration::from_secs(30));
        let r =
            routes("routes: {device: vips0, protocol: 210, drain: 0s, holdTime: 10s, restartWindow: 1m}\n")
                .unwrap();
        assert_eq!((r.device.as_str(), r.protocol), ("vips0", 210));
        assert_eq!((r.drain, r.hold_time), (Duration::ZERO, Duration::from_secs(10)));
        assert_eq!(r.restart_window, Duration::from_secs(60));
    }

    #[test]
    fn bad_values_are_named() {
        for (yaml, field, expected) in [
            ("routes: {protocol: 186}", "routes.protocol", "5-185 or 199-255"),
            ("routes: {protocol: 2}", "routes.protocol", "5-185 or 199-255"),
            ("routes: {drain: 6m}", "routes.drain", "at most 5m"),
            ("routes: {holdTime: 500ms}", "routes.holdTime", "from 1s to 1m"),
            ("routes: {holdTime: 2m}", "routes.holdTime", "from 1s to 1m"),
            ("routes: {device: a-name-far-too-long}", "routes.device", ""),
            (
                "routes: {holdTime: 10s, restartWindow: 5s}",
                "routes.restartWindow",
                "from routes.holdTime (10s)",
            ),
            ("routes: {restartWindow: 6m}", "routes.restartWindow", "to 5m"),
        ] {
            let e = routes(&format!("{yaml}\n")).unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
            assert!(e.expected.contains(expected), "{yaml}: {e}");
        }
    }
}
