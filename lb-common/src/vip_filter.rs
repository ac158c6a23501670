//! Which `(VIP, port, protocol)`s may be services: a bit array the XDP program reads before
//! its service lookup, to decide whether to fetch the packet's connection-table line early
//! (see [`crate::flow_table`]: the bucket is known from the client alone). A hint, never a
//! verdict: the service lookup decides. A stale or colliding bit only costs a packet an
//! early read of a line it will not use, or a service packet its early read; and the host's
//! own traffic, which no service matches, does not fetch lines it would never use.
//!
//! 4,096 bits, 512 bytes: eight cache lines, which stay cached under traffic. With a hundred
//! services about 2.4 % of other traffic finds a bit set. The agent keeps a count per bit
//! ([`FilterCounts`]), so adding or removing a service costs one bit, not a rebuild.

use crate::{
    murmur3::{finalize, mix},
    service::{Address, ServiceKeyOf},
};

pub const FILTER_WORDS: usize = 64;
pub const FILTER_BITS: u32 = FILTER_WORDS as u32 * 64;

/// The array map's one element.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipFilter {
    pub words: [u64; FILTER_WORDS],
}

impl Default for VipFilter {
    fn default() -> Self {
        VipFilter { words: [0; FILTER_WORDS] }
    }
}

/// A fixed seed: the filter is no secret (a packet aimed at a set bit gains one early read).
const FILTER_SEED: u32 = 0x7f11_7e55;

/// The bit a service key sets: the address folded to one word (a hint needs no more, and an
/// IPv6 packet pays one mix for it, not four).
#[inline(always)]
pub fn bit_of<A: Address>(vip: &A, port: [u8; 2], proto: u8) -> u32 {
    let port_and_proto = u32::from_be_bytes([port[0], port[1], proto, 0]);
    finalize(mix(mix(FILTER_SEED, vip.fold()), port_and_proto)) & (FILTER_BITS - 1)
}

/// Where `bit` lives: its word and the mask in it.
#[inline(always)]
pub const fn word_and_mask(bit: u32) -> (usize, u64) {
    ((bit / 64) as usize & (FILTER_WORDS - 1), 1 << (bit % 64))
}

impl VipFilter {
    /// Whether a packet to `(vip, port, proto)` may be for a service.
    pub fn may_serve<A: Address>(&self, vip: &A, port: [u8; 2], proto: u8) -> bool {
        let (word, mask) = word_and_mask(bit_of(vip, port, proto));
        self.words[word] & mask != 0
    }
}

/// The agent's side: how many installed services set each bit, so that a bit is cleared only
/// when its last service goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterCounts {
    counts: [u32; FILTER_BITS as usize],
}

impl Default for FilterCounts {
    fn default() -> Self {
        FilterCounts { counts: [0; FILTER_BITS as usize] }
    }
}

impl FilterCounts {
    /// Counts `key` in; whether its bit was clear until now (the map needs writing).
    pub fn insert<A: Address>(&mut self, key: &ServiceKeyOf<A>) -> bool {
        let count = &mut self.counts[bit_of(&key.vip, key.port, key.proto) as usize];
        *count += 1;
        *count == 1
    }

    /// Counts `key` out; whether its bit is clear now (the map needs writing). A key never
    /// counted in changes nothing.
    pub fn remove<A: Address>(&mut self, key: &ServiceKeyOf<A>) -> bool {
        let count = &mut self.counts[bit_of(&key.vip, key.port, key.proto) as usize];
        if *count == 0 {
            return false;
        }
        *count -= 1;
        *count == 0
    }

    /// The bits as the map holds them.
    pub fn filter(&self) -> VipFilter {
        let mut filter = VipFilter::default();
        for (bit, count) in self.counts.iter().enumerate() {
            if *count > 0 {
                let (word, mask) = word_and_mask(bit as u32);
                filter.words[word] |= mask;
            }
        }
        filter
    }
}

#[cfg(feature = "user")]
// SAFETY: `#[repr(C)]` words, no padding; any bit pattern is valid.
unsafe impl aya::Pod for VipFilter {}

#[cfg(test)]
mod tests {
    extern crate std;

    use proptest::prelude::*;

    use super::*;

    fn key(last: u8, port: u16, proto: u8) -> ServiceKeyOf<[u8; 4]> {
        ServiceKeyOf { vip: [192, 0, 2, last], port: port.to_be_bytes(), proto, _pad: 0 }
    }

    #[test]
    fn a_counted_service_may_be_served_until_its_last_count_goes() {
        let mut counts = FilterCounts::default();
        let web = key(10, 80, 6);
        assert!(!counts.filter().may_serve(&web.vip, web.port, web.proto));
        assert!(counts.insert(&web), "the first count sets the bit");
        assert!(!counts.insert(&web), "the second finds it set");
        assert!(counts.filter().may_serve(&web.vip, web.port, web.proto));
        assert!(!counts.remove(&web), "one count left");
        assert!(counts.filter().may_serve(&web.vip, web.port, web.proto));
        assert!(counts.remove(&web), "the last count clears it");
        assert!(!counts.remove(&web), "nothing left to remove");
        assert_eq!(counts.filter(), VipFilter::default());
    }

    #[test]
    fn the_bit_depends_on_address_port_and_protocol() {
        let bits = [key(10, 80, 6), key(11, 80, 6), key(10, 81, 6), key(10, 80, 17)]
            .map(|k| bit_of(&k.vip, k.port, k.proto));
        for (i, a) in bits.iter().enumerate() {
            for b in &bits[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let six = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10];
        assert!(bit_of(&six, 80u16.to_be_bytes(), 6) < FILTER_BITS);
    }

    #[test]
    fn a_hundred_services_leave_most_other_traffic_unflagged() {
        let mut counts = FilterCounts::default();
        for i in 0..100u16 {
            counts.insert(&key(i as u8, 80 + i, 6));
        }
        let filter = counts.filter();
        let flagged = (0..10_000u16)
            .filter(|p| filter.may_serve(&[10, 1, (p >> 8) as u8, *p as u8], 22u16.to_be_bytes(), 6))
            .count();
        assert!(flagged < 500, "{flagged} of 10,000 other packets flagged");
    }

    proptest! {
        /// The counts against a plain multiset: every counted key is flagged, and the filter
        /// is exactly the bits of the keys still counted.
        #[test]
        fn the_filter_is_the_bits_of_the_keys_counted(ops in proptest::collection::vec((any::<bool>(), 0u8..40), 0..200)) {
            let mut counts = FilterCounts::default();
            let mut model: std::collections::BTreeMap<u8, u32> = Default::default();
            for (add, k) in ops {
                let service = key(k, 80, 6);
                if add {
                    counts.insert(&service);
                    *model.entry(k).or_default() += 1;
                } else if model.get(&k).copied().unwrap_or(0) > 0 {
                    counts.remove(&service);
                    *model.get_mut(&k).unwrap() -= 1;
                }
            }
            let mut expected = VipFilter::default();
            for (k, n) in &model {
                if *n > 0 {
                    let s = key(*k, 80, 6);
                    let (word, mask) = word_and_mask(bit_of(&s.vip, s.port, s.proto));
                    expected.words[word] |= mask;
                    prop_assert!(counts.filter().may_serve(&s.vip, s.port, s.proto));
                }
            }
            prop_assert_eq!(counts.filter(), expected);
        }
    }
}
