//! An IPv6 address's four 32-bit words, big-endian, as the hashes read them.
//!
//! In the XDP program each word is one load. Rust must take an address (`[u8; 16]`) as
//! unaligned, so a word read the portable way is four byte loads, shifts and ors, four times an
//! address and again for each hash of it (a packet's path hashes its addresses four times).
//! This relies on the kernel letting a program load packet and map words at any alignment, as
//! it does where unaligned access is efficient (`CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS`:
//! x86-64, arm64, ppc64le, s390x, where Kubernetes nodes run). A stack load it holds to its
//! alignment everywhere, refusing the program at load time otherwise: an address misplaced on
//! the stack fails the verifier, it is never misread.

/// `addr`'s words, each read as big-endian.
#[inline(always)]
pub fn be_words(addr: &[u8; 16]) -> [u32; 4] {
    [word::<0>(addr), word::<4>(addr), word::<8>(addr), word::<12>(addr)]
}

#[cfg(target_arch = "bpf")]
#[inline(always)]
fn word<const AT: usize>(addr: &[u8; 16]) -> u32 {
    let word: u64;
    // SAFETY: bytes AT..AT + 4 of a 16-byte address (AT is 0, 4, 8 or 12); a plain load.
    unsafe {
        core::arch::asm!(
            "{word} = *(u32 *)({addr} + {at})",
            word = lateout(reg) word,
            addr = in(reg) addr.as_ptr(),
            at = const AT,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    u32::from_be(word as u32)
}

#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
fn word<const AT: usize>(addr: &[u8; 16]) -> u32 {
    u32::from_be_bytes([addr[AT], addr[AT + 1], addr[AT + 2], addr[AT + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_big_endian_in_address_order() {
        let addr: [u8; 16] = core::array::from_fn(|i| i as u8);
        assert_eq!(be_words(&addr), [0x0001_0203, 0x0405_0607, 0x0809_0a0b, 0x0c0d_0e0f]);
    }
}
