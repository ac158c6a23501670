//! Neighbor Discovery for owned IPv6 VIPs (RFC 4861): validate a Neighbor Solicitation and turn
//! it into the Neighbor Advertisement that answers it, in place; and the ICMPv6 checksum both
//! need.
//!
//! Pure and allocation-free so that the XDP program and host unit tests run the same code. The
//! program hands over the solicitation as fixed-size views: the Ethernet and IPv6 headers with
//! the message's first 24 bytes ([`EthNd`]), and the one option a solicitation may carry
//! ([`LinkLayerOption`]).

use network_types::{eth::EthHdr, ip::Ipv6Hdr};

pub const ICMPV6: u8 = 58;
pub const NEIGHBOR_SOLICITATION: u8 = 135;
pub const NEIGHBOR_ADVERTISEMENT: u8 = 136;
pub const ECHO_REQUEST: u8 = 128;
pub const ECHO_REPLY: u8 = 129;
/// RFC 4861 §4.6.1.
const SOURCE_LINK_LAYER: u8 = 1;
/// Neighbor Discovery's hop limit, sent and required (RFC 4861 §7.1.1).
pub const ND_HOP_LIMIT: u8 = 255;

/// ff02::1, and its Ethernet address (RFC 2464 §7: 33:33 and the address's last four bytes).
pub const ALL_NODES: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
/// NA flags (RFC 4861 §4.4), in the first byte of the reserved word.
pub const SOLICITED: u8 = 0x40;
pub const OVERRIDE: u8 = 0x20;
/// RFC 4861 §4.6.1.
pub const TARGET_LINK_LAYER: u8 = 2;

/// The solicited-node multicast group of `address` (RFC 4291 §2.7.1): ff02::1:ff and its last
/// three bytes. A Neighbor Solicitation for `address` goes to it (RFC 4861 §7.2.2).
pub const fn solicited_node(address: [u8; 16]) -> [u8; 16] {
    [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, address[13], address[14], address[15]]
}

/// The first 24 bytes of a Neighbor Solicitation or Advertisement.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NdMessage {
    pub kind: u8,
    pub code: u8,
    pub check: [u8; 2],
    /// Reserved in a solicitation; R, S, O flags in an advertisement.
    pub flags: [u8; 4],
    pub target: [u8; 16],
}

/// A link-layer address option for Ethernet: 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkLayerOption {
    pub kind: u8,
    /// In units of 8 bytes.
    pub len: u8,
    pub mac: [u8; 6],
}

/// Ethernet, IPv6 and a solicitation or advertisement without options: 78 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EthNd {
    pub eth: EthHdr,
    pub ip: Ipv6Hdr,
    pub nd: NdMessage,
}

impl EthNd {
    pub const LEN: usize = EthHdr::LEN + Ipv6Hdr::LEN + 24;
    /// The advertisement this module writes: [`EthNd`] and a target link-layer option.
    pub const ADVERTISEMENT_LEN: usize = Self::LEN + 8;
    /// Where the option starts.
    pub const OPTION_OFFSET: usize = Self::LEN;
}

/// What a Neighbor Solicitation asks of us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NdClass {
    /// A valid solicitation for `target`. `from_unspecified`: a duplicate address detection
    /// probe (source ::), answered to all nodes (RFC 4861 §7.2.4).
    Solicitation { target: [u8; 16], from_unspecified: bool },
    /// Fails a §7.1.1 validity check; never answered.
    Malformed(NdDefect),
}

/// Which §7.1.1 check a solicitation failed (for tests and logs; counted as one reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NdDefect {
    HopLimit,
    Code,
    /// ICMP length under 24 bytes, or an option of length zero or running past the message.
    Length,
    MulticastTarget,
    Checksum,
    /// From the unspecified address, but not to a solicited-node group or with a source
    /// link-layer option.
    UnspecifiedSource,
    /// From a multicast MAC or IPv6 address.
    GroupSender,
}

/// Validates a solicitation (RFC 4861 §7.1.1) of `icmp_len` bytes: 24 alone, or 32 with
/// `option` (any other length is refused by the caller before this, as no sender uses one for
/// a solicitation to a unicast address).
pub fn classify(frame: &EthNd, option: Option<&LinkLayerOption>, icmp_len: u16) -> NdClass {
    let malformed = NdClass::Malformed;
    if frame.ip.hop_limit != ND_HOP_LIMIT {
        return malformed(NdDefect::HopLimit);
    }
    if frame.nd.code != 0 {
        return malformed(NdDefect::Code);
    }
    let option_len_ok = match option {
        None => icmp_len == 24,
        Some(o) => icmp_len == 32 && o.len == 1,
    };
    if !option_len_ok {
        return malformed(NdDefect::Length);
    }
    if frame.nd.target[0] == 0xff {
        return malformed(NdDefect::MulticastTarget);
    }
    if frame.eth.src_addr[0] & 1 == 1 || frame.ip.src_addr[0] == 0xff {
        return malformed(NdDefect::GroupSender);
    }
    if icmpv6_sum(&frame.ip.src_addr, &frame.ip.dst_addr, icmp_len, &frame.nd, option) != 0xffff {
        return malformed(NdDefect::Checksum);
    }
    let from_unspecified = frame.ip.src_addr == [0; 16];
    if from_unspecified {
        let solicited_node = frame.ip.dst_addr[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff];
        let source_option = option.is_some_and(|o| o.kind == SOURCE_LINK_LAYER);
        if !solicited_node || source_option {
            return malformed(NdDefect::UnspecifiedSource);
        }
    }
    NdClass::Solicitation { target: frame.nd.target, from_unspecified }
}

/// Rewrites a solicitation (as accepted by [`classify`]) into the advertisement `owner_mac`
/// answers with (RFC 4861 §7.2.4): from the target, to the soliciting node (all nodes for a
/// DAD probe, with Solicited clear), Override set, with the target link-layer option. The
/// frame must already be [`EthNd::ADVERTISEMENT_LEN`] bytes; `option` is its last 8.
#[inline(always)]
pub fn rewrite_solicitation_into_advertisement(
    frame: &mut EthNd,
    option: &mut LinkLayerOption,
    owner_mac: [u8; 6],
) {
    let from_unspecified = frame.ip.src_addr == [0; 16];
    if from_unspecified {
        frame.eth.dst_addr = ALL_NODES_MAC;
        frame.ip.dst_addr = ALL_NODES;
    } else {
        frame.eth.dst_addr = frame.eth.src_addr;
        frame.ip.dst_addr = frame.ip.src_addr;
    }
    frame.eth.src_addr = owner_mac;
    frame.ip.vcf = [0x60, 0, 0, 0];
    frame.ip.payload_len = 32u16.to_be_bytes();
    frame.ip.next_hdr = ICMPV6;
    frame.ip.hop_limit = ND_HOP_LIMIT;
    frame.ip.src_addr = frame.nd.target;
    frame.nd.kind = NEIGHBOR_ADVERTISEMENT;
    frame.nd.code = 0;
    frame.nd.check = [0; 2];
    frame.nd.flags = [if from_unspecified { OVERRIDE } else { SOLICITED | OVERRIDE }, 0, 0, 0];
    *option = LinkLayerOption { kind: TARGET_LINK_LAYER, len: 1, mac: owner_mac };
    let sum = icmpv6_sum(&frame.ip.src_addr, &frame.ip.dst_addr, 32, &frame.nd, Some(option));
    frame.nd.check = (!sum).to_be_bytes();
}

/// The one's-complement sum (folded, not inverted) of the ICMPv6 pseudo-header (RFC 8200 §8.1)
/// and a Neighbor Discovery message of `len` bytes: 0xffff when the checksum in it is right.
#[inline(always)]
pub fn icmpv6_sum(
    src: &[u8; 16],
    dst: &[u8; 16],
    len: u16,
    nd: &NdMessage,
    option: Option<&LinkLayerOption>,
) -> u16 {
    let mut sum = pseudo_header_sum(src, dst, u32::from(len));
    sum += word(nd.kind, nd.code) + word(nd.check[0], nd.check[1]);
    sum += word(nd.flags[0], nd.flags[1]) + word(nd.flags[2], nd.flags[3]);
    sum += words(&nd.target);
    if let Some(o) = option {
        sum += word(o.kind, o.len) + word(o.mac[0], o.mac[1]) + word(o.mac[2], o.mac[3]);
        sum += word(o.mac[4], o.mac[5]);
    }
    crate::csum::fold(sum)
}

/// The pseudo-header's sum for an ICMPv6 message of `len` bytes.
#[inline(always)]
pub fn pseudo_header_sum(src: &[u8; 16], dst: &[u8; 16], len: u32) -> u32 {
    words(src) + words(dst) + (len >> 16) + (len & 0xffff) + u32::from(ICMPV6)
}

#[inline(always)]
fn word(high: u8, low: u8) -> u32 {
    u32::from(u16::from_be_bytes([high, low]))
}

#[inline(always)]
fn words(bytes: &[u8; 16]) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while i < 16 {
        sum += word(bytes[i], bytes[i + 1]);
        i += 2;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_types::eth::EtherType;

    const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
    const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
    /// 2001:db8::100 and 2001:db8::10.
    const CLIENT: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0];
    const VIP: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
    /// ff02::1:ff00:10, the VIP's solicited-node group.
    const SOLICITED_NODE: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0x10];

    /// A solicitation for `target` from `source`, as Linux sends it (with the source
    /// link-layer option unless from ::), checksummed.
    fn solicitation(source: [u8; 16], target: [u8; 16]) -> (EthNd, Option<LinkLayerOption>, u16) {
        let mut ip: Ipv6Hdr = unsafe { core::mem::zeroed() };
        ip.vcf = [0x60, 0, 0, 0];
        ip.next_hdr = ICMPV6;
        ip.hop_limit = 255;
        ip.src_addr = source;
        ip.dst_addr = SOLICITED_NODE;
        let option = (source != [0; 16]).then_some(LinkLayerOption {
            kind: SOURCE_LINK_LAYER,
            len: 1,
            mac: CLIENT_MAC,
        });
        let len: u16 = if option.is_some() { 32 } else { 24 };
        ip.payload_len = len.to_be_bytes();
        let nd = NdMessage { kind: NEIGHBOR_SOLICITATION, code: 0, check: [0; 2], flags: [0; 4], target };
        let mut frame =
            EthNd { eth: EthHdr::new([0x33, 0x33, 0xff, 0, 0, 0x10], CLIENT_MAC, EtherType::Ipv6), ip, nd };
        let sum = icmpv6_sum(&source, &SOLICITED_NODE, len, &frame.nd, option.as_ref());
        frame.nd.check = (!sum).to_be_bytes();
        (frame, option, len)
    }

    #[test]
    fn a_valid_solicitation_names_its_target() {
        let (f, o, len) = solicitation(CLIENT, VIP);
        assert_eq!(
            classify(&f, o.as_ref(), len),
            NdClass::Solicitation { target: VIP, from_unspecified: false }
        );
    }

    #[test]
    fn the_advertisement_answers_the_solicitor_with_a_valid_checksum() {
        let (mut f, _, _) = solicitation(CLIENT, VIP);
        let mut option = LinkLayerOption { kind: 0, len: 0, mac: [0; 6] };
        rewrite_solicitation_into_advertisement(&mut f, &mut option, VIP_MAC);
        assert_eq!((f.eth.dst_addr, f.eth.src_addr), (CLIENT_MAC, VIP_MAC));
        assert_eq!((f.ip.src_addr, f.ip.dst_addr, f.ip.hop_limit), (VIP, CLIENT, 255));
        assert_eq!(f.ip.payload_len, [0, 32]);
        assert_eq!((f.nd.kind, f.nd.code, f.nd.flags, f.nd.target), (136, 0, [0x60, 0, 0, 0], VIP));
        assert_eq!(option, LinkLayerOption { kind: 2, len: 1, mac: VIP_MAC });
        assert_eq!(icmpv6_sum(&VIP, &CLIENT, 32, &f.nd, Some(&option)), 0xffff);
    }

    #[test]
    fn a_duplicate_address_probe_is_answered_to_all_nodes_unsolicited() {
        let (mut f, o, len) = solicitation([0; 16], VIP);
        assert_eq!(
            classify(&f, o.as_ref(), len),
            NdClass::Solicitation { target: VIP, from_unspecified: true }
        );
        let mut option = LinkLayerOption { kind: 0, len: 0, mac: [0; 6] };
        rewrite_solicitation_into_advertisement(&mut f, &mut option, VIP_MAC);
        assert_eq!((f.eth.dst_addr, f.ip.dst_addr), (ALL_NODES_MAC, ALL_NODES));
        assert_eq!(f.nd.flags[0], OVERRIDE, "not Solicited");
        assert_eq!(icmpv6_sum(&VIP, &ALL_NODES, 32, &f.nd, Some(&option)), 0xffff);
    }

    #[test]
    fn each_validity_check_refuses_its_defect() {
        let broken = |change: &dyn Fn(&mut EthNd, &mut Option<LinkLayerOption>, &mut u16)| {
            let (mut f, mut o, mut len) = solicitation(CLIENT, VIP);
            change(&mut f, &mut o, &mut len);
            classify(&f, o.as_ref(), len)
        };
        use NdDefect::*;
        assert_eq!(broken(&|f, _, _| f.ip.hop_limit = 64), NdClass::Malformed(HopLimit));
        assert_eq!(broken(&|f, _, _| f.nd.code = 1), NdClass::Malformed(Code));
        assert_eq!(broken(&|_, o, _| o.as_mut().unwrap().len = 0), NdClass::Malformed(Length));
        assert_eq!(broken(&|_, _, len| *len = 24), NdClass::Malformed(Length));
        assert_eq!(broken(&|_, o, _| *o = None), NdClass::Malformed(Length));
        assert_eq!(broken(&|f, _, _| f.nd.target[0] = 0xff), NdClass::Malformed(MulticastTarget));
        assert_eq!(broken(&|f, _, _| f.nd.check[1] ^= 1), NdClass::Malformed(Checksum));
        assert_eq!(broken(&|f, _, _| f.nd.target[15] ^= 1), NdClass::Malformed(Checksum));
        assert_eq!(broken(&|f, _, _| f.eth.src_addr[0] |= 1), NdClass::Malformed(GroupSender));
        // From :: with a source link-layer option, or to a unicast address.
        let (mut f, _, _) = solicitation([0; 16], VIP);
        let option = LinkLayerOption { kind: SOURCE_LINK_LAYER, len: 1, mac: CLIENT_MAC };
        let sum =
            icmpv6_sum(&[0; 16], &SOLICITED_NODE, 32, &NdMessage { check: [0; 2], ..f.nd }, Some(&option));
        f.nd.check = (!sum).to_be_bytes();
        assert_eq!(classify(&f, Some(&option), 32), NdClass::Malformed(UnspecifiedSource));
        let (mut f, _, _) = solicitation([0; 16], VIP);
        f.ip.dst_addr = VIP;
        let sum = icmpv6_sum(&[0; 16], &VIP, 24, &NdMessage { check: [0; 2], ..f.nd }, None);
        f.nd.check = (!sum).to_be_bytes();
        assert_eq!(classify(&f, None, 24), NdClass::Malformed(UnspecifiedSource));
    }

    #[test]
    fn the_solicited_node_group_keeps_the_last_three_bytes() {
        // 2001:db8:6::12:3456 → ff02::1:ff12:3456.
        let address = [0x20, 0x01, 0x0d, 0xb8, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0x56];
        assert_eq!(
            solicited_node(address),
            [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0x12, 0x34, 0x56]
        );
        assert_eq!(solicited_node(VIP), SOLICITED_NODE);
    }

    #[test]
    fn the_views_are_exactly_the_wire_lengths() {
        assert_eq!(core::mem::size_of::<EthNd>(), EthNd::LEN);
        assert_eq!(EthNd::LEN, 78);
        assert_eq!(core::mem::size_of::<LinkLayerOption>(), 8);
    }
}
