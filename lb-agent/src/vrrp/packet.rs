//! VRRPv3 advertisements (RFC 5798 §5, RFC 9568 §5), the same message for both families: the
//! address family of its source decides how long its addresses are and which pseudo-header
//! its checksum covers. What carried it is each family's: [`super::ipv4`] (the raw socket
//! hands over the IPv4 header) and [`super::ipv6`] (the header's fields come as ancillary data).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Version| Type  | Virtual Rtr ID|   Priority    |Count IPvX Addr|
//! |(rsvd) |     Max Adver Int     |          Checksum             |
//! |                       IPvX Address(es)                        |
//! ```
//!
//! Decoding never panics: every way a datagram can be wrong is a [`DecodeError`], which the
//! caller counts as a drop reason.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IANA protocol number for VRRP.
pub const IPPROTO_VRRP: u8 = 112;
/// RFC 5798 §5.1.1.2: the IPv4 multicast group.
pub const VRRP_MULTICAST_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// RFC 5798 §5.1.2.2: the IPv6 multicast group.
pub const VRRP_MULTICAST_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// RFC 5798 §5.1.1.3, §5.1.2.3: VRRP packets are sent with TTL (hop limit) 255 and received
/// only with 255.
pub const VRRP_TTL: u8 = 255;

const VERSION_3: u8 = 3;
const TYPE_ADVERTISEMENT: u8 = 1;
const HEADER_LEN: usize = 8;
/// Max Adver Int is a 12-bit count of centiseconds.
pub const MAX_ADVER_INT_CS: u16 = 0x0fff;
/// Addresses listed in one advertisement. The list is informational (RFC 5798 §7.1 "MAY
/// verify"), so a large shared instance lists its first 20, as keepalived does (it moves the
/// rest to `virtual_ipaddress_excluded`): adverts stay small at 10 ms intervals.
pub const MAX_ADVERTISED_ADDRS: usize = 20;

/// Which pseudo-header the checksum covers.
///
/// RFC 5798 §5.2.8 includes an IPv4 pseudo-header with the packet's real destination. keepalived
/// before 2.2.? (and with `old_unicast_checksum`) used 224.0.0.18 as the destination even for
/// unicast adverts; some VRRPv2-era implementations use no pseudo-header at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChecksumMode {
    /// RFC 5798: pseudo-header with the real destination. keepalived 2.2.7's default.
    #[default]
    Rfc,
    /// Pseudo-header with the family's multicast group (224.0.0.18, ff02::12) as destination
    /// whatever the real one (keepalived's `old_unicast_checksum`).
    MulticastDestination,
    /// The VRRP message alone, as in VRRPv2.
    NoPseudoHeader,
}

/// A VRRPv3 advertisement, independent of the IP header that carried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertisement {
    pub vrid: u8,
    pub priority: u8,
    /// Centiseconds, 1..=4095.
    pub max_adver_int_cs: u16,
    /// Of the family the advertisement is sent in; others are left out of the encoding.
    pub addresses: Vec<IpAddr>,
}

/// An advertisement with what its IP header said about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub advert: Advertisement,
}

/// Why a datagram was dropped. [`DecodeError::label`] is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    #[error("not a VRRP datagram (another protocol, or source and destination of two families)")]
    NotVrrp,
    #[error("IPv4 fragment")]
    Fragment,
    #[error("TTL (hop limit) {0}, expected 255 (RFC 5798 §7.1)")]
    BadTtl(u8),
    #[error("VRRP version {0}, expected 3")]
    BadVersion(u8),
    #[error("VRRP type {0}, expected 1 (advertisement)")]
    BadType(u8),
    #[error("address count {count} does not match {len} bytes of addresses")]
    BadCount { count: u8, len: usize },
    #[error("advertisement interval 0")]
    ZeroInterval,
    #[error("bad checksum")]
    BadChecksum,
}

impl DecodeError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::Truncated(_) => "truncated",
            DecodeError::NotVrrp => "not_vrrp",
            DecodeError::Fragment => "fragment",
            DecodeError::BadTtl(_) => "bad_ttl",
            DecodeError::BadVersion(_) => "bad_version",
            DecodeError::BadType(_) => "bad_type",
            DecodeError::BadCount { .. } => "bad_count",
            DecodeError::ZeroInterval => "zero_interval",
            DecodeError::BadChecksum => "bad_checksum",
        }
    }
}

impl Advertisement {
    /// The VRRP message (no IP header), checksummed for `source` → `destination`, whose family
    /// is the message's.
    pub fn encode(
        &self,
        source: impl Into<IpAddr>,
        destination: impl Into<IpAddr>,
        mode: ChecksumMode,
    ) -> Vec<u8> {
        let (source, destination) = (source.into(), destination.into());
        let addresses: Vec<&IpAddr> = self
            .addresses
            .iter()
            .filter(|a| a.is_ipv4() == source.is_ipv4())
            .take(MAX_ADVERTISED_ADDRS)
            .collect();
        let mut buf = Vec::with_capacity(HEADER_LEN + address_len(source) * addresses.len());
        buf.push(VERSION_3 << 4 | TYPE_ADVERTISEMENT);
        buf.push(self.vrid);
        buf.push(self.priority);
        buf.push(addresses.len() as u8);
        buf.extend_from_slice(&(self.max_adver_int_cs & MAX_ADVER_INT_CS).to_be_bytes());
        buf.extend_from_slice(&[0, 0]);
        for a in addresses {
            match a {
                IpAddr::V4(v4) => buf.extend_from_slice(&v4.octets()),
                IpAddr::V6(v6) => buf.extend_from_slice(&v6.octets()),
            }
        }
        let sum = checksum(&buf, source, destination, mode);
        buf[6..8].copy_from_slice(&sum.to_be_bytes());
        buf
    }

    /// Decodes a VRRP message whose IP header was already checked. RFC 5798 §7.1's checks that
    /// need only the packet: version, type, completeness, checksum.
    pub fn decode(
        msg: &[u8],
        source: impl Into<IpAddr>,
        destination: impl Into<IpAddr>,
        mode: ChecksumMode,
    ) -> Result<Self, DecodeError> {
        let (source, destination) = (source.into(), destination.into());
        if source.is_ipv4() != destination.is_ipv4() {
            return Err(DecodeError::NotVrrp);
        }
        if msg.len() < HEADER_LEN {
            return Err(DecodeError::Truncated(msg.len()));
        }
        let version = msg[0] >> 4;
        if version != VERSION_3 {
            return Err(DecodeError::BadVersion(version));
        }
        let kind = msg[0] & 0x0f;
        if kind != TYPE_ADVERTISEMENT {
            return Err(DecodeError::BadType(kind));
        }
        let count = msg[3];
        let body = &msg[HEADER_LEN..];
        let size = address_len(source);
        // Trailing bytes beyond the addresses would be padding from a sloppy sender; a short body
        // is an incomplete packet. Both are rejected: the checksum could not be trusted.
        if body.len() != size * count as usize {
            return Err(DecodeError::BadCount { count, len: body.len() });
        }
        if checksum(msg, source, destination, mode) != 0 {
            return Err(DecodeError::BadChecksum);
        }
        let max_adver_int_cs = u16::from_be_bytes([msg[4], msg[5]]) & MAX_ADVER_INT_CS;
        if max_adver_int_cs == 0 {
            return Err(DecodeError::ZeroInterval);
        }
        let addresses = body
            .chunks_exact(size)
            .map(|a| match <[u8; 4]>::try_from(a) {
                Ok(v4) => IpAddr::from(v4),
                Err(_) => IpAddr::from(<[u8; 16]>::try_from(a).expect("16-byte chunks")),
            })
            .collect();
        Ok(Advertisement { vrid: msg[1], priority: msg[2], max_adver_int_cs, addresses })
    }

    /// The message's length on the wire with `count` addresses of `source`'s family.
    pub fn message_len(source: IpAddr, count: usize) -> usize {
        HEADER_LEN + address_len(source) * count
    }
}

/// Bytes per address in `family`'s advertisements.
fn address_len(family: IpAddr) -> usize {
    if family.is_ipv4() { 4 } else { 16 }
}

/// Splits what follows the IP header into the VRRP message (as its address count says) and
/// whatever follows it (an authentication trailer, or nothing).
pub fn split_trailer(payload: &[u8], source: IpAddr) -> Result<(&[u8], &[u8]), DecodeError> {
    let count = usize::from(*payload.get(3).ok_or(DecodeError::Truncated(payload.len()))?);
    Ok(payload.split_at(payload.len().min(Advertisement::message_len(source, count))))
}

/// The Internet checksum (RFC 1071) over the message and, per `mode`, the pseudo-header of
/// the addresses' family: IPv4's (RFC 5798 §5.2.8), or IPv6's (RFC 8200 §8.1, as ICMPv6).
/// Over a message that already carries its checksum the result is 0.
pub fn checksum(
    msg: &[u8],
    source: impl Into<IpAddr>,
    destination: impl Into<IpAddr>,
    mode: ChecksumMode,
) -> u16 {
    let (source, destination) = (source.into(), destination.into());
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        let mut chunks = bytes.chunks_exact(2);
        for c in &mut chunks {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
        }
    };
    let group = match source {
        IpAddr::V4(_) => IpAddr::V4(VRRP_MULTICAST_V4),
        IpAddr::V6(_) => IpAddr::V6(VRRP_MULTICAST_V6),
    };
    let destination = match mode {
        ChecksumMode::Rfc => Some(destination),
        ChecksumMode::MulticastDestination => Some(group),
        ChecksumMode::NoPseudoHeader => None,
    };
    match (source, destination) {
        (IpAddr::V4(source), Some(IpAddr::V4(destination))) => {
            add(&source.octets());
            add(&destination.octets());
            add(&[0, IPPROTO_VRRP]);
            add(&(msg.len() as u16).to_be_bytes());
        }
        (IpAddr::V6(source), Some(IpAddr::V6(destination))) => {
            add(&source.octets());
            add(&destination.octets());
            add(&(msg.len() as u32).to_be_bytes());
            add(&[0, 0, 0, IPPROTO_VRRP]);
        }
        _ => {}
    }
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vrrp::ipv4;

    const SRC: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    fn advert() -> Advertisement {
        Advertisement {
            vrid: 51,
            priority: 150,
            max_adver_int_cs: 100,
            addresses: vec![Ipv4Addr::new(198, 51, 100, 10).into(), Ipv4Addr::new(198, 51, 100, 11).into()],
        }
    }

    /// An IPv4 header (no options) around `msg`, as the kernel hands it to a raw socket.
    fn datagram(msg: &[u8], ttl: u8, destination: Ipv4Addr) -> Vec<u8> {
        let mut d = vec![0x45, 0xc0];
        d.extend_from_slice(&((20 + msg.len()) as u16).to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0, ttl, IPPROTO_VRRP, 0, 0]);
        d.extend_from_slice(&SRC.octets());
        d.extend_from_slice(&destination.octets());
        d.extend_from_slice(msg);
        d
    }

    /// Golden datagram: what keepalived 2.2.7 (Debian 12) sent for `version 3,
    /// virtual_router_id 51, priority 150, advert_int 1, virtual_ipaddress { 198.51.100.10
    /// 198.51.100.11 }` from 192.0.2.10, captured with `tcpdump -xx` in a namespace.
    const KEEPALIVED_DATAGRAM: [u8; 36] = [
        0x45, 0xc0, 0x00, 0x24, 0x00, 0x01, 0x00, 0x00, 0xff, 0x70, 0x18, 0x8c, 0xc0, 0x00, 0x02,
        0x0a, //
        0xe0, 0x00, 0x00, 0x12, 0x31, 0x33, 0x96, 0x02, 0x00, 0x64, 0x41, 0x4b, 0xc6, 0x33, 0x64,
        0x0a, //
        0xc6, 0x33, 0x64, 0x0b,
    ];

    #[test]
    fn decodes_what_keepalived_sends() {
        let got = ipv4::decode(&KEEPALIVED_DATAGRAM, ChecksumMode::Rfc).unwrap();
        assert_eq!(
            got,
            Received { source: SRC.into(), destination: VRRP_MULTICAST_V4.into(), advert: advert() }
        );
    }

    #[test]
    fn encodes_what_keepalived_sends() {
        let msg = advert().encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        assert_eq!(msg, KEEPALIVED_DATAGRAM[20..]);
    }

    #[test]
    fn round_trips_in_every_checksum_mode() {
        for mode in [ChecksumMode::Rfc, ChecksumMode::MulticastDestination, ChecksumMode::NoPseudoHeader] {
            let dst = Ipv4Addr::new(192, 0, 2, 11);
            let msg = advert().encode(SRC, dst, mode);
            let got = ipv4::decode(&datagram(&msg, 255, dst), mode).unwrap();
            assert_eq!(got.advert, advert(), "{mode:?}");
            assert_eq!((got.source, got.destination), (SRC.into(), dst.into()));
        }
    }

    #[test]
    fn checksum_modes_differ_for_unicast_and_are_not_interchangeable() {
        let dst = Ipv4Addr::new(192, 0, 2, 11);
        let rfc = advert().encode(SRC, dst, ChecksumMode::Rfc);
        let old = advert().encode(SRC, dst, ChecksumMode::MulticastDestination);
        assert_ne!(rfc, old);
        assert_eq!(
            ipv4::decode(&datagram(&rfc, 255, dst), ChecksumMode::MulticastDestination),
            Err(DecodeError::BadChecksum)
        );
        // For multicast the two modes agree.
        assert_eq!(
            advert().encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
            advert().encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::MulticastDestination)
        );
    }

    #[test]
    fn hostile_datagrams_are_rejected_with_their_reason() {
        let msg = advert().encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        let good = datagram(&msg, 255, VRRP_MULTICAST_V4);
        let decode = |d: &[u8]| ipv4::decode(d, ChecksumMode::Rfc);
        assert!(decode(&good).is_ok());

        assert_eq!(decode(&datagram(&msg, 254, VRRP_MULTICAST_V4)), Err(DecodeError::BadTtl(254)));
        assert_eq!(decode(&good[..10]), Err(DecodeError::Truncated(10)));
        assert_eq!(decode(&good[..good.len() - 1]), Err(DecodeError::Truncated(good.len() - 1)));

        let mut v2 = msg.clone();
        v2[0] = 0x21;
        assert_eq!(decode(&datagram(&v2, 255, VRRP_MULTICAST_V4)), Err(DecodeError::BadVersion(2)));
        let mut bad_type = msg.clone();
        bad_type[0] = 0x32;
        assert_eq!(decode(&datagram(&bad_type, 255, VRRP_MULTICAST_V4)), Err(DecodeError::BadType(2)));
        let mut bad_sum = msg.clone();
        bad_sum[7] ^= 1;
        assert_eq!(decode(&datagram(&bad_sum, 255, VRRP_MULTICAST_V4)), Err(DecodeError::BadChecksum));
        let mut bad_count = msg.clone();
        bad_count[3] = 3;
        assert_eq!(
            decode(&datagram(&bad_count, 255, VRRP_MULTICAST_V4)),
            Err(DecodeError::BadCount { count: 3, len: 8 })
        );
        let mut fragment = good.clone();
        fragment[6] = 0x20; // more fragments
        assert_eq!(decode(&fragment), Err(DecodeError::Fragment));
        let mut other_proto = good.clone();
        other_proto[9] = 17;
        assert_eq!(decode(&other_proto), Err(DecodeError::NotVrrp));
        let zero_interval = Advertisement { max_adver_int_cs: 0, ..advert() }.encode(
            SRC,
            VRRP_MULTICAST_V4,
            ChecksumMode::Rfc,
        );
        assert_eq!(decode(&datagram(&zero_interval, 255, VRRP_MULTICAST_V4)), Err(DecodeError::ZeroInterval));
    }

    #[test]
    fn options_in_the_ip_header_are_skipped() {
        let msg = advert().encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        let mut d = datagram(&msg, 255, VRRP_MULTICAST_V4);
        d[0] = 0x46; // IHL 6: one word of options (Router Alert)
        d.splice(20..20, [0x94, 0x04, 0x00, 0x00]);
        let total = (d.len() as u16).to_be_bytes();
        d[2..4].copy_from_slice(&total);
        assert_eq!(ipv4::decode(&d, ChecksumMode::Rfc).unwrap().advert, advert());
    }

    #[test]
    fn interval_uses_only_twelve_bits() {
        let a = Advertisement { max_adver_int_cs: 0xf064, ..advert() };
        let msg = a.encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        assert_eq!(msg[4] & 0xf0, 0, "reserved bits are sent as zero");
        let got = Advertisement::decode(&msg, SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc).unwrap();
        assert_eq!(got.max_adver_int_cs, 0x064);
    }

    #[test]
    fn large_instances_list_their_first_addresses() {
        let a = Advertisement {
            addresses: (0..300u32).map(|i| Ipv4Addr::from(0xc633_6400 + i).into()).collect(),
            ..advert()
        };
        let msg = a.encode(SRC, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        assert_eq!(usize::from(msg[3]), MAX_ADVERTISED_ADDRS);
        assert_eq!(msg.len(), 8 + 4 * MAX_ADVERTISED_ADDRS);
    }
}

#[cfg(test)]
mod fuzz {
    //! The decoder against arbitrary and mutated input: it may reject, it must never panic, and
    //! whatever it accepts must re-encode to the same bytes.
    use proptest::prelude::*;

    use super::*;
    use crate::vrrp::ipv4;

    fn valid_datagram(vrid: u8, priority: u8, count: usize) -> Vec<u8> {
        let advert = Advertisement {
            vrid,
            priority,
            max_adver_int_cs: 100,
            addresses: (0..count as u32).map(|i| Ipv4Addr::from(0xc633_6400 + i).into()).collect(),
        };
        let src = Ipv4Addr::new(192, 0, 2, 10);
        let msg = advert.encode(src, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        let mut d = vec![0x45, 0xc0];
        d.extend_from_slice(&((20 + msg.len()) as u16).to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0, 255, IPPROTO_VRRP, 0, 0]);
        d.extend_from_slice(&src.octets());
        d.extend_from_slice(&VRRP_MULTICAST_V4.octets());
        d.extend_from_slice(&msg);
        d
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ipv4::decode(&bytes, ChecksumMode::Rfc);
            let _ = ipv4::decode(&bytes, ChecksumMode::NoPseudoHeader);
        }

        #[test]
        fn mutated_adverts_are_rejected_or_round_trip(
            vrid in any::<u8>(),
            priority in any::<u8>(),
            count in 0usize..6,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in any::<usize>(),
        ) {
            let mut d = valid_datagram(vrid, priority, count);
            for (at, xor) in flips {
                let at = at % d.len();
                d[at] ^= xor;
            }
            d.truncate(cut % (d.len() + 1));
            if let Ok(r) = ipv4::decode(&d, ChecksumMode::Rfc) {
                let again = r.advert.encode(r.source, r.destination, ChecksumMode::Rfc);
                let header_len = usize::from(d[0] & 0x0f) * 4;
                // Reserved bits are ignored on receipt and sent as zero, so compare without them.
                let mut original = d[header_len..header_len + again.len()].to_vec();
                original[4] &= 0x0f;
                let mut again = again;
                again[6..8].copy_from_slice(&original[6..8]);
                prop_assert_eq!(original, again);
            }
        }
    }
}
