//! Data-plane settings: where maps are pinned, whether forwarding outlives the agent, and the
//! full-NAT source ports.

use std::{fmt, path::PathBuf, str::FromStr};

use lb_common::service::MAX_SERVICE_NUMBERS;
use serde::{Deserialize, Deserializer, de};

use super::ConfigError;

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataplaneConfig {
    /// A directory on bpffs. Maps and program links are pinned under it, so a restarted agent
    /// takes over the running data plane instead of rebuilding it.
    #[serde(default = "default_pin_path")]
    pub pin_path: PathBuf,
    /// Leave the programs attached (pinned) when the agent exits, so forwarding continues
    /// through a restart or upgrade. `lb-agent cleanup` removes them for good.
    #[serde(default = "yes")]
    pub keep_on_exit: bool,
    /// Source ports for full-NAT, e.g. `61000-65535`: keep them outside the kernel's
    /// `net.ipv4.ip_local_port_range`, so translated flows never collide with local sockets.
    #[serde(default)]
    pub snat_ports: PortRange,
    /// How long a full-NAT flow keeps its source port without a packet (`10m` by default), as
    /// conntrack lets an idle flow go. Ports are never taken from a flow for anything else.
    #[serde(default = "default_snat_idle_timeout", deserialize_with = "super::group::duration")]
    pub snat_idle_timeout: std::time::Duration,
    /// How much the maps hold. Fixed when the maps are created: a change takes a restart,
    /// and replaces the pinned maps.
    #[serde(default)]
    pub capacity: Capacity,
    /// How much the IPv6 service maps hold (they are IPv4's over 16-byte addresses, so their
    /// entries are larger): half of IPv4's by default, for the many clusters that serve mostly
    /// IPv4. `ringSize` is `capacity`'s, for both.
    #[serde(default)]
    pub capacity6: Capacity6,
}

/// The sizes of the IPv6 service maps (see [`Capacity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Capacity6 {
    pub services: u32,
    pub backends: u32,
    pub flows: u32,
    pub reply_nat: u32,
    pub local_endpoints: u32,
}

impl Default for Capacity6 {
    fn default() -> Self {
        let v4 = Capacity::default();
        Self {
            services: v4.services / 2,
            backends: v4.backends / 2,
            flows: v4.flows / 2,
            reply_nat: v4.reply_nat / 2,
            local_endpoints: v4.local_endpoints / 2,
        }
    }
}

/// The sizes of the service maps. Past a limit, the services that do not fit are refused
/// (logged, counted, and reported on the Service), and everything else keeps forwarding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Capacity {
    /// Service entries: one per (VIP, port, protocol), so a Service with two ports takes two.
    pub services: u32,
    /// Distinct backends (endpoint address, target port and delivery) over all services.
    pub backends: u32,
    /// The connection table: established flows keep their backend while they are in it. Sized
    /// at two flows a 64-byte bucket of eight, the buckets a power of two (rounded up); a full
    /// bucket evicts its oldest flow.
    pub flows: u32,
    /// Reply translations: one per local or DSR-decapsulated flow (an LRU), and as many for
    /// full NAT's source ports (never evicted; see `snatIdleTimeout`).
    pub reply_nat: u32,
    /// This node's endpoints, one per (service entry, endpoint).
    pub local_endpoints: u32,
    /// The largest Maglev ring, a prime from `maglev::TABLE_SIZES`. A service's ring is the
    /// smallest of them at least 100 times its endpoint count, and at most this.
    pub ring_size: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            services: 32_768,
            backends: 131_072,
            flows: 262_144,
            reply_nat: 262_144,
            local_endpoints: 65_536,
            ring_size: 65_521,
        }
    }
}

/// No map is made larger than this many entries (and 4 GiB of values would not load anyway).
pub const MAX_MAP_ENTRIES: u32 = 1 << 24;

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            pin_path: default_pin_path(),
            keep_on_exit: true,
            snat_ports: PortRange::default(),
            snat_idle_timeout: default_snat_idle_timeout(),
            capacity: Capacity::default(),
            capacity6: Capacity6::default(),
        }
    }
}

pub fn default_pin_path() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/lb-agent")
}

fn default_snat_idle_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(600)
}

/// The shortest `snatIdleTimeout`: a flow refreshes its port twice a second while it sends.
pub const MIN_SNAT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn yes() -> bool {
    true
}

impl DataplaneConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.pin_path.is_absolute() {
            return Err(ConfigError::new(
                "dataplane.pinPath",
                format!("an absolute path on bpffs, got {:?}", self.pin_path),
            ));
        }
        if self.snat_idle_timeout < MIN_SNAT_IDLE_TIMEOUT {
            return Err(ConfigError::new(
                "dataplane.snatIdleTimeout",
                format!("at least {MIN_SNAT_IDLE_TIMEOUT:?}, got {:?}", self.snat_idle_timeout),
            ));
        }
        self.capacity.validate()?;
        let c = &self.capacity6;
        check_sizes(
            "capacity6",
            [
                ("services", c.services),
                ("backends", c.backends),
                ("flows", c.flows),
                ("replyNat", c.reply_nat),
                ("localEndpoints", c.local_endpoints),
            ],
        )
    }
}

/// Each map size of `dataplane.<block>` is a number of entries the kernel takes; services are
/// numbered in 16 bits (the connection table's keys carry the number).
fn check_sizes(block: &str, sizes: [(&str, u32); 5]) -> Result<(), ConfigError> {
    for (field, value) in sizes {
        let max = if field == "services" { MAX_SERVICE_NUMBERS } else { MAX_MAP_ENTRIES };
        if !(1..=max).contains(&value) {
            return Err(ConfigError::new(
                format!("dataplane.{block}.{field}"),
                format!("a number of entries from 1 to {max}, got {value}"),
            ));
        }
    }
    Ok(())
}

impl Capacity {
    fn validate(&self) -> Result<(), ConfigError> {
        check_sizes(
            "capacity",
            [
                ("services", self.services),
                ("backends", self.backends),
                ("flows", self.flows),
                ("replyNat", self.reply_nat),
                ("localEndpoints", self.local_endpoints),
            ],
        )?;
        if !crate::maglev::TABLE_SIZES.contains(&self.ring_size) {
            return Err(ConfigError::new(
                "dataplane.capacity.ringSize",
                format!(
                    "one of the Maglev table sizes {:?}, got {}",
                    crate::maglev::TABLE_SIZES,
                    self.ring_size
                ),
            ));
        }
        Ok(())
    }
}

/// An inclusive port range, written `61000-65535`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl Default for PortRange {
    fn default() -> Self {
        Self { first: 61_000, last: 65_535 }
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = || format!("a port range like 61000-65535 above 1023, got {s:?}");
        let (a, b) = s.split_once('-').ok_or_else(expected)?;
        let first: u16 = a.trim().parse().map_err(|_| expected())?;
        let last: u16 = b.trim().parse().map_err(|_| expected())?;
        if first < 1024 || last < first {
            return Err(expected());
        }
        Ok(Self { first, last })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn the_snat_idle_timeout_defaults_to_ten_minutes_and_has_a_floor() {
        let idle = |yaml: &str| {
            Config::parse(&format!("interface: eth0\n{yaml}")).map(|c| c.dataplane.snat_idle_timeout)
        };
        assert_eq!(idle("").unwrap(), std::time::Duration::from_secs(600));
        assert_eq!(idle("dataplane: {snatIdleTimeout: 30s}\n").unwrap(), std::time::Duration::from_secs(30));
        let e = idle("dataplane: {snatIdleTimeout: 1s}\n").unwrap_err();
        assert_eq!(e.field, "dataplane.snatIdleTimeout");
        assert!(e.expected.contains("at least 10s"), "{e}");
    }

    #[test]
    fn defaults_and_overrides() {
        let c = Config::parse("interface: eth0\n").unwrap();
        assert!(c.dataplane.keep_on_exit);
        assert_eq!(c.dataplane.snat_ports.to_string(), "61000-65535");
        let c = Config::parse("interface: eth0\ndataplane:\n  pinPath: /sys/fs/bpf/x\n  keepOnExit: false\n  snatPorts: 40000-40100\n").unwrap();
        assert!(!c.dataplane.keep_on_exit);
        assert_eq!((c.dataplane.snat_ports.first, c.dataplane.snat_ports.last), (40_000, 40_100));
        let c = Config::parse("interface: eth0\ndataplane:\n  capacity: {services: 100, ringSize: 1021}\n")
            .unwrap();
        assert_eq!((c.dataplane.capacity.services, c.dataplane.capacity.ring_size), (100, 1021));
        assert_eq!(c.dataplane.capacity.backends, super::Capacity::default().backends);
    }

    #[test]
    fn bad_values_are_named() {
        for bad in ["80-90", "5000-4000", "61000", "a-b"] {
            let e = Config::parse(&format!("interface: eth0\ndataplane:\n  snatPorts: {bad}\n")).unwrap_err();
            assert_eq!(e.field, "dataplane.snatPorts", "{bad}");
            assert!(e.expected.contains("61000-65535"), "{e}");
        }
        let e = Config::parse("interface: eth0\ndataplane:\n  pinPath: relative\n").unwrap_err();
        assert_eq!(e.field, "dataplane.pinPath");
        let e = Config::parse("interface: eth0\ndataplane:\n  capacity: {backends: 0}\n").unwrap_err();
        assert_eq!(e.field, "dataplane.capacity.backends");
        let e = Config::parse("interface: eth0\ndataplane:\n  capacity: {ringSize: 1000}\n").unwrap_err();
        assert_eq!(e.field, "dataplane.capacity.ringSize");
        assert!(e.expected.contains("1021"), "{e}");
        // Service numbers are 16 bits.
        let e = Config::parse("interface: eth0\ndataplane:\n  capacity: {services: 65537}\n").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.expected.as_str()),
            ("dataplane.capacity.services", "a number of entries from 1 to 65536, got 65537")
        );
        assert!(Config::parse("interface: eth0\ndataplane:\n  capacity6: {services: 65536}\n").is_ok());
        let e = Config::parse("interface: eth0\ndataplane:\n  capacity6: {flows: 0}\n").unwrap_err();
        assert_eq!(e.field, "dataplane.capacity6.flows");
        let c = Config::parse("interface: eth0\ndataplane:\n  capacity6: {flows: 1000}\n").unwrap();
        assert_eq!((c.dataplane.capacity6.flows, c.dataplane.capacity6.services), (1000, 16_384));
        let e = Config::parse("interface: eth0\ndataplane:\n  capacity: {sessions: 5}\n").unwrap_err();
        assert!(e.field.starts_with("dataplane.capacity"), "{e}");
    }
}
