//! The agent's uplinks: every interface it serves VIPs on (the default one and each of its
//! groups'), with what the agent holds there: the interface, this node's address on it (the
//! source of full NAT and IPIP leaving by it), and the socket gratuitous ARPs go out of.
//!
//! The shell around [`crate::node_plan::NodePlan::uplinks`]: resolving names through netlink,
//! opening sockets. Attaching XDP is the data plane's (see [`crate::dataplane::Dataplane`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::Ipv4Addr,
    sync::Arc,
};

use lb_common::maps::{Uplink as UplinkEntry, UplinkKey};
use tracing::{info, warn};

use crate::{
    config::{Config, ConfigError},
    dataplane::uplinks::{Slots, UplinkSet},
    error::{Error, Result},
    netdev::{self, Interface},
    node_plan::NodePlan,
    vrrp::announcement::AnnouncementSocket,
};

/// One interface (or VLAN of one) the agent serves VIPs on.
pub struct Uplink {
    /// The interface frames arrive and leave by: for a VLAN, its parent.
    pub interface: Interface,
    /// The 802.1Q VLAN on `interface`, zero for none.
    pub vlan: u16,
    /// This node's address there: the full-NAT and IPIP source for traffic leaving by it.
    pub node_address: Ipv4Addr,
    /// Its IPv6 address there (`nodeAddress6`/`nodeAddresses6`, else the interface's first
    /// global one), the full-NAT and 6in6 source for IPv6; none: IPv6 full NAT and DSR out of it
    /// are left to the kernel, counted (`no_source_address`).
    pub node_address6: Option<std::net::Ipv6Addr>,
    pub announcements: Arc<AnnouncementSocket>,
}

/// Every uplink, by interface name, and the slots the data plane knows them by.
#[derive(Default)]
pub struct Uplinks {
    pub by_name: BTreeMap<String, Uplink>,
    pub slots: Slots,
}

impl Uplinks {
    /// The interfaces the uplinks arrive by, each once (a VLAN's parent once for all).
    pub fn devices(&self) -> Vec<String> {
        let devices: BTreeSet<&str> = self.by_name.values().map(|u| u.interface.name.as_str()).collect();
        devices.into_iter().map(str::to_owned).collect()
    }

    /// Where `name`'s VRRP runs: the interface's index, and the VLAN's link for one on a VLAN.
    pub fn vrrp_link(uplink: &Uplink) -> (u32, Option<crate::vrrp::tagged::Link>) {
        let index = uplink.interface.index;
        let link = (uplink.vlan != 0).then_some(crate::vrrp::tagged::Link {
            ifindex: index,
            vlan: uplink.vlan,
            mac: uplink.interface.mac,
        });
        (index, link)
    }

    /// The uplink `name`, if the agent has it.
    pub fn get(&self, name: &str) -> Option<&Uplink> {
        self.by_name.get(name)
    }

    /// The uplink map's entries: each uplink under its own ifindex, with its slot and address.
    pub fn entries(&self) -> UplinkSet {
        self.by_name
            .iter()
            .filter_map(|(name, uplink)| {
                let slot = self.slots.get(name)?;
                let entry = UplinkEntry {
                    source: uplink.node_address.octets(),
                    mac: uplink.interface.mac.0,
                    slot,
                    _pad: 0,
                };
                Some((UplinkKey::new(uplink.interface.index, uplink.vlan), entry))
            })
            .collect()
    }

    /// The IPv6 uplink-address map's entries: each uplink with an IPv6 address, under its own
    /// ifindex.
    pub fn entries6(&self) -> crate::dataplane::uplinks::Uplink6Set {
        self.by_name
            .values()
            .filter_map(|uplink| {
                let address = uplink.node_address6?;
                Some((
                    UplinkKey::new(uplink.interface.index, uplink.vlan),
                    lb_common::maps::Vip6Key::new(address.octets()),
                ))
            })
            .collect()
    }

    /// This node's IPv6 VRRP address (the group member's `address6`) on each uplink where it
    /// has one, under the uplink's arrival key: XDP counts an advert that arrives there with it.
    pub fn own_vrrp6(&self, plan: &NodePlan) -> crate::dataplane::uplinks::Uplink6Set {
        plan.locals
            .iter()
            .filter_map(|((name, _), address)| match address {
                std::net::IpAddr::V6(v6) => {
                    let uplink = self.by_name.get(name)?;
                    Some((
                        UplinkKey::new(uplink.interface.index, uplink.vlan),
                        lb_common::maps::Vip6Key::new(v6.octets()),
                    ))
                }
                std::net::IpAddr::V4(_) => None,
            })
            .collect()
    }

    /// The uplink slot each of the config's VIPs is served on: a group's VIPs on its
    /// interface's, `vips` on the default uplink's.
    pub fn vip_slots(&self, config: &Config, plan: &NodePlan) -> Arc<HashMap<std::net::IpAddr, u8>> {
        let default = self.slots.for_vips(&config.interface);
        let slots = config
            .vips
            .iter()
            .map(|v| (v.address, default))
            .chain(plan.vips.iter().map(|(vip, s)| (*vip, self.slots.for_vips(&s.interface))));
        Arc::new(slots.collect())
    }
}

/// Where a config names an uplink, for errors: `interface`, else the first group that names it.
pub fn interface_field(config: &Config, name: &str) -> String {
    if name == config.interface {
        return "interface".into();
    }
    config
        .groups
        .iter()
        .position(|g| g.interface.is_some() && config.group_interface(g) == name)
        .map_or_else(|| "interface".into(), |g| format!("groups[{g}].interface"))
}

/// Looks up the plan's uplinks that `known` lacks: each interface, this node's address there,
/// a gratuitous-ARP socket. An interface that does not exist, or has no address to default
/// to, is the config's mistake and named by its field.
pub async fn resolve(
    netlink: &rtnetlink::Handle,
    config: &Config,
    plan: &NodePlan,
    known: &BTreeSet<String>,
) -> Result<std::result::Result<BTreeMap<String, Uplink>, ConfigError>> {
    let mut found = BTreeMap::new();
    let vlans = config.vlan_uplinks();
    for name in plan.uplinks.iter().filter(|n| !known.contains(*n)) {
        let (interface, vlan, addresses) = match locate(netlink, config, &vlans, name).await? {
            Ok(located) => located,
            Err(e) => return Ok(Err(e)),
        };
        let configured = config
            .node_addresses
            .get(name)
            .copied()
            .or(config.node_address.filter(|_| *name == config.interface));
        let primary = match addresses {
            Some(index) => netdev::primary_ipv4(netlink, index).await?,
            None => None,
        };
        let node_address = match configured {
            Some(address) => address,
            None => match primary {
                Some(address) => address,
                // A group's own address there serves as well.
                None => match plan.ipv4_local(name) {
                    Some(address) => address,
                    None => {
                        let field = if *name == config.interface {
                            "nodeAddress".to_owned()
                        } else {
                            format!("nodeAddresses.{name}")
                        };
                        return Ok(Err(ConfigError::new(
                            field,
                            format!(
                                "this node's address on {name}, since it has no IPv4 address to default to"
                            ),
                        )));
                    }
                },
            },
        };
        let configured6 = config
            .node_addresses6
            .get(name)
            .copied()
            .or(config.node_address6.filter(|_| *name == config.interface));
        let node_address6 = match (configured6, addresses) {
            (Some(address), _) => Some(address),
            (None, Some(index)) => netdev::primary_ipv6(netlink, index).await?,
            (None, None) => None,
        };
        let announcements = AnnouncementSocket::open(interface.index, vlan)
            .map_err(|e| Error::io(format!("opening the announcement (ARP/NA) socket on {name}"), e))?;
        found.insert(
            name.clone(),
            Uplink { interface, vlan, node_address, node_address6, announcements: Arc::new(announcements) },
        );
    }
    Ok(Ok(found))
}

/// Where uplink `name` arrives: a VLAN without a device the config names (its parent and
/// VLAN); else the interface, or for a VLAN device its parent and VLAN. With the interface
/// whose addresses are this node's there (none on a VLAN without a device: the parent's are
/// another network's). On a VLAN, receive VLAN offload is turned off on the parent, so XDP
/// sees the tags.
async fn locate(
    netlink: &rtnetlink::Handle,
    config: &Config,
    vlans: &BTreeMap<String, (String, u16)>,
    name: &str,
) -> Result<std::result::Result<(Interface, u16, Option<u32>), ConfigError>> {
    let located = match vlans.get(name) {
        Some((parent, vlan)) => netdev::find(netlink, parent).await?.map(|i| (i, *vlan, None)),
        None => netdev::find_uplink(netlink, name).await?.map(|(i, vlan, own)| (i, vlan, Some(own))),
    };
    let Some((interface, vlan, addresses)) = located else {
        let device = vlans.get(name).map_or(name, |(parent, _)| parent.as_str());
        return Ok(Err(ConfigError::new(
            interface_field(config, name),
            format!("an interface of this node, but {device:?} does not exist here"),
        )));
    };
    if vlan == 0 {
        return Ok(Ok((interface, vlan, addresses)));
    }
    if addresses.is_some() {
        info!(uplink = %name, parent = %interface.name, vlan, "a VLAN device: served on its parent, natively");
    }
    match netdev::keep_vlan_tags_in_frames(&interface.name) {
        Ok(true) => {
            info!(interface = %interface.name, "receive VLAN offload turned off, so XDP sees the tags")
        }
        Ok(false) => {}
        Err(e) => warn!(
            interface = %interface.name,
            error = %e,
            "cannot turn receive VLAN offload off: if the NIC strips tags, its VLANs' frames reach XDP untagged and are not served"
        ),
    }
    Ok(Ok((interface, vlan, addresses)))
}
