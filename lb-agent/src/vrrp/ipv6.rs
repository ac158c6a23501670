//! VRRP over IPv6 (RFC 5798 §5.1.2): adverts go to ff02::12 from the interface's link-local
//! address with hop limit 255. A raw IPv6 socket delivers only the payload; the header's
//! fields the receive checks need (source, destination, hop limit) come beside it, as
//! ancillary data, and are checked here as the IPv4 header's are in [`super::ipv4`].

use std::net::{IpAddr, Ipv6Addr};

use super::packet::{
    Advertisement, ChecksumMode, DecodeError, IPPROTO_VRRP, Received, VRRP_TTL, split_trailer,
};

/// What the IPv6 header said about a received advertisement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub source: Ipv6Addr,
    pub destination: Ipv6Addr,
    pub hop_limit: u8,
}

/// The fixed IPv6 header's length.
const HEADER_LEN: usize = 40;

/// Decodes a VRRP payload that arrived under `header`: hop limit 255 (§7.1: "MUST verify that
/// the IPv6 Hop Limit is 255"), then the message, with nothing after it.
pub fn decode(payload: &[u8], header: Header, mode: ChecksumMode) -> Result<Received, DecodeError> {
    check(header)?;
    let advert = Advertisement::decode(payload, header.source, header.destination, mode)?;
    Ok(Received { source: header.source.into(), destination: header.destination.into(), advert })
}

/// As [`decode`], for a group that authenticates: the advertisement, the message bytes the
/// tag covers, and what follows them.
pub fn decode_with_trailer(
    payload: &[u8],
    header: Header,
    mode: ChecksumMode,
) -> Result<(Received, &[u8], &[u8]), DecodeError> {
    check(header)?;
    let (message, trailer) = split_trailer(payload, IpAddr::V6(header.source))?;
    let advert = Advertisement::decode(message, header.source, header.destination, mode)?;
    Ok((
        Received { source: header.source.into(), destination: header.destination.into(), advert },
        message,
        trailer,
    ))
}

/// A whole IPv6 packet as it is on the wire: its header's fields and its VRRP payload. Extension
/// headers are refused: VRRP is sent without any, and a receiver need not walk them.
pub fn split_packet(packet: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
    if packet.len() < HEADER_LEN {
        return Err(DecodeError::Truncated(packet.len()));
    }
    if packet[0] >> 4 != 6 || packet[6] != IPPROTO_VRRP {
        return Err(DecodeError::NotVrrp);
    }
    let payload_len = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
    if packet.len() < HEADER_LEN + payload_len {
        return Err(DecodeError::Truncated(packet.len()));
    }
    let address = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&packet[at..at + 16]).expect("16 bytes"));
    let header = Header { source: address(8), destination: address(24), hop_limit: packet[7] };
    Ok((header, &packet[HEADER_LEN..HEADER_LEN + payload_len]))
}

fn check(header: Header) -> Result<(), DecodeError> {
    if header.hop_limit != VRRP_TTL {
        return Err(DecodeError::BadTtl(header.hop_limit));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vrrp::packet::VRRP_MULTICAST_V6;

    const SOURCE: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x10);

    /// Golden packet: what keepalived 2.2.7 (Debian 12) sent for `version 3, virtual_router_id
    /// 51, priority 150, advert_int 1, virtual_ipaddress { 2001:db8:0:1::10 2001:db8:0:1::11 }`
    /// from fe80::10, captured with `tcpdump -xx` in a namespace (Ethernet header left out).
    const KEEPALIVED_PACKET: [u8; 80] = [
        0x6c, 0x0a, 0x68, 0x70, 0x00, 0x28, 0x70,
        0xff, // version, class, flow; length 40; VRRP; hop limit 255
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, // fe80::10
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, // ff02::12
        0x31, 0x33, 0x96, 0x02, 0x00, 0x64, 0xde,
        0x92, // v3 advert, VRID 51, priority 150, 2 addresses, 100 cs
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x10, //
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x11,
    ];

    fn advert() -> Advertisement {
        Advertisement {
            vrid: 51,
            priority: 150,
            max_adver_int_cs: 100,
            addresses: vec!["2001:db8:0:1::10".parse().unwrap(), "2001:db8:0:1::11".parse().unwrap()],
        }
    }

    #[test]
    fn decodes_what_keepalived_sends() {
        let (header, payload) = split_packet(&KEEPALIVED_PACKET).unwrap();
        assert_eq!(header, Header { source: SOURCE, destination: VRRP_MULTICAST_V6, hop_limit: 255 });
        let got = decode(payload, header, ChecksumMode::Rfc).unwrap();
        assert_eq!(got.advert, advert());
        assert_eq!((got.source, got.destination), (IpAddr::V6(SOURCE), IpAddr::V6(VRRP_MULTICAST_V6)));
    }

    #[test]
    fn encodes_what_keepalived_sends() {
        let msg = advert().encode(SOURCE, VRRP_MULTICAST_V6, ChecksumMode::Rfc);
        assert_eq!(msg, KEEPALIVED_PACKET[40..]);
    }

    #[test]
    fn the_pseudo_header_binds_both_addresses_and_the_hop_limit_is_checked() {
        let (header, payload) = split_packet(&KEEPALIVED_PACKET).unwrap();
        let rfc_decode = |h: Header| decode(payload, h, ChecksumMode::Rfc);
        assert_eq!(rfc_decode(Header { hop_limit: 64, ..header }), Err(DecodeError::BadTtl(64)));
        let other = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x11);
        assert_eq!(rfc_decode(Header { source: other, ..header }), Err(DecodeError::BadChecksum));
        // Unicast to a peer: the real destination, or ff02::12 in keepalived's old mode.
        for mode in [ChecksumMode::Rfc, ChecksumMode::MulticastDestination, ChecksumMode::NoPseudoHeader] {
            let msg = advert().encode(SOURCE, other, mode);
            let got = decode(&msg, Header { destination: other, ..header }, mode).unwrap();
            assert_eq!(got.advert, advert(), "{mode:?}");
        }
        let rfc = advert().encode(SOURCE, other, ChecksumMode::Rfc);
        let unicast = Header { destination: other, ..header };
        assert_eq!(decode(&rfc, unicast, ChecksumMode::MulticastDestination), Err(DecodeError::BadChecksum));
        // Addresses of the other family are not part of an IPv6 advertisement.
        let mixed = Advertisement { addresses: vec!["198.51.100.10".parse().unwrap()], ..advert() };
        assert_eq!(mixed.encode(SOURCE, VRRP_MULTICAST_V6, ChecksumMode::Rfc)[3], 0);
    }

    #[test]
    fn broken_packets_are_refused_with_their_reason() {
        assert_eq!(split_packet(&KEEPALIVED_PACKET[..30]), Err(DecodeError::Truncated(30)));
        assert_eq!(split_packet(&KEEPALIVED_PACKET[..60]), Err(DecodeError::Truncated(60)));
        let mut hop_by_hop = KEEPALIVED_PACKET;
        hop_by_hop[6] = 0;
        assert_eq!(split_packet(&hop_by_hop), Err(DecodeError::NotVrrp));
        let (header, payload) = split_packet(&KEEPALIVED_PACKET).unwrap();
        assert_eq!(
            decode(&payload[..payload.len() - 16], header, ChecksumMode::Rfc),
            Err(DecodeError::BadCount { count: 2, len: 16 })
        );
        let (_, message, trailer) = decode_with_trailer(payload, header, ChecksumMode::Rfc).unwrap();
        assert_eq!((message.len(), trailer.len()), (40, 0));
    }
}
