//! An Ethernet MAC address: the config names one, the uplinks have one, and the announcer and
//! the VRRP shell write them into frames.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, de};

/// An Ethernet MAC address, written `02:00:5e:00:01:01`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0
    }
}

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().filter(|p| p.len() == 2);
            *byte = part
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("a MAC address like 02:00:5e:00:01:01, got {s:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("a MAC address like 02:00:5e:00:01:01, got {s:?}"));
        }
        Ok(Self(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips_through_text() {
        let m: MacAddr = "02:00:5e:00:01:0a".parse().unwrap();
        assert_eq!(m.to_string(), "02:00:5e:00:01:0a");
        assert!("02:00:5e:00:01:0a:ff".parse::<MacAddr>().is_err());
        assert!("02-00-5e-00-01-0a".parse::<MacAddr>().is_err());
    }
}
