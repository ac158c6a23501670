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

use futures::TryStreamExt;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::{
        neighbour::{NeighbourFlags, NeighbourState},
        route::{RouteAddress, RouteAttribute},
    },
};

use crate::error::Result;

/// Resolves the next hop of each address; returns how many next hops were poked.
pub async fn warm(handle: &rtnetlink::Handle, addresses: &BTreeSet<Ipv4Addr>) -> Result<usize> {
    let mut next_hops = BTreeSet::new();
    for address in addresses {
        let route = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(*address, 32).build();
        let mut replies = std::pin::pin!(handle.route().get(route).execute());
        // Read the stream to its end: a dropped stream leaves netlink replies undelivered.
        while let Some(reply) = replies.try_next().await? {
            let oif = reply.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            });
            let gateway = reply.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
                _ => None,
            });
            if let Some(oif) = oif {
                next_hops.insert((oif, gateway.unwrap_or(*address)));
            }
        }
    }
    tracing::debug!(?next_hops, "resolving next hops");
    for (oif, hop) in &next_hops {
        handle
            .neighbours()
            .add(*oif, IpAddr::V4(*hop))
            .replace()
            .state(NeighbourState::None)
            .flags(NeighbourFlags::Use)
            .execute()
            .await?;
    }
    Ok(next_hops.len())
}
