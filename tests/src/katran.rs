//! Katran's balancer, the DSR benchmark's peer: the XDP program of Facebook's L4 load balancer,
//! vendored unmodified in `tests/peers/katran` and built by `cargo xtask` with clang. [`load`]
//! sets its maps as Katran's userspace (`KatranLb`) sets them for one VIP and one real; the
//! benchmark attaches it, and the `katran_peer` test checks, through BPF_PROG_TEST_RUN, that it
//! then does what the benchmark assumes.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{Array, ArrayOfMaps, HashMap, Map, MapData},
    programs::Xdp,
};

/// Katran's `struct vip_definition`: the address (IPv4 in its first word), port and protocol,
/// in network order.
#[repr(C)]
#[derive(Clone, Copy)]
struct VipDefinition {
    address: [u8; 16],
    port: [u8; 2],
    proto: u8,
    _pad: u8,
}

/// Katran's `struct vip_meta`.
#[repr(C)]
#[derive(Clone, Copy)]
struct VipMeta {
    flags: u32,
    vip_num: u32,
}

/// Katran's `struct real_definition`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RealDefinition {
    address: [u8; 16],
    flags: u8,
    _pad: [u8; 3],
}

// SAFETY: plain `repr(C)` data with explicit padding, laid out as Katran's structs.
unsafe impl aya::Pod for VipDefinition {}
// SAFETY: as above.
unsafe impl aya::Pod for VipMeta {}
// SAFETY: as above.
unsafe impl aya::Pod for RealDefinition {}

/// Katran's `RING_SIZE`: the slots of one VIP's consistent-hashing ring.
const RING_SIZE: u32 = 65_537;
/// `sizeof(struct flow_key)` and `sizeof(struct real_pos_lru)`: its connection table's shape.
const FLOW_KEY_SIZE: u32 = 40;
const REAL_POS_SIZE: u32 = 16;
/// The real's id: Katran's ids start at 1 (0 marks an empty ring slot).
const REAL_ID: u32 = 1;

/// The object `cargo xtask` builds (`bench dataplane --dsr`, `test`).
pub fn object() -> PathBuf {
    let object = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/katran-balancer.o");
    assert!(
        object.exists(),
        "{} is missing: `cargo xtask test` builds it (clang, from tests/peers/katran)",
        object.display()
    );
    object
}

type ConnectionTable = HashMap<MapData, [u8; FLOW_KEY_SIZE as usize], [u8; REAL_POS_SIZE as usize]>;

/// Katran's balancer, loaded with its maps set.
pub struct Katran {
    pub ebpf: Ebpf,
    /// The per-CPU connection tables in `lru_mapping`, by raw key and value.
    lrus: Vec<ConnectionTable>,
}

/// One UDP VIP (`vip`:`port`, vip_num 0, no flags) whose ring names one real (`real`), the
/// default gateway's MAC (`gateway_mac`) in `ctl_array`, and a connection table (LRU hash) of
/// `lru_entries` flows per CPU in `lru_mapping`, as `KatranLb::initLrus` makes one per
/// forwarding core; its program loaded, not attached.
pub fn load(
    object: &Path,
    vip: Ipv4Addr,
    port: u16,
    real: Ipv4Addr,
    gateway_mac: [u8; 6],
    lru_entries: u32,
) -> Katran {
    let mut ebpf = aya::EbpfLoader::new()
        .load_file(object)
        .unwrap_or_else(|e| panic!("loading Katran's balancer {}: {e}", object.display()));
    let word = |address: Ipv4Addr| {
        let mut bytes = [0u8; 16];
        bytes[..4].copy_from_slice(&address.octets());
        bytes
    };
    let mut vips: HashMap<_, VipDefinition, VipMeta> =
        HashMap::try_from(ebpf.map_mut("vip_map").unwrap()).unwrap();
    let key = VipDefinition { address: word(vip), port: port.to_be_bytes(), proto: 17, _pad: 0 };
    vips.insert(key, VipMeta { flags: 0, vip_num: 0 }, 0).expect("Katran's VIP");
    let mut reals: Array<_, RealDefinition> = Array::try_from(ebpf.map_mut("reals").unwrap()).unwrap();
    reals
        .set(REAL_ID, RealDefinition { address: word(real), flags: 0, _pad: [0; 3] }, 0)
        .expect("Katran's real");
    let mut ring: Array<_, u32> = Array::try_from(ebpf.map_mut("ch_rings").unwrap()).unwrap();
    for slot in 0..RING_SIZE {
        ring.set(slot, REAL_ID, 0).expect("Katran's ring");
    }
    let mut control: Array<_, [u8; 8]> = Array::try_from(ebpf.map_mut("ctl_array").unwrap()).unwrap();
    let mut mac = [0u8; 8];
    mac[..6].copy_from_slice(&gateway_mac);
    control.set(0, mac, 0).expect("Katran's gateway MAC");
    let mut outer: ArrayOfMaps<_, MapData> =
        ArrayOfMaps::try_from(ebpf.map_mut("lru_mapping").unwrap()).unwrap();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
    let lrus = (0..cpus)
        .map(|cpu| {
            let shape = aya_obj::Map::new_from_params(
                aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
                FLOW_KEY_SIZE,
                REAL_POS_SIZE,
                lru_entries,
                0,
            );
            let lru =
                MapData::create(shape, &format!("katran_lru{cpu}"), None).expect("a per-CPU LRU for Katran");
            outer.set(cpu, &lru, 0).expect("putting Katran's LRU in");
            HashMap::try_from(Map::LruHashMap(lru)).expect("an LRU hash")
        })
        .collect();
    let program: &mut Xdp = ebpf.program_mut("balancer_ingress").unwrap().try_into().unwrap();
    program.load().unwrap_or_else(|e| panic!("loading Katran's balancer_ingress: {e}"));
    Katran { ebpf, lrus }
}

impl Katran {
    pub fn program(&mut self) -> &mut Xdp {
        self.ebpf.program_mut("balancer_ingress").unwrap().try_into().unwrap()
    }

    /// Flows in its connection tables, all CPUs'.
    pub fn connections(&self) -> usize {
        self.lrus.iter().map(|lru| lru.keys().count()).sum()
    }
}
