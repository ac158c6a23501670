//! IPv4 dispatch: validate the header, then hand the packet to the path for its protocol.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    programs::XdpContext,
};
use lb_common::{
    counters::Reason,
    service::{FlowKey, PROTO_ICMP, PROTO_IPIP, PROTO_TCP, PROTO_UDP, PROTO_VRRP},
};
use network_types::ip::Ipv4Hdr;

use super::icmp;
use crate::{
    family::V4,
    owned::{is_owned, is_owned_exclusively},
    packet::{self, ETH_LEN, FRAGMENT_MASK, IPV4_LEN, L4_OFFSET, Ports, header},
    services::{self, encap4},
    stats, vrrp,
};

#[inline(always)]
pub fn handle(ctx: &XdpContext) -> u32 {
    let bytes = packet::len(ctx);
    let Some(ip) = header::<Ipv4Hdr>(ctx, ETH_LEN) else {
        return stats::verdict(Reason::MalformedIpv4, bytes, XDP_PASS);
    };
    // SAFETY: bounds-checked by `header`; copied out before any other access.
    let (vihl, tot_len, frags, proto, src, dst) = unsafe {
        (
            (*ip).vihl,
            u16::from_be_bytes((*ip).tot_len),
            u16::from_be_bytes((*ip).frags),
            (*ip).proto,
            (*ip).src_addr,
            (*ip).dst_addr,
        )
    };
    let header_len = (vihl & 0x0f) as usize * 4;
    if vihl >> 4 != 4
        || header_len < IPV4_LEN
        || (tot_len as usize) < header_len
        || tot_len as usize > bytes - ETH_LEN
    {
        return stats::verdict(Reason::MalformedIpv4, bytes, XDP_PASS);
    }
    // Options and fragments are rare and legitimate: the kernel handles them, and we only
    // count the ones aimed at a VIP of ours.
    if header_len != IPV4_LEN {
        return stats::verdict(
            if is_owned(dst) { Reason::IpOptions } else { Reason::Ipv4Passed },
            bytes,
            XDP_PASS,
        );
    }
    if frags & FRAGMENT_MASK != 0 {
        return stats::verdict(
            if is_owned(dst) { Reason::Fragment } else { Reason::Ipv4Passed },
            bytes,
            XDP_PASS,
        );
    }
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let Some(ports) = header::<Ports>(ctx, L4_OFFSET) else {
                return stats::verdict(Reason::MalformedIpv4, bytes, XDP_PASS);
            };
            // SAFETY: bounds-checked by `header`; copied out.
            let flow = unsafe { FlowKey::new(src, dst, (*ports).sport, (*ports).dport, proto) };
            services::transport::<V4>(ctx, &flow, tot_len)
        }
        PROTO_ICMP => icmp::answer_echo(ctx),
        PROTO_IPIP => encap4::decapsulate(ctx),
        PROTO_VRRP => vrrp::observe(ctx, src),
        _ if is_owned_exclusively(ctx, dst) => stats::verdict(Reason::UnexposedPort, bytes, XDP_DROP),
        _ => stats::verdict(Reason::Ipv4Passed, bytes, XDP_PASS),
    }
}
