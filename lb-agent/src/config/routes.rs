//! How routed VIPs (groups with `announce: bgp` or `bgpOwner`) reach the node's routing daemon.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, check_interface_name, group::duration};

/// The agent routes each VIP it serves into a device of its own (`ip route add <vip>/32 dev
/// <device> proto <protocol>`); the node's FRR redistributes those kernel routes to the fabric.
/// The device lives as long as the agent's process: when the agent dies, the kernel deletes
/// it and its routes, and FRR withdraws them.
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
}

impl Default for RoutesConfig {
    fn default() -> Self {
        Self { device: default_device(), protocol: default_protocol(), drain: default_drain() }
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
        Ok(())
    }
}
