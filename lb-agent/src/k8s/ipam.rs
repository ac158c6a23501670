//! Address management for LoadBalancer Services: pure, deterministic, and never handing out an
//! address twice.
//!
//! Order of precedence, so a running Service never loses its address to a newcomer:
//! 1. addresses Services already hold (their `status.loadBalancer.ingress`) and may keep;
//! 2. addresses Services ask for (`lb-agent.io/ips`), in Service-name order;
//! 3. the lowest free address of the group's pools, in Service-name order.
//!
//! Sharing is explicit: two Services may hold one address only when both carry the same
//! `lb-agent.io/allow-shared-ip` key and their ports do not overlap (MetalLB's rule).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::Ipv4Addr,
};

/// A group's pools: inclusive ranges of addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pools {
    ranges: Vec<(u32, u32)>,
}

impl Pools {
    /// Parses `198.51.100.0/28` (network and broadcast addresses excluded below /31) or
    /// `198.51.100.10-198.51.100.20`. The error names the entry and what was expected.
    pub fn parse(entries: &[String]) -> Result<Pools, String> {
        let mut ranges = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let ipv6 = entry
                .split(['/', '-'])
                .next()
                .is_some_and(|a| a.trim().parse::<std::net::Ipv6Addr>().is_ok());
            let bad = || {
                let why = if ipv6 {
                    " (IPv6 pools are not allocated from yet: lb-agent serves Kubernetes Services over IPv4 only for now)"
                } else {
                    ""
                };
                format!(
                    "addressPools[{i}]: expected an IPv4 CIDR or a range like 198.51.100.10-198.51.100.20{why}, got {entry:?}"
                )
            };
            let range = if let Some((a, b)) = entry.split_once('-') {
                let (a, b): (Ipv4Addr, Ipv4Addr) =
                    (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if u32::from(a) > u32::from(b) {
                    return Err(bad());
                }
                (u32::from(a), u32::from(b))
            } else {
                let (net, len) = entry.split_once('/').ok_or_else(bad)?;
                let net: Ipv4Addr = net.parse().map_err(|_| bad())?;
                let len: u32 = len.parse().ok().filter(|l| *l <= 32).ok_or_else(bad)?;
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                let first = u32::from(net) & mask;
                let last = first | !mask;
                if len <= 30 { (first + 1, last - 1) } else { (first, last) }
            };
            ranges.push(range);
        }
        Ok(Pools { ranges })
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&ip))
    }

    fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.ranges.iter().flat_map(|(a, b)| (*a..=*b).map(Ipv4Addr::from))
    }
}

/// One Service's needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `namespace/name`.
    pub service: String,
    pub group: String,
    /// What it holds now.
    pub current: Vec<Ipv4Addr>,
    /// What it asks for; empty: any one address.
    pub requested: Vec<Ipv4Addr>,
    pub shared_key: Option<String>,
    /// (port, protocol) pairs, to decide whether sharing is possible.
    pub ports: BTreeSet<(u16, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpamError {
    UnknownGroup { group: String },
    NotInPool { ip: Ipv4Addr, group: String },
    InUse { ip: Ipv4Addr, by: String },
    Exhausted { group: String },
}

impl IpamError {
    /// The Event/condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            IpamError::UnknownGroup { .. } => "UnknownGroup",
            IpamError::NotInPool { .. } => "AddressNotInPool",
            IpamError::InUse { .. } => "AddressInUse",
            IpamError::Exhausted { .. } => "PoolExhausted",
        }
    }
}

impl fmt::Display for IpamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpamError::UnknownGroup { group } => write!(f, "LoadBalancerGroup {group:?} does not exist"),
            IpamError::NotInPool { ip, group } => {
                write!(f, "{ip} is not in the address pools of group {group:?}")
            }
            IpamError::InUse { ip, by } => write!(
                f,
                "{ip} is already used by {by} (sharing needs the same lb-agent.io/allow-shared-ip key on both and no common port)"
            ),
            IpamError::Exhausted { group } => write!(f, "the address pools of group {group:?} are exhausted"),
        }
    }
}

/// The outcome: each Service's addresses, or why it has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    pub addresses: BTreeMap<String, Vec<Ipv4Addr>>,
    pub errors: BTreeMap<String, IpamError>,
}

struct Holder<'a> {
    request: &'a Request,
}

pub fn allocate(pools: &BTreeMap<String, Pools>, requests: &[Request]) -> Allocation {
    let mut sorted: Vec<&Request> = requests.iter().collect();
    sorted.sort_by(|a, b| a.service.cmp(&b.service));
    let mut holders: BTreeMap<Ipv4Addr, Vec<Holder>> = BTreeMap::new();
    let mut out = Allocation::default();
    let may_join =
        |holders: &BTreeMap<Ipv4Addr, Vec<Holder>>, ip: Ipv4Addr, r: &Request| -> Result<(), String> {
            match holders.get(&ip) {
                None => Ok(()),
                Some(existing) => match existing.iter().find(|h| !can_share(h.request, r)) {
                    None => Ok(()),
                    Some(h) => Err(h.request.service.clone()),
                },
            }
        };

    // 1. Keep what is held, when it is still valid.
    for r in &sorted {
        let Some(pool) = pools.get(&r.group) else { continue };
        let keep: Vec<Ipv4Addr> = r
            .current
            .iter()
            .copied()
            .filter(|ip| pool.contains(*ip) && (r.requested.is_empty() || r.requested.contains(ip)))
            .filter(|ip| may_join(&holders, *ip, r).is_ok())
            .collect();
        if !keep.is_empty() && (r.requested.is_empty() || keep.len() == r.requested.len()) {
            for ip in &keep {
                holders.entry(*ip).or_default().push(Holder { request: r });
            }
            out.addresses.insert(r.service.clone(), keep);
        }
    }
    // 2 and 3. Everyone else, in name order.
    for r in &sorted {
        if out.addresses.contains_key(&r.service) {
            continue;
        }
        let Some(pool) = pools.get(&r.group) else {
            out.errors.insert(r.service.clone(), IpamError::UnknownGroup { group: r.group.clone() });
            continue;
        };
        let result = if r.requested.is_empty() {
            pool.addresses()
                .find(|ip| {
                    may_join(&holders, *ip, r).is_ok()
                        && (!holders.contains_key(ip) || r.shared_key.is_some())
                })
                .or_else(|| pool.addresses().find(|ip| !holders.contains_key(ip)))
                .map(|ip| vec![ip])
                .ok_or(IpamError::Exhausted { group: r.group.clone() })
        } else {
            r.requested
                .iter()
                .map(|ip| {
                    if !pool.contains(*ip) {
                        return Err(IpamError::NotInPool { ip: *ip, group: r.group.clone() });
                    }
                    may_join(&holders, *ip, r).map(|()| *ip).map_err(|by| IpamError::InUse { ip: *ip, by })
                })
                .collect()
        };
        match result {
            Ok(ips) => {
                for ip in &ips {
                    holders.entry(*ip).or_default().push(Holder { request: r });
                }
                out.addresses.insert(r.service.clone(), ips);
            }
            Err(e) => {
                out.errors.insert(r.service.clone(), e);
            }
        }
    }
    out
}

fn can_share(a: &Request, b: &Request) -> bool {
    a.shared_key.is_some()
        && a.shared_key == b.shared_key
        && a.group == b.group
        && a.ports.is_disjoint(&b.ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pools(entries: &[&str]) -> BTreeMap<String, Pools> {
        [("g".to_owned(), Pools::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap())]
            .into()
    }

    fn req(service: &str, current: &[&str], requested: &[&str]) -> Request {
        Request {
            service: service.into(),
            group: "g".into(),
            current: current.iter().map(|a| a.parse().unwrap()).collect(),
            requested: requested.iter().map(|a| a.parse().unwrap()).collect(),
            shared_key: None,
            ports: [(80, "TCP".to_owned())].into(),
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn pools_parse_cidrs_and_ranges_and_name_bad_entries() {
        let p = Pools::parse(&["198.51.100.0/30".into(), "198.51.100.10-198.51.100.11".into()]).unwrap();
        let all: Vec<Ipv4Addr> = p.addresses().collect();
        assert_eq!(all, [ip("198.51.100.1"), ip("198.51.100.2"), ip("198.51.100.10"), ip("198.51.100.11")]);
        let e = Pools::parse(&["198.51.100.0/28".into(), "10.0.0.9-10.0.0.1".into()]).unwrap_err();
        assert!(e.starts_with("addressPools[1]"), "{e}");
        assert!(Pools::parse(&["198.51.100.0/33".into()]).is_err());
        let e = Pools::parse(&["198.51.100.0/28".into(), "2001:db8:6::/64".into()]).unwrap_err();
        assert!(e.starts_with("addressPools[1]:") && e.contains("IPv4 only for now"), "{e}");
    }

    #[test]
    fn held_addresses_are_kept_and_newcomers_get_the_lowest_free() {
        let p = pools(&["198.51.100.0/29"]);
        let a = allocate(&p, &[req("ns/b", &["198.51.100.1"], &[]), req("ns/a", &[], &[])]);
        assert_eq!(a.addresses["ns/b"], [ip("198.51.100.1")], "b keeps its address although a sorts first");
        assert_eq!(a.addresses["ns/a"], [ip("198.51.100.2")]);
    }

    #[test]
    fn requests_are_checked_and_conflicts_named() {
        let p = pools(&["198.51.100.0/29"]);
        let a = allocate(
            &p,
            &[
                req("ns/a", &[], &["198.51.100.3"]),
                req("ns/b", &[], &["198.51.100.3"]),
                req("ns/c", &[], &["203.0.113.1"]),
            ],
        );
        assert_eq!(a.addresses["ns/a"], [ip("198.51.100.3")]);
        assert_eq!(a.errors["ns/b"], IpamError::InUse { ip: ip("198.51.100.3"), by: "ns/a".into() });
        assert_eq!(a.errors["ns/c"].reason(), "AddressNotInPool");
    }

    #[test]
    fn exhaustion_and_unknown_groups_are_errors() {
        let p = pools(&["198.51.100.1-198.51.100.1"]);
        let mut other = req("ns/z", &[], &[]);
        other.group = "nope".into();
        let a = allocate(&p, &[req("ns/a", &[], &[]), req("ns/b", &[], &[]), other]);
        assert_eq!(a.errors["ns/b"], IpamError::Exhausted { group: "g".into() });
        assert_eq!(a.errors["ns/z"].reason(), "UnknownGroup");
    }

    #[test]
    fn sharing_needs_the_same_key_and_disjoint_ports() {
        let p = pools(&["198.51.100.1-198.51.100.2"]);
        let mut a = req("ns/a", &[], &[]);
        let mut b = req("ns/b", &[], &[]);
        a.shared_key = Some("k".into());
        b.shared_key = Some("k".into());
        b.ports = [(53, "UDP".to_owned())].into();
        let out = allocate(&p, &[a.clone(), b.clone()]);
        assert_eq!(out.addresses["ns/a"], out.addresses["ns/b"], "same key, disjoint ports: shared");
        b.ports = [(80, "TCP".to_owned())].into();
        let out = allocate(&p, &[a, b]);
        assert_ne!(out.addresses["ns/a"], out.addresses["ns/b"], "a common port: not shared");
    }

    proptest! {
        /// Whatever the requests and their order, no address goes to two Services unless they
        /// may share, every address is in the pool, and the result does not depend on order.
        #[test]
        fn never_twice_and_order_independent(
            n in 1usize..12,
            held in proptest::collection::vec(proptest::option::of(0u8..10), 12),
            seed in any::<u64>(),
        ) {
            let p = pools(&["198.51.100.0/29"]);
            let mut requests: Vec<Request> = (0..n)
                .map(|i| {
                    let current: Vec<String> = held[i].map(|h| format!("198.51.100.{h}")).into_iter().collect();
                    let current: Vec<&str> = current.iter().map(String::as_str).collect();
                    req(&format!("ns/s{i:02}"), &current, &[])
                })
                .collect();
            let first = allocate(&p, &requests);
            let len = requests.len();
            requests.rotate_left(seed as usize % len);
            prop_assert_eq!(&allocate(&p, &requests), &first);
            let mut seen = BTreeSet::new();
            for ips in first.addresses.values() {
                for ip in ips {
                    prop_assert!(p["g"].contains(*ip));
                    prop_assert!(seen.insert(*ip), "{ip} allocated twice");
                }
            }
            prop_assert_eq!(first.addresses.len() + first.errors.len(), n);
        }
    }
}
