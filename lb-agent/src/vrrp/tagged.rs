//! VRRP on a VLAN of the interface, without a VLAN device: packet sockets on the parent.
//!
//! The kernel without 802.1Q devices never hands a tagged frame to IP, so advertisements are
//! built and read whole here. Sending: Ethernet (to the group's multicast MAC, from the
//! interface's), the 802.1Q tag, the IP header a raw socket would have written (TTL or hop
//! limit 255, DSCP CS6), the message. Receiving: the kernel moves the tag of a frame it
//! receives into the packet's metadata before packet sockets see it, so it comes as
//! `PACKET_AUXDATA`; a socket filter keeps only the VLAN's IP protocol 112. What the router
//! gets is what the raw sockets give it, and it runs the same receive checks on it.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, FromRawFd},
};

use socket2::Socket;

use super::{
    ipv6,
    packet::{IPPROTO_VRRP, VRRP_TTL},
};
use crate::{mac::MacAddr, vrrp::announcement};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
/// DSCP CS6, as the raw sockets set it.
const TOS_NETWORK_CONTROL: u8 = 0xc0;

/// Where a VLAN's advertisements go in and out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    pub vlan: u16,
    /// The interface's MAC: the frames' source, as the kernel would send from it.
    pub mac: MacAddr,
}

/// A packet socket on `link`'s interface that receives only the VLAN's VRRP (both families).
pub fn open(link: Link) -> io::Result<Socket> {
    // SAFETY: socket() returns a new fd or -1, checked before it is owned.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from((libc::ETH_P_ALL as u16).to_be()),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is valid and owned by nothing else.
    let socket = unsafe { Socket::from_raw_fd(fd) };
    // The filter before the bind, so nothing unfiltered is queued.
    attach_filter(&socket, link.vlan)?;
    set_int(&socket, libc::SOL_PACKET, libc::PACKET_AUXDATA, 1)?;
    // SAFETY: a zeroed sockaddr_ll is valid; we fill the fields bind reads.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    addr.sll_ifindex = link.ifindex as i32;
    // SAFETY: addr outlives the call, its length passed with it.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// A packet socket that only sends (bound to no protocol, it receives nothing).
pub fn open_send() -> io::Result<Socket> {
    // SAFETY: socket() returns a new fd or -1, checked before it is owned.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is valid and owned by nothing else.
    Ok(unsafe { Socket::from_raw_fd(fd) })
}

/// Sends `message` (a VRRP message, checksummed) from `source` to the multicast `destination`
/// on `link`'s VLAN.
pub fn send(
    socket: &Socket,
    link: Link,
    message: &[u8],
    source: IpAddr,
    destination: IpAddr,
) -> io::Result<()> {
    let frame = frame(link, message, source, destination)?;
    announcement::send_frame(socket, link.ifindex, &announcement::tagged(&frame, link.vlan))
}

/// The untagged Ethernet frame carrying `message` from `source` to `destination`.
fn frame(link: Link, message: &[u8], source: IpAddr, destination: IpAddr) -> io::Result<Vec<u8>> {
    let mut frame = Vec::with_capacity(ETH_LEN + IPV6_LEN + message.len());
    let ether_type = match destination {
        IpAddr::V4(group) if group.is_multicast() => {
            let o = group.octets();
            frame.extend_from_slice(&[0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
            ETHERTYPE_IPV4
        }
        IpAddr::V6(group) if group.is_multicast() => {
            let o = group.octets();
            frame.extend_from_slice(&[0x33, 0x33, o[12], o[13], o[14], o[15]]);
            ETHERTYPE_IPV6
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("multicast advertisements on a VLAN without a device, not to {destination}"),
            ));
        }
    };
    frame.extend_from_slice(&link.mac.0);
    frame.extend_from_slice(&ether_type.to_be_bytes());
    match (source, destination) {
        (IpAddr::V4(source), IpAddr::V4(destination)) => {
            frame.extend_from_slice(&ipv4_header(source, destination, message.len()))
        }
        (IpAddr::V6(source), IpAddr::V6(destination)) => {
            frame.extend_from_slice(&[
                0x60 | (TOS_NETWORK_CONTROL >> 4),
                (TOS_NETWORK_CONTROL & 0x0f) << 4,
                0,
                0,
            ]);
            frame.extend_from_slice(&(message.len() as u16).to_be_bytes());
            frame.extend_from_slice(&[IPPROTO_VRRP, VRRP_TTL]);
            frame.extend_from_slice(&source.octets());
            frame.extend_from_slice(&destination.octets());
        }
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "source and destination of one family")),
    }
    frame.extend_from_slice(message);
    Ok(frame)
}

fn ipv4_header(source: Ipv4Addr, destination: Ipv4Addr, payload: usize) -> [u8; IPV4_LEN] {
    let mut h = [0u8; IPV4_LEN];
    h[0] = 0x45;
    h[1] = TOS_NETWORK_CONTROL;
    h[2..4].copy_from_slice(&((IPV4_LEN + payload) as u16).to_be_bytes());
    h[8] = VRRP_TTL;
    h[9] = IPPROTO_VRRP;
    h[12..16].copy_from_slice(&source.octets());
    h[16..20].copy_from_slice(&destination.octets());
    let check = lb_common::csum::fold(h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum());
    h[10..12].copy_from_slice(&(!check).to_be_bytes());
    h
}

/// What one receive got, as the raw sockets deliver it: the length in the buffer and, for
/// IPv6, the header's fields (the buffer holding the message alone).
pub type Datagram = (usize, Option<ipv6::Header>);

/// Receives the next advertisement of `family` on the socket's VLAN into `buf` as the raw
/// sockets deliver it (IPv4: header and message; IPv6: the message, the header's fields
/// beside it); `WouldBlock` once none is queued. Frames this node sent, and any the filter
/// let through that are not the VLAN's VRRP of `family`, are skipped.
pub fn receive(
    socket: &Socket,
    vlan: u16,
    family: super::family::IpFamily,
    buf: &mut [u8],
) -> io::Result<Datagram> {
    let mut frame = [0u8; 2048];
    loop {
        let (len, from, tag) = recv_frame(socket, &mut frame)?;
        if from.sll_pkttype == libc::PACKET_OUTGOING || tag != Some(vlan) {
            continue;
        }
        if let Some(arrived) = datagram(&frame[..len], family, buf) {
            return Ok(arrived);
        }
    }
}

/// The VRRP datagram in an (untagged) frame, copied to `buf` as the raw sockets give it.
fn datagram(frame: &[u8], family: super::family::IpFamily, buf: &mut [u8]) -> Option<Datagram> {
    use super::family::IpFamily;
    let ether_type = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(ETH_LEN..)?;
    match (family, ether_type) {
        (IpFamily::V4, ETHERTYPE_IPV4) if ip.len() >= IPV4_LEN && ip[9] == IPPROTO_VRRP => {
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
            let len = total.min(buf.len());
            buf[..len].copy_from_slice(&ip[..len]);
            Some((len, None))
        }
        (IpFamily::V6, ETHERTYPE_IPV6) if ip.len() >= IPV6_LEN && ip[6] == IPPROTO_VRRP => {
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]])).min(ip.len() - IPV6_LEN);
            let len = payload.min(buf.len());
            buf[..len].copy_from_slice(&ip[IPV6_LEN..IPV6_LEN + len]);
            let address =
                |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&ip[at..at + 16]).unwrap_or_default());
            let header = ipv6::Header { source: address(8), destination: address(24), hop_limit: ip[7] };
            Some((len, Some(header)))
        }
        _ => None,
    }
}

/// One frame, where it came from, and its VLAN (from the auxiliary data).
fn recv_frame(socket: &Socket, frame: &mut [u8]) -> io::Result<(usize, libc::sockaddr_ll, Option<u16>)> {
    // SAFETY: zeroed sockaddr_ll, iovec and msghdr are valid; every pointer below is to
    // storage that outlives the recvmsg call, with its true length.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 8];
    let mut iov = libc::iovec { iov_base: frame.as_mut_ptr().cast(), iov_len: frame.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let len = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut tag = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if ((*cmsg).cmsg_level, (*cmsg).cmsg_type) == (libc::SOL_PACKET, libc::PACKET_AUXDATA) {
                let aux = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::tpacket_auxdata>());
                if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 {
                    tag = Some(aux.tp_vlan_tci & 0x0fff);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((len as usize, from, tag))
}

/// A classic BPF socket filter: a frame whose tag (in the metadata) is `vlan` and that carries
/// IPv4 or IPv6 protocol 112 (no IPv6 extension headers, as VRRP is sent).
fn attach_filter(socket: &Socket, vlan: u16) -> io::Result<()> {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let ancillary = |offset: i32| (libc::SKF_AD_OFF + offset) as u32;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let program = [
        op(LD_W_ABS, 0, 0, ancillary(libc::SKF_AD_VLAN_TAG_PRESENT)),
        op(JEQ_K, 0, 11, 1),
        op(LD_W_ABS, 0, 0, ancillary(libc::SKF_AD_VLAN_TAG)),
        op(AND_K, 0, 0, 0x0fff),
        op(JEQ_K, 0, 8, u32::from(vlan)),
        op(LD_H_ABS, 0, 0, 12),
        op(JEQ_K, 0, 2, u32::from(ETHERTYPE_IPV4)),
        op(LD_B_ABS, 0, 0, (ETH_LEN + 9) as u32),
        op(JEQ_K, 3, 4, u32::from(IPPROTO_VRRP)),
        op(JEQ_K, 0, 3, u32::from(ETHERTYPE_IPV6)),
        op(LD_B_ABS, 0, 0, (ETH_LEN + 6) as u32),
        op(JEQ_K, 0, 1, u32::from(IPPROTO_VRRP)),
        op(RET_K, 0, 0, u32::MAX),
        op(RET_K, 0, 0, 0),
    ];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
    // SAFETY: the program outlives the call (the kernel copies it), its length passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Sets an integer socket option (the raw sockets' too).
pub(super) fn set_int(socket: &Socket, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: an int option, its size passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vrrp::family::IpFamily;

    const LINK: Link = Link { ifindex: 7, vlan: 30, mac: MacAddr([2, 0, 0, 0, 0, 1]) };

    #[test]
    fn an_ipv4_advertisement_leaves_as_the_raw_socket_would_send_it_and_reads_back() {
        let message = [0x31, 7, 100, 1, 0, 100, 0, 0, 198, 51, 100, 30];
        let source: IpAddr = "10.30.0.11".parse().unwrap();
        let frame = frame(LINK, &message, source, "224.0.0.18".parse().unwrap()).unwrap();
        assert_eq!(&frame[..14], &[1, 0, 0x5e, 0, 0, 0x12, 2, 0, 0, 0, 0, 1, 8, 0]);
        let ip = &frame[14..34];
        assert_eq!((ip[1], ip[8], ip[9]), (0xc0, 255, 112), "CS6, TTL 255, protocol 112");
        let sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        assert_eq!(lb_common::csum::fold(sum), 0xffff, "a valid header checksum");
        let mut buf = [0u8; 64];
        let Some((len, None)) = datagram(&frame, IpFamily::V4, &mut buf) else { panic!("an IPv4 datagram") };
        assert_eq!(&buf[..len], &frame[14..]);
        assert!(datagram(&frame, IpFamily::V6, &mut buf).is_none(), "not for the IPv6 socket");
    }

    #[test]
    fn an_ipv6_advertisement_reads_back_with_its_header_fields() {
        let message = [0x31, 7, 100, 1, 0, 100, 0, 0];
        let source: Ipv6Addr = "fe80::11".parse().unwrap();
        let group: Ipv6Addr = "ff02::12".parse().unwrap();
        let frame = frame(LINK, &message, source.into(), group.into()).unwrap();
        assert_eq!(&frame[..6], &[0x33, 0x33, 0, 0, 0, 0x12]);
        let mut buf = [0u8; 64];
        let Some((len, Some(header))) = datagram(&frame, IpFamily::V6, &mut buf) else { panic!("IPv6") };
        assert_eq!(
            (&buf[..len], header),
            (&message[..], ipv6::Header { source, destination: group, hop_limit: 255 })
        );
    }

    #[test]
    fn unicast_is_refused_by_name() {
        let error =
            frame(LINK, &[0; 8], "10.30.0.11".parse().unwrap(), "10.30.0.12".parse().unwrap()).unwrap_err();
        assert!(error.to_string().contains("multicast"), "{error}");
    }
}
