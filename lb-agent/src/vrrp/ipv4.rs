//! VRRP over IPv4: a raw IPv4 socket delivers the whole datagram, header included, and the
//! header's checks are made here (RFC 5798 §7.1): protocol, TTL 255, no fragments.

use std::net::{IpAddr, Ipv4Addr};

use super::packet::{
    Advertisement, ChecksumMode, DecodeError, IPPROTO_VRRP, Received, VRRP_TTL, split_trailer,
};

/// Decodes a whole IPv4 datagram as a raw socket delivers it: header checks (protocol, TTL 255,
/// no fragments) then the VRRP message, with nothing after it.
pub fn decode(datagram: &[u8], mode: ChecksumMode) -> Result<Received, DecodeError> {
    let (source, destination, payload) = ipv4_payload(datagram)?;
    let advert = Advertisement::decode(payload, source, destination, mode)?;
    Ok(Received { source: source.into(), destination: destination.into(), advert })
}

/// As [`decode`], for a group that authenticates: the advertisement, the message bytes the
/// tag covers, and what follows them (the [`super::auth`] trailer, or nothing).
pub fn decode_with_trailer(
    datagram: &[u8],
    mode: ChecksumMode,
) -> Result<(Received, &[u8], &[u8]), DecodeError> {
    let (source, destination, payload) = ipv4_payload(datagram)?;
    let (message, trailer) = split_trailer(payload, IpAddr::V4(source))?;
    let advert = Advertisement::decode(message, source, destination, mode)?;
    Ok((Received { source: source.into(), destination: destination.into(), advert }, message, trailer))
}

/// The IPv4 header's checks; its source, destination and payload.
fn ipv4_payload(datagram: &[u8]) -> Result<(Ipv4Addr, Ipv4Addr, &[u8]), DecodeError> {
    if datagram.len() < 20 {
        return Err(DecodeError::Truncated(datagram.len()));
    }
    if datagram[0] >> 4 != 4 || datagram[9] != IPPROTO_VRRP {
        return Err(DecodeError::NotVrrp);
    }
    let header_len = usize::from(datagram[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([datagram[2], datagram[3]]));
    if header_len < 20 || total_len < header_len || datagram.len() < total_len {
        return Err(DecodeError::Truncated(datagram.len()));
    }
    let flags_fragment = u16::from_be_bytes([datagram[6], datagram[7]]);
    if flags_fragment & 0x3fff != 0 {
        // More-fragments set or a non-zero offset: VRRP adverts are never fragmented.
        return Err(DecodeError::Fragment);
    }
    let ttl = datagram[8];
    if ttl != VRRP_TTL {
        return Err(DecodeError::BadTtl(ttl));
    }
    let source = Ipv4Addr::new(datagram[12], datagram[13], datagram[14], datagram[15]);
    let destination = Ipv4Addr::new(datagram[16], datagram[17], datagram[18], datagram[19]);
    Ok((source, destination, &datagram[header_len..total_len]))
}
