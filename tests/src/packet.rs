//! Raw frames on a lab interface: craft, send and capture with AF_PACKET, for inputs that no
//! well-behaved tool will send (truncated, contradictory or hostile packets).

use std::{
    ffi::CString,
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use crate::netns::run_in;

const ETH_P_ALL: u16 = 0x0003;

/// An Ethernet/IPv4 ARP frame, byte by byte as RFC 826 lays it out. Written independently of
/// `lb_common::arp`, so tests that use it check that code rather than repeat it.
pub fn arp_frame(
    oper: u16,
    eth_dst: [u8; 6],
    sha: [u8; 6],
    spa: Ipv4Addr,
    tha: [u8; 6],
    tpa: Ipv4Addr,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&sha);
    f.extend_from_slice(&[0x08, 0x06]); // EtherType ARP
    f.extend_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4]); // Ethernet, IPv4, hlen, plen
    f.extend_from_slice(&oper.to_be_bytes());
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa.octets());
    f.extend_from_slice(&tha);
    f.extend_from_slice(&tpa.octets());
    f
}

/// A broadcast ARP request from `sha`/`spa` for `tpa`.
pub fn arp_request(sha: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    arp_frame(1, [0xff; 6], sha, spa, [0; 6], tpa)
}

/// A raw socket bound to one interface of one namespace.
struct RawSocket {
    fd: i32,
}

impl RawSocket {
    fn bind(interface: &str) -> RawSocket {
        let name = CString::new(interface).unwrap();
        // SAFETY: plain syscalls on values we own; every result is checked.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr());
            assert!(ifindex != 0, "no interface {interface}");
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P_ALL.to_be()));
            assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = ETH_P_ALL.to_be();
            addr.sll_ifindex = ifindex as i32;
            let rc = libc::bind(
                fd,
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert!(rc == 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
            RawSocket { fd }
        }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: the buffer outlives the call.
        let sent = unsafe { libc::send(self.fd, frame.as_ptr().cast(), frame.len(), 0) };
        assert!(sent == frame.len() as isize, "send: {}", std::io::Error::last_os_error());
    }

    /// Received (not outgoing) frames until `window` has passed.
    fn receive_for(&self, window: Duration) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + window;
        let mut frames = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let timeout =
                libc::timeval { tv_sec: left.as_secs() as _, tv_usec: left.subsec_micros().max(1) as _ };
            // SAFETY: as above; `from` is sized for sockaddr_ll.
            unsafe {
                libc::setsockopt(
                    self.fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    &timeout as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::timeval>() as u32,
                );
                let mut from: libc::sockaddr_ll = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                let n = libc::recvfrom(
                    self.fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    &mut from as *mut _ as *mut libc::sockaddr,
                    &mut len,
                );
                if n < 0 {
                    break;
                }
                if from.sll_pkttype != libc::PACKET_OUTGOING {
                    frames.push(buf[..n as usize].to_vec());
                }
            }
        }
        frames
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: our own fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// Sends `frames` on `interface` in namespace `ns`, and returns every frame received there
/// during `window` afterwards.
pub fn send_and_capture(ns: &str, interface: &str, frames: Vec<Vec<u8>>, window: Duration) -> Vec<Vec<u8>> {
    let interface = interface.to_owned();
    run_in(ns, move || {
        let socket = RawSocket::bind(&interface);
        for frame in &frames {
            socket.send(frame);
        }
        socket.receive_for(window)
    })
}

/// Sends `frames` on `interface` in namespace `ns` from a thread pinned to `cpu`: the receiving
/// veth processes them on that CPU, so per-CPU state there (an LRU's lists) is what they touch.
pub fn send_from_cpu(ns: &str, interface: &str, frames: Vec<Vec<u8>>, cpu: usize) {
    let interface = interface.to_owned();
    run_in(ns, move || {
        // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let socket = RawSocket::bind(&interface);
        for frame in &frames {
            socket.send(frame);
        }
    })
}

/// The ARP replies among `frames`, as (sender MAC, sender IP, target MAC, target IP).
pub fn arp_replies(frames: &[Vec<u8>]) -> Vec<([u8; 6], Ipv4Addr, [u8; 6], Ipv4Addr)> {
    frames
        .iter()
        .filter(|f| f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 2])
        .map(|f| {
            let mac = |at: usize| <[u8; 6]>::try_from(&f[at..at + 6]).unwrap();
            let ip = |at: usize| Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]);
            (mac(22), ip(28), mac(32), ip(38))
        })
        .collect()
}

/// An Ethernet frame carrying an IPv4 datagram (no options, checksummed header).
pub fn ipv4_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ttl: u8,
    protocol: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut header = vec![0x45, 0xc0];
    header.extend_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    header.extend_from_slice(&[0, 0, 0, 0, ttl, protocol, 0, 0]);
    header.extend_from_slice(&src.octets());
    header.extend_from_slice(&dst.octets());
    let mut sum: u32 = header.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    header[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let mut frame = Vec::with_capacity(14 + header.len() + payload.len());
    frame.extend_from_slice(&dst_mac);
    frame.extend_from_slice(&src_mac);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&header);
    frame.extend_from_slice(payload);
    frame
}

/// The Ethernet address of an IPv4 multicast group (RFC 1112 §6.4).
pub fn multicast_mac(group: Ipv4Addr) -> [u8; 6] {
    let o = group.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// The Internet checksum of `bytes` (RFC 1071).
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 =
        bytes.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A TCP or UDP segment with a correct checksum over the IPv4 pseudo-header.
pub fn transport(protocol: u8, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    segment(protocol, sport, dport, data, |s| transport_checksum(protocol, src, dst, s))
}

/// As [`transport`] over IPv6 (the RFC 8200 §8.1 pseudo-header).
pub fn transport6(
    protocol: u8,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    dport: u16,
    data: &[u8],
) -> Vec<u8> {
    segment(protocol, sport, dport, data, |s| transport_checksum6(protocol, src, dst, s))
}

/// A TCP (SYN|ACK) or UDP segment carrying `data`, checksummed by `sum`.
fn segment(protocol: u8, sport: u16, dport: u16, data: &[u8], sum: impl Fn(&[u8]) -> u16) -> Vec<u8> {
    let mut segment = Vec::new();
    segment.extend_from_slice(&sport.to_be_bytes());
    segment.extend_from_slice(&dport.to_be_bytes());
    let check_at = if protocol == 6 {
        // seq, ack, data offset 5, flags SYN|ACK, window
        segment.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x12, 0xff, 0xff, 0, 0, 0, 0]);
        16
    } else {
        segment.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        segment.extend_from_slice(&[0, 0]);
        6
    };
    segment.extend_from_slice(data);
    let mut c = sum(&segment);
    if protocol == 17 && c == 0 {
        c = 0xffff;
    }
    segment[check_at..check_at + 2].copy_from_slice(&c.to_be_bytes());
    segment
}

/// The checksum a segment's checksum field must make zero: over the pseudo-header and the
/// segment as it is.
pub fn transport_checksum(protocol: u8, src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, protocol]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(segment);
    checksum(&pseudo)
}

/// As [`transport_checksum`] over IPv6.
pub fn transport_checksum6(protocol: u8, src: Ipv6Addr, dst: Ipv6Addr, segment: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(segment.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, protocol]);
    pseudo.extend_from_slice(segment);
    checksum(&pseudo)
}

/// Checks an Ethernet/IPv4 frame's header checksum and, for TCP/UDP, its transport checksum.
pub fn checksums_valid(frame: &[u8]) -> bool {
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    if checksum(&frame[14..14 + ihl]) != 0 {
        return false;
    }
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let (src, dst) = (ipv4_at(frame, 26), ipv4_at(frame, 30));
    let segment = &frame[14 + ihl..14 + total];
    match frame[23] {
        6 => transport_checksum(6, src, dst, segment) == 0,
        17 if segment[6..8] == [0, 0] => true,
        17 => transport_checksum(17, src, dst, segment) == 0,
        _ => true,
    }
}

pub fn ipv4_at(frame: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3])
}

/// Deterministic noise for fuzzing frames (xorshift64): the same bytes on every run, so a
/// failure reproduces.
pub struct Noise(u64);

impl Noise {
    pub fn new(seed: u64) -> Noise {
        Noise(seed | 1)
    }

    pub fn byte(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 as u8
    }
}

/// An Ethernet/IPv6 frame with `payload` after the fixed header (no extension headers); the
/// arguments in [`ipv4_frame`]'s order.
pub fn ipv6_frame(
    eth_src: [u8; 6],
    eth_dst: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    next_header: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(54 + payload.len());
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[next_header, hop_limit]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    f
}

/// The ICMPv6 checksum over the RFC 8200 §8.1 pseudo-header and `message` (checksum zeroed).
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + message.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(message.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(message);
    checksum(&pseudo)
}

/// An ICMPv6 message of `kind` with `body` after the checksum, checksummed for `src` → `dst`.
pub fn icmpv6(kind: u8, code: u8, body: &[u8], src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(body);
    let check = icmpv6_checksum(src, dst, &m);
    m[2..4].copy_from_slice(&check.to_be_bytes());
    m
}

/// `address`'s solicited-node multicast group (RFC 4291 §2.7.1) and its Ethernet address.
pub fn solicited_node(address: Ipv6Addr) -> (Ipv6Addr, [u8; 6]) {
    let o = address.octets();
    let group = Ipv6Addr::from([0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15]]);
    (group, [0x33, 0x33, 0xff, o[13], o[14], o[15]])
}

/// A Neighbor Solicitation for `target` from `mac`/`src` to the target's solicited-node group,
/// as RFC 4861 §4.3 lays it out, with the source link-layer option unless `src` is ::.
pub fn neighbor_solicitation(mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let (group, group_mac) = solicited_node(target);
    let mut body = vec![0, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    if !src.is_unspecified() {
        body.extend_from_slice(&[1, 1]);
        body.extend_from_slice(&mac);
    }
    ipv6_frame(mac, group_mac, src, group, 255, 58, &icmpv6(135, 0, &body, src, group))
}

/// A Neighbor Advertisement as captured: (Ethernet destination, IPv6 source, flags byte, target,
/// target link-layer address).
pub type Advertisement6 = ([u8; 6], Ipv6Addr, u8, Ipv6Addr, [u8; 6]);

/// The Neighbor Advertisements among `frames`.
pub fn neighbor_advertisements(frames: &[Vec<u8>]) -> Vec<Advertisement6> {
    frames
        .iter()
        .filter(|f| f.len() >= 86 && f[12..14] == [0x86, 0xdd] && f[20] == 58 && f[54] == 136)
        .map(|f| {
            let address = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap());
            (f[..6].try_into().unwrap(), address(22), f[58], address(62), f[80..86].try_into().unwrap())
        })
        .collect()
}
