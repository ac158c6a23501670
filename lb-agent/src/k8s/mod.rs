//! The Kubernetes source.
//!
//! - `crd`: the `LoadBalancerGroup` resource and the names (`lb-agent.io`).
//! - `ipam`: LoadBalancer address allocation (pure).
//! - `binding`: which group serves a Service, and what is refused (pure).
//! - `source`: cluster objects to the same `Config` the standalone YAML gives (pure).

pub mod binding;
pub mod crd;
pub mod ipam;
pub mod source;
