//! The raw IP sockets for protocol 112, one family each: the only part of VRRP that touches
//! the network.

use std::{
    collections::BTreeMap,
    io,
    mem::MaybeUninit,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    os::fd::AsRawFd,
    task::Poll,
};

use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockAddr, Socket, Type};
use tokio::io::{Interest, unix::AsyncFd};

use super::{
    family::IpFamily,
    ipv6,
    packet::{IPPROTO_VRRP, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6, VRRP_TTL},
    router::Datagram,
    tagged::{self, set_int},
};

/// The receive socket's buffer, in bytes (the kernel counts each datagram's whole buffer,
/// about 1 KiB for an advertisement).
const RECEIVE_BUFFER: i32 = 4 << 20;

/// DSCP CS6 (network control), as keepalived and most routers send VRRP.
const TOS_NETWORK_CONTROL: u32 = 0xc0;

pub struct VrrpSocket {
    /// Unbound: a raw socket bound to an address only receives datagrams addressed to it, and
    /// adverts go to the multicast group.
    receive: AsyncFd<Socket>,
    /// Bound to our address, so adverts carry the source the peers expect and the checksum
    /// was computed with.
    send: Socket,
    source: IpAddr,
    ifindex: u32,
    /// On a VLAN of the interface: packet sockets, frames built and read here.
    vlan: Option<tagged::Link>,
}

/// What one receive got: the length in the buffer and, for IPv6, the header's fields (a raw
/// IPv6 socket delivers the payload alone).
#[derive(Clone, Copy, Debug)]
pub enum Arrived {
    V4 { len: usize },
    V6 { len: usize, header: ipv6::Header },
}

impl Arrived {
    /// The datagram as the router takes it.
    pub fn datagram<'a>(&self, buf: &'a [u8]) -> Datagram<'a> {
        match *self {
            Arrived::V4 { len } => Datagram::V4(&buf[..len]),
            Arrived::V6 { len, header } => Datagram::V6 { header, payload: &buf[..len] },
        }
    }
}

impl VrrpSocket {
    /// Opens the sockets on `interface`, sourced from `source` (its family is the socket's),
    /// joined to the family's VRRP group (224.0.0.18, ff02::12).
    ///
    /// Bound to the device so that only the uplink's adverts arrive; multicast loop off so we
    /// never hear ourselves; TTL (hop limit) 255 both ways because receivers drop anything
    /// else (§5.1.1.3, §5.1.2.3).
    ///
    /// On a VLAN (`vlan`), packet sockets on the interface instead (see [`tagged`]).
    pub fn open(
        interface: &str,
        ifindex: u32,
        source: IpAddr,
        vlan: Option<tagged::Link>,
    ) -> io::Result<Self> {
        let (receive, send) = match (vlan, source) {
            (Some(link), _) => (tagged::open(link)?, tagged::open_send()?),
            (None, IpAddr::V4(source)) => open_v4(interface, ifindex, source)?,
            (None, IpAddr::V6(source)) => open_v6(interface, ifindex, source)?,
        };
        receive.set_nonblocking(true)?;
        // Room for every advertisement of a busy segment through a stall of a second or so (a
        // default buffer holds ~200): one dropped here may be the one that keeps a backup
        // from taking over. Forced past rmem_max where the agent may (CAP_NET_ADMIN).
        if set_int(&receive, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER).is_err() {
            receive.set_recv_buffer_size(RECEIVE_BUFFER as usize)?;
        }
        send.set_nonblocking(true)?;
        // The send socket would queue every advert on the segment too; nobody reads it.
        send.set_recv_buffer_size(0)?;
        // SAFETY: the Socket owns its fd, which stays open until the AsyncFd drops it.
        let receive = unsafe { AsyncFd::register_with_interest(receive, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Self { receive, send, source, ifindex, vlan })
    }

    /// The address adverts leave from.
    pub fn source(&self) -> IpAddr {
        self.source
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.source)
    }

    /// Receives one datagram if one is already queued; `WouldBlock` otherwise.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Arrived> {
        self.receive_on(self.receive.get_ref(), buf)
    }

    fn receive_on(&self, socket: &Socket, buf: &mut [u8]) -> io::Result<Arrived> {
        match self.vlan {
            Some(link) => {
                tagged::receive(socket, link.vlan, self.family(), buf).map(|(len, header)| match header {
                    Some(header) => Arrived::V6 { len, header },
                    None => Arrived::V4 { len },
                })
            }
            None => receive(socket, self.family(), buf),
        }
    }

    /// Receives one datagram from whichever of `sockets` has one, and names its socket.
    /// The search starts after the socket `*turn` last named, so a flood on one interface
    /// cannot starve the others.
    pub async fn recv_any<K: Clone>(
        sockets: &BTreeMap<K, VrrpSocket>,
        turn: &mut usize,
        buf: &mut [u8],
    ) -> (K, io::Result<Arrived>) {
        std::future::poll_fn(|cx| {
            let count = sockets.len();
            for step in 0..count {
                let index = (*turn + step) % count;
                let Some((key, socket)) = sockets.iter().nth(index) else { continue };
                loop {
                    match socket.receive.poll_read_ready(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Err(e)) => return Poll::Ready((key.clone(), Err(e))),
                        Poll::Ready(Ok(mut ready)) => {
                            if let Ok(result) = ready.try_io(|fd| socket.receive_on(fd.get_ref(), buf)) {
                                *turn = index + 1;
                                return Poll::Ready((key.clone(), result));
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

    /// Sends to `destination`, of the socket's family (a link-local one through this
    /// socket's interface).
    pub fn send_to(&self, msg: &[u8], destination: IpAddr) -> io::Result<()> {
        if let Some(link) = self.vlan {
            return tagged::send(&self.send, link, msg, self.source, destination);
        }
        let addr = match destination {
            IpAddr::V4(v4) => SockAddr::from(SocketAddr::from((v4, 0))),
            IpAddr::V6(v6) => SockAddr::from(SocketAddrV6::new(v6, 0, 0, scope(v6, self.ifindex))),
        };
        // Adverts are small and the socket buffer is rarely full; a send that would block is
        // reported rather than awaited so the state machine never stalls behind the network.
        self.send.send_to(msg, &addr).map(|_| ())
    }
}

fn raw(domain: Domain) -> io::Result<Socket> {
    Socket::new(domain, Type::RAW, Some(Protocol::from(i32::from(IPPROTO_VRRP))))
}

fn open_v4(interface: &str, ifindex: u32, source: Ipv4Addr) -> io::Result<(Socket, Socket)> {
    let receive = raw(Domain::IPV4)?;
    receive.bind_device(Some(interface.as_bytes()))?;
    receive.join_multicast_v4_n(&VRRP_MULTICAST_V4, &InterfaceIndexOrAddress::Index(ifindex))?;
    receive.set_multicast_loop_v4(false)?;

    let send = raw(Domain::IPV4)?;
    send.bind_device(Some(interface.as_bytes()))?;
    send.bind(&SockAddr::from(SocketAddrV4::new(source, 0)))?;
    send.set_ttl_v4(u32::from(VRRP_TTL))?;
    send.set_multicast_ttl_v4(u32::from(VRRP_TTL))?;
    send.set_multicast_loop_v4(false)?;
    send.set_multicast_if_v4(&source)?;
    send.set_tos_v4(TOS_NETWORK_CONTROL)?;
    Ok((receive, send))
}

/// RFC 5798 §5.1.2: from the interface's link-local address (or the configured one, for
/// unicast), to ff02::12, hop limit 255. The receive side asks for the hop limit and the
/// destination as ancillary data: the §7.1 checks need them, and the header is not delivered.
fn open_v6(interface: &str, ifindex: u32, source: Ipv6Addr) -> io::Result<(Socket, Socket)> {
    let receive = raw(Domain::IPV6)?;
    receive.bind_device(Some(interface.as_bytes()))?;
    receive.join_multicast_v6(&VRRP_MULTICAST_V6, ifindex)?;
    receive.set_multicast_loop_v6(false)?;
    set_int(&receive, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
    set_int(&receive, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;

    let send = raw(Domain::IPV6)?;
    send.bind_device(Some(interface.as_bytes()))?;
    send.bind(&SockAddr::from(SocketAddrV6::new(source, 0, 0, scope(source, ifindex))))?;
    send.set_unicast_hops_v6(u32::from(VRRP_TTL))?;
    send.set_multicast_hops_v6(u32::from(VRRP_TTL))?;
    send.set_multicast_loop_v6(false)?;
    send.set_multicast_if_v6(ifindex)?;
    send.set_tclass_v6(TOS_NETWORK_CONTROL)?;
    Ok((receive, send))
}

/// The scope a link-local address needs: the interface's index.
fn scope(address: Ipv6Addr, ifindex: u32) -> u32 {
    if address.is_unicast_link_local() || address.is_multicast() { ifindex } else { 0 }
}

fn receive(socket: &Socket, family: IpFamily, buf: &mut [u8]) -> io::Result<Arrived> {
    match family {
        IpFamily::V4 => socket.recv(uninit(buf)).map(|len| Arrived::V4 { len }),
        IpFamily::V6 => receive_v6(socket, buf),
    }
}

/// One IPv6 datagram: the payload into `buf`, the source from the address, the destination
/// and hop limit from the ancillary data. A datagram without them is reported with hop limit
/// 0, which the receive checks drop.
fn receive_v6(socket: &Socket, buf: &mut [u8]) -> io::Result<Arrived> {
    // SAFETY: zeroed sockaddr_in6, iovec and msghdr are valid; every pointer below is to
    // storage that outlives the recvmsg call, with its true length.
    let mut from: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_in6).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in6>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let len = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut header = ipv6::Header {
        source: Ipv6Addr::from(from.sin6_addr.s6_addr),
        destination: Ipv6Addr::UNSPECIFIED,
        hop_limit: 0,
    };
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                    let hops = std::ptr::read_unaligned(data.cast::<i32>());
                    header.hop_limit = u8::try_from(hops).unwrap_or(0);
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let info = std::ptr::read_unaligned(data.cast::<libc::in6_pktinfo>());
                    header.destination = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Arrived::V6 { len: len as usize, header })
}

/// `buf` as `recv` takes it.
fn uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: recv only writes initialised bytes into the prefix it reports.
    unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) }
}
