//! The flow hash that picks a Maglev ring slot. Every load-balancing node must compute the same
//! value for the same flow, so that a flow keeps its backend when the VIP moves between nodes:
//! the function is fixed, unseeded, and golden-tested.

use crate::{
    murmur3::{finalize, mix},
    service::{Address, FlowKeyOf},
};

/// murmur3's 32-bit mixing over the 5-tuple's words (three for IPv4, nine for IPv6), then its
/// finalizer.
#[inline(always)]
pub fn flow_hash<A: Address>(key: &FlowKeyOf<A>) -> u32 {
    let mut h = 0x2545_f491u32;
    h = key.src.mix_into(h);
    h = key.dst.mix_into(h);
    h = mix(
        h,
        u32::from_be_bytes([key.sport[0], key.sport[1], key.dport[0], key.dport[1]]) ^ key.proto as u32,
    );
    finalize(h ^ 13)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::FlowKey;

    #[test]
    fn value_is_fixed_forever() {
        // Changing this moves flows between backends during a rolling upgrade.
        let key = FlowKey::new(
            [192, 0, 2, 100],
            [198, 51, 100, 10],
            40000u16.to_be_bytes(),
            80u16.to_be_bytes(),
            6,
        );
        assert_eq!(flow_hash(&key), GOLDEN);
    }

    // Computed independently (Python, the same murmur3 steps).
    const GOLDEN: u32 = 0x28d4_b0ea;

    #[test]
    fn ipv6_mixes_every_word() {
        let key = |last: u8| {
            let mut dst = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
            dst[15] = last;
            crate::service::FlowKey6::new([0xfd; 16], dst, 40000u16.to_be_bytes(), 80u16.to_be_bytes(), 6)
        };
        assert_ne!(flow_hash(&key(0x10)), flow_hash(&key(0x11)));
        let mut src_high = key(0x10);
        src_high.src[0] = 0xfc;
        assert_ne!(flow_hash(&key(0x10)), flow_hash(&src_high));
    }

    #[test]
    fn nearby_ports_spread() {
        let mut buckets = [0u32; 16];
        for port in 0..16_000u16 {
            let key = FlowKey::new([10, 0, 0, 1], [10, 0, 0, 2], port.to_be_bytes(), 80u16.to_be_bytes(), 6);
            buckets[(flow_hash(&key) % 16) as usize] += 1;
        }
        for b in buckets {
            assert!((900..1100).contains(&b), "{buckets:?}");
        }
    }
}
