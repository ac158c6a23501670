//! Address families, and what names a virtual router: RFC 5798 §5.2.3 scopes a VRID to its
//! address family ("VRID 1 for IPv4 and VRID 1 for IPv6 are separate virtual routers"), so
//! an IPv4 and an IPv6 instance may share a VRID on one node.

use std::{fmt, net::IpAddr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The metric label and the word in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        }
    }

    /// The family's unspecified address: the source of an instance with no local address yet.
    pub fn unspecified(self) -> IpAddr {
        match self {
            IpFamily::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One virtual router of this node: its family and VRID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId {
    pub family: IpFamily,
    pub vrid: u8,
}

/// Lease slots: 0 is "no lease", 1–255 the IPv4 VRIDs, 257–511 the IPv6 ones.
const IPV6_LEASES: u16 = 256;

impl InstanceId {
    pub const fn v4(vrid: u8) -> Self {
        Self { family: IpFamily::V4, vrid }
    }

    pub const fn v6(vrid: u8) -> Self {
        Self { family: IpFamily::V6, vrid }
    }

    /// The data plane's lease slot for this instance's VIPs.
    pub fn lease_slot(self) -> u16 {
        match self.family {
            IpFamily::V4 => u16::from(self.vrid),
            IpFamily::V6 => IPV6_LEASES + u16::from(self.vrid),
        }
    }

    /// The instance whose lease is `slot`.
    pub fn from_lease_slot(slot: u16) -> Option<Self> {
        let (family, vrid) =
            if slot >= IPV6_LEASES { (IpFamily::V6, slot - IPV6_LEASES) } else { (IpFamily::V4, slot) };
        let vrid = u8::try_from(vrid).ok().filter(|v| *v != 0)?;
        Some(Self { family, vrid })
    }
}

impl fmt::Display for InstanceId {
    /// `51` for IPv4 (as VRIDs always read), `51/ipv6` for IPv6.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.family {
            IpFamily::V4 => write!(f, "{}", self.vrid),
            IpFamily::V6 => write!(f, "{}/ipv6", self.vrid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_slots_of_both_families_are_distinct_and_read_back() {
        let mut seen = std::collections::BTreeSet::new();
        for vrid in 1..=255u8 {
            for id in [InstanceId::v4(vrid), InstanceId::v6(vrid)] {
                let slot = id.lease_slot();
                assert!(slot != 0 && u32::from(slot) < lb_common::maps::MAX_LEASES, "{id}: {slot}");
                assert!(seen.insert(slot), "{id}: slot {slot} twice");
                assert_eq!(InstanceId::from_lease_slot(slot), Some(id));
            }
        }
        assert_eq!(InstanceId::from_lease_slot(0), None);
        assert_eq!(InstanceId::from_lease_slot(256), None);
    }
}
