//! Optional authentication of advertisements, for groups whose members are all lb-agents.
//!
//! VRRPv3 has none: RFC 5798 §9.1 removed VRRPv2's, judging that it did not stop a host on the
//! segment from disrupting the protocol. That host can still jam the segment; what this adds is
//! that it can no longer *speak for a member*: a spoofed priority-254 advertisement, or an old
//! one replayed, is dropped before the state machine sees it.
//!
//! The tag travels after the VRRP message, inside the same IPv4 payload, so the message itself
//! is the standard one (tcpdump decodes it; the checksum covers it alone):
//!
//! ```text
//! | VRRPv3 message (RFC 5798 §5.1) | key id (4) | sequence (8) | HMAC-SHA-256 (32) |
//! ```
//!
//! - The key id names the key (the first four bytes of a hash of it), so a receiver tries one
//!   key, and two keys can be live during a rotation: the first signs, either verifies.
//! - The sequence is the sender's clock in microseconds, strictly increasing: a receiver drops
//!   one not newer than the last it accepted from that sender and VRID, and, for a sender it has
//!   not heard yet, one older than [`FRESHNESS`] (an advert captured earlier and replayed after
//!   the receiver restarted).
//! - The HMAC covers a label, both IPv4 addresses, the message, the key id and the sequence.
//!
//! A keepalived peer never sees the trailer: authentication is per group, and a group that
//! needs it is one of lb-agents only.

use std::{fmt, net::IpAddr, time::Duration};

use ring::{digest, hmac};

/// Bytes appended to an authenticated advertisement.
pub const TRAILER_LEN: usize = KEY_ID_LEN + 8 + TAG_LEN;
const KEY_ID_LEN: usize = 4;
const TAG_LEN: usize = 32;
/// Shortest key accepted: 128 bits of hex.
pub const MIN_KEY_LEN: usize = 32;
/// The signing key and one more, for a rotation.
pub const MAX_KEYS: usize = 2;
/// A sender heard for the first time must have signed within this long (by the receiver's
/// clock): the members' clocks must agree this well.
pub const FRESHNESS: Duration = Duration::from_secs(60);

const TAG_LABEL: &[u8] = b"lb-agent vrrp advert v1\0";
const KEY_ID_LABEL: &[u8] = b"lb-agent vrrp key id v1\0";

/// One group's keys: the first signs, each verifies. Parsed from a key file.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<Key>,
}

#[derive(Clone)]
struct Key {
    id: [u8; KEY_ID_LEN],
    /// A hash of the secret, so keyrings compare without holding the secret twice.
    fingerprint: [u8; 32],
    hmac: hmac::Key,
}

/// Why a key file was not accepted. Names the line (1-based) where one is at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("no key: expected one key per line (e.g. from `openssl rand -hex 32`), the first used to sign")]
    Empty,
    #[error("line {line}: a key of at least {MIN_KEY_LEN} characters, but {len}")]
    TooShort { line: usize, len: usize },
    #[error("line {line}: at most {MAX_KEYS} keys (the signing key and one being rotated)")]
    TooMany { line: usize },
    #[error("line {line} repeats the key of line {first}")]
    Repeated { line: usize, first: usize },
}

/// Why an advertisement failed authentication. [`AuthError::label`] is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no authentication trailer")]
    Missing,
    #[error("authentication trailer of {0} bytes, expected {TRAILER_LEN}")]
    Malformed(usize),
    #[error("signed with a key this node does not have")]
    UnknownKey,
    #[error("authentication tag does not match")]
    BadTag,
}

impl AuthError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            AuthError::Missing => "unauthenticated",
            AuthError::Malformed(_) => "bad_auth_trailer",
            AuthError::UnknownKey => "unknown_key",
            AuthError::BadTag => "bad_tag",
        }
    }
}

impl Keyring {
    /// One key per line; blank lines and `#` comments are skipped, surrounding space trimmed.
    /// A key is used as the bytes of its line, whatever its encoding.
    pub fn parse(text: &str) -> Result<Self, KeyringError> {
        let mut keys: Vec<(usize, Key)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let (line_no, secret) = (index + 1, line.trim());
            if secret.is_empty() || secret.starts_with('#') {
                continue;
            }
            if secret.len() < MIN_KEY_LEN {
                return Err(KeyringError::TooShort { line: line_no, len: secret.len() });
            }
            if keys.len() == MAX_KEYS {
                return Err(KeyringError::TooMany { line: line_no });
            }
            let key = Key::new(secret.as_bytes());
            if let Some((first, _)) = keys.iter().find(|(_, k)| k.fingerprint == key.fingerprint) {
                return Err(KeyringError::Repeated { line: line_no, first: *first });
            }
            keys.push((line_no, key));
        }
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(Self { keys: keys.into_iter().map(|(_, k)| k).collect() })
    }

    /// The trailer for `message` sent from `source` to `destination`, signed by the first key.
    pub fn sign(
        &self,
        source: impl Into<IpAddr>,
        destination: impl Into<IpAddr>,
        message: &[u8],
        sequence: u64,
    ) -> Vec<u8> {
        let key = &self.keys[0];
        let mut trailer = Vec::with_capacity(TRAILER_LEN);
        trailer.extend_from_slice(&key.id);
        trailer.extend_from_slice(&sequence.to_be_bytes());
        let tag = hmac::sign(&key.hmac, &signed_input(source.into(), destination.into(), message, &trailer));
        trailer.extend_from_slice(tag.as_ref());
        trailer
    }

    /// Checks `trailer` against `message`; the sender's sequence when it is genuine.
    pub fn verify(
        &self,
        source: impl Into<IpAddr>,
        destination: impl Into<IpAddr>,
        message: &[u8],
        trailer: &[u8],
    ) -> Result<u64, AuthError> {
        let (source, destination) = (source.into(), destination.into());
        if trailer.is_empty() {
            return Err(AuthError::Missing);
        }
        if trailer.len() != TRAILER_LEN {
            return Err(AuthError::Malformed(trailer.len()));
        }
        let (signed, tag) = trailer.split_at(KEY_ID_LEN + 8);
        let key = self.keys.iter().find(|k| k.id == signed[..KEY_ID_LEN]).ok_or(AuthError::UnknownKey)?;
        // Compared in constant time by ring.
        hmac::verify(&key.hmac, &signed_input(source, destination, message, signed), tag)
            .map_err(|_| AuthError::BadTag)?;
        Ok(u64::from_be_bytes(signed[KEY_ID_LEN..].try_into().expect("eight bytes")))
    }

    /// The key ids, signing key first: for logs, never the keys.
    pub fn key_ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id.iter().map(|b| format!("{b:02x}")).collect()).collect()
    }
}

impl Key {
    fn new(secret: &[u8]) -> Self {
        let mut labelled = KEY_ID_LABEL.to_vec();
        labelled.extend_from_slice(secret);
        let id_hash = digest::digest(&digest::SHA256, &labelled);
        let fingerprint = digest::digest(&digest::SHA256, secret);
        Self {
            id: id_hash.as_ref()[..KEY_ID_LEN].try_into().expect("a SHA-256 is 32 bytes"),
            fingerprint: fingerprint.as_ref().try_into().expect("a SHA-256 is 32 bytes"),
            hmac: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }
}

/// What the tag covers, in order: the addresses as they are on the wire (4 or 16 bytes each).
fn signed_input(source: IpAddr, destination: IpAddr, message: &[u8], signed: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(TAG_LABEL.len() + 32 + message.len() + signed.len());
    input.extend_from_slice(TAG_LABEL);
    for address in [source, destination] {
        match address {
            IpAddr::V4(v4) => input.extend_from_slice(&v4.octets()),
            IpAddr::V6(v6) => input.extend_from_slice(&v6.octets()),
        }
    }
    input.extend_from_slice(message);
    input.extend_from_slice(signed);
    input
}

impl PartialEq for Keyring {
    fn eq(&self, other: &Self) -> bool {
        self.keys.len() == other.keys.len()
            && self.keys.iter().zip(&other.keys).all(|(a, b)| a.fingerprint == b.fingerprint)
    }
}

impl Eq for Keyring {}

impl fmt::Debug for Keyring {
    /// Key ids only: a secret never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring").field("key_ids", &self.key_ids()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const OLD: &str = "0123456789abcdef0123456789abcdef";
    const NEW: &str = "fedcba9876543210fedcba9876543210";
    const SRC: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const DST: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
    const MSG: &[u8] = &[0x31, 0x0a, 0x96, 0x01, 0x00, 0x64, 0x12, 0x34, 198, 51, 100, 10];

    fn ring(text: &str) -> Keyring {
        Keyring::parse(text).unwrap()
    }

    #[test]
    fn a_signed_message_verifies_with_its_sequence() {
        let keys = ring(OLD);
        let trailer = keys.sign(SRC, DST, MSG, 77);
        assert_eq!(trailer.len(), TRAILER_LEN);
        assert_eq!(keys.verify(SRC, DST, MSG, &trailer), Ok(77));
    }

    #[test]
    fn any_change_breaks_the_tag() {
        let keys = ring(OLD);
        let trailer = keys.sign(SRC, DST, MSG, 77);
        let mut message = MSG.to_vec();
        message[2] = 254; // the priority a spoofer wants
        assert_eq!(keys.verify(SRC, DST, &message, &trailer), Err(AuthError::BadTag));
        assert_eq!(keys.verify(Ipv4Addr::new(192, 0, 2, 11), DST, MSG, &trailer), Err(AuthError::BadTag));
        assert_eq!(keys.verify(SRC, Ipv4Addr::new(192, 0, 2, 11), MSG, &trailer), Err(AuthError::BadTag));
        let mut later = trailer.clone();
        later[KEY_ID_LEN + 7] ^= 1; // the sequence
        assert_eq!(keys.verify(SRC, DST, MSG, &later), Err(AuthError::BadTag));
        let mut tag = trailer.clone();
        tag[TRAILER_LEN - 1] ^= 1;
        assert_eq!(keys.verify(SRC, DST, MSG, &tag), Err(AuthError::BadTag));
    }

    #[test]
    fn missing_short_and_foreign_trailers_are_told_apart() {
        let keys = ring(OLD);
        assert_eq!(keys.verify(SRC, DST, MSG, &[]), Err(AuthError::Missing));
        let trailer = keys.sign(SRC, DST, MSG, 1);
        assert_eq!(keys.verify(SRC, DST, MSG, &trailer[..20]), Err(AuthError::Malformed(20)));
        let other = ring(NEW).sign(SRC, DST, MSG, 1);
        assert_eq!(keys.verify(SRC, DST, MSG, &other), Err(AuthError::UnknownKey));
    }

    #[test]
    fn during_a_rotation_both_keys_verify_and_the_first_signs() {
        // Step 1: every node adds the new key second; step 2: swaps them; step 3: drops the old.
        let step1 = ring(&format!("{OLD}\n{NEW}\n"));
        let step2 = ring(&format!("# rotated 2026-11-24\n{NEW}\n\n  {OLD}  \n"));
        let done = ring(NEW);
        let from_step1 = step1.sign(SRC, DST, MSG, 1);
        let from_step2 = step2.sign(SRC, DST, MSG, 2);
        assert_eq!(step2.verify(SRC, DST, MSG, &from_step1), Ok(1));
        assert_eq!(step1.verify(SRC, DST, MSG, &from_step2), Ok(2));
        assert_eq!(done.verify(SRC, DST, MSG, &from_step2), Ok(2));
        assert_eq!(done.verify(SRC, DST, MSG, &from_step1), Err(AuthError::UnknownKey));
        assert_eq!(step1.key_ids()[1], step2.key_ids()[0]);
        assert_ne!(step1, step2, "the order says which key signs");
    }

    #[test]
    fn key_files_are_checked_line_by_line() {
        assert_eq!(Keyring::parse("").unwrap_err(), KeyringError::Empty);
        assert_eq!(Keyring::parse("# only a comment\n\n").unwrap_err(), KeyringError::Empty);
        assert_eq!(Keyring::parse("\nsecret\n").unwrap_err(), KeyringError::TooShort { line: 2, len: 6 });
        let three = format!("{OLD}\n{NEW}\n{}\n", "a".repeat(40));
        assert_eq!(Keyring::parse(&three).unwrap_err(), KeyringError::TooMany { line: 3 });
        let twice = format!("{OLD}\n#\n{OLD}\n");
        assert_eq!(Keyring::parse(&twice).unwrap_err(), KeyringError::Repeated { line: 3, first: 1 });
    }

    #[test]
    fn debug_output_never_holds_a_key() {
        let shown = format!("{:?}", ring(OLD));
        assert!(!shown.contains(OLD) && shown.contains("key_ids"), "{shown}");
    }
}
