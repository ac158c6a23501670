//! Network interfaces, through rtnetlink.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use futures::TryStreamExt;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressFlags, AddressMessage, AddressProtocol},
    link::{InfoData, InfoKind, InfoVlan, LinkAttribute, LinkInfo, LinkMessage, VlanProtocol},
};

use crate::{error::Result, mac::MacAddr};

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

/// Carrier changes of every interface, as (ifindex, has a link), from the kernel's link
/// notifications (`ip monitor link`). A master re-announces its VIPs when an uplink comes
/// back: the clients followed whichever node answered while it was away.
pub fn watch_carrier() -> Result<tokio::sync::mpsc::UnboundedReceiver<(u32, bool)>> {
    use futures::StreamExt;
    use rtnetlink::packet_core::NetlinkPayload;
    use rtnetlink::packet_route::{RouteNetlinkMessage, link::LinkFlags};
    let (connection, _, mut messages) =
        rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])
            .map_err(|e| crate::error::Error::io("subscribing to link notifications", e))?;
    tokio::spawn(connection);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut last = std::collections::HashMap::new();
        while let Some((message, _)) = messages.next().await {
            let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) = message.payload else {
                continue;
            };
            let up = link.header.flags.contains(LinkFlags::LowerUp);
            let index = link.header.index;
            if last.insert(index, up) != Some(up) && tx.send((index, up)).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Looks an interface up by name; `None` when this namespace has no such interface.
pub async fn find(handle: &rtnetlink::Handle, name: &str) -> Result<Option<Interface>> {
    Ok(link_named(handle, name).await?.map(|msg| interface(name, &msg)))
}

/// Where an uplink on interface `name` arrives: `name` itself, untagged; or, when `name` is an
/// 802.1Q VLAN device, its parent and the VLAN, so the programs run natively on the parent (a
/// VLAN device gets only generic XDP). Also the interface whose addresses are this node's
/// there (the device's own). `None` when there is no such interface.
pub async fn find_uplink(handle: &rtnetlink::Handle, name: &str) -> Result<Option<(Interface, u16, u32)>> {
    let Some(msg) = link_named(handle, name).await? else { return Ok(None) };
    let own = msg.header.index;
    let Some((parent, vlan)) = vlan_of(&msg) else { return Ok(Some((interface(name, &msg), 0, own))) };
    Ok(Some(match link_indexed(handle, parent).await? {
        Some(parent) => (interface(&link_name(&parent).unwrap_or_default(), &parent), vlan, own),
        None => (interface(name, &msg), 0, own),
    }))
}

/// The link message of interface `name`; `None` when this namespace has no such interface.
async fn link_named(handle: &rtnetlink::Handle, name: &str) -> Result<Option<LinkMessage>> {
    let mut request = std::pin::pin!(handle.link().get().match_name(name.to_owned()).execute());
    match request.try_next().await {
        Ok(found) => Ok(found),
        // The kernel answers a name it does not know with ENODEV.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The link message of interface `ifindex`, if there is one.
async fn link_indexed(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Option<LinkMessage>> {
    let mut request = std::pin::pin!(handle.link().get().match_index(ifindex).execute());
    Ok(request.try_next().await?)
}

/// An interface's name, from its link message.
fn link_name(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })
}

/// A VLAN device's parent (`IFLA_LINK`) and 802.1Q VLAN id (`IFLA_VLAN_ID`), from its link
/// message; `None` for any other interface, and for an 802.1ad device (the programs read
/// 802.1Q tags only: such a device stays an interface of its own).
pub fn vlan_of(msg: &LinkMessage) -> Option<(u32, u16)> {
    let parent = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(index) => Some(*index),
        _ => None,
    })?;
    let info = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(info) => Some(info),
        _ => None,
    })?;
    if !info.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vlan))) {
        return None;
    }
    let data = info.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vlan(data)) => Some(data),
        _ => None,
    })?;
    if data.iter().any(|d| matches!(d, InfoVlan::Protocol(p) if *p != VlanProtocol::Ieee8021Q)) {
        return None;
    }
    data.iter().find_map(|d| match d {
        InfoVlan::Id(id) => Some((parent, *id)),
        _ => None,
    })
}

/// Turns receive VLAN offload off on `interface` (`ethtool -K <interface> rxvlan off`), so a
/// NIC leaves 802.1Q tags in the frames XDP sees: with it on, the NIC strips them into
/// metadata that only the dev-bound `bpf_xdp_metadata_rx_vlan_tag` kfunc reads, which the
/// agent's BPF loader (aya 0.14) cannot call. True when it was on.
pub fn keep_vlan_tags_in_frames(interface: &str) -> std::io::Result<bool> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GFLAGS: u32 = 0x25;
    const ETHTOOL_SFLAGS: u32 = 0x26;
    const ETH_FLAG_RXVLAN: u32 = 1 << 8;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    if interface.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!("{interface:?} is longer than an interface name may be")));
    }
    // SAFETY: socket() returns a new descriptor or -1, checked before it is owned.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut value = EthtoolValue { cmd: ETHTOOL_GFLAGS, data: 0 };
    // SAFETY: all-zero is a valid ifreq.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(interface.bytes()) {
        *slot = byte as libc::c_char;
    }
    request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    let ethtool = |request: &mut libc::ifreq| {
        // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points to, both alive.
        if unsafe { libc::ioctl(socket.as_raw_fd(), SIOCETHTOOL as _, request as *mut libc::ifreq) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    ethtool(&mut request)?;
    if value.data & ETH_FLAG_RXVLAN == 0 {
        return Ok(false);
    }
    value = EthtoolValue { cmd: ETHTOOL_SFLAGS, data: value.data & !ETH_FLAG_RXVLAN };
    request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    ethtool(&mut request)?;
    Ok(true)
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

/// The interface's addresses of both families, each with whether lb-agent added it (marked
/// with [`VIP_ADDRESS_PROTO`]), in the kernel's order.
async fn addresses(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Vec<(IpAddr, bool, AddressMessage)>> {
    let mut found = Vec::new();
    let mut stream = std::pin::pin!(handle.address().get().set_link_index_filter(ifindex).execute());
    while let Some(msg) = stream.try_next().await? {
        let ours = msg
            .attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Protocol(p) if u8::from(*p) == VIP_ADDRESS_PROTO));
        // IPv6 addresses carry IFA_ADDRESS only; IPv4 ones IFA_LOCAL too (the peer's on a
        // point-to-point link is in IFA_ADDRESS there).
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = local.or_else(|| {
            msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip @ IpAddr::V6(_)) => Some(*ip),
                _ => None,
            })
        });
        if let Some(ip) = address {
            found.push((ip, ours, msg));
        }
    }
    Ok(found)
}

/// The VIPs (/32, /128) lb-agent has on the interface.
async fn managed_addresses(
    handle: &rtnetlink::Handle,
    ifindex: u32,
) -> Result<Vec<(IpAddr, AddressMessage)>> {
    Ok(addresses(handle, ifindex).await?.into_iter().filter(|a| a.1).map(|(ip, _, msg)| (ip, msg)).collect())
}

/// Makes the interface's lb-agent VIP addresses equal `desired`; returns (added, removed).
/// An IPv6 VIP is added without duplicate address detection (`nodad`): it moves between
/// nodes on purpose, and DAD would hold it tentative, unusable, for a second or more.
pub async fn sync_vip_addresses(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    desired: &BTreeSet<IpAddr>,
) -> Result<(Vec<IpAddr>, Vec<IpAddr>)> {
    let current = managed_addresses(handle, ifindex).await?;
    let have: BTreeSet<IpAddr> = current.iter().map(|(a, _)| *a).collect();
    let mut added = Vec::new();
    for vip in desired.difference(&have) {
        let prefix = if vip.is_ipv4() { 32 } else { 128 };
        let mut request = handle.address().add(ifindex, *vip, prefix);
        let attributes = &mut request.message_mut().attributes;
        attributes.push(AddressAttribute::Protocol(AddressProtocol::from(VIP_ADDRESS_PROTO)));
        if vip.is_ipv6() {
            attributes.push(AddressAttribute::Flags(AddressFlags::Nodad | AddressFlags::Noprefixroute));
        }
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
    Ok(addresses(handle, ifindex).await?.into_iter().find_map(|a| match a {
        (IpAddr::V4(v4), false, _) => Some(v4),
        _ => None,
    }))
}

/// The interface's first global IPv6 address that lb-agent did not add (not link-local, not a
/// VIP).
pub async fn primary_ipv6(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Option<std::net::Ipv6Addr>> {
    Ok(addresses(handle, ifindex).await?.into_iter().find_map(|a| match a {
        (IpAddr::V6(v6), false, _) if !v6.is_unicast_link_local() && !v6.is_loopback() => Some(v6),
        _ => None,
    }))
}

/// The interface's IPv6 link-local address: where its IPv6 VRRP adverts come from.
pub async fn link_local_ipv6(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Option<std::net::Ipv6Addr>> {
    Ok(addresses(handle, ifindex).await?.into_iter().find_map(|a| match a {
        (IpAddr::V6(v6), false, _) if v6.is_unicast_link_local() => Some(v6),
        _ => None,
    }))
}

/// The name of the interface this node uses to reach `address` (as `ip route get`).
pub async fn route_interface(handle: &rtnetlink::Handle, address: IpAddr) -> Result<Option<String>> {
    let Some(route) = route_to(handle, address).await? else { return Ok(None) };
    Ok(link_indexed(handle, route.oif).await?.as_ref().and_then(link_name))
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

/// The main table's IPv4 unicast routes, for resolving many addresses at once without a
/// round trip each (see [`RouteTable::lookup`]).
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    /// (prefix, prefix length, route), longest prefixes first.
    routes: Vec<(u32, u8, RouteTo)>,
    /// Every unicast route of the table is here (none was multipath), so no match means no
    /// route in the main table.
    pub complete: bool,
}

/// The kernel's main routing table.
const MAIN_TABLE: u32 = 254;

impl RouteTable {
    /// Dumps the main table once.
    pub async fn dump(handle: &rtnetlink::Handle) -> Result<Self> {
        use rtnetlink::{
            RouteMessageBuilder,
            packet_route::route::{RouteAddress, RouteAttribute, RouteType},
        };
        let mut routes = Vec::new();
        let mut complete = true;
        let mut replies =
            std::pin::pin!(handle.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute());
        while let Some(reply) = replies.try_next().await? {
            let table = reply
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Table(t) => Some(*t),
                    _ => None,
                })
                .unwrap_or(u32::from(reply.header.table));
            if table != MAIN_TABLE || reply.header.kind != RouteType::Unicast {
                continue;
            }
            let (mut destination, mut oif, mut gateway) = (Ipv4Addr::UNSPECIFIED, None, None);
            for attribute in &reply.attributes {
                match attribute {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => destination = *d,
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(IpAddr::V4(*g)),
                    _ => {}
                }
            }
            // Multipath routes have no single interface: those addresses are asked one by one.
            match oif {
                Some(oif) => {
                    let len = reply.header.destination_prefix_length;
                    routes.push((u32::from(destination), len, RouteTo { oif, gateway }));
                }
                None => complete = false,
            }
        }
        routes.sort_by_key(|(_, len, _)| std::cmp::Reverse(*len));
        Ok(Self { routes, complete })
    }

    /// The longest-prefix match for `address`, as the main table alone decides it.
    pub fn lookup(&self, address: Ipv4Addr) -> Option<RouteTo> {
        let address = u32::from(address);
        self.routes
            .iter()
            .find(|(prefix, len, _)| {
                let mask = if *len == 0 { 0 } else { u32::MAX << (32 - u32::from(*len)) };
                address & mask == prefix & mask
            })
            .map(|(_, _, route)| *route)
    }
}

#[cfg(test)]
mod route_table_tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins() {
        let via = |oif, gateway: Option<[u8; 4]>| RouteTo { oif, gateway: gateway.map(IpAddr::from) };
        let mut table = RouteTable {
            complete: true,
            routes: vec![
                (u32::from(Ipv4Addr::new(0, 0, 0, 0)), 0, via(2, Some([192, 0, 2, 1]))),
                (u32::from(Ipv4Addr::new(10, 244, 1, 0)), 24, via(2, Some([192, 0, 2, 11]))),
                (u32::from(Ipv4Addr::new(10, 244, 0, 5)), 32, via(7, None)),
                (u32::from(Ipv4Addr::new(10, 244, 0, 0)), 16, via(3, None)),
            ],
        };
        table.routes.sort_by_key(|(_, len, _)| std::cmp::Reverse(*len));
        assert_eq!(table.lookup(Ipv4Addr::new(10, 244, 1, 9)), Some(via(2, Some([192, 0, 2, 11]))));
        assert_eq!(table.lookup(Ipv4Addr::new(10, 244, 0, 5)), Some(via(7, None)));
        assert_eq!(table.lookup(Ipv4Addr::new(10, 244, 9, 9)), Some(via(3, None)));
        assert_eq!(table.lookup(Ipv4Addr::new(8, 8, 8, 8)), Some(via(2, Some([192, 0, 2, 1]))));
        assert_eq!(RouteTable::default().lookup(Ipv4Addr::new(8, 8, 8, 8)), None);
    }
}

/// VLAN devices from recorded `RTM_NEWLINK` messages: `ip link add link eth1 name eth1.30 type
/// vlan id 30` as the kernel reports it (its IFLA_LINKINFO laid out as netlink-packet-route's
/// own recorded VLAN message), beside an 802.1ad device and a veth. This kernel has no 802.1Q
/// module, so no VLAN device can be made here to ask for a live one.
#[cfg(test)]
mod vlan_device_tests {
    use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
    use rtnetlink::packet_route::RouteNetlinkMessage;

    use super::*;

    /// An RTM_NEWLINK for interface 7 named `name`, linked to interface 3, of `kind` with
    /// `data` as its IFLA_INFO_DATA (attributes, each already padded).
    fn recorded(name: &str, kind: &str, data: &[u8]) -> Vec<u8> {
        fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
            let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(value);
            a.resize(a.len().next_multiple_of(4), 0);
            a
        }
        let mut kind_z = kind.as_bytes().to_vec();
        kind_z.push(0);
        let mut name_z = name.as_bytes().to_vec();
        name_z.push(0);
        let mut info = attribute(1, &kind_z); // IFLA_INFO_KIND
        if !data.is_empty() {
            info.extend(attribute(2, data)); // IFLA_INFO_DATA
        }
        // struct ifinfomsg: family, pad, type ARPHRD_ETHER, index 7, flags, change.
        let mut body = vec![0, 0, 1, 0, 7, 0, 0, 0, 0x43, 0x10, 1, 0, 0, 0, 0, 0];
        body.extend(attribute(3, &name_z)); // IFLA_IFNAME
        body.extend(attribute(5, &3u32.to_ne_bytes())); // IFLA_LINK
        body.extend(attribute(18, &info)); // IFLA_LINKINFO
        let mut message = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        message.extend_from_slice(&16u16.to_ne_bytes()); // RTM_NEWLINK
        message.extend_from_slice(&[0; 10]); // flags, sequence, port
        message.extend(body);
        message
    }

    fn parse(bytes: &[u8]) -> LinkMessage {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).expect("a netlink message");
        match message.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => link,
            other => panic!("not RTM_NEWLINK: {other:?}"),
        }
    }

    /// IFLA_VLAN_PROTOCOL (big-endian) and IFLA_VLAN_ID, as the kernel sends them.
    fn vlan_data(protocol: u16, id: u16) -> Vec<u8> {
        let mut data = vec![6, 0, 5, 0];
        data.extend_from_slice(&protocol.to_be_bytes());
        data.extend_from_slice(&[0, 0, 6, 0, 1, 0]);
        data.extend_from_slice(&id.to_ne_bytes());
        data.extend_from_slice(&[0, 0]);
        data
    }

    #[test]
    fn a_vlan_device_resolves_to_its_parent_and_vlan() {
        let message = parse(&recorded("eth1.30", "vlan", &vlan_data(0x8100, 30)));
        assert_eq!(vlan_of(&message), Some((3, 30)));
        // Named as the agent names a VLAN it serves without a device: the same uplink.
        assert_eq!(crate::config::uplink_name("eth1", Some(30)), "eth1.30");
    }

    #[test]
    fn other_interfaces_are_themselves() {
        assert_eq!(vlan_of(&parse(&recorded("eth1.30", "vlan", &vlan_data(0x88a8, 30)))), None, "802.1ad");
        assert_eq!(vlan_of(&parse(&recorded("veth0", "veth", &[]))), None, "a veth");
    }
}
