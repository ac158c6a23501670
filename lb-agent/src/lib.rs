//! lb-agent: a VRRP-driven XDP load balancer for bare-metal Kubernetes.
//!
//! - [`config`]: the standalone YAML configuration and its validation.
//! - [`netdev`]: interface lookup through rtnetlink.
//! - [`dataplane`]: the embedded XDP object, attach/detach, and its maps.
//! - [`metrics`]: Prometheus metrics, with XDP counters collected at scrape time.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` on the network; `/status` and `/loglevel` on
//!   the admin socket.
//! - [`announcer`]: gratuitous ARPs and NAs for VIPs taken, paced from one task.
//! - [`routes`]: routed VIPs (`announce: bgp`, `bgpOwner`) as kernel routes the node's FRR
//!   redistributes, into a device that dies with the agent.
//! - [`admin`]: the admin socket's client (`lb-agent status`, `lb-agent log-level`).
//! - [`status`]: `lb-agent status`: the local agent's groups, VIPs and backends.
//! - [`logging`]: structured logs with a filter that changes at run time.
//! - [`mac`]: Ethernet MAC addresses.
//! - [`k8s`]: the Kubernetes source: the LoadBalancerGroup resource.
//! - [`vrrp`]: VRRPv3 — who owns each VIP at run time.
//! - [`vrrp_driver`]: the router with its sockets: the VRRP shell the run loop drives.
//! - [`placement`]: each group's VIPs placed on ranked owners and shared VRRP instances (pure).
//! - [`ownership`]: which VIPs this node answers, where and how (pure); the agent applies it.
//! - [`node_plan`]: from the config and the groups' placements to this node's VRRP instances.
//! - [`key_files`]: the groups' VRRP key files, followed while the agent runs.
//! - [`map_contents`]: from the config's services to this node's forwarding maps (pure).
//! - [`endpoint_listings`]: which services each local endpoint lists, for verifying its replies
//!   by the connection table (pure).
//! - [`service_sync`]: writes the map contents into the maps in a task of its own.
//! - [`agent`]: the run loop and signal handling.
//! - [`uplinks`]: the interfaces VIPs are served on, resolved and with their sockets.
//! - [`vip_addresses`]: VIP addresses on the uplinks, kept by a task so netlink never stalls VRRP.
//! - [`maglev`]: Maglev lookup tables for the data plane.
//! - [`name_hash`]: the fixed hash of names every agent ranks and places with (the flow hash is
//!   `lb_common::hash`).
//! - [`error`]: the crate's error type.
//!
//! One word for each kind of computed result, each from a pure function:
//! - a group's **placement** ([`placement::place`]): which nodes rank for each VIP, in which
//!   VRRP instance, the same on every node;
//! - this node's **plan** ([`node_plan::node_plan`]): the instances it runs and how each VIP is
//!   served;
//! - a family's **map contents** ([`map_contents::for_node`]): what its service maps must hold;
//! - a cluster's **status writes** ([`k8s::status::writes`]): what the API must be told;
//! - the **wanted ownership** ([`ownership::wanted`]): which VIPs this node answers now.

pub mod admin;
pub mod agent;
pub mod announcer;
pub mod config;
pub mod dataplane;
pub mod endpoint_listings;
pub mod error;
pub mod http;
pub mod k8s;
pub mod key_files;
pub mod logging;
pub mod mac;
pub mod maglev;
pub mod map_contents;
pub mod metrics;
pub mod name_hash;
pub mod netdev;
pub mod node_plan;
pub mod ownership;
pub mod placement;
pub mod routes;
pub mod service_sync;
pub mod status;
pub mod uplinks;
pub mod vip_addresses;
pub mod vrrp;
pub mod vrrp_driver;
