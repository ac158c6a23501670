//! Internet checksum arithmetic (RFC 1071), with incremental updates (RFC 1624).
//!
//! Pure integer code: the XDP and TC programs use it to patch headers after a rewrite, and the
//! host tests check it against full recomputation. All values are the 16-bit words exactly as
//! they sit in the packet, read with `u16::from_be_bytes`.

/// Folds a 32-bit one's-complement sum into 16 bits.
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The checksum field after one 16-bit word changes from `old` to `new`: RFC 1624 eqn. 3,
/// `HC' = ~(~HC + ~m + m')`, which never yields the ambiguous `0x0000` for a non-zero sum.
#[inline(always)]
pub const fn replace16(check: u16, old: u16, new: u16) -> u16 {
    !fold(!check as u32 + !old as u32 + new as u32)
}

/// As [`replace16`], for a 32-bit field such as an IPv4 address.
#[inline(always)]
pub const fn replace32(check: u16, old: [u8; 4], new: [u8; 4]) -> u16 {
    let c = replace16(check, u16::from_be_bytes([old[0], old[1]]), u16::from_be_bytes([new[0], new[1]]));
    replace16(c, u16::from_be_bytes([old[2], old[3]]), u16::from_be_bytes([new[2], new[3]]))
}

/// A UDP checksum of zero means "none" (RFC 768); a computed zero is sent as `0xffff`.
#[inline(always)]
pub const fn udp_replace32(check: u16, old: [u8; 4], new: [u8; 4]) -> u16 {
    if check == 0 {
        return 0;
    }
    match replace32(check, old, new) {
        0 => 0xffff,
        c => c,
    }
}

/// As [`udp_replace32`] for a port.
#[inline(always)]
pub const fn udp_replace16(check: u16, old: u16, new: u16) -> u16 {
    if check == 0 {
        return 0;
    }
    match replace16(check, old, new) {
        0 => 0xffff,
        c => c,
    }
}

/// The full checksum of a 20-byte IPv4 header whose checksum field (bytes 10–11) is zero.
#[inline(always)]
pub fn ipv4_header(header: &[u8; 20]) -> u16 {
    let mut sum = 0u32;
    let mut i = 0;
    while i < 20 {
        sum += u16::from_be_bytes([header[i], header[i + 1]]) as u32;
        i += 2;
    }
    !fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(bytes: &[u8]) -> u16 {
        let mut sum = 0u32;
        for pair in bytes.chunks(2) {
            sum += u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]) as u32;
        }
        !fold(sum)
    }

    #[test]
    fn header_checksum_matches_a_known_header() {
        // RFC 1071 style example: a captured header (checksum 0xb861 once filled in).
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01,
            0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_header(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(full(&h), 0);
    }

    #[test]
    fn incremental_update_equals_recomputation() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..10_000 {
            let mut h = [0u8; 20];
            for b in h.iter_mut() {
                *b = next() as u8;
            }
            h[10] = 0;
            h[11] = 0;
            let check = ipv4_header(&h);
            let old: [u8; 4] = h[16..20].try_into().unwrap();
            let new = (next() as u32).to_be_bytes();
            h[16..20].copy_from_slice(&new);
            let old_ttl = u16::from_be_bytes([h[8], h[9]]);
            h[8] = h[8].wrapping_sub(1);
            let patched = replace16(replace32(check, old, new), old_ttl, u16::from_be_bytes([h[8], h[9]]));
            h[10..12].copy_from_slice(&patched.to_be_bytes());
            assert_eq!(full(&h), 0, "header {h:02x?}");
        }
    }

    #[test]
    fn udp_zero_checksum_stays_absent() {
        assert_eq!(udp_replace32(0, [1, 2, 3, 4], [5, 6, 7, 8]), 0);
        assert_eq!(udp_replace16(0, 80, 8080), 0);
        assert_ne!(udp_replace16(0xffff, 1, 1), 0);
    }
}
