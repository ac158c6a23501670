//! Network layer: IPv4 and IPv6 validated and dispatched, ICMP and ICMPv6 echo answered.

pub mod icmp;
pub mod ipv4;
pub mod ipv6;
