//! Benchmark instruments, loaded only by `cargo xtask bench dataplane`; the agent never
//! attaches them.
//!
//! - `bench_gen`: run through BPF_PROG_TEST_RUN in live-frames mode on the client, it sends
//!   its input frame out with `XDP_TX`, cycling the UDP source port over `flows` values. IPv4
//!   frames (802.1Q-tagged too) go without a UDP checksum; IPv6 ones (where it is mandatory) get
//!   theirs computed.
//! - `bench_sink`: counts and drops (XDP): the ceiling's sink on the LB node, and the DSR run's
//!   at the switch's end of the LB node's link.
//! - `bench_sink_tc`: counts and drops at the pod's TC ingress, after the kernel has built the
//!   packet's skb as for any pod traffic, whichever mode forwarded it.
//! - `bench_pass_tc`: lets everything go (TC): `bench program`'s measure of a TC test run's
//!   own cost, as `lb_pass` is of an XDP one.
//! - `bench_dnat`: the smallest useful XDP load balancer, a fixed UDP DNAT and redirect, the
//!   yardstick for the full program's cost; `bench_dnat_table`: the same with a lookup in a
//!   connection table of the agent's shape, the yardstick of a stateful one;
//!   `bench_dnat_line`: with a lookup in `flow_table`'s one-line buckets instead.

use aya_ebpf::{
    Global,
    bindings::{
        BPF_F_MMAPABLE, TC_ACT_OK, TC_ACT_SHOT,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    btf_maps,
    helpers::bpf_redirect,
    macros::{btf_map, classifier, map, xdp},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::{TcContext, XdpContext},
};
use lb_common::{
    csum,
    flow_table::{
        self, Bucket, DEFAULT_KEYING, Entry, Keying, Position, SHARD_SKEW, Shard, Stored, Tick, shards_for,
    },
    service::{ConnectionKey, Flow, MAX_FLOWS, PROTO_IPIP, PROTO_UDP, bench::BenchConfig},
};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

use crate::{
    packet::{ETH_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPV4_LEN, IPV6_LEN, L4_OFFSET},
    rewrite,
    services::flow::MapBucket,
};

#[map]
static BENCH_CONFIG: Array<BenchConfig> = Array::with_max_entries(1, 0);

#[map]
static BENCH_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

const ETHERTYPE_8021Q: u16 = 0x8100;

/// `bench_gen`'s source ports per source address.
const SOURCE_PORTS: u64 = 32_768;

#[xdp]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + L4_OFFSET + 8 > end {
        return XDP_DROP;
    }
    let Some(flows) = BENCH_CONFIG.get(0).map(|c| if c.flows == 0 { 1 } else { c.flows as u64 }) else {
        return XDP_DROP;
    };
    let Some(counter) = BENCH_COUNT.get_ptr_mut(0) else {
        return XDP_DROP;
    };
    // SAFETY: this CPU's counter, and the Ethernet header bounds-checked above.
    let (n, ipv6) = unsafe {
        let n = *counter;
        *counter = n + 1;
        (n, (*(start as *const EthHdr)).ether_type == ETHERTYPE_IPV6.to_be())
    };
    // Up to 32,768 flows differ in their source port; beyond, also in the source address's
    // second byte (a million flows: 32 addresses).
    let flow = n % flows;
    let port = (1024 + flow % SOURCE_PORTS) as u16;
    if ipv6 {
        const UDP6: usize = ETH_LEN + IPV6_LEN;
        if start + UDP6 + 8 > end {
            return XDP_DROP;
        }
        // SAFETY: the IPv6 and UDP headers were bounds-checked above; they do not overlap.
        let (ip, udp) =
            unsafe { (&*((start + ETH_LEN) as *const Ipv6Hdr), &mut *((start + UDP6) as *mut [u8; 8])) };
        udp[0..2].copy_from_slice(&port.to_be_bytes());
        // The whole checksum again (the frames are reused between runs): the pseudo-header's
        // addresses, length and protocol, and the header; the payload is zeros.
        let len = u16::from_be_bytes([udp[4], udp[5]]) as u32;
        let mut sum = 2 * len + u32::from(PROTO_UDP);
        sum += u32::from(port) + u32::from(u16::from_be_bytes([udp[2], udp[3]]));
        for pair in ip.src_addr.chunks_exact(2).chain(ip.dst_addr.chunks_exact(2)) {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        let check = match !csum::fold(sum) {
            0 => 0xffff,
            c => c,
        };
        udp[6..8].copy_from_slice(&check.to_be_bytes());
        return XDP_TX;
    }
    // An 802.1Q-tagged frame (the VLAN rows) has its IPv4 header four bytes on.
    // SAFETY: the Ethernet header was bounds-checked above.
    let tagged = unsafe { (*(start as *const EthHdr)).ether_type == ETHERTYPE_8021Q.to_be() };
    let l3 = if tagged { ETH_LEN + 4 } else { ETH_LEN };
    if start + l3 + IPV4_LEN + 8 > end {
        return XDP_DROP;
    }
    // SAFETY: the IPv4 header and the eight UDP header bytes were bounds-checked just above.
    let (ip, udp) =
        unsafe { (&mut *((start + l3) as *mut Ipv4Hdr), &mut *((start + l3 + IPV4_LEN) as *mut [u8; 8])) };
    let mut source = ip.src_addr;
    source[1] = (flow / SOURCE_PORTS) as u8;
    if source != ip.src_addr {
        ip.check = csum::replace32(u16::from_be_bytes(ip.check), ip.src_addr, source).to_be_bytes();
        ip.src_addr = source;
    }
    // The frames are reused between runs: write every field that varies, and leave the UDP
    // checksum absent.
    udp[0..2].copy_from_slice(&port.to_be_bytes());
    udp[6] = 0;
    udp[7] = 0;
    XDP_TX
}

#[xdp]
pub fn bench_sink(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + ETH_LEN + IPV6_LEN > end {
        return XDP_PASS;
    }
    // SAFETY: the Ethernet header and 40 bytes after it were bounds-checked above.
    let (ethertype, next) = unsafe {
        let ethertype = (*(start as *const EthHdr)).ether_type;
        (
            ethertype,
            if ethertype == ETHERTYPE_IPV6.to_be() {
                *((start + ETH_LEN + 6) as *const u8)
            } else {
                *((start + ETH_LEN + 9) as *const u8)
            },
        )
    };
    // Only the generated UDP, bare or in IPIP (what the DSR run's sink sees leave the LB node),
    // is counted and dropped: ARP, NDP and TCP go on, so the pod still resolves and serves.
    if (ethertype != ETHERTYPE_IPV4.to_be() && ethertype != ETHERTYPE_IPV6.to_be())
        || (next != PROTO_UDP && next != PROTO_IPIP)
    {
        return XDP_PASS;
    }
    if let Some(counter) = BENCH_COUNT.get_ptr_mut(0) {
        // SAFETY: this CPU's counter.
        unsafe { *counter += 1 };
    }
    XDP_DROP
}

#[classifier]
pub fn bench_sink_tc(ctx: TcContext) -> i32 {
    // Only the generated UDP (the protocol byte at offset 23 in IPv4, the next header at 20 in
    // IPv6) is counted and dropped.
    let is_udp = match ctx.load::<u16>(12) {
        Ok(t) if t == ETHERTYPE_IPV4.to_be() => ctx.load::<u8>(ETH_LEN + 9).is_ok_and(|p| p == PROTO_UDP),
        Ok(t) if t == ETHERTYPE_IPV6.to_be() => ctx.load::<u8>(ETH_LEN + 6).is_ok_and(|p| p == PROTO_UDP),
        _ => false,
    };
    if !is_udp {
        return TC_ACT_OK;
    }
    if let Some(counter) = BENCH_COUNT.get_ptr_mut(0) {
        // SAFETY: this CPU's counter.
        unsafe { *counter += 1 };
    }
    TC_ACT_SHOT
}

#[classifier]
pub fn bench_pass_tc(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

/// `bench_dnat_table`'s connection table: `FLOWS`'s key, value, size and flags.
#[map]
static BENCH_FLOWS: LruHashMap<ConnectionKey, Flow> = LruHashMap::with_max_entries(MAX_FLOWS, 2);

/// `bench_dnat_line`'s connection table: [`flow_table`] buckets for `MAX_FLOWS` flows. Mappable,
/// so the kernel allocates its values page-aligned and each 64-byte bucket is one cache line
/// (an ordinary array's values start 8-byte aligned, and a bucket would straddle two).
#[map]
static BENCH_LINE_TABLE: Array<Bucket> = Array::with_max_entries(DEFAULT_KEYING.buckets(), BPF_F_MMAPABLE);
/// Its keying: the bench sizes the table for its flows (no header: nothing reads it back).
#[unsafe(no_mangle)]
static BENCH_LINE_KEYING: Global<Keying> = Global::new(DEFAULT_KEYING);

/// `bench_dnat_shard`'s connection table: the same buckets in shards of one kernel allocation
/// each (see [`Shard`]), which the bench creates and puts in.
#[btf_map]
static BENCH_SHARDS: btf_maps::ArrayOfMaps<btf_maps::Array<Shard, 1>, SHARDS> = btf_maps::ArrayOfMaps::new();
const SHARDS: usize = shards_for(MAX_FLOWS) as usize;
/// Its shards in use: the bench sizes the table for its flows.
#[unsafe(no_mangle)]
static BENCH_SHARD_COUNT: Global<u32> = Global::new(SHARDS as u32);

/// Which connection table a bare DNAT looks each flow up in first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    None,
    KernelHash,
    OneLine,
    Sharded,
}

#[xdp]
pub fn bench_dnat(ctx: XdpContext) -> u32 {
    dnat(&ctx, Table::None)
}

/// `bench_dnat` that also looks each flow up in a connection table of the agent's shape first
/// (and records a new one): the yardstick's cost with the per-flow state every stateful load
/// balancer keeps.
#[xdp]
pub fn bench_dnat_table(ctx: XdpContext) -> u32 {
    dnat(&ctx, Table::KernelHash)
}

/// `bench_dnat_table` with the one-line table ([`flow_table`]) in place of the kernel's hash.
#[xdp]
pub fn bench_dnat_line(ctx: XdpContext) -> u32 {
    dnat(&ctx, Table::OneLine)
}

/// `bench_dnat_line` with the table in shards in the kernel's direct map.
#[xdp]
pub fn bench_dnat_shard(ctx: XdpContext) -> u32 {
    dnat(&ctx, Table::Sharded)
}

/// Whether the flow's entry names a backend (the yardsticks' never do); records a new one.
#[inline(always)]
fn seen_before(bucket: &MapBucket, position: Position) -> bool {
    match flow_table::find(bucket, position.fingerprint) {
        Some(hit) => hit.entry.backend() != 0,
        None => {
            let entry = Entry::new(position.fingerprint, 0, None, Tick(0));
            let _: Stored = flow_table::store(bucket, entry, Tick(0));
            false
        }
    }
}

#[inline(always)]
fn dnat(ctx: &XdpContext, table: Table) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + L4_OFFSET + 8 > end {
        return XDP_PASS;
    }
    let Some(config) = BENCH_CONFIG.get(0) else {
        return XDP_PASS;
    };
    // SAFETY: Ethernet, IPv4 and the UDP header were bounds-checked above; they do not overlap.
    let (eth, ip, udp) = unsafe {
        (
            &mut *(start as *mut EthHdr),
            &mut *((start + ETH_LEN) as *mut Ipv4Hdr),
            &mut *((start + L4_OFFSET) as *mut [u8; 8]),
        )
    };
    if ip.proto != PROTO_UDP || ip.dst_addr != config.vip || udp[2..4] != config.port {
        return XDP_PASS;
    }
    let key = ConnectionKey { client: ip.src_addr, client_port: [udp[0], udp[1]], service: 0 };
    match table {
        Table::None => {}
        Table::KernelHash => {
            // SAFETY: copied out at once.
            match unsafe { BENCH_FLOWS.get(&key) } {
                Some(flow) if flow.backend != 0 => return XDP_PASS,
                Some(_) => {}
                None => {
                    let _ = BENCH_FLOWS.insert(&key, &Flow::default(), 0);
                }
            }
        }
        Table::OneLine => {
            let keying = BENCH_LINE_KEYING.load();
            let position = flow_table::position(&key, keying.seed);
            let Some(bucket) = BENCH_LINE_TABLE.get_ptr_mut(keying.bucket(position)) else {
                return XDP_PASS;
            };
            if MapBucket::new(bucket).is_some_and(|bucket| seen_before(&bucket, position)) {
                return XDP_PASS;
            }
        }
        Table::Sharded => {
            let position = flow_table::position(&key, DEFAULT_KEYING.seed);
            let (shard, bucket) = position.shard_and_bucket(BENCH_SHARD_COUNT.load());
            let Some(value) = BENCH_SHARDS.get_value_ptr_mut(shard, &0) else {
                return XDP_PASS;
            };
            // SAFETY: `bucket` < SHARD_BUCKETS, so the line ends inside the shard.
            let bucket = unsafe { (value as *mut u8).add(SHARD_SKEW + 64 * bucket as usize) as *mut Bucket };
            if MapBucket::new(bucket).is_some_and(|bucket| seen_before(&bucket, position)) {
                return XDP_PASS;
            }
        }
    }
    let ip_check = csum::replace32(u16::from_be_bytes(ip.check), ip.dst_addr, config.target);
    let mut l4 = csum::udp_replace32(u16::from_be_bytes([udp[6], udp[7]]), ip.dst_addr, config.target);
    l4 =
        csum::udp_replace16(l4, u16::from_be_bytes([udp[2], udp[3]]), u16::from_be_bytes(config.target_port));
    ip.dst_addr = config.target;
    ip.check = ip_check.to_be_bytes();
    udp[2..4].copy_from_slice(&config.target_port);
    udp[6..8].copy_from_slice(&l4.to_be_bytes());
    if !rewrite::decrement_ttl(ip) {
        return XDP_PASS;
    }
    eth.src_addr = config.smac;
    eth.dst_addr = config.dmac;
    // SAFETY: a helper call with plain integer arguments.
    unsafe { bpf_redirect(config.ifindex, 0) as u32 }
}
