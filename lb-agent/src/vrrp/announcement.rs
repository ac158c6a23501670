//! Announcements of a VIP just taken: gratuitous ARP for IPv4, an unsolicited Neighbor
//! Advertisement for IPv6. Either tells the segment's switches and hosts that the VIP's MAC is
//! now ours.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb_common::ndp;

use crate::mac::MacAddr;

/// An ARP Announcement (RFC 5227 §2.3): a broadcast request whose sender and target protocol
/// addresses are both the VIP. Hosts with the VIP in their cache update it; switches learn the
/// MAC's port from the Ethernet source.
pub fn announcement(mac: MacAddr, vip: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    f[14..20].copy_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4]);
    f[20..22].copy_from_slice(&[0x00, 0x01]);
    f[22..28].copy_from_slice(&mac.0);
    f[28..32].copy_from_slice(&vip.octets());
    // Target hardware address stays zero, as in a request.
    f[38..42].copy_from_slice(&vip.octets());
    f
}

/// The length of [`neighbor_advertisement`]'s frame: Ethernet, IPv6, NA with one option.
pub const NA_FRAME_LEN: usize = ndp::EthNd::ADVERTISEMENT_LEN;

/// An unsolicited Neighbor Advertisement (RFC 4861 §7.2.6) for `vip`: from the VIP to all
/// nodes, hop limit 255, Override set and Solicited clear, with the Target Link-Layer Address
/// option. Hosts with the VIP in their neighbour cache take the new MAC (Override); switches
/// learn its port from the Ethernet source. Checksummed as the data plane's advertisements are
/// (`lb_common::ndp`).
pub fn neighbor_advertisement(mac: MacAddr, vip: Ipv6Addr) -> [u8; NA_FRAME_LEN] {
    let nd = ndp::NdMessage {
        kind: ndp::NEIGHBOR_ADVERTISEMENT,
        code: 0,
        check: [0; 2],
        flags: [ndp::OVERRIDE, 0, 0, 0],
        target: vip.octets(),
    };
    let option = ndp::LinkLayerOption { kind: ndp::TARGET_LINK_LAYER, len: 1, mac: mac.0 };
    let sum = ndp::icmpv6_sum(&vip.octets(), &ndp::ALL_NODES, 32, &nd, Some(&option));
    let mut f = [0u8; NA_FRAME_LEN];
    f[0..6].copy_from_slice(&ndp::ALL_NODES_MAC);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = ndp::ICMPV6;
    ip[7] = ndp::ND_HOP_LIMIT;
    ip[8..24].copy_from_slice(&vip.octets());
    ip[24..40].copy_from_slice(&ndp::ALL_NODES);
    let message = &mut f[54..];
    message[..2].copy_from_slice(&[nd.kind, nd.code]);
    message[2..4].copy_from_slice(&(!sum).to_be_bytes());
    message[4..8].copy_from_slice(&nd.flags);
    message[8..24].copy_from_slice(&nd.target);
    message[24..26].copy_from_slice(&[option.kind, option.len]);
    message[26..32].copy_from_slice(&option.mac);
    f
}

/// The announcement for `vip`, of its family.
pub fn announcement_for(mac: MacAddr, vip: IpAddr) -> Vec<u8> {
    match vip {
        IpAddr::V4(v4) => announcement(mac, v4).to_vec(),
        IpAddr::V6(v6) => neighbor_advertisement(mac, v6).to_vec(),
    }
}

/// `frame` with an 802.1Q tag for `vlan` after its Ethernet addresses; as it is for VLAN 0.
pub fn tagged(frame: &[u8], vlan: u16) -> std::borrow::Cow<'_, [u8]> {
    if vlan == 0 || frame.len() < 12 {
        return std::borrow::Cow::Borrowed(frame);
    }
    let mut out = Vec::with_capacity(frame.len() + 4);
    out.extend_from_slice(&frame[..12]);
    out.extend_from_slice(&ETHERTYPE_8021Q.to_be_bytes());
    out.extend_from_slice(&vlan.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    std::borrow::Cow::Owned(out)
}

pub const ETHERTYPE_8021Q: u16 = 0x8100;

/// An AF_PACKET socket on the uplink for sending announcements: on its interface, tagged with
/// its VLAN if it has one.
pub struct AnnouncementSocket {
    fd: std::os::fd::OwnedFd,
    ifindex: u32,
    vlan: u16,
}

impl AnnouncementSocket {
    pub fn open(ifindex: u32, vlan: u16) -> io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: socket() returns a new fd or -1, checked before it is owned.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is valid and owned by nothing else.
        Ok(Self { fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }, ifindex, vlan })
    }

    /// A socket that sends nowhere (on /dev/null), for tests of what schedules sends.
    #[cfg(test)]
    pub fn closed() -> Self {
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        Self { fd: null.into(), ifindex: 0, vlan: 0 }
    }

    /// Sends a whole (untagged) Ethernet frame, to the destination and EtherType it names.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        if frame.len() < 14 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an Ethernet frame of 14 bytes or more"));
        }
        send_frame(&self.fd, self.ifindex, &tagged(frame, self.vlan))
    }
}

/// Sends `frame` as it is (14 bytes or more) out of `ifindex` through the packet socket `fd`.
pub fn send_frame(fd: &impl std::os::fd::AsRawFd, ifindex: u32, frame: &[u8]) -> io::Result<()> {
    // SAFETY: a zeroed sockaddr_ll is valid; we fill the fields the kernel reads.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = u16::from_be_bytes([frame[12], frame[13]]).to_be();
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: frame and addr outlive the call; lengths are theirs.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neighbor_advertisement_overrides_from_the_vip_to_all_nodes() {
        let vip: Ipv6Addr = "2001:db8::10".parse().unwrap();
        let mac = MacAddr([2, 0, 0, 0, 0, 0xaa]);
        let f = neighbor_advertisement(mac, vip);
        assert_eq!(&f[..14], &[0x33, 0x33, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0xaa, 0x86, 0xdd]);
        assert_eq!(&f[14..22], &[0x60, 0, 0, 0, 0, 32, 58, 255]);
        assert_eq!(&f[22..38], &vip.octets());
        assert_eq!(&f[38..54], &ndp::ALL_NODES);
        // Type 136, code 0, then flags R=0 S=0 O=1, the target, and its link-layer address.
        assert_eq!(&f[54..56], &[136, 0]);
        assert_eq!(&f[58..62], &[0x20, 0, 0, 0]);
        assert_eq!(&f[62..78], &vip.octets());
        assert_eq!(&f[78..86], &[2, 1, 2, 0, 0, 0, 0, 0xaa]);
        // With its checksum in place, the pseudo-header (source, destination, length 32, next
        // header 58) and the message sum to all ones.
        let mut words: Vec<u8> = f[22..54].to_vec();
        words.extend_from_slice(&[0, 0, 0, 32, 0, 0, 0, 58]);
        words.extend_from_slice(&f[54..]);
        let sum: u32 = words.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        assert_eq!(lb_common::csum::fold(sum), 0xffff);
    }

    #[test]
    fn an_announcement_names_the_vip_as_sender_and_target() {
        let f = announcement(MacAddr([2, 0, 0, 0, 0, 0xaa]), Ipv4Addr::new(198, 51, 100, 10));
        assert_eq!(
            f,
            [
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0xaa, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0,
                1, //
                2, 0, 0, 0, 0, 0xaa, 198, 51, 100, 10, 0, 0, 0, 0, 0, 0, 198, 51, 100, 10
            ]
        );
    }
}
