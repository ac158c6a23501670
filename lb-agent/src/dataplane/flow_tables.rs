//! The connection tables (`FLOW_TABLE`, `FLOW_TABLE6`; [`lb_common::flow_table`]) from the
//! agent's side: each table's keying, kept in its header across restarts and handed to the
//! programs at load; the conversion of an earlier build's `FLOWS` maps, and the migration of a
//! table whose buckets an earlier build chose by service ([`Scheme::ByService`]); and reads
//! and writes through the table's memory, with the same atomic 8-byte slots the programs use.

use std::{
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use aya::maps::{HashMap, Map, MapData};
use lb_common::{
    flow_table::{self, BUCKET_SLOTS, Bucket, Entry, Header, Keying, Scheme, Tick},
    service::{Address, ConnectionKeyOf, FLOW_TABLE, FLOW_TABLE6, FLOWS, FLOWS6, Flow},
};
use memmap2::{MmapMut, MmapOptions};
use tracing::{info, warn};

use crate::error::{Error, Result};

/// A family's table: its map, the program global that carries its keying, and the map an
/// earlier build kept its flows in.
#[derive(Clone, Copy, Debug)]
pub struct TableNames {
    pub table: &'static str,
    pub keying_global: &'static str,
    pub earlier: &'static str,
}

pub const TABLES: [TableNames; 2] = [
    TableNames { table: FLOW_TABLE, keying_global: "FLOW_KEYING", earlier: FLOWS },
    TableNames { table: FLOW_TABLE6, keying_global: "FLOW_KEYING6", earlier: FLOWS6 },
];

/// The array elements of a table for `flows` flows (buckets and header).
pub fn table_entries(flows: u32) -> u32 {
    Keying::for_flows(flows, 0).entries()
}

/// How long a migrated table's earlier positions are still read after the agent starts: a flow
/// that sends within it keeps its entry (moved by its first packet); one idle longer takes its
/// Maglev choice again, the same backend unless the ring changed meanwhile. Until then a
/// lookup that misses (a new flow's first packet) reads a second line.
pub const MIGRATION_WINDOW: Duration = Duration::from_secs(3600);

/// The header a table for `flows` flows is loaded with: the pinned table's keying, read from
/// its header, when `pinned` is one of that size (migrating if an earlier build chose its
/// buckets, see [`Header::adopted`]); else a fresh random seed. A pinned table without a
/// readable header is unpinned (its entries could not be found again).
pub fn header_for(pinned: &Path, flows: u32) -> Result<Header> {
    let wanted = Keying::for_flows(flows, 0);
    if let Ok(map) = MapData::from_pin(pinned) {
        match FlowTable::new(&map).map(|t| t.header) {
            Ok(header) if header.keying.mask == wanted.mask => {
                let adopted = header.adopted();
                if adopted.migrating {
                    info!(map = %pinned.display(), earlier_scheme = header.scheme == Scheme::ByService,
                        window_s = MIGRATION_WINDOW.as_secs(),
                        "the pinned connection table is migrated: a flow's entry is moved to its new bucket by its next packet");
                }
                return Ok(adopted);
            }
            Ok(_) | Err(_) => {
                warn!(map = %pinned.display(), "the pinned connection table has no usable header: replacing it (its flows are re-balanced)");
                std::fs::remove_file(pinned)
                    .map_err(|e| Error::io(format!("removing the pinned map {}", pinned.display()), e))?;
            }
        }
    }
    Ok(Header::fresh(Keying { seed: random_seed()?, ..wanted }))
}

/// Ends the migration of the tables pinned at `pins` after [`MIGRATION_WINDOW`]: their
/// headers no longer send a miss to the earlier positions. Run beside the agent; an agent that
/// stops first leaves the header migrating, and the next one starts a window of its own.
pub async fn end_migrations(pins: Vec<PathBuf>, window: Duration) {
    tokio::time::sleep(window).await;
    for pin in pins {
        let table = MapData::from_pin(&pin)
            .map_err(|e| Error::io("opening a pinned connection table", std::io::Error::other(e)))
            .and_then(|map| FlowTable::new(&map));
        match table {
            Ok(table) => {
                table.end_migration();
                info!(map = %pin.display(), "the connection table's migration ended");
            }
            Err(e) => {
                warn!(map = %pin.display(), error = %e, "could not end the connection table's migration")
            }
        }
    }
}

fn random_seed() -> Result<u32> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0; 4];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        Error::io("drawing the connection table's seed", std::io::Error::other("no randomness"))
    })?;
    Ok(u32::from_ne_bytes(bytes))
}

/// Now, as a table tick: the programs read `bpf_ktime_get_coarse_ns`, the coarse reading of
/// the same monotonic clock (behind it by under a jiffy, nothing beside a 134 ms tick).
pub fn now() -> Tick {
    Tick::at(super::leases::monotonic_ns())
}

/// A table mapped into the agent.
pub struct FlowTable {
    memory: MmapMut,
    pub header: Header,
}

/// Maps `elements` buckets of the table behind `map`.
fn map_memory(map: &MapData, elements: usize) -> Result<MmapMut> {
    // SAFETY: the mapping is shared with the kernel's array, which outlives it (the map is
    // pinned or held by the caller); it is only read and written through atomics.
    unsafe { MmapOptions::new().len(elements * size_of::<Bucket>()).map_mut(&map.fd().as_fd()) }
        .map_err(|e| Error::io("mapping a connection table", e))
}

/// Bucket `index` of a mapped table.
fn bucket_in(memory: &MmapMut, index: u32) -> &[AtomicU64; BUCKET_SLOTS] {
    let offset = index as usize * size_of::<Bucket>();
    assert!(offset + size_of::<Bucket>() <= memory.len(), "bucket {index} beyond the table");
    // SAFETY: in bounds (checked), 64-byte aligned (the mapping is page aligned), and the
    // memory is only accessed through atomics.
    unsafe { &*(memory.as_ptr().add(offset) as *const [AtomicU64; BUCKET_SLOTS]) }
}

impl FlowTable {
    /// Maps the table behind `map` and reads its header.
    pub fn new(map: &MapData) -> Result<FlowTable> {
        let info = map
            .info()
            .map_err(|e| Error::io("reading a connection table's shape", std::io::Error::other(e)))?;
        let entries = info.max_entries() as usize;
        let memory = map_memory(map, entries)?;
        let header = bucket_in(&memory, entries as u32 - 1);
        let header = Bucket { slots: core::array::from_fn(|i| header[i].load(Ordering::Relaxed)) };
        let header = Header::read(&header).ok_or_else(|| {
            Error::io(
                "reading a connection table",
                std::io::Error::other("its last element is not a header of a scheme this build reads"),
            )
        })?;
        if header.keying.entries() as usize != entries {
            return Err(Error::io(
                "reading a connection table",
                std::io::Error::other(format!(
                    "its header says {} buckets in {entries} elements",
                    header.keying.buckets()
                )),
            ));
        }
        Ok(FlowTable { memory, header })
    }

    /// Writes `header` into the table behind `map` (fresh, all zero, or the pinned one it was
    /// read from), and maps it.
    pub fn initialize(map: &MapData, header: Header) -> Result<FlowTable> {
        let memory = map_memory(map, header.keying.entries() as usize)?;
        let table = FlowTable { memory, header };
        table.write_header(header);
        Ok(table)
    }

    /// Its header no longer sends a miss to the earlier positions.
    pub fn end_migration(&self) {
        self.write_header(Header { migrating: false, ..self.header });
    }

    /// Writes the table's header (the keying must be the table's own).
    pub fn write_header(&self, header: Header) {
        for (slot, word) in self.bucket(self.header.keying.buckets()).iter().zip(header.bucket().slots) {
            slot.store(word, Ordering::Relaxed);
        }
    }

    /// Bucket `index`'s slots, as the programs read and write them.
    pub fn bucket(&self, index: u32) -> &[AtomicU64; BUCKET_SLOTS] {
        bucket_in(&self.memory, index)
    }

    fn bucket_of<A: Address>(
        &self,
        key: &ConnectionKeyOf<A>,
    ) -> (&[AtomicU64; BUCKET_SLOTS], flow_table::Position) {
        let position = flow_table::position(key, self.header.keying.seed);
        (self.bucket(self.header.keying.bucket(position)), position)
    }

    /// The entry `key` finds (its own, or a collider's).
    pub fn lookup<A: Address>(&self, key: &ConnectionKeyOf<A>) -> Option<Entry> {
        let (bucket, position) = self.bucket_of(key);
        flow_table::find(bucket, position.fingerprint).map(|hit| hit.entry)
    }

    /// Writes `key`'s entry as the programs do.
    pub fn store<A: Address>(
        &self,
        key: &ConnectionKeyOf<A>,
        backend: u16,
        snat_attempt: Option<u8>,
        now: Tick,
    ) {
        let (bucket, position) = self.bucket_of(key);
        let _ = flow_table::store(bucket, Entry::new(position.fingerprint, backend, snat_attempt, now), now);
    }

    /// Replaces the entry `key` finds; whether there was one.
    pub fn replace<A: Address>(&self, key: &ConnectionKeyOf<A>, entry: Option<Entry>) -> bool {
        let (bucket, position) = self.bucket_of(key);
        let Some(hit) = flow_table::find(bucket, position.fingerprint) else { return false };
        let new = entry.map_or(0, |e| e.0);
        bucket[hit.slot].compare_exchange(hit.entry.0, new, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// The flows the table holds.
    pub fn len(&self) -> usize {
        (0..self.header.keying.buckets())
            .map(|b| self.bucket(b).iter().filter(|s| s.load(Ordering::Relaxed) != 0).count())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Moves the flows of an earlier build's `FLOWS` map pinned in `pin_dir` into `table`, so that
/// they keep their backends, and unpins it. Run once this build's programs replaced the old
/// ones (which wrote `FLOWS` until then); a flow whose packet came first has its entry already
/// and is overwritten with the backend it had. Full NAT's ports are not carried: each flow
/// finds its own again in `SNAT_REPLIES`, which is kept.
pub fn convert_earlier<A: Address>(pin_dir: &Path, names: TableNames, table: &FlowTable) {
    let path = pin_dir.join(names.earlier);
    let Ok(data) = MapData::from_pin(&path) else { return };
    let map = Map::LruHashMap(data);
    let converted = HashMap::<_, ConnectionKeyOf<A>, Flow>::try_from(&map).map(|flows| {
        let now = now();
        let mut converted = 0;
        for (key, flow) in flows.iter().filter_map(std::result::Result::ok) {
            if let Ok(backend) = u16::try_from(flow.backend) {
                table.store(&key, backend, None, now);
                converted += 1;
            }
        }
        converted
    });
    match converted {
        Ok(n) => info!(
            from = names.earlier,
            to = names.table,
            flows = n,
            "converted an earlier build's connection table"
        ),
        Err(e) => {
            warn!(map = %path.display(), error = %e, "an earlier build's connection table could not be read: its flows are re-balanced")
        }
    }
    if let Err(e) = std::fs::remove_file(&path) {
        warn!(map = %path.display(), error = %e, "could not unpin an earlier build's connection table");
    }
}
