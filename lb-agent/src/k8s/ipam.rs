//! Address management for LoadBalancer Services: pure, deterministic, and never handing out an
//! address twice.
//!
//! Order of precedence, so a running Service never loses its address to a newcomer:
//! 1. addresses Services already hold (their `status.loadBalancer.ingress`) and may keep;
//! 2. addresses Services ask for (`lb-agent.io/ips`), in Service-name order;
//! 3. the lowest free address of the group's pools, in Service-name order.
//!
//! Each of a Service's families (`spec.ipFamilies`) gets its address on its own terms: a
//! dual-stack Service has one address per family, and a family that fails (its pool exhausted)
//! costs it only that family's address, never the other's.
//!
//! Sharing is explicit: two Services may hold one address only when both carry the same
//! `lb-agent.io/allow-shared-ip` key and their ports do not overlap (MetalLB's rule).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use crate::vrrp::family::IpFamily;

/// An inclusive range of addresses of one family, as integers (IPv4's in the low 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    family: IpFamily,
    first: u128,
    last: u128,
}

fn to_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4).into(),
        IpAddr::V6(v6) => v6.into(),
    }
}

fn from_bits(family: IpFamily, bits: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

/// The Kubernetes name of a family (`spec.ipFamilies`).
pub fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// A group's pools: inclusive ranges of addresses, of either family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pools {
    ranges: Vec<Range>,
}

impl Pools {
    /// Parses `addressPools`: CIDRs (`198.51.100.0/28`, `2001:db8:6::/112`) or ranges of one
    /// family (`198.51.100.10-198.51.100.20`, `2001:db8:6::10-2001:db8:6::20`). A CIDR's
    /// addresses that are not a host's are left out: IPv4's network and broadcast addresses
    /// below /31 (RFC 3021), IPv6's Subnet-Router anycast address below /127 (RFC 4291 §2.6.1,
    /// RFC 6164). The error names the entry and what was expected.
    pub fn parse(entries: &[String]) -> Result<Pools, String> {
        Self::parse_field("addressPools", entries, true)
    }

    /// Parses `allowedExternalIPs`: the same forms, every address of a CIDR included (an
    /// externalIP is whatever the user routes there).
    pub fn parse_allowed(entries: &[String]) -> Result<Pools, String> {
        Self::parse_field("allowedExternalIPs", entries, false)
    }

    fn parse_field(field: &str, entries: &[String], hosts_only: bool) -> Result<Pools, String> {
        let mut ranges = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let bad = || {
                format!(
                    "{field}[{i}]: expected a CIDR (198.51.100.0/28, 2001:db8:6::/112) or a range of one family \
                     (198.51.100.10-198.51.100.20), got {entry:?}"
                )
            };
            let range = if let Some((a, b)) = entry.split_once('-') {
                let (a, b): (IpAddr, IpAddr) =
                    (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if IpFamily::of(a) != IpFamily::of(b) || to_bits(a) > to_bits(b) {
                    return Err(bad());
                }
                Range { family: IpFamily::of(a), first: to_bits(a), last: to_bits(b) }
            } else {
                let (net, len) = entry.split_once('/').ok_or_else(bad)?;
                let net: IpAddr = net.trim().parse().map_err(|_| bad())?;
                let family = IpFamily::of(net);
                let bits = if family == IpFamily::V4 { 32 } else { 128 };
                let len: u32 = len.trim().parse().ok().filter(|l| *l <= bits).ok_or_else(bad)?;
                // The host part's bits, within the family's width.
                let host = if len == 0 { u128::MAX >> (128 - bits) } else { (1u128 << (bits - len)) - 1 };
                let first = to_bits(net) & !host;
                let last = first | host;
                match (hosts_only, family) {
                    (true, IpFamily::V4) if len <= 30 => Range { family, first: first + 1, last: last - 1 },
                    (true, IpFamily::V6) if len <= 126 => Range { family, first: first + 1, last },
                    _ => Range { family, first, last },
                }
            };
            ranges.push(range);
        }
        Ok(Pools { ranges })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let (family, bits) = (IpFamily::of(ip), to_bits(ip));
        self.ranges.iter().any(|r| r.family == family && (r.first..=r.last).contains(&bits))
    }

    /// Whether any pool is of `family`.
    pub fn has(&self, family: IpFamily) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }

    /// `family`'s addresses, pool by pool, lowest first (lazily: a /64 is not listed).
    fn addresses(&self, family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
        self.ranges
            .iter()
            .filter(move |r| r.family == family)
            .flat_map(|r| (r.first..=r.last).map(move |bits| from_bits(r.family, bits)))
    }
}

/// One Service's needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `namespace/name`.
    pub service: String,
    pub group: String,
    /// The families it needs an address of, primary first (`spec.ipFamilies`; empty: IPv4).
    pub families: Vec<IpFamily>,
    /// `ipFamilyPolicy: PreferDualStack`: a family the group has no pool of (and that it asks
    /// no address of) is left out rather than refused.
    pub prefer_dual_stack: bool,
    /// What it holds now.
    pub current: Vec<IpAddr>,
    /// What it asks for; none of a family: any one address of that family.
    pub requested: Vec<IpAddr>,
    pub shared_key: Option<String>,
    /// (port, protocol) pairs, to decide whether sharing is possible.
    pub ports: BTreeSet<(u16, String)>,
}

impl Request {
    /// The families it gets an address of from `pool`, in its order.
    fn needs(&self, pool: &Pools) -> Vec<IpFamily> {
        let families = if self.families.is_empty() { &[IpFamily::V4][..] } else { &self.families };
        families
            .iter()
            .copied()
            .filter(|f| {
                !self.prefer_dual_stack
                    || pool.has(*f)
                    || self.requested.iter().any(|ip| IpFamily::of(*ip) == *f)
            })
            .collect()
    }

    fn requested_of(&self, family: IpFamily) -> Vec<IpAddr> {
        self.requested.iter().copied().filter(|ip| IpFamily::of(*ip) == family).collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpamError {
    UnknownGroup { group: String },
    NotInPool { ip: IpAddr, group: String },
    InUse { ip: IpAddr, by: String },
    Exhausted { group: String, family: IpFamily },
    NoPool { group: String, family: IpFamily },
}

impl IpamError {
    /// The Event/condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            IpamError::UnknownGroup { .. } => "UnknownGroup",
            IpamError::NotInPool { .. } => "AddressNotInPool",
            IpamError::InUse { .. } => "AddressInUse",
            IpamError::Exhausted { .. } => "PoolExhausted",
            IpamError::NoPool { .. } => "NoPoolForFamily",
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
            IpamError::Exhausted { group, family } => {
                write!(f, "the {} address pools of group {group:?} are exhausted", family_name(*family))
            }
            IpamError::NoPool { group, family } => write!(
                f,
                "group {group:?} has no {} address pool, and the Service's ipFamilies need one \
                 (ipFamilyPolicy PreferDualStack would leave that family out)",
                family_name(*family)
            ),
        }
    }
}

/// The outcome: each Service's addresses, and why it lacks any it needs. A dual-stack Service
/// may be in both: it keeps the family it got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// In the order of the Service's families.
    pub addresses: BTreeMap<String, Vec<IpAddr>>,
    /// The first failure of each Service that has one.
    pub errors: BTreeMap<String, IpamError>,
}

pub fn allocate(pools: &BTreeMap<String, Pools>, requests: &[Request]) -> Allocation {
    let mut sorted: Vec<&Request> = requests.iter().collect();
    sorted.sort_by(|a, b| a.service.cmp(&b.service));
    let mut holders = Holders::new();
    // 1. Keep what is held, when it is still valid.
    let settled = keep_held(pools, &sorted, &mut holders);
    // 2 and 3. Everything else, in name order.
    let mut out = Allocation::default();
    for r in &sorted {
        let Some(pool) = pools.get(&r.group) else {
            out.errors.insert(r.service.clone(), IpamError::UnknownGroup { group: r.group.clone() });
            continue;
        };
        let mut addresses = Vec::new();
        for family in r.needs(pool) {
            if let Some(kept) = settled.get(&(r.service.as_str(), family)) {
                addresses.extend(kept);
                continue;
            }
            match choose(pool, family, r, &holders) {
                Ok(ips) => {
                    for ip in &ips {
                        holders.entry(*ip).or_default().push(r);
                    }
                    addresses.extend(ips);
                }
                Err(e) => {
                    out.errors.entry(r.service.clone()).or_insert(e);
                }
            }
        }
        if !addresses.is_empty() {
            out.addresses.insert(r.service.clone(), addresses);
        }
    }
    out
}

/// Each address given so far, with the requests holding it.
type Holders<'r> = BTreeMap<IpAddr, Vec<&'r Request>>;

/// Whether `r` may hold `ip` beside its holders; else the Service that cannot share it.
fn may_join(holders: &Holders, ip: IpAddr, r: &Request) -> Result<(), String> {
    match holders.get(&ip).and_then(|existing| existing.iter().find(|h| !can_share(h, r))) {
        None => Ok(()),
        Some(h) => Err(h.service.clone()),
    }
}

/// The first pass: each (Service, family)'s held addresses that are still valid, kept.
fn keep_held<'r>(
    pools: &BTreeMap<String, Pools>,
    sorted: &[&'r Request],
    holders: &mut Holders<'r>,
) -> BTreeMap<(&'r str, IpFamily), Vec<IpAddr>> {
    let mut settled = BTreeMap::new();
    for r in sorted {
        let Some(pool) = pools.get(&r.group) else { continue };
        for family in r.needs(pool) {
            let requested = r.requested_of(family);
            let keep: Vec<IpAddr> = r
                .current
                .iter()
                .copied()
                .filter(|ip| IpFamily::of(*ip) == family && pool.contains(*ip))
                .filter(|ip| requested.is_empty() || requested.contains(ip))
                .filter(|ip| may_join(holders, *ip, r).is_ok())
                .collect();
            if !keep.is_empty() && (requested.is_empty() || keep.len() == requested.len()) {
                for ip in &keep {
                    holders.entry(*ip).or_default().push(*r);
                }
                settled.insert((r.service.as_str(), family), keep);
            }
        }
    }
    settled
}

/// The addresses of `family` for `r`: those it requests, if it may have them, or the pool's
/// first it may join (a shared key may join a holder), else its first free one.
fn choose(pool: &Pools, family: IpFamily, r: &Request, holders: &Holders) -> Result<Vec<IpAddr>, IpamError> {
    let requested = r.requested_of(family);
    if !pool.has(family) && requested.is_empty() {
        return Err(IpamError::NoPool { group: r.group.clone(), family });
    }
    if requested.is_empty() {
        return pool
            .addresses(family)
            .find(|ip| {
                may_join(holders, *ip, r).is_ok() && (!holders.contains_key(ip) || r.shared_key.is_some())
            })
            .or_else(|| pool.addresses(family).find(|ip| !holders.contains_key(ip)))
            .map(|ip| vec![ip])
            .ok_or(IpamError::Exhausted { group: r.group.clone(), family });
    }
    requested
        .iter()
        .map(|ip| {
            if !pool.contains(*ip) {
                return Err(IpamError::NotInPool { ip: *ip, group: r.group.clone() });
            }
            may_join(holders, *ip, r).map(|()| *ip).map_err(|by| IpamError::InUse { ip: *ip, by })
        })
        .collect()
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
            families: Vec::new(),
            prefer_dual_stack: false,
            current: current.iter().map(|a| a.parse().unwrap()).collect(),
            requested: requested.iter().map(|a| a.parse().unwrap()).collect(),
            shared_key: None,
            ports: [(80, "TCP".to_owned())].into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pools_parse_cidrs_and_ranges_and_name_bad_entries() {
        let p = Pools::parse(&["198.51.100.0/30".into(), "198.51.100.10-198.51.100.11".into()]).unwrap();
        let all: Vec<IpAddr> = p.addresses(IpFamily::V4).collect();
        assert_eq!(all, [ip("198.51.100.1"), ip("198.51.100.2"), ip("198.51.100.10"), ip("198.51.100.11")]);
        assert_eq!(p.addresses(IpFamily::V6).count(), 0);
        let e = Pools::parse(&["198.51.100.0/28".into(), "10.0.0.9-10.0.0.1".into()]).unwrap_err();
        assert!(e.starts_with("addressPools[1]"), "{e}");
        assert!(Pools::parse(&["198.51.100.0/33".into()]).is_err());
        let e = Pools::parse(&["2001:db8:6::/129".into()]).unwrap_err();
        assert!(e.starts_with("addressPools[0]:") && e.contains("2001:db8:6::/112"), "{e}");
        let e = Pools::parse(&["198.51.100.0/28".into(), "198.51.100.1-2001:db8::9".into()]).unwrap_err();
        assert!(e.starts_with("addressPools[1]:") && e.contains("range of one family"), "{e}");
    }

    #[test]
    fn ipv6_pools_leave_out_the_subnet_router_anycast_address() {
        let p = Pools::parse(&[
            "2001:db8:6::/126".into(),
            "2001:db8:7::/127".into(),
            "2001:db8:8::5-2001:db8:8::6".into(),
            "2001:db8:9::/64".into(),
        ])
        .unwrap();
        let all: Vec<IpAddr> = p.addresses(IpFamily::V6).take(8).collect();
        let expected: Vec<IpAddr> = [
            "2001:db8:6::1",
            "2001:db8:6::2",
            "2001:db8:6::3",
            "2001:db8:7::",
            "2001:db8:7::1",
            "2001:db8:8::5",
        ]
        .into_iter()
        .chain(["2001:db8:8::6", "2001:db8:9::1"])
        .map(ip)
        .collect();
        assert_eq!(all, expected);
        assert!(p.has(IpFamily::V6) && !p.has(IpFamily::V4));
        assert!(p.contains(ip("2001:db8:9::ffff:ffff:ffff:ffff")) && !p.contains(ip("2001:db8:9::")));
        assert!(!p.contains(ip("2001:db8:a::1")) && !p.contains(ip("198.51.100.1")));
        // allowedExternalIPs: every address of a CIDR, of either family.
        let allowed = Pools::parse_allowed(&["2001:db8:6::/64".into(), "203.0.113.0/24".into()]).unwrap();
        assert!(allowed.contains(ip("2001:db8:6::")) && allowed.contains(ip("203.0.113.0")));
        assert!(allowed.contains(ip("203.0.113.255")) && !allowed.contains(ip("2001:db8:7::")));
        let e = Pools::parse_allowed(&["2001:db8::/64/1".into()]).unwrap_err();
        assert!(e.starts_with("allowedExternalIPs[0]:"), "{e}");
    }

    fn dual(service: &str, current: &[&str], requested: &[&str]) -> Request {
        Request { families: vec![IpFamily::V4, IpFamily::V6], ..req(service, current, requested) }
    }

    #[test]
    fn a_dual_stack_service_gets_one_address_per_family_primary_first() {
        let p = pools(&["198.51.100.0/29", "2001:db8:6::/125"]);
        let mut v6_first = dual("ns/b", &[], &[]);
        v6_first.families.reverse();
        let a = allocate(&p, &[dual("ns/a", &[], &[]), v6_first, req("ns/c", &[], &[])]);
        assert_eq!(a.addresses["ns/a"], [ip("198.51.100.1"), ip("2001:db8:6::1")]);
        assert_eq!(a.addresses["ns/b"], [ip("2001:db8:6::2"), ip("198.51.100.2")]);
        assert_eq!(a.addresses["ns/c"], [ip("198.51.100.3")], "single stack: IPv4 alone");
        assert!(a.errors.is_empty(), "{:?}", a.errors);

        // Held addresses are kept per family; asked-for ones of each family are checked.
        let a = allocate(
            &p,
            &[dual("ns/a", &["2001:db8:6::5"], &[]), dual("ns/b", &[], &["2001:db8:6::5", "198.51.100.2"])],
        );
        assert_eq!(a.addresses["ns/a"], [ip("198.51.100.1"), ip("2001:db8:6::5")]);
        assert_eq!(a.addresses["ns/b"], [ip("198.51.100.2")], "its IPv4 address is served");
        assert_eq!(a.errors["ns/b"], IpamError::InUse { ip: ip("2001:db8:6::5"), by: "ns/a".into() });
    }

    #[test]
    fn a_missing_or_exhausted_family_costs_only_that_family() {
        let only_v4 = pools(&["198.51.100.0/30"]);
        let mut prefer = dual("ns/p", &[], &[]);
        prefer.prefer_dual_stack = true;
        let a = allocate(&only_v4, &[dual("ns/r", &[], &[]), prefer.clone()]);
        assert_eq!(a.addresses["ns/p"], [ip("198.51.100.1")], "PreferDualStack: IPv4 alone");
        assert!(!a.errors.contains_key("ns/p"));
        assert_eq!(a.addresses["ns/r"], [ip("198.51.100.2")], "RequireDualStack keeps what it got");
        assert_eq!(a.errors["ns/r"], IpamError::NoPool { group: "g".into(), family: IpFamily::V6 });
        assert!(a.errors["ns/r"].to_string().contains("no IPv6 address pool"), "{}", a.errors["ns/r"]);
        // PreferDualStack asking for an IPv6 address still gets it checked.
        prefer.requested = vec![ip("2001:db8:6::1")];
        let a = allocate(&only_v4, &[prefer]);
        assert_eq!(a.errors["ns/p"].reason(), "AddressNotInPool");

        let one_v6 = pools(&["198.51.100.0/29", "2001:db8:6::1-2001:db8:6::1"]);
        let a = allocate(&one_v6, &[dual("ns/a", &[], &[]), dual("ns/b", &[], &[])]);
        assert_eq!(a.addresses["ns/b"], [ip("198.51.100.2")]);
        assert_eq!(a.errors["ns/b"], IpamError::Exhausted { group: "g".into(), family: IpFamily::V6 });
        assert!(a.errors["ns/b"].to_string().contains("IPv6 address pools"), "{}", a.errors["ns/b"]);
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
        assert_eq!(a.errors["ns/b"], IpamError::Exhausted { group: "g".into(), family: IpFamily::V4 });
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
        /// Whatever the requests, their families and their order, no address goes to two
        /// Services unless they may share, every address is in the pool, a Service has at most
        /// one address of each family it needs, and the result does not depend on order.
        #[test]
        fn never_twice_and_order_independent(
            n in 1usize..12,
            held in proptest::collection::vec((proptest::option::of(0u8..10), proptest::option::of(0u8..6)), 12),
            stacks in proptest::collection::vec(0u8..4, 12),
            seed in any::<u64>(),
        ) {
            let p = pools(&["198.51.100.0/29", "2001:db8:6::/126"]);
            let mut requests: Vec<Request> = (0..n)
                .map(|i| {
                    let (v4, v6) = held[i];
                    let current: Vec<String> = v4
                        .map(|h| format!("198.51.100.{h}"))
                        .into_iter()
                        .chain(v6.map(|h| format!("2001:db8:6::{h}")))
                        .collect();
                    let current: Vec<&str> = current.iter().map(String::as_str).collect();
                    let mut r = req(&format!("ns/s{i:02}"), &current, &[]);
                    r.families = match stacks[i] {
                        0 => vec![],
                        1 => vec![IpFamily::V6],
                        2 => vec![IpFamily::V4, IpFamily::V6],
                        _ => vec![IpFamily::V6, IpFamily::V4],
                    };
                    r
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
            for r in &requests {
                let got = first.addresses.get(&r.service).cloned().unwrap_or_default();
                let needs = r.needs(&p["g"]);
                prop_assert!(got.len() == needs.len() || first.errors.contains_key(&r.service));
                let families: Vec<IpFamily> = got.iter().map(|ip| IpFamily::of(*ip)).collect();
                prop_assert!(needs.starts_with(&families) || families.len() == 1 && needs.contains(&families[0]));
            }
        }
    }
}
