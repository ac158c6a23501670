//! Network interfaces, through rtnetlink.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};

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
