//! VRRPv3 (RFC 5798, RFC 9568). The message is one for both families; what carries it is
//! each family's. The router runs IPv4 instances; IPv6 has its codec so far.
//!
//! - [`packet`]: the advertisement, its encoding for either family, the checksum modes.
//! - [`ipv4`], [`ipv6`]: each family's header checks around it.
//! - [`auth`]: optional HMAC authentication of advertisements, for groups of lb-agents only.
//! - [`instance`]: the pure state machine for one virtual router.
//! - [`router`]: every instance on one interface — receive checks, dispatch, handover.
//! - [`metrics`]: per-instance metrics.
//! - [`socket`]: the raw protocol-112 socket (the only I/O here).
//! - [`garp`]: gratuitous ARP announcements when a VIP is taken.

pub mod auth;
pub mod garp;
pub mod instance;
pub mod ipv4;
pub mod ipv6;
pub mod metrics;
pub mod packet;
pub mod router;
pub mod socket;
