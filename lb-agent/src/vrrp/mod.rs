//! VRRPv3 (RFC 5798, RFC 9568). The message is one for both families; what carries it is
//! each family's, and an IPv4 and an IPv6 instance run side by side.
//!
//! - [`packet`]: the advertisement, its encoding for either family, the checksum modes.
//! - [`ipv4`], [`ipv6`]: each family's header checks around it.
//! - [`family`]: address families and what names an instance (family and VRID).
//! - [`auth`]: optional HMAC authentication of advertisements, for groups of lb-agents only.
//! - [`instance`]: the pure state machine for one virtual router.
//! - [`router`]: every instance of the node — receive checks, dispatch, handover.
//! - [`metrics`]: per-instance metrics.
//! - [`socket`]: the raw protocol-112 sockets of both families (the only I/O here).
//! - [`announcement`]: gratuitous ARP and unsolicited Neighbor Advertisements when a VIP is taken.

pub mod announcement;
pub mod auth;
pub mod family;
pub mod instance;
pub mod ipv4;
pub mod ipv6;
pub mod metrics;
pub mod packet;
pub mod router;
pub mod socket;
pub mod tagged;
