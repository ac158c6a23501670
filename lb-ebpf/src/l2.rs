//! Link layer: what the program answers for the segment: ARP (IPv4) and Neighbor Discovery
//! (IPv6) for owned VIPs.

pub mod arp;
pub mod ndp;
