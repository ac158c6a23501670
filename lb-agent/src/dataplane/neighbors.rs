//! Keeps the next hops towards endpoints resolved.
//!
//! The program forwards with `bpf_fib_lookup`, which reports a missing neighbour entry instead
//! of resolving it; such packets go to the kernel untranslated and are lost. So for every
//! endpoint the agent asks the kernel for the route, and for its next hop asks the neighbour
//! table to resolve it (`NTF_USE`, as `ip neigh replace … use`), at each sync and periodically,
//! before entries can age out.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use rtnetlink::packet_route::neighbour::{NeighbourFlags, NeighbourState};

use crate::error::Result;

/// Resolves the next hop of each address; returns how many next hops were poked.
pub async fn warm(handle: &rtnetlink::Handle, addresses: &BTreeSet<Ipv4Addr>) -> Result<usize> {
    let mut next_hops = BTreeSet::new();
    for address in addresses {
        if let Some(route) = crate::netdev::route_to(handle, IpAddr::V4(*address)).await? {
            next_hops.insert((route.oif, route.gateway.unwrap_or(IpAddr::V4(*address))));
        }
    }
    tracing::debug!(?next_hops, "resolving next hops");
    for (oif, hop) in &next_hops {
        handle
            .neighbours()
            .add(*oif, *hop)
            .replace()
            .state(NeighbourState::None)
            .flags(NeighbourFlags::Use)
            .execute()
            .await?;
    }
    Ok(next_hops.len())
}
