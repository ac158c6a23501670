//! Keeps the next hops towards endpoints resolved.
//!
//! The program forwards with `bpf_fib_lookup`, which reports a missing neighbour entry instead
//! of resolving it; such packets go to the kernel untranslated and are lost. So for every
//! endpoint the agent asks the kernel for the route, and for its next hop asks the neighbour
//! table to resolve it (`NTF_USE`, as `ip neigh replace … use`), at each sync and periodically,
//! before entries can age out. Routes come from one dump of the main table, matched here
//! (longest prefix); only addresses it cannot answer are asked one by one. Policy routing is
//! not consulted: at worst a next hop is not warmed, and the kernel resolves it on the first
//! packet, which the program passes to it (`no_neighbor`).

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use rtnetlink::packet_route::neighbour::{NeighbourFlags, NeighbourState};

use crate::error::Result;

/// The next hop of every endpoint address, looked up once per address: a sync that adds one
/// endpoint costs one route lookup, not one per endpoint in the cluster.
#[derive(Default)]
pub struct NextHops {
    /// Address → (its references, its next hop: interface and neighbour).
    routes: HashMap<IpAddr, (u32, Option<(u32, IpAddr)>)>,
}

impl NextHops {
    /// Counts `added` in and `removed` out; looks up the routes of addresses new here and
    /// resolves their next hops. Returns how many next hops were poked.
    pub async fn update(
        &mut self,
        handle: &rtnetlink::Handle,
        added: &[IpAddr],
        removed: &[IpAddr],
    ) -> Result<usize> {
        for address in removed {
            if let Some(entry) = self.routes.get_mut(address) {
                entry.0 -= 1;
                if entry.0 == 0 {
                    self.routes.remove(address);
                }
            }
        }
        let mut fresh = BTreeSet::new();
        // One dump of the routing table answers most addresses; the rest (no match in the
        // main table, multipath) are asked one by one.
        let table = if added.len() > 1 {
            crate::netdev::RouteTable::dump(handle).await.unwrap_or_default()
        } else {
            crate::netdev::RouteTable::default()
        };
        for address in added {
            let entry = self.routes.entry(*address).or_insert((0, None));
            entry.0 += 1;
            if entry.0 == 1 {
                // No route is not fatal: that endpoint is unreachable, the others still count.
                // The dump holds IPv4 routes: IPv6 endpoints are asked one by one.
                let from_table = match address {
                    IpAddr::V4(v4) => table.lookup(*v4),
                    IpAddr::V6(_) => None,
                };
                let route = match from_table {
                    Some(route) => Ok(Some(route)),
                    None if table.complete && address.is_ipv4() => Ok(None),
                    None => crate::netdev::route_to(handle, *address).await,
                };
                let hop = match route {
                    Ok(route) => route.map(|r| (r.oif, r.gateway.unwrap_or(*address))),
                    Err(e) => {
                        tracing::debug!(%address, error = %e, "no route to an endpoint");
                        None
                    }
                };
                self.routes.get_mut(address).expect("inserted above").1 = hop;
                fresh.extend(hop);
            }
        }
        poke(handle, &fresh).await
    }

    /// Resolves every known next hop again, before the kernel's entries age out.
    pub async fn refresh(&self, handle: &rtnetlink::Handle) -> Result<usize> {
        let hops: BTreeSet<(u32, IpAddr)> = self.routes.values().filter_map(|(_, hop)| *hop).collect();
        poke(handle, &hops).await
    }
}

async fn poke(handle: &rtnetlink::Handle, next_hops: &BTreeSet<(u32, IpAddr)>) -> Result<usize> {
    tracing::debug!(count = next_hops.len(), "resolving next hops");
    for (oif, hop) in next_hops {
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
