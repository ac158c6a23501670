//! Gratuitous ARP: tells the segment's switches and hosts that a VIP's MAC is now ours.

use std::{io, net::Ipv4Addr};

use crate::config::MacAddr;

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

/// An AF_PACKET socket on the uplink for sending announcements.
pub struct GarpSocket {
    fd: std::os::fd::OwnedFd,
    ifindex: u32,
}

impl GarpSocket {
    pub fn open(ifindex: u32) -> io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: socket() returns a new fd or -1, checked before it is owned.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is valid and owned by nothing else.
        Ok(Self { fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }, ifindex })
    }

    pub fn send(&self, frame: &[u8; 42]) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed sockaddr_ll is valid; we fill the fields the kernel reads.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = 0x0806u16.to_be();
        addr.sll_ifindex = self.ifindex as i32;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        // SAFETY: frame and addr outlive the call; lengths are theirs.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
