//! Network layer: IPv4 validated and dispatched, ICMP echo answered.

pub mod icmp;
pub mod ipv4;
