//! The raw IP socket for protocol 112: the only part of VRRP that touches the network.

use std::{
    collections::BTreeMap,
    io,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    task::Poll,
};

use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockAddr, Socket, Type};
use tokio::io::{Interest, unix::AsyncFd};

use super::packet::{IPPROTO_VRRP, VRRP_MULTICAST_V4, VRRP_TTL};

/// DSCP CS6 (network control), as keepalived and most routers send VRRP.
const TOS_NETWORK_CONTROL: u32 = 0xc0;

pub struct VrrpSocket {
    /// Unbound: a raw socket bound to an address only receives datagrams addressed to it, and
    /// adverts go to 224.0.0.18.
    receive: AsyncFd<Socket>,
    /// Bound to our address, so adverts carry the source the peers expect and the checksum
    /// was computed with.
    send: Socket,
    source: Ipv4Addr,
}

impl VrrpSocket {
    /// Opens the sockets on `interface`, sourced from `source`, joined to 224.0.0.18.
    ///
    /// Bound to the device so that only the uplink's adverts arrive; multicast loop off so we
    /// never hear ourselves; TTL 255 both ways because receivers drop anything else (§5.1.1.3).
    pub fn open(interface: &str, ifindex: u32, source: Ipv4Addr) -> io::Result<Self> {
        let raw = || Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(i32::from(IPPROTO_VRRP))));
        let receive = raw()?;
        receive.bind_device(Some(interface.as_bytes()))?;
        receive.join_multicast_v4_n(&VRRP_MULTICAST_V4, &InterfaceIndexOrAddress::Index(ifindex))?;
        receive.set_multicast_loop_v4(false)?;
        receive.set_nonblocking(true)?;

        let send = raw()?;
        send.bind_device(Some(interface.as_bytes()))?;
        send.bind(&SockAddr::from(SocketAddrV4::new(source, 0)))?;
        send.set_ttl_v4(u32::from(VRRP_TTL))?;
        send.set_multicast_ttl_v4(u32::from(VRRP_TTL))?;
        send.set_multicast_loop_v4(false)?;
        send.set_multicast_if_v4(&source)?;
        send.set_tos_v4(TOS_NETWORK_CONTROL)?;
        send.set_nonblocking(true)?;
        // The send socket would queue every advert on the segment too; nobody reads it.
        send.set_recv_buffer_size(0)?;

        // SAFETY: the Socket owns its fd, which stays open until the AsyncFd drops it.
        let receive = unsafe { AsyncFd::register_with_interest(receive, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Self { receive, send, source })
    }

    /// The address adverts leave from.
    pub fn source(&self) -> Ipv4Addr {
        self.source
    }

    /// Receives one datagram, IPv4 header included.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.receive.async_io(Interest::READABLE, |socket| socket.recv(uninit(buf))).await
    }

    /// Receives one datagram if one is already queued; `WouldBlock` otherwise.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.receive.get_ref().recv(uninit(buf))
    }

    /// Receives one datagram from whichever of `sockets` has one, and names its interface.
    /// The search starts after the socket `*turn` last named, so a flood on one interface
    /// cannot starve the others.
    pub async fn recv_any(
        sockets: &BTreeMap<String, VrrpSocket>,
        turn: &mut usize,
        buf: &mut [u8],
    ) -> (String, io::Result<usize>) {
        std::future::poll_fn(|cx| {
            let count = sockets.len();
            for step in 0..count {
                let index = (*turn + step) % count;
                let Some((name, socket)) = sockets.iter().nth(index) else { continue };
                loop {
                    match socket.receive.poll_read_ready(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Err(e)) => return Poll::Ready((name.clone(), Err(e))),
                        Poll::Ready(Ok(mut ready)) => {
                            if let Ok(result) = ready.try_io(|fd| fd.get_ref().recv(uninit(buf))) {
                                *turn = index + 1;
                                return Poll::Ready((name.clone(), result));
                            }
                            // Not readable after all: readiness was cleared, poll again.
                        }
                    }
                }
            }
            Poll::Pending
        })
        .await
    }

    pub fn send_to(&self, msg: &[u8], destination: Ipv4Addr) -> io::Result<()> {
        let addr = SockAddr::from(SocketAddr::from((destination, 0)));
        // Adverts are small and the socket buffer is rarely full; a send that would block is
        // reported rather than awaited so the state machine never stalls behind the network.
        self.send.send_to(msg, &addr).map(|_| ())
    }
}

/// `buf` as `recv` takes it.
fn uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: recv only writes initialised bytes into the prefix it reports.
    unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) }
}
