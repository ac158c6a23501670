//! The connection table: each flow keeps the backend it was given (and the attempt that
//! claimed its full-NAT source port); a new flow's backend is its Maglev slot's. The table is
//! [`lb_common::flow_table`]'s: one cache line a lookup.

use lb_common::{
    flow_table::{self, BUCKET_SLOTS, Bucket, Cells, Entry, Fingerprint, Hit, MIGRATING_SLOT, Tick},
    hash::flow_hash,
    service::{Address, BackendOf, ConnectionKeyOf, Delivery, FlowKeyOf, Service},
    vip_filter,
};

use core::ptr::NonNull;

use crate::{family::IpFamily, maps::MAGLEV_RINGS};

/// [`Picked::snat_attempt`]: none.
pub const NO_ATTEMPT: u8 = u8::MAX;

/// The backend a packet goes to, and what its flow's entry said. Plain values, no pointer
/// into the table: IPv6 hands them to a stage of its own through a tail call.
pub struct Picked<A> {
    pub id: u32,
    pub backend: BackendOf<A>,
    /// The service's [`Service::number`], for the flow's key.
    pub service: u16,
    /// Whether the flow has an entry; a new flow is recorded by [`Picked::remember`].
    pub known: bool,
    /// The full-NAT attempt whose source port the entry says the flow holds, [`NO_ATTEMPT`]
    /// for none: a hint that full NAT checks against the port table.
    pub snat_attempt: u8,
    /// Whether the flow's periodic checks are due with this packet (a new flow's are): its
    /// entry's clock was moved on when it was read.
    pub check_due: bool,
    /// The service's [`Service::replies_by_table`]: local delivery needs no reply entry.
    pub replies_by_table: bool,
}

impl<A: Address> Picked<A> {
    /// Records a new flow with its backend; a known flow has its entry.
    #[inline(always)]
    pub fn remember<F: IpFamily<Addr = A>>(&self, flow: &FlowKeyOf<A>, now: u64) {
        if !self.known {
            record::<F>(flow, self.service, self.id, None, now);
        }
    }

    /// The attempt that claimed the flow's full-NAT port, if its entry names one.
    pub(super) fn snat_attempt(&self) -> Option<u8> {
        Some(self.snat_attempt).filter(|attempt| *attempt != NO_ATTEMPT)
    }
}

/// A bucket in the map: each slot read and written with one 8-byte access. BPF at the
/// linker's CPU level has no compare-and-swap, so a compare then a store (see [`Cells`]).
/// Not null, so that an `Option` of one is a single register (the early-read line is carried
/// across the service lookup in one).
pub struct MapBucket(NonNull<Bucket>);

impl MapBucket {
    #[inline(always)]
    pub fn new(bucket: *mut Bucket) -> Option<MapBucket> {
        NonNull::new(bucket).map(MapBucket)
    }

    #[inline(always)]
    fn slot(&self, slot: usize) -> *mut u64 {
        // SAFETY: masked to the bucket's eight slots, inside the map value.
        unsafe { (*self.0.as_ptr()).slots.as_mut_ptr().add(slot & (BUCKET_SLOTS - 1)) }
    }
}

impl Cells for MapBucket {
    #[inline(always)]
    fn load(&self, slot: usize) -> u64 {
        // SAFETY: an aligned u64 of the map value.
        unsafe { core::ptr::read_volatile(self.slot(slot)) }
    }

    #[inline(always)]
    fn compare_exchange(&self, slot: usize, current: u64, new: u64) -> bool {
        let at = self.slot(slot);
        // SAFETY: an aligned u64 of the map value.
        unsafe {
            if core::ptr::read_volatile(at) != current {
                return false;
            }
            core::ptr::write_volatile(at, new);
        }
        true
    }
}

/// The bucket `key` lives in, and its position there.
#[inline(always)]
fn bucket_of<F: IpFamily>(key: &ConnectionKeyOf<F::Addr>) -> Option<(MapBucket, flow_table::Position)> {
    let keying = F::flow_keying().load();
    let position = flow_table::position(key, keying.seed);
    let bucket = F::flow_table().get_ptr_mut(keying.bucket(position))?;
    Some((MapBucket::new(bucket)?, position))
}

/// The line a client's flows live in, whatever their service.
#[inline(always)]
fn line_of<F: IpFamily>(client: &F::Addr, client_port: [u8; 2]) -> Option<MapBucket> {
    let keying = F::flow_keying().load();
    let at = keying.bucket_at(flow_table::bucket_hash(client, client_port, keying.seed));
    F::flow_table().get_ptr_mut(at).and_then(MapBucket::new)
}

/// `flow`'s line, its read started before the service lookup when the VIP filter says the
/// packet may be a service's: at scale the line is a miss to memory, the flow's whole cost,
/// and its latency then overlaps the lookup (BPF has no prefetch; a load whose value is not
/// yet needed lets the CPU run on). `None` for other traffic, which has no line to fetch.
#[inline(always)]
pub fn fetch_early<F: IpFamily>(flow: &FlowKeyOf<F::Addr>) -> Option<MapBucket> {
    let filter = F::vip_filter().get(0)?;
    let (word, mask) = vip_filter::word_and_mask(vip_filter::bit_of(&flow.dst, flow.dport, flow.proto));
    if filter.words.get(word).is_none_or(|w| w & mask == 0) {
        return None;
    }
    let line = line_of::<F>(&flow.src, flow.sport)?;
    let _ = line.load(0);
    Some(line)
}

/// The entry with `fingerprint` in `line`, or, in a table being migrated, where the earlier
/// scheme put `key`; with the bucket it is in.
#[inline(always)]
fn find_entry<F: IpFamily>(
    key: &ConnectionKeyOf<F::Addr>,
    line: MapBucket,
    fingerprint: Fingerprint,
) -> Option<(MapBucket, Hit)> {
    match flow_table::find(&line, fingerprint) {
        Some(hit) => Some((line, hit)),
        None => migrated::<F>(key, line, fingerprint),
    }
}

/// A miss in a table an earlier build kept ([`flow_table::Header::migrating`], read from the
/// header on misses only): the entry at the flow's earlier position, moved into a free slot of
/// its line (written there, then cleared where it was), so each flow pays the second read once.
/// With no free slot it is used where it is, and found there again.
#[inline(always)]
fn migrated<F: IpFamily>(
    key: &ConnectionKeyOf<F::Addr>,
    line: MapBucket,
    fingerprint: Fingerprint,
) -> Option<(MapBucket, Hit)> {
    let keying = F::flow_keying().load();
    let header = MapBucket::new(F::flow_table().get_ptr_mut(keying.buckets())?)?;
    if header.load(MIGRATING_SLOT) == 0 {
        return None;
    }
    let at = keying.bucket_at(flow_table::earlier_bucket_hash(key, keying.seed));
    let earlier = MapBucket::new(F::flow_table().get_ptr_mut(at)?)?;
    let hit = flow_table::find(&earlier, fingerprint)?;
    match flow_table::place_if_free(&line, hit.entry) {
        Some(slot) => {
            let _ = earlier.compare_exchange(hit.slot, hit.entry.0, 0);
            Some((line, Hit { slot, entry: hit.entry }))
        }
        None => Some((earlier, hit)),
    }
}

/// Writes `flow`'s entry whole (over its own, or a collider's, or the bucket's oldest).
#[inline(always)]
pub(super) fn record<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    service: u16,
    id: u32,
    snat_attempt: Option<u8>,
    now: u64,
) {
    let Some((bucket, position)) = bucket_of::<F>(&ConnectionKeyOf::of(flow, service)) else {
        return;
    };
    let tick = Tick::at(now);
    // Backend ids are below `MAX_BACKENDS`, 2^16.
    let entry = Entry::new(position.fingerprint, id as u16, snat_attempt, tick);
    let _ = flow_table::store(&bucket, entry, tick);
}

/// The flow's backend: the one it already has if that still exists, else the Maglev choice.
#[inline(always)]
pub(super) fn pick_backend<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    line: Option<MapBucket>,
    service: &Service,
    now: u64,
) -> Option<Picked<F::Addr>> {
    let key = ConnectionKeyOf::of(flow, service.number);
    let keying = F::flow_keying().load();
    if let Some(line) = line.or_else(|| line_of::<F>(&flow.src, flow.sport))
        && let Some((bucket, hit)) = find_entry::<F>(&key, line, flow_table::fingerprint(&key, keying.seed))
    {
        let check_due = flow_table::checks_due(&bucket, hit, Tick::at(now));
        let id = u32::from(hit.entry.backend());
        if let Some(backend) = F::backends().get(id).copied()
            && Delivery::from_u8(backend.delivery).is_some()
        {
            return Some(Picked {
                id,
                backend,
                service: service.number,
                known: true,
                snat_attempt: hit.entry.snat_attempt().unwrap_or(NO_ATTEMPT),
                check_due,
                replies_by_table: service.replies_by_table(),
            });
        }
    }
    if service.backend_count == 0 || service.ring_size == 0 {
        return None;
    }
    let slot = flow_hash(flow) % service.ring_size;
    // SAFETY: copied out at once; the agent rewrites a slot with one atomic store.
    let pair = unsafe { MAGLEV_RINGS.get_value(&service.ring_id, &(slot / 2)) }.copied()?;
    // Shifted, not indexed: LLVM turns an index into the stack copy into pointer arithmetic
    // (`fp | 4`) that the verifier refuses.
    let packed = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
    let id = (packed >> ((slot & 1) * 32)) as u32;
    let backend = F::backends().get(id).copied()?;
    Delivery::from_u8(backend.delivery)?;
    Some(Picked {
        id,
        backend,
        service: service.number,
        known: false,
        snat_attempt: NO_ATTEMPT,
        check_due: true,
        replies_by_table: service.replies_by_table(),
    })
}

/// Whether the table holds an entry for `key` naming `backend`: the TC egress program's check
/// that a reply belongs to a flow this node delivered to that endpoint (see
/// `lb_common::endpoint_services`). Such a reply moves the entry's clock on as a packet of the
/// flow would, so a flow whose client is quiet while its endpoint talks stays recent, as the
/// reply entry's LRU kept it.
#[inline(always)]
pub fn names_backend<F: IpFamily>(key: &ConnectionKeyOf<F::Addr>, backend: u16, now: u64) -> bool {
    let Some((line, position)) = bucket_of::<F>(key) else { return false };
    let Some((bucket, hit)) = find_entry::<F>(key, line, position.fingerprint) else { return false };
    if hit.entry.backend() != backend {
        return false;
    }
    let _ = flow_table::checks_due(&bucket, hit, Tick::at(now));
    true
}
