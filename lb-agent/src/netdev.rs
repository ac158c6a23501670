//! Network interfaces, through rtnetlink.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use futures::TryStreamExt;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressMessage, AddressProtocol},
    link::{LinkAttribute, LinkMessage},
};

use crate::{config::MacAddr, error::Result};

/// What the agent needs to know about its uplink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
}

/// A netlink connection whose driver runs on the current tokio runtime.
pub fn connect() -> Result<rtnetlink::Handle> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| crate::error::Error::io("opening a netlink socket", e))?;
    tokio::spawn(connection);
    Ok(handle)
}

/// Looks an interface up by name; `None` when this namespace has no such interface.
pub async fn find(handle: &rtnetlink::Handle, name: &str) -> Result<Option<Interface>> {
    let mut request = std::pin::pin!(handle.link().get().match_name(name.to_owned()).execute());
    match request.try_next().await {
        Ok(Some(msg)) => Ok(Some(interface(name, &msg))),
        Ok(None) => Ok(None),
        // The kernel answers a name it does not know with ENODEV.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn interface(name: &str, msg: &LinkMessage) -> Interface {
    let mac = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) => <[u8; 6]>::try_from(bytes.as_slice()).ok(),
            _ => None,
        })
        .unwrap_or_default();
    Interface { name: name.to_owned(), index: msg.header.index, mac: MacAddr(mac) }
}

/// IFA_PROTO value ('l') on the VIP addresses lb-agent adds, so that a restart after a crash
/// finds and removes exactly its own leftovers and never an address an operator configured.
pub const VIP_ADDRESS_PROTO: u8 = b'l';

/// The interface's IPv4 addresses, each with whether lb-agent added it (marked with
/// [`VIP_ADDRESS_PROTO`]), in the kernel's order.
async fn ipv4_addresses(
    handle: &rtnetlink::Handle,
    ifindex: u32,
) -> Result<Vec<(Ipv4Addr, bool, AddressMessage)>> {
    let mut found = Vec::new();
    let mut stream = std::pin::pin!(handle.address().get().set_link_index_filter(ifindex).execute());
    while let Some(msg) = stream.try_next().await? {
        let ours = msg
            .attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Protocol(p) if u8::from(*p) == VIP_ADDRESS_PROTO));
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(IpAddr::V4(v4)) => Some(*v4),
            _ => None,
        });
        if let Some(v4) = local {
            found.push((v4, ours, msg));
        }
    }
    Ok(found)
}

/// The /32 VIPs lb-agent has on the interface.
async fn managed_addresses(
    handle: &rtnetlink::Handle,
    ifindex: u32,
) -> Result<Vec<(Ipv4Addr, AddressMessage)>> {
    Ok(ipv4_addresses(handle, ifindex)
        .await?
        .into_iter()
        .filter(|a| a.1)
        .map(|(ip, _, msg)| (ip, msg))
        .collect())
}

/// Makes the interface's lb-agent VIP addresses equal `desired`; returns (added, removed).
pub async fn sync_vip_addresses(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    desired: &BTreeSet<Ipv4Addr>,
) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Addr>)> {
    let current = managed_addresses(handle, ifindex).await?;
    let have: BTreeSet<Ipv4Addr> = current.iter().map(|(a, _)| *a).collect();
    let mut added = Vec::new();
    for vip in desired.difference(&have) {
        let mut request = handle.address().add(ifindex, IpAddr::V4(*vip), 32);
        request
            .message_mut()
            .attributes
            .push(AddressAttribute::Protocol(AddressProtocol::from(VIP_ADDRESS_PROTO)));
        match request.execute().await {
            Ok(()) => added.push(*vip),
            // Already there (e.g. added by hand without our mark): nothing to do.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut removed = Vec::new();
    for (vip, msg) in current {
        if !desired.contains(&vip) {
            handle.address().del(msg).execute().await?;
            removed.push(vip);
        }
    }
    Ok((added, removed))
}

/// The interface's first IPv4 address that lb-agent did not add (not a VIP).
pub async fn primary_ipv4(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Option<Ipv4Addr>> {
    Ok(ipv4_addresses(handle, ifindex).await?.into_iter().find(|a| !a.1).map(|a| a.0))
}

/// The name of the interface this node uses to reach `address` (as `ip route get`).
pub async fn route_interface(handle: &rtnetlink::Handle, address: IpAddr) -> Result<Option<String>> {
    let Some(route) = route_to(handle, address).await? else { return Ok(None) };
    let mut links = std::pin::pin!(handle.link().get().match_index(route.oif).execute());
    Ok(links.try_next().await?.and_then(|msg| {
        msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(name) => Some(name.clone()),
            _ => None,
        })
    }))
}

/// Where the kernel sends packets for one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteTo {
    /// The outgoing interface's index.
    pub oif: u32,
    /// The gateway, or `None` when the address is on-link.
    pub gateway: Option<IpAddr>,
}

/// Asks the kernel for its route to `address` (as `ip route get`).
pub async fn route_to(handle: &rtnetlink::Handle, address: IpAddr) -> Result<Option<RouteTo>> {
    use rtnetlink::{
        RouteMessageBuilder,
        packet_route::route::{RouteAddress, RouteAttribute},
    };
    let route = match address {
        IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(v4, 32).build(),
        IpAddr::V6(v6) => {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(v6, 128).build()
        }
    };
    let mut found = None;
    let mut replies = std::pin::pin!(handle.route().get(route).execute());
    // Read the stream to its end: a dropped stream leaves netlink replies undelivered.
    while let Some(reply) = replies.try_next().await? {
        let oif = reply.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        });
        let gateway = reply.attributes.iter().find_map(|a| match a {
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => Some(IpAddr::V6(*g)),
            _ => None,
        });
        if let (None, Some(oif)) = (found, oif) {
            found = Some(RouteTo { oif, gateway });
        }
    }
    Ok(found)
}
