//! The Kubernetes source.
//!
//! - `crd`: the `LoadBalancerGroup` resource and the names (`lb-agent.io`).
//! - `ipam`: LoadBalancer address allocation (pure).
//! - `binding`: which group serves a Service, and what is refused (pure).
//! - `slice`: an EndpointSlice as the agent keeps it, and `trim`: what the watch stores keep
//!   of the other objects (pure).
//! - `changes`: which Services each watch event touched (pure).
//! - `cluster`: the snapshot of cluster objects the translation and status writes are made from (pure).
//! - `source`: cluster objects to the same `Config` the standalone YAML gives (pure).
//! - `status`: what the leader writes back: addresses, finalizers, Events, group status (pure).
//! - `writer`: carries status writes out with server-side apply and Events (I/O).
//! - `lease`: leader election for those writes (decision pure, Lease I/O thin).
//! - `controller`: the watches, the config channel to the agent, and the leader's loop.
//! - `departure`: at SIGTERM, whether the pod is replaced by a roll or removed (decision pure,
//!   two reads thin).

pub mod binding;
pub mod changes;
pub mod cluster;
pub mod controller;
pub mod crd;
pub mod departure;
pub mod ipam;
pub mod lease;
pub mod slice;
pub mod source;
pub mod status;
pub mod trim;
pub mod writer;
