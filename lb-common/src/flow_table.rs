//! The connection table at its floor: one cache line per lookup. The XDP programs keep each
//! family's flows in one (`FLOW_TABLE`, `FLOW_TABLE6`); this is its pure core.
//!
//! A flow's entry is one `u64` ([`Entry`]): a 32-bit fingerprint of its key beside its backend,
//! its full-NAT port (as the attempt that claimed it) and a coarse clock. Eight entries make a
//! [`Bucket`], one aligned 64-byte line; a key's bucket and fingerprint come from one keyed hash
//! ([`position`]), and a lookup compares the eight in a bounded loop: one memory access, where
//! the kernel's hash map makes two dependent ones (bucket, then element). Eight bytes a flow,
//! against a 64-byte element and a 16-byte bucket.
//!
//! The bucket comes from the client's address and port alone ([`bucket_hash`]); the service
//! is in the fingerprint. So a packet's line can be fetched before its service is looked up,
//! and the memory's latency, a flow's whole cost at scale, overlaps that lookup. A client's
//! flows from one port to several services share a bucket, and differ in fingerprint.
//!
//! What can go wrong, by construction (each is tested below):
//! - **A fingerprint collision**: a flow whose bucket holds another flow with the same
//!   fingerprint reads that flow's entry. For a flow not in the table the chance per lookup is
//!   the bucket's occupied slots over 2^32, at most 8 / 2^32 ≈ 1.9·10⁻⁹; the hash is keyed with
//!   a per-node seed, so nobody outside can aim for it.
//!   While a table an earlier build kept is migrated ([`Header::migrating`]), a miss also reads
//!   the flow's earlier bucket: twice that chance, for the window's new flows only.
//! - **Two CPUs writing**: every write is of a whole entry (a compare-and-swap, or in BPF a
//!   compare and one 8-byte store; see [`Cells`]), so no entry is ever torn. A writer that
//!   loses a race leaves a flow without an entry (its next packet tries again), never with
//!   another flow's; a clock update lost to a race only makes a periodic check run once more.
//! - **A full bucket** evicts its oldest entry: that flow's next packet takes its Maglev choice
//!   again, as an LRU eviction would. Full NAT's ports are held in `SNAT_REPLIES`, not here:
//!   an entry only names the attempt that claimed the flow's port, a hint checked against that
//!   table on every packet, so a flood of new flows never hands an established flow's port to
//!   another, and neither a collision nor a changed port range can give a flow another's port.
//!
//! A table is an array of [`Bucket`]s, a power of two of them, then one more: its header
//! ([`Keying::header`]), which holds the seed and size the programs were loaded with, so that
//! a table pinned across a restart is read with the keying it was written with.

use crate::{
    murmur3::{finalize, mix},
    service::{Address, ConnectionKeyOf},
};

/// Entries in a bucket: 8 × 8 bytes, one cache line.
pub const BUCKET_SLOTS: usize = 8;

/// Buckets for a table of `flows` flows: two a bucket on average, so that at its full
/// capacity only about 0.015 % of flows meet a full bucket (Poisson with λ = 2; tested below
/// with real keys): 32 MiB per million flows, against about 80 MiB for the kernel's LRU hash.
pub const fn buckets_for(flows: u32) -> u32 {
    let half = flows / 2;
    if half <= 1 { 1 } else { half.next_power_of_two() }
}

/// How a table is keyed: its seed (per node, random) and its bucket count less one. The
/// programs get it as a read-only global set at load; the table keeps it in its header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keying {
    pub seed: u32,
    pub mask: u32,
}

/// The keying of a table loaded without the agent (the fixtures, the bench): `MAX_FLOWS` flows
/// and a fixed seed; the agent sets each table's at load.
pub const DEFAULT_KEYING: Keying = Keying::for_flows(crate::service::MAX_FLOWS, 0x5eed_1b0b);

/// [`Keying::header`]'s mark, so that a table whose last element holds anything else is not
/// mistaken for one with a header.
const HEADER_MARK: u64 = 0x6c62_666c; // "lbfl"

/// The header's slots: mark and seed, mask, then these two. The programs read the second
/// (nonzero: [`Header::migrating`]) when a lookup misses.
const SCHEME_SLOT: usize = 2;
pub const MIGRATING_SLOT: usize = 3;

/// How a table's buckets were chosen, as its header records it (an earlier build wrote none).
/// Its value is the header's word.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Until the bucket left the service out: by client, port and service (header slot 0).
    ByService = 0,
    /// By client and port ([`bucket_hash`]), this build's.
    ByClient = 2,
}

impl Scheme {
    const fn recorded(word: u64) -> Option<Scheme> {
        match word {
            w if w == Scheme::ByService as u64 => Some(Scheme::ByService),
            w if w == Scheme::ByClient as u64 => Some(Scheme::ByClient),
            _ => None,
        }
    }
}

/// A table's header, read: its keying, the scheme its entries were written by, and whether
/// entries may still sit where [`Scheme::ByService`] put them (a table an earlier build kept,
/// being migrated: a lookup that misses tries there too, and moves what it finds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub keying: Keying,
    pub scheme: Scheme,
    pub migrating: bool,
}

impl Header {
    /// A fresh table's: this build's scheme, nothing to migrate.
    pub const fn fresh(keying: Keying) -> Header {
        Header { keying, scheme: Scheme::ByClient, migrating: false }
    }

    /// The header's element, written as this build writes it ([`Scheme::ByClient`]).
    pub const fn bucket(self) -> Bucket {
        let mut bucket = self.keying.header();
        bucket.slots[MIGRATING_SLOT] = self.migrating as u64;
        bucket
    }

    /// What a table adopted at start must be: this build's scheme, migrating if the table was
    /// written by the earlier one or was being migrated when its agent stopped.
    pub const fn adopted(self) -> Header {
        let migrating = self.migrating || matches!(self.scheme, Scheme::ByService);
        Header { keying: self.keying, scheme: Scheme::ByClient, migrating }
    }
}

impl Keying {
    /// A table for `flows` flows, keyed with `seed`.
    pub const fn for_flows(flows: u32, seed: u32) -> Keying {
        Keying { seed, mask: buckets_for(flows) - 1 }
    }

    pub const fn buckets(self) -> u32 {
        self.mask + 1
    }

    /// The table's array elements: its buckets, then its header.
    pub const fn entries(self) -> u32 {
        self.buckets() + 1
    }

    /// The bucket a position falls in.
    #[inline(always)]
    pub const fn bucket(self, position: Position) -> u32 {
        position.bucket(self.buckets())
    }

    /// The bucket a [`bucket_hash`] (or [`earlier_bucket_hash`]) falls in.
    #[inline(always)]
    pub const fn bucket_at(self, bucket_hash: u32) -> u32 {
        bucket_hash & self.mask
    }

    /// The table's last element, which no position reaches: this build's, not migrating.
    pub const fn header(self) -> Bucket {
        let mut slots = [0; BUCKET_SLOTS];
        slots[0] = HEADER_MARK << 32 | self.seed as u64;
        slots[1] = self.mask as u64;
        slots[SCHEME_SLOT] = Scheme::ByClient as u64;
        Bucket { slots }
    }
}

impl Header {
    /// The header `bucket` holds, if it is one of a scheme this build reads.
    pub const fn read(bucket: &Bucket) -> Option<Header> {
        let [mark_seed, mask, scheme, migrating, ..] = bucket.slots;
        if mark_seed >> 32 != HEADER_MARK
            || mask > u32::MAX as u64
            || !(mask as u32).wrapping_add(1).is_power_of_two()
        {
            return None;
        }
        let Some(scheme) = Scheme::recorded(scheme) else { return None };
        let keying = Keying { seed: mark_seed as u32, mask: mask as u32 };
        Some(Header { keying, scheme, migrating: migrating != 0 })
    }
}

/// One cache line of entries; a table is an array of them, its length a power of two.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub slots: [u64; BUCKET_SLOTS],
}

/// A table in shards of one kernel allocation each, so that it lives in the kernel's direct
/// map (huge pages) rather than in vmalloc's 4 KiB pages: an array map of up to 32 KiB is
/// allocated with `kmalloc`, a larger one with `vmalloc`, where every lookup of a table bigger
/// than the TLB's reach also walks the page tables (measured: that walk, not the line, was the
/// one-line table's cost). A shard is one array element of [`SHARD_WORDS`] words, sized so
/// that it and the array map's header fill 32 KiB.
pub const SHARD_WORDS: usize = (32 * 1024 - ARRAY_MAP_HEADER) / 8;

/// `sizeof(struct bpf_array)` on 6.18 (from its BTF): where an array map's values start in its
/// allocation.
pub const ARRAY_MAP_HEADER: usize = 312;

/// Buckets in a shard after [`SHARD_SKEW`]: one fewer than fit, because the verifier bounds
/// `(h × n) >> 32` shifted to a byte offset by `n × 64 − 1`, not by the last bucket's start.
pub const SHARD_BUCKETS: u32 = ((SHARD_WORDS * 8 - SHARD_SKEW) / 64 - 1) as u32;

/// Bytes from a shard's start to its first cache-line boundary: the allocation is page-aligned
/// and the array's values start [`ARRAY_MAP_HEADER`] bytes in (56 past a line). Wrong on
/// another kernel, buckets straddle two lines: slower, never incorrect.
pub const SHARD_SKEW: usize = 8;

/// One shard of a sharded table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Shard {
    pub words: [u64; SHARD_WORDS],
}

/// Shards for a table of `flows` flows, two a bucket on average.
pub const fn shards_for(flows: u32) -> u32 {
    let buckets = flows.div_ceil(2);
    let shards = buckets.div_ceil(SHARD_BUCKETS);
    if shards == 0 { 1 } else { shards }
}

impl Position {
    /// The shard among `shards`, and the bucket in it: the hash's high bits choose the shard
    /// (multiply-shift, no division), the product's low half the bucket.
    #[inline(always)]
    pub const fn shard_and_bucket(self, shards: u32) -> (u32, u32) {
        let product = self.bucket_hash as u64 * shards as u64;
        let bucket = ((product as u32) as u64 * SHARD_BUCKETS as u64) >> 32;
        ((product >> 32) as u32, bucket as u32)
    }
}

/// The table's clock: `bpf_ktime_get_coarse_ns` in units of 2^27 ns (134 ms), 8 bits, so it
/// wraps every 34 s. Ages beyond that are misread as younger, which only makes such an idle
/// entry a later pick for eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tick(pub u8);

impl Tick {
    #[inline(always)]
    pub const fn at(now_ns: u64) -> Tick {
        Tick((now_ns >> 27) as u8)
    }

    #[inline(always)]
    pub const fn since(self, then: Tick) -> u8 {
        self.0.wrapping_sub(then.0)
    }
}

/// A flow's periodic checks (its reply entry, its full-NAT port) are due after this many ticks
/// (537 ms, about a cached next hop's refresh, `HOP_REFRESH_NS`).
pub const CHECK_TICKS: u8 = 4;

/// Full NAT's source-port attempts an entry can name (`nat::claim_snat_port` tries eight).
pub const SNAT_ATTEMPTS: u8 = 15;

/// A flow's entry: fingerprint (bits 63–32, never zero), backend id (31–16), tick (15–8), full
/// NAT's port as its claiming attempt plus one, zero for none (7–4), zero (3–0). Zero is an
/// empty slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry(pub u64);

impl Entry {
    #[inline(always)]
    pub const fn new(fingerprint: Fingerprint, backend: u16, snat_attempt: Option<u8>, tick: Tick) -> Entry {
        let attempt = match snat_attempt {
            Some(a) if a < SNAT_ATTEMPTS => a as u64 + 1,
            _ => 0,
        };
        Entry(
            ((fingerprint.0 as u64) << 32)
                | ((backend as u64) << 16)
                | ((tick.0 as u64) << 8)
                | (attempt << 4),
        )
    }

    #[inline(always)]
    pub const fn fingerprint(self) -> u32 {
        (self.0 >> 32) as u32
    }

    #[inline(always)]
    pub const fn backend(self) -> u16 {
        (self.0 >> 16) as u16
    }

    #[inline(always)]
    pub const fn tick(self) -> Tick {
        Tick((self.0 >> 8) as u8)
    }

    /// The full-NAT attempt whose port the flow holds.
    #[inline(always)]
    pub const fn snat_attempt(self) -> Option<u8> {
        match (self.0 >> 4) & 0xf {
            0 => None,
            a => Some(a as u8 - 1),
        }
    }

    #[inline(always)]
    pub const fn with_tick(self, tick: Tick) -> Entry {
        Entry((self.0 & !0xff00) | ((tick.0 as u64) << 8))
    }
}

/// A key's fingerprint: never zero, so a zero slot is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fingerprint(u32);

impl Fingerprint {
    #[inline(always)]
    pub const fn of(hash: u32) -> Fingerprint {
        Fingerprint(if hash == 0 { 1 } else { hash })
    }

    pub const fn get(self) -> u32 {
        self.0
    }
}

/// Where a key lives: its bucket (`bucket_hash` masked by the table's size) and fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub bucket_hash: u32,
    pub fingerprint: Fingerprint,
}

impl Position {
    /// The bucket in a table of `buckets` buckets (a power of two).
    #[inline(always)]
    pub const fn bucket(self, buckets: u32) -> u32 {
        self.bucket_hash & (buckets - 1)
    }
}

/// `key`'s position, from two murmur3 lanes over its words seeded from the node's `seed`:
/// bucket and fingerprint independent, so flows sharing a bucket still differ in 32 bits.
#[inline(always)]
pub fn position<A: Address>(key: &ConnectionKeyOf<A>, seed: u32) -> Position {
    Position {
        bucket_hash: bucket_hash(&key.client, key.client_port, seed),
        fingerprint: fingerprint(key, seed),
    }
}

/// The bucket lane: the client's address and port, not the service (see the module's notes).
#[inline(always)]
pub fn bucket_hash<A: Address>(client: &A, client_port: [u8; 2], seed: u32) -> u32 {
    finalize(mix(client.mix_into(seed), u32::from_be_bytes([client_port[0], client_port[1], 0, 0])))
}

/// The fingerprint lane: the whole key.
#[inline(always)]
pub fn fingerprint<A: Address>(key: &ConnectionKeyOf<A>, seed: u32) -> Fingerprint {
    Fingerprint::of(finalize(mix(key.client.mix_into(seed ^ 0x9e37_79b9), port_and_service(key))))
}

fn port_and_service<A>(key: &ConnectionKeyOf<A>) -> u32 {
    u32::from_be_bytes([key.client_port[0], key.client_port[1], 0, 0]) | key.service as u32
}

/// Where an earlier build ([`Scheme::ByService`]) put `key`'s bucket: its lane took the whole
/// key. Read while a table that build kept is migrated; the fingerprint lane is unchanged.
#[inline(always)]
pub fn earlier_bucket_hash<A: Address>(key: &ConnectionKeyOf<A>, seed: u32) -> u32 {
    finalize(mix(key.client.mix_into(seed), port_and_service(key)))
}

/// A bucket's slots, each read and written whole (one 8-byte load or store): atomic cells in
/// userspace and tests; a map value's memory in the XDP program, where BPF at the linker's CPU
/// level has no compare-and-swap and `compare_exchange` may be a load, a compare and a store.
/// Then a write racing another CPU's can overwrite that whole entry: it costs that flow its
/// entry, as a lost race does, and still never leaves a torn or foreign one.
pub trait Cells {
    fn load(&self, slot: usize) -> u64;
    /// Writes `new` where `current` still is; whether it did.
    fn compare_exchange(&self, slot: usize, current: u64, new: u64) -> bool;
}

#[cfg(target_has_atomic = "64")]
impl Cells for [core::sync::atomic::AtomicU64; BUCKET_SLOTS] {
    #[inline(always)]
    fn load(&self, slot: usize) -> u64 {
        self[slot].load(core::sync::atomic::Ordering::Relaxed)
    }

    #[inline(always)]
    fn compare_exchange(&self, slot: usize, current: u64, new: u64) -> bool {
        use core::sync::atomic::Ordering::{Relaxed, SeqCst};
        self[slot].compare_exchange(current, new, SeqCst, Relaxed).is_ok()
    }
}

/// A found entry and its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub slot: usize,
    pub entry: Entry,
}

/// The entry with `fingerprint`, if the bucket holds one.
#[inline(always)]
pub fn find(cells: &impl Cells, fingerprint: Fingerprint) -> Option<Hit> {
    for slot in 0..BUCKET_SLOTS {
        let entry = Entry(cells.load(slot));
        if entry.0 != 0 && entry.fingerprint() == fingerprint.0 {
            return Some(Hit { slot, entry });
        }
    }
    None
}

/// Whether a found flow's periodic checks are due `now`; if so its clock is moved on (a write
/// lost to another CPU's only means that CPU did the same).
#[inline(always)]
pub fn checks_due(cells: &impl Cells, hit: Hit, now: Tick) -> bool {
    let due = now.since(hit.entry.tick()) >= CHECK_TICKS;
    if due {
        let _ = cells.compare_exchange(hit.slot, hit.entry.0, hit.entry.with_tick(now).0);
    }
    due
}

/// What [`store`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Into a free slot.
    Free { slot: usize },
    /// Over the entry with the same fingerprint (the flow's own, or a collider's).
    Replaced { slot: usize, old: Entry },
    /// Over the bucket's oldest entry, the bucket being full.
    Evicted { slot: usize, old: Entry },
    /// Another CPU wrote the chosen slot first: nothing was written.
    Lost,
}

/// Writes `entry`: over the entry with its fingerprint, else into a free slot, else over the
/// oldest entry (ties: the first). One compare-and-swap, not retried.
#[inline(always)]
pub fn store(cells: &impl Cells, entry: Entry, now: Tick) -> Stored {
    let mut same = None;
    let mut free = None;
    let mut oldest = 0;
    let mut oldest_age = 0;
    let mut seen = [0u64; BUCKET_SLOTS];
    for (slot, seen) in seen.iter_mut().enumerate() {
        let current = Entry(cells.load(slot));
        *seen = current.0;
        if current.0 == 0 {
            if free.is_none() {
                free = Some(slot);
            }
        } else if current.fingerprint() == entry.fingerprint() {
            same = Some(slot);
        } else {
            let age = now.since(current.tick()) as u16 + 1;
            if age > oldest_age {
                (oldest, oldest_age) = (slot, age);
            }
        }
    }
    let (slot, stored) = match (same, free) {
        (Some(slot), _) => (slot, Stored::Replaced { slot, old: Entry(seen[slot]) }),
        (None, Some(slot)) => (slot, Stored::Free { slot }),
        (None, None) => (oldest, Stored::Evicted { slot: oldest, old: Entry(seen[oldest]) }),
    };
    if cells.compare_exchange(slot, seen[slot], entry.0) { stored } else { Stored::Lost }
}

/// Writes `entry` into the first free slot, if one is free: a migrated entry's move, which
/// must not evict a flow, and whose stack (in the programs) has no room for [`store`]'s.
#[inline(always)]
pub fn place_if_free(cells: &impl Cells, entry: Entry) -> Option<usize> {
    (0..BUCKET_SLOTS).find(|&slot| cells.load(slot) == 0 && cells.compare_exchange(slot, 0, entry.0))
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` words, no padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::Shard {}
    unsafe impl aya::Pod for super::Bucket {}
    unsafe impl aya::Pod for super::Keying {}
}

#[cfg(test)]
mod tests {
    extern crate std;

    use core::cell::Cell;
    use std::{collections::BTreeMap, sync::Arc, vec::Vec};

    use proptest::prelude::*;

    use super::*;

    impl Cells for [Cell<u64>; BUCKET_SLOTS] {
        fn load(&self, slot: usize) -> u64 {
            self[slot].get()
        }

        fn compare_exchange(&self, slot: usize, current: u64, new: u64) -> bool {
            let ok = self[slot].get() == current;
            if ok {
                self[slot].set(new);
            }
            ok
        }
    }

    fn empty() -> [Cell<u64>; BUCKET_SLOTS] {
        core::array::from_fn(|_| Cell::new(0))
    }

    #[test]
    fn an_entry_round_trips_every_field() {
        let fp = Fingerprint::of(0xdead_beef);
        let e = Entry::new(fp, 65_535, Some(7), Tick(200));
        assert_eq!(
            (e.fingerprint(), e.backend(), e.snat_attempt(), e.tick()),
            (0xdead_beef, 65_535, Some(7), Tick(200))
        );
        assert_eq!(Entry::new(fp, 3, None, Tick(0)).snat_attempt(), None);
        assert_eq!(e.with_tick(Tick(9)).tick(), Tick(9));
        assert_eq!(e.with_tick(Tick(9)).backend(), 65_535);
        assert_ne!(Entry::new(Fingerprint::of(0), 0, None, Tick(0)).0, 0, "no entry is an empty slot");
    }

    #[test]
    fn a_header_records_the_keying_and_nothing_else_reads_as_one() {
        let keying = Keying::for_flows(1 << 18, 0xdead_beef);
        assert_eq!((keying.buckets(), keying.entries()), (1 << 17, (1 << 17) + 1));
        assert_eq!(Header::read(&keying.header()).map(|h| h.keying), Some(keying));
        assert_eq!(Header::read(&Bucket::default()), None, "an empty element");
        let mut odd = keying.header();
        odd.slots[1] = 1000;
        assert_eq!(Header::read(&odd), None, "not a power of two");
        let entry = Entry::new(Fingerprint::of(7), 1, None, Tick(0));
        assert_eq!(Header::read(&Bucket { slots: [entry.0; BUCKET_SLOTS] }), None, "a bucket");
        let mut newer = keying.header();
        newer.slots[SCHEME_SLOT] = 3;
        assert_eq!(Header::read(&newer), None, "a scheme this build does not know");
        let pos = Position { bucket_hash: u32::MAX, fingerprint: Fingerprint::of(1) };
        assert_eq!(keying.bucket(pos), keying.buckets() - 1, "no position reaches the header");
    }

    /// A header an earlier build wrote (mark, seed and mask only) reads as [`Scheme::ByService`];
    /// adopted, it becomes this build's, migrating, until the agent ends the migration.
    #[test]
    fn an_earlier_builds_header_is_adopted_as_migrating() {
        let keying = Keying::for_flows(1 << 18, 0xdead_beef);
        let mut earlier = keying.header();
        earlier.slots[SCHEME_SLOT] = 0;
        let read = Header::read(&earlier).expect("an earlier build's header");
        assert_eq!(read, Header { keying, scheme: Scheme::ByService, migrating: false });
        let adopted = read.adopted();
        assert_eq!(adopted, Header { keying, scheme: Scheme::ByClient, migrating: true });
        assert_eq!(Header::read(&adopted.bucket()), Some(adopted), "written and read back");
        assert_eq!(adopted.bucket().slots[MIGRATING_SLOT], 1, "the word the programs read");
        let ended = Header { migrating: false, ..adopted };
        assert_eq!(ended.bucket(), keying.header(), "an ended migration is a plain header");
        assert_eq!(Header::read(&keying.header()).map(Header::adopted), Some(ended), "nothing to migrate");
        assert_eq!(Header::read(&adopted.bucket()).map(Header::adopted), Some(adopted), "still migrating");
    }

    /// Values the earlier build computed (its `position`, recorded): a migrated table's entries
    /// are found only if `earlier_bucket_hash` and the fingerprint lane stay exactly these.
    #[test]
    fn the_earlier_bucket_and_the_fingerprint_are_the_earlier_builds() {
        let seed = 0x5eed_1b0b;
        let key = ConnectionKeyOf { client: [10, 0, 0, 1], client_port: 40000u16.to_be_bytes(), service: 7 };
        assert_eq!(
            (earlier_bucket_hash(&key, seed), fingerprint(&key, seed).get()),
            (0xa058_dde1, 0x5c41_4e1f)
        );
        let mut client = [0; 16];
        client[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        client[15] = 9;
        let key6 = ConnectionKeyOf { client, client_port: 40000u16.to_be_bytes(), service: 7 };
        assert_eq!(
            (earlier_bucket_hash(&key6, seed), fingerprint(&key6, seed).get()),
            (0x6de7_59e7, 0x61c8_2fa0)
        );
    }

    #[test]
    fn a_moved_entry_takes_a_free_slot_and_never_evicts() {
        let cells = empty();
        let entry = |n| Entry::new(Fingerprint::of(n), 1, None, Tick(0));
        cells[0].set(entry(1).0);
        assert_eq!(place_if_free(&cells, entry(2)), Some(1));
        for n in 3..=8 {
            assert!(place_if_free(&cells, entry(n)).is_some());
        }
        assert_eq!(place_if_free(&cells, entry(9)), None, "a full bucket keeps its flows");
        assert!((1..=8).all(|n| find(&cells, Fingerprint::of(n)).is_some()));
    }

    #[test]
    fn a_bucket_is_one_aligned_cache_line() {
        assert_eq!(core::mem::size_of::<Bucket>(), 64);
        assert_eq!(core::mem::align_of::<Bucket>(), 64);
    }

    #[test]
    fn the_position_is_fixed_for_a_seed_and_moves_with_it() {
        let key = ConnectionKeyOf { client: [10, 0, 0, 1], client_port: 40000u16.to_be_bytes(), service: 7 };
        assert_eq!(position(&key, 1), position(&key, 1));
        assert_ne!(position(&key, 1), position(&key, 2));
        let other = ConnectionKeyOf { service: 8, ..key };
        let (mine, theirs) = (position(&key, 1), position(&other, 1));
        assert_eq!(mine.bucket_hash, theirs.bucket_hash, "the bucket leaves the service out");
        assert_ne!(mine.fingerprint, theirs.fingerprint, "the fingerprint does not");
        assert_eq!(
            mine.bucket_hash,
            bucket_hash(&key.client, key.client_port, 1),
            "known before the service"
        );
        let port = ConnectionKeyOf { client_port: 40001u16.to_be_bytes(), ..key };
        assert_ne!(position(&key, 1).bucket_hash, position(&port, 1).bucket_hash);
    }

    #[test]
    fn checks_fall_due_every_check_ticks_and_move_the_clock() {
        let cells = empty();
        let fp = Fingerprint::of(5);
        store(&cells, Entry::new(fp, 1, None, Tick(253)), Tick(253));
        let hit = find(&cells, fp).unwrap();
        assert!(!checks_due(&cells, hit, Tick(255)));
        assert_eq!(find(&cells, fp).unwrap().entry.tick(), Tick(253), "not due: the clock stays");
        assert!(checks_due(&cells, hit, Tick(1)), "four ticks on, across the wrap");
        assert_eq!(find(&cells, fp).unwrap().entry.tick(), Tick(1));
        assert_eq!(find(&cells, fp).unwrap().entry.backend(), 1, "only the clock moved");
    }

    #[test]
    fn a_lost_race_writes_nothing() {
        // Another CPU fills the free slot between this writer's read and its write.
        struct Racing(core::cell::RefCell<[u64; BUCKET_SLOTS]>, Cell<bool>);
        impl Cells for Racing {
            fn load(&self, slot: usize) -> u64 {
                self.0.borrow()[slot]
            }
            fn compare_exchange(&self, slot: usize, current: u64, new: u64) -> bool {
                if self.1.replace(false) {
                    self.0.borrow_mut()[slot] = Entry::new(Fingerprint::of(99), 9, None, Tick(0)).0;
                }
                let mut s = self.0.borrow_mut();
                let ok = s[slot] == current;
                if ok {
                    s[slot] = new;
                }
                ok
            }
        }
        let cells = Racing(core::cell::RefCell::new([0; BUCKET_SLOTS]), Cell::new(true));
        let mine = Entry::new(Fingerprint::of(1), 1, None, Tick(0));
        assert_eq!(store(&cells, mine, Tick(0)), Stored::Lost);
        assert_eq!(find(&cells, Fingerprint::of(1)), None, "my flow has no entry");
        assert_eq!(find(&cells, Fingerprint::of(99)).unwrap().entry.backend(), 9, "theirs is whole");
    }

    /// Flows of the model test: few buckets and few fingerprints, so that full buckets and
    /// fingerprint collisions are common.
    const BUCKETS: u32 = 4;
    const FINGERPRINTS: u32 = 12;

    fn test_position(flow: u16) -> Position {
        let flow = flow as u32;
        Position {
            bucket_hash: flow % BUCKETS,
            fingerprint: Fingerprint::of(1 + (flow / BUCKETS) % FINGERPRINTS),
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Store { flow: u16, backend: u16, snat: Option<u8> },
        Lookup { flow: u16 },
        Advance { ticks: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u16..200, any::<u16>(), proptest::option::of(0u8..8))
                .prop_map(|(flow, backend, snat)| Op::Store { flow, backend, snat }),
            3 => (0u16..200).prop_map(|flow| Op::Lookup { flow }),
            1 => (0u8..6).prop_map(|ticks| Op::Advance { ticks }),
        ]
    }

    proptest! {
        /// The table against a plain map of (bucket, fingerprint) → entry. Every lookup returns
        /// exactly what the model holds for the flow's position: the flow's last stored entry,
        /// or a collider's if one was stored there since. A store changes only its own slot;
        /// it evicts only from a full bucket, and only an entry at least as old as the others.
        #[test]
        fn the_table_behaves_as_a_map_that_evicts_the_oldest_from_full_buckets(ops in proptest::collection::vec(op(), 1..400)) {
            let table: Vec<[Cell<u64>; BUCKET_SLOTS]> = (0..BUCKETS).map(|_| empty()).collect();
            let mut model: BTreeMap<(u32, Fingerprint), Entry> = BTreeMap::new();
            let mut now = Tick(0);
            for op in ops {
                match op {
                    Op::Store { flow, backend, snat } => {
                        let pos = test_position(flow);
                        let bucket = &table[pos.bucket(BUCKETS) as usize];
                        let before: Vec<u64> = (0..BUCKET_SLOTS).map(|s| bucket.load(s)).collect();
                        let entry = Entry::new(pos.fingerprint, backend, snat, now);
                        let stored = store(bucket, entry, now);
                        let after: Vec<u64> = (0..BUCKET_SLOTS).map(|s| bucket.load(s)).collect();
                        let changed: Vec<usize> = (0..BUCKET_SLOTS).filter(|s| before[*s] != after[*s]).collect();
                        let key = (pos.bucket(BUCKETS), pos.fingerprint);
                        match stored {
                            Stored::Free { slot } => {
                                prop_assert_eq!(before[slot], 0);
                                prop_assert!(!model.contains_key(&key));
                            }
                            Stored::Replaced { slot, old } => {
                                prop_assert_eq!(Some(&old), model.get(&key));
                                prop_assert_eq!(before[slot], old.0);
                            }
                            Stored::Evicted { slot, old } => {
                                prop_assert!(before.iter().all(|e| *e != 0), "evicted from a bucket with room");
                                prop_assert!(!model.contains_key(&key));
                                let oldest = before.iter().map(|e| now.since(Entry(*e).tick())).max().unwrap();
                                prop_assert_eq!(now.since(old.tick()), oldest, "not the oldest");
                                prop_assert_eq!(model.remove(&(key.0, Fingerprint(old.fingerprint()))), Some(old));
                                prop_assert_eq!(before[slot], old.0);
                            }
                            Stored::Lost => prop_assert!(false, "no other writer here"),
                        }
                        prop_assert!(changed.len() <= 1, "one slot written: {:?}", changed);
                        model.insert(key, entry);
                    }
                    Op::Lookup { flow } => {
                        let pos = test_position(flow);
                        let bucket = &table[pos.bucket(BUCKETS) as usize];
                        let found = find(bucket, pos.fingerprint).map(|hit| hit.entry);
                        prop_assert_eq!(found, model.get(&(pos.bucket(BUCKETS), pos.fingerprint)).copied());
                        if let Some(hit) = find(bucket, pos.fingerprint) {
                            let due = checks_due(bucket, hit, now);
                            prop_assert_eq!(due, now.since(hit.entry.tick()) >= CHECK_TICKS);
                            if due {
                                model.insert((pos.bucket(BUCKETS), pos.fingerprint), hit.entry.with_tick(now));
                            }
                        }
                    }
                    Op::Advance { ticks } => now = Tick(now.0.wrapping_add(ticks)),
                }
                // No bucket ever holds one fingerprint twice.
                for bucket in &table {
                    let mut fps: Vec<u32> = (0..BUCKET_SLOTS).map(|s| Entry(bucket.load(s))).filter(|e| e.0 != 0).map(|e| e.fingerprint()).collect();
                    let n = fps.len();
                    fps.sort();
                    fps.dedup();
                    prop_assert_eq!(fps.len(), n);
                }
            }
        }
    }

    /// Two threads store and read their own flows in the same two buckets at once (each flow's
    /// backend is its own number). Every hit, during and after, is the flow's own whole entry:
    /// lost races leave flows without entries, never with another's.
    #[test]
    fn writers_on_two_cpus_never_give_a_flow_another_flows_entry() {
        use core::sync::atomic::AtomicU64;
        let table: Arc<[[AtomicU64; BUCKET_SLOTS]; 2]> =
            Arc::new(core::array::from_fn(|_| core::array::from_fn(|_| AtomicU64::new(0))));
        let flow_position = |flow: u16| Position {
            bucket_hash: (flow % 2) as u32,
            fingerprint: Fingerprint::of(0x1000_0000 | flow as u32),
        };
        let threads: Vec<_> = (0..2u16)
            .map(|cpu| {
                let table = table.clone();
                std::thread::spawn(move || {
                    let mut lost = 0;
                    for round in 0..20_000u32 {
                        let flow = cpu * 1000 + (round % 24) as u16;
                        let pos = flow_position(flow);
                        let bucket = &table[pos.bucket(2) as usize];
                        let now = Tick((round / 64) as u8);
                        match find(bucket, pos.fingerprint) {
                            Some(hit) => {
                                assert_eq!(hit.entry.backend(), flow, "flow {flow} read another's entry");
                                checks_due(bucket, hit, now);
                            }
                            None => {
                                let entry = Entry::new(pos.fingerprint, flow, Some((flow % 8) as u8), now);
                                if store(bucket, entry, now) == Stored::Lost {
                                    lost += 1;
                                }
                            }
                        }
                    }
                    lost
                })
            })
            .collect();
        let lost: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        for bucket in table.iter() {
            for slot in 0..BUCKET_SLOTS {
                let entry = Entry(bucket.load(slot));
                if entry.0 != 0 {
                    assert_eq!(entry.fingerprint(), 0x1000_0000 | entry.backend() as u32, "a torn entry");
                    assert_eq!(entry.snat_attempt(), Some((entry.backend() % 8) as u8), "a torn entry");
                }
            }
        }
        std::eprintln!("races lost (flows left to retry): {lost}");
    }

    #[test]
    fn a_full_table_of_real_keys_overflows_a_bucket_about_as_rarely_as_stated() {
        const FLOWS: u32 = 1 << 16;
        assert_eq!(
            buckets_for(1 << 20) as usize * core::mem::size_of::<Bucket>(),
            32 << 20,
            "32 MiB a million"
        );
        let buckets = buckets_for(FLOWS);
        let table: Vec<[Cell<u64>; BUCKET_SLOTS]> = (0..buckets).map(|_| empty()).collect();
        // Structured keys, as a busy client subnet gives: consecutive addresses and ports.
        let keys = (0..FLOWS).map(|i| ConnectionKeyOf {
            client: [10, 1, (i >> 12) as u8, (i >> 4) as u8],
            client_port: (32768 + (i & 0xf) as u16).to_be_bytes(),
            service: 3,
        });
        let mut evicted = 0;
        for key in keys.clone() {
            let pos = position(&key, 0x5eed);
            let bucket = &table[pos.bucket(buckets) as usize];
            match store(bucket, Entry::new(pos.fingerprint, 1, None, Tick(0)), Tick(0)) {
                Stored::Evicted { .. } => evicted += 1,
                Stored::Free { .. } | Stored::Replaced { .. } => {}
                Stored::Lost => unreachable!(),
            }
        }
        let found = keys.filter(|key| {
            let pos = position(key, 0x5eed);
            find(&table[pos.bucket(buckets) as usize], pos.fingerprint).is_some()
        });
        let found = found.count() as u32;
        std::eprintln!("{FLOWS} flows in {buckets} buckets: {evicted} evicted, {found} found");
        // Poisson, λ = 2: about 10 of 65,536 (0.015 %); structured keys must not do much worse.
        assert!(evicted <= 40, "{evicted} flows met a full bucket");
        assert!(found >= FLOWS - evicted - 2, "a stored flow not found: {found}");
    }

    #[test]
    fn a_sharded_table_puts_every_line_inside_its_shard_and_spreads_real_keys_evenly() {
        // Each bucket's line ends inside the shard's value, which with the array header fills
        // exactly the 32 KiB that the kernel still allocates with kmalloc.
        assert_eq!(SHARD_WORDS * 8 + ARRAY_MAP_HEADER, 32 * 1024);
        assert!(SHARD_SKEW + SHARD_BUCKETS as usize * 64 <= SHARD_WORDS * 8);
        // The most a bucket index can be, as the verifier bounds it: (2^32 − 1) × n >> 32.
        let last = Position { bucket_hash: u32::MAX, fingerprint: Fingerprint::of(1) };
        assert_eq!(last.shard_and_bucket(7), (6, SHARD_BUCKETS - 1));
        // Two flows a bucket at capacity, as `buckets_for`.
        let shards = shards_for(1 << 20);
        assert!(shards as u64 * SHARD_BUCKETS as u64 >= 1 << 19);
        assert!(shards <= 1037, "{shards} shards of 32 KiB for a million flows");
        // Structured keys land evenly over shards and over buckets in a shard.
        let (flows, shards) = (1u32 << 16, shards_for(1 << 16));
        let mut per_shard = std::vec![0u32; shards as usize];
        let mut per_bucket = std::vec![0u32; SHARD_BUCKETS as usize];
        for i in 0..flows {
            let key = ConnectionKeyOf {
                client: [10, 1, (i >> 12) as u8, (i >> 4) as u8],
                client_port: (32768 + (i & 0xf) as u16).to_be_bytes(),
                service: 3,
            };
            let (shard, bucket) = position(&key, 0x5eed).shard_and_bucket(shards);
            per_shard[shard as usize] += 1;
            per_bucket[bucket as usize] += 1;
        }
        let mean = flows / shards;
        assert!(per_shard.iter().all(|n| n.abs_diff(mean) < mean / 4), "uneven shards: {per_shard:?}");
        let mean = flows / SHARD_BUCKETS;
        assert!(per_bucket.iter().all(|n| n.abs_diff(mean) < mean / 3), "uneven buckets: {per_bucket:?}");
    }

    #[test]
    fn a_fingerprint_collision_reads_the_colliders_entry_and_no_other() {
        // Stated in the module's documentation: a flow sharing its bucket and fingerprint with a
        // stored flow reads that flow's entry; with different fingerprints it reads nothing.
        let cells = empty();
        let stored = Entry::new(Fingerprint::of(42), 7, Some(2), Tick(0));
        store(&cells, stored, Tick(0));
        assert_eq!(find(&cells, Fingerprint::of(42)).map(|h| h.entry), Some(stored));
        assert_eq!(find(&cells, Fingerprint::of(43)), None);
    }
}
