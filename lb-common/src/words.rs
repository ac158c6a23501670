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

/// A value held 4-aligned: an address in it is read and copied a word at a time, where Rust,
/// taking a bare `[u8; 16]` as unaligned, reads it a byte at a time.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aligned<T>(pub T);

/// `addr`'s words, each read as big-endian.
#[inline(always)]
pub fn be_words(addr: &[u8; 16]) -> [u32; 4] {
    ne_words(addr).map(u32::from_be)
}

/// Whether two addresses are equal, compared a word at a time: Rust's comparison of two
/// `[u8; 16]` is sixteen byte loads a side in BPF. One block of loads, XORs and ORs, so that
/// the words never live in registers at once (LLVM would spill them to the stack, which the
/// IPv6 path has little of).
#[cfg(target_arch = "bpf")]
#[inline(always)]
pub fn same(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let differ: u64;
    // SAFETY: sixteen bytes at each address; plain loads.
    unsafe {
        core::arch::asm!(
            "{d} = *(u32 *)({a} + 0)",
            "{t} = *(u32 *)({b} + 0)",
            "{d} ^= {t}",
            "{x} = *(u32 *)({a} + 4)",
            "{t} = *(u32 *)({b} + 4)",
            "{x} ^= {t}",
            "{d} |= {x}",
            "{x} = *(u32 *)({a} + 8)",
            "{t} = *(u32 *)({b} + 8)",
            "{x} ^= {t}",
            "{d} |= {x}",
            "{x} = *(u32 *)({a} + 12)",
            "{t} = *(u32 *)({b} + 12)",
            "{x} ^= {t}",
            "{d} |= {x}",
            d = out(reg) differ,
            x = out(reg) _,
            t = out(reg) _,
            a = in(reg) a.as_ptr(),
            b = in(reg) b.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    differ == 0
}

#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
pub fn same(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a == b
}

/// `addr`'s words as they lie in memory.
#[inline(always)]
fn ne_words(addr: &[u8; 16]) -> [u32; 4] {
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
    word as u32
}

#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
fn word<const AT: usize>(addr: &[u8; 16]) -> u32 {
    u32::from_ne_bytes([addr[AT], addr[AT + 1], addr[AT + 2], addr[AT + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_big_endian_in_address_order() {
        let addr: [u8; 16] = core::array::from_fn(|i| i as u8);
        assert_eq!(be_words(&addr), [0x0001_0203, 0x0405_0607, 0x0809_0a0b, 0x0c0d_0e0f]);
    }

    #[test]
    fn addresses_are_the_same_only_when_every_byte_is() {
        let addr: [u8; 16] = core::array::from_fn(|i| i as u8);
        assert!(same(&addr, &addr.clone()));
        for i in 0..16 {
            let mut other = addr;
            other[i] ^= 0x80;
            assert!(!same(&addr, &other), "byte {i} differs");
        }
    }
}
