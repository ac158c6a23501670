//! ARP for owned VIPs: classify a request and turn it into a reply in place (RFC 826).
//!
//! Pure and allocation-free so that the XDP program and host unit tests run the same code.

use network_types::{arp::ArpHdr, eth::EthHdr, eth::EtherType};

/// An Ethernet header followed by an Ethernet/IPv4 ARP body: 42 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EthArp {
    pub eth: EthHdr,
    pub arp: ArpHdr,
}

impl EthArp {
    pub const LEN: usize = EthHdr::LEN + ArpHdr::LEN;
}

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;
const OPER_REQUEST: u16 = 1;
const OPER_REPLY: u16 = 2;

/// What an ARP frame asks of us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpClass {
    /// A request whose target protocol address may be one of ours.
    Request { target: [u8; 4] },
    /// Well-formed, but nothing we answer: a reply, a gratuitous announcement (sender address
    /// equals target), or another hardware or protocol type.
    Ignored,
    /// Ethernet/IPv4 ARP with impossible address lengths, or a sender MAC that is
    /// multicast/broadcast (answering it would turn a request into a broadcast storm).
    Malformed,
}

/// Classifies a frame already known to carry EtherType ARP.
pub fn classify(frame: &EthArp) -> ArpClass {
    let arp = &frame.arp;
    if arp.htype() != HTYPE_ETHERNET || arp.ptype() != PTYPE_IPV4 {
        return ArpClass::Ignored;
    }
    if arp.hlen != 6 || arp.plen != 4 {
        return ArpClass::Malformed;
    }
    if is_group_mac(&arp.sha) || is_group_mac(&frame.eth.src_addr) {
        return ArpClass::Malformed;
    }
    if arp.oper() != OPER_REQUEST || arp.spa == arp.tpa {
        return ArpClass::Ignored;
    }
    ArpClass::Request { target: arp.tpa }
}

/// Rewrites a request (as accepted by [`classify`]) into the reply that `owner_mac` would send,
/// addressed back to the requester. RFC 826 "Packet Reception": swap the hardware and protocol
/// fields, put the local hardware address in, set the opcode to reply.
#[inline(always)]
pub fn rewrite_request_into_reply(frame: &mut EthArp, owner_mac: [u8; 6]) {
    let requester_mac = frame.arp.sha;
    let requester_ip = frame.arp.spa;
    let vip = frame.arp.tpa;

    frame.eth.dst_addr = frame.eth.src_addr;
    frame.eth.src_addr = owner_mac;
    frame.arp.set_oper(OPER_REPLY);
    frame.arp.tha = requester_mac;
    frame.arp.tpa = requester_ip;
    frame.arp.sha = owner_mac;
    frame.arp.spa = vip;
}

/// True when the frame's EtherType is ARP.
#[inline(always)]
pub fn is_arp(eth: &EthHdr) -> bool {
    eth.ether_type == EtherType::Arp as u16
}

/// The I/G bit: set for multicast and broadcast MACs, which never send ARP requests.
#[inline(always)]
fn is_group_mac(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
    const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
    const CLIENT_IP: [u8; 4] = [192, 0, 2, 100];
    const VIP: [u8; 4] = [198, 51, 100, 10];

    fn request(sender_ip: [u8; 4], target_ip: [u8; 4]) -> EthArp {
        let mut arp = ArpHdr::new();
        arp.set_htype(HTYPE_ETHERNET);
        arp.set_ptype(PTYPE_IPV4);
        arp.hlen = 6;
        arp.plen = 4;
        arp.set_oper(OPER_REQUEST);
        arp.sha = CLIENT_MAC;
        arp.spa = sender_ip;
        arp.tpa = target_ip;
        EthArp { eth: EthHdr::new([0xff; 6], CLIENT_MAC, EtherType::Arp), arp }
    }

    #[test]
    fn a_request_is_classified_by_its_target() {
        assert_eq!(classify(&request(CLIENT_IP, VIP)), ArpClass::Request { target: VIP });
    }

    #[test]
    fn reply_is_addressed_to_the_requester_and_names_the_vip() {
        let mut f = request(CLIENT_IP, VIP);
        rewrite_request_into_reply(&mut f, VIP_MAC);
        assert_eq!(f.eth.dst_addr, CLIENT_MAC);
        assert_eq!(f.eth.src_addr, VIP_MAC);
        assert!(is_arp(&f.eth));
        assert_eq!(f.arp.oper(), OPER_REPLY);
        assert_eq!((f.arp.sha, f.arp.spa), (VIP_MAC, VIP));
        assert_eq!((f.arp.tha, f.arp.tpa), (CLIENT_MAC, CLIENT_IP));
        assert_eq!((f.arp.htype(), f.arp.ptype(), f.arp.hlen, f.arp.plen), (1, 0x0800, 6, 4));
    }

    #[test]
    fn duplicate_address_probe_is_answered_to_its_sender() {
        // RFC 5227 probes carry sender IP 0.0.0.0; the reply tells the prober the VIP is taken.
        let mut f = request([0; 4], VIP);
        assert_eq!(classify(&f), ArpClass::Request { target: VIP });
        rewrite_request_into_reply(&mut f, VIP_MAC);
        assert_eq!((f.eth.dst_addr, f.arp.tha, f.arp.tpa), (CLIENT_MAC, CLIENT_MAC, [0; 4]));
    }

    #[test]
    fn gratuitous_announcements_and_replies_are_ignored() {
        assert_eq!(classify(&request(VIP, VIP)), ArpClass::Ignored);
        let mut reply = request(CLIENT_IP, VIP);
        reply.arp.set_oper(OPER_REPLY);
        assert_eq!(classify(&reply), ArpClass::Ignored);
        let mut other_proto = request(CLIENT_IP, VIP);
        other_proto.arp.set_ptype(0x86dd);
        assert_eq!(classify(&other_proto), ArpClass::Ignored);
    }

    #[test]
    fn impossible_lengths_and_group_senders_are_malformed() {
        let mut bad_hlen = request(CLIENT_IP, VIP);
        bad_hlen.arp.hlen = 8;
        assert_eq!(classify(&bad_hlen), ArpClass::Malformed);
        let mut bad_plen = request(CLIENT_IP, VIP);
        bad_plen.arp.plen = 16;
        assert_eq!(classify(&bad_plen), ArpClass::Malformed);
        let mut broadcast_sender = request(CLIENT_IP, VIP);
        broadcast_sender.arp.sha = [0xff; 6];
        assert_eq!(classify(&broadcast_sender), ArpClass::Malformed);
        let mut multicast_src = request(CLIENT_IP, VIP);
        multicast_src.eth.src_addr = [0x01, 0, 0x5e, 0, 0, 1];
        assert_eq!(classify(&multicast_src), ArpClass::Malformed);
    }

    #[test]
    fn frame_is_exactly_the_wire_length() {
        assert_eq!(core::mem::size_of::<EthArp>(), EthArp::LEN);
        assert_eq!(EthArp::LEN, 42);
    }
}
