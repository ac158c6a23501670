//! What the router exchanges with the shell: datagrams in ([`Datagram`]), datagrams out
//! ([`Outgoing`]), and the advertisements' encoding, decoding and authentication (RFC 5798 §5,
//! §7.1).

use std::{collections::BTreeSet, net::IpAddr, time::SystemTime};

use super::{InstanceSpec, Transport};
use crate::vrrp::{
    auth::Keyring,
    family::{InstanceId, IpFamily},
    ipv4, ipv6,
    packet::{Advertisement, ChecksumMode, DecodeError, Received, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6},
};

/// A datagram for the shell to send, out of `interface`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub interface: String,
    pub destination: IpAddr,
    pub payload: Vec<u8>,
}

/// A datagram as a raw socket of its family delivers it.
#[derive(Clone, Copy, Debug)]
pub enum Datagram<'a> {
    /// The whole IPv4 datagram, header included.
    V4(&'a [u8]),
    /// The VRRP payload, and the IPv6 header's fields from the ancillary data.
    V6 { header: ipv6::Header, payload: &'a [u8] },
}

impl Datagram<'_> {
    pub fn family(&self) -> IpFamily {
        match self {
            Datagram::V4(_) => IpFamily::V4,
            Datagram::V6 { .. } => IpFamily::V6,
        }
    }

    /// The VRID byte, before anything is verified.
    pub(super) fn peek_vrid(&self) -> Option<u8> {
        match self {
            Datagram::V4(datagram) => {
                let header_len = usize::from(*datagram.first()? & 0x0f) * 4;
                datagram.get(header_len + 1).copied()
            }
            Datagram::V6 { payload, .. } => payload.get(1).copied(),
        }
    }

    /// The instance the datagram names, before anything is verified.
    pub(super) fn peek_id(&self) -> Option<InstanceId> {
        Some(InstanceId { family: self.family(), vrid: self.peek_vrid()? })
    }
}

/// The advertisement for each destination; signed with `sequence` when the group
/// authenticates.
pub(super) fn encode_adverts(
    local: IpAddr,
    spec: &InstanceSpec,
    priority: u8,
    sequence: u64,
    out: &mut Vec<Outgoing>,
) {
    let advert = Advertisement {
        vrid: spec.vrid,
        priority,
        max_adver_int_cs: (spec.advert_interval.as_millis() / 10) as u16,
        addresses: spec.vips.iter().copied().collect(),
    };
    let encode = |destination: IpAddr| {
        let mut payload = advert.encode(local, destination, spec.checksum);
        if let Some(keys) = &spec.keys {
            let trailer = keys.sign(local, destination, &payload, sequence);
            payload.extend_from_slice(&trailer);
        }
        Outgoing { interface: spec.interface.clone(), destination, payload }
    };
    match spec.transport {
        Transport::Multicast => out.push(encode(match spec.family {
            IpFamily::V4 => VRRP_MULTICAST_V4.into(),
            IpFamily::V6 => VRRP_MULTICAST_V6.into(),
        })),
        Transport::Unicast => out.extend(spec.peers.iter().map(|&peer| encode(peer))),
    }
}

pub(super) fn unix_micros(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Decodes, and for a group with keys authenticates: the sender, the advert and its sequence,
/// or the error and its drop label.
pub(super) fn decode_authenticated(
    datagram: Datagram,
    checksum: ChecksumMode,
    keys: Option<&Keyring>,
) -> Result<(Received, Option<u64>), (String, &'static str)> {
    let decode_error = |e: DecodeError| (e.to_string(), e.metric_label());
    let Some(keys) = keys else {
        let received = match datagram {
            Datagram::V4(datagram) => ipv4::decode(datagram, checksum),
            Datagram::V6 { header, payload } => ipv6::decode(payload, header, checksum),
        };
        return Ok((received.map_err(decode_error)?, None));
    };
    let (received, message, trailer) = match datagram {
        Datagram::V4(datagram) => ipv4::decode_with_trailer(datagram, checksum),
        Datagram::V6 { header, payload } => ipv6::decode_with_trailer(payload, header, checksum),
    }
    .map_err(decode_error)?;
    match keys.verify(received.source, received.destination, message, trailer) {
        Ok(sequence) => Ok((received, Some(sequence))),
        Err(e) => Err((format!("from {}: {e}", received.source), e.metric_label())),
    }
}

pub(super) fn same_addresses(advert: &Advertisement, ours: &BTreeSet<IpAddr>) -> bool {
    // Another lb-agent lists the first of the same sorted addresses: compared in place, with
    // nothing allocated (this runs for every advertisement accepted).
    if let Some(first) = advert.addresses.first() {
        let listed_by_us = ours
            .iter()
            .filter(|a| a.is_ipv4() == first.is_ipv4())
            .take(crate::vrrp::packet::MAX_ADVERTISED_ADDRS);
        if advert.addresses.iter().eq(listed_by_us) {
            return true;
        }
    }
    let listed: BTreeSet<IpAddr> = advert.addresses.iter().copied().collect();
    // Large instances advertise only the first addresses (see packet::MAX_ADVERTISED_ADDRS).
    listed.len() == advert.addresses.len()
        && listed.iter().all(|a| ours.contains(a))
        && (listed.len() == ours.len() || listed.len() == crate::vrrp::packet::MAX_ADVERTISED_ADDRS)
}
