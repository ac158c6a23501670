//! VRRPv3 (RFC 5798, RFC 9568) for IPv4, built so IPv6 can be added beside it.
//!
//! - [`packet`]: advertisement encode/decode and the checksum modes.
//! - [`auth`]: optional HMAC authentication of advertisements, for groups of lb-agents only.
//! - [`instance`]: the pure state machine for one virtual router.
//! - [`router`]: every instance on one interface — receive checks, dispatch, handover.
//! - [`metrics`]: per-instance metrics.
//! - [`socket`]: the raw protocol-112 socket (the only I/O here).
//! - [`garp`]: gratuitous ARP announcements when a VIP is taken.

pub mod auth;
pub mod garp;
pub mod instance;
pub mod metrics;
pub mod packet;
pub mod router;
pub mod socket;
