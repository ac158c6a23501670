//! murmur3's 32-bit mixing steps, the flow hash's parts (see [`crate::hash`]): a word mixed
//! into the state, and the finalizer. Apart, so that an address can mix itself in without its
//! module needing the hash's.

#[inline(always)]
pub(crate) const fn mix(h: u32, word: u32) -> u32 {
    let k = word.wrapping_mul(0xcc9e_2d51).rotate_left(15).wrapping_mul(0x1b87_3593);
    (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
pub(crate) const fn finalize(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}
