//! The node's BGP sessions, for the metrics: the agent hands its routes to the node's routing
//! daemon through the kernel and speaks no BGP itself, so what it can tell an operator is
//! whether that daemon has any session to carry them. It counts the established TCP
//! connections to or from port 179 in its network namespace (the node's, with `hostNetwork`),
//! through sock_diag at scrape time: any daemon's (FRR, BIRD), no API of theirs needed.

use std::{collections::BTreeSet, io};

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::gauge::ConstGauge,
};
use tracing::warn;

/// BGP's TCP port (RFC 4271 §8.2.1).
pub const BGP_PORT: u16 = 179;

/// Established TCP connections with port 179 at either end, counted once each (by the kernel's
/// socket cookie).
pub fn established() -> io::Result<usize> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut seen = BTreeSet::new();
    for family in [AF_INET, AF_INET6] {
        // The kernel skips sockets whose ports differ from a non-zero port in the request, so
        // each dump returns only the few sessions; the ports are checked here all the same.
        for (source_port, destination_port) in [(BGP_PORT, 0), (0, BGP_PORT)] {
            let mut socket_id = if family == AF_INET { SocketId::new_v4() } else { SocketId::new_v6() };
            socket_id.source_port = source_port;
            socket_id.destination_port = destination_port;
            let request = InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::ESTABLISHED,
                socket_id,
            };
            dump(&mut socket, request, |id| {
                if id.source_port == BGP_PORT || id.destination_port == BGP_PORT {
                    seen.insert(id.cookie);
                }
            })?;
        }
    }
    Ok(seen.len())
}

/// Sends one dump request and hands each socket it returns to `each`.
fn dump(socket: &mut Socket, request: InetRequest, mut each: impl FnMut(&SocketId)) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut received = Vec::with_capacity(32 * 1024);
    loop {
        received.clear();
        let size = socket.recv(&mut received, 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&received[offset..size])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a sock_diag reply: {e}")))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                    each(&response.header.socket_id)
                }
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => return Err(io::Error::other(format!("sock_diag: {e}"))),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// `lbagent_bgp_sessions`, read at scrape time.
#[derive(Debug)]
pub struct SessionCollector;

impl Collector for SessionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let count = match established() {
            Ok(count) => count,
            Err(e) => {
                warn!(error = %e, "counting BGP sessions failed; omitting them from this scrape");
                return Ok(());
            }
        };
        let metric = encoder.encode_descriptor(
            "bgp_sessions",
            "Established BGP sessions (TCP port 179) of this node's routing daemon, which carries the routed VIPs to the fabric",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(count as i64).encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// Needs no privilege: sock_diag dumps are open to every user. Port 179 is bound only when
    /// the test may (root) and nothing else holds it; else the count is checked unchanged by
    /// connections on other ports.
    #[test]
    fn counts_established_connections_on_port_179_only() {
        let before = established().expect("sock_diag answers");
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let _a = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let _b = other.accept().unwrap();
        assert_eq!(established().unwrap(), before, "a connection on another port is not BGP");
        let Ok(bgp) = TcpListener::bind(("127.0.0.1", BGP_PORT)) else { return };
        let _client = TcpStream::connect(bgp.local_addr().unwrap()).unwrap();
        let _server = bgp.accept().unwrap();
        // Both ends are in this namespace: two sockets, each with port 179 at one end.
        assert_eq!(established().unwrap(), before + 2);
    }
}
