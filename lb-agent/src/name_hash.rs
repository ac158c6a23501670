//! A fixed 64-bit hash: every agent, on every platform and Rust version, must rank nodes the
//! same way, which rules out std's randomly seeded hashers.

/// FNV-1a, then the SplitMix64 finalizer to spread FNV's weak low bits.
pub fn of(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// The rendezvous (HRW) score of `node` for `seed`.
pub fn hrw(seed: &str, node: &str) -> u64 {
    mix(of(seed) ^ of(node).rotate_left(17))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_are_fixed_forever() {
        // Changing these changes every cluster's plan: a breaking change for rolling upgrades.
        // Reference values computed independently (Python, same FNV-1a + SplitMix64 steps).
        assert_eq!(super::of("n0"), 0x6401_c4a8_77e4_0bdc);
        assert_eq!(super::hrw("198.51.100.10", "n1"), 0x0c45_7d22_7c1a_b50b);
    }
}
