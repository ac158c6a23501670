//! Whole-batch map writes and reads (`BPF_MAP_UPDATE_BATCH`, `BPF_MAP_LOOKUP_BATCH`, Linux 5.6).
//!
//! aya 0.14 writes one element per `bpf()` call: the batch form writes every new backend,
//! service entry or ring registration of a sync in one call.

use std::os::fd::{AsFd, AsRawFd};

use aya::{Pod, maps::IterableMap};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Writes `keys[i] → values[i]` for every `i`, in one system call.
pub fn update<K: Pod, V: Pod>(map: &impl AsFd, keys: &[K], values: &[V]) -> std::io::Result<()> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    update_raw(map, keys.as_ptr().cast(), values.as_ptr().cast(), keys.len())
}

/// Removes `keys` in one system call. Removing an absent key is an error (`ENOENT`).
pub fn delete<K: Pod>(map: &impl AsFd, keys: &[K]) -> std::io::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `update_raw`.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.batch.map_fd = map.as_fd().as_raw_fd() as u32;
    attr.batch.keys = keys.as_ptr() as u64;
    attr.batch.count = keys.len() as u32;
    sys_bpf(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr)
}

/// Sets every CPU's copy of a per-CPU array's `indices` to zero.
pub fn zero_per_cpu<V: Pod>(map: &impl AsFd, indices: &[u32], cpus: usize) -> std::io::Result<()> {
    // The kernel lays per-CPU values out as `cpus` slots of the value size rounded up to 8.
    let stride = size_of::<V>().next_multiple_of(8) * cpus;
    let zeros = vec![0u8; stride * indices.len()];
    update_raw(map, indices.as_ptr().cast(), zeros.as_ptr(), indices.len())
}

fn update_raw(map: &impl AsFd, keys: *const u8, values: *const u8, count: usize) -> std::io::Result<()> {
    if count == 0 {
        return Ok(());
    }
    // SAFETY: an all-zero `bpf_attr` is the documented "no options" value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // Writing a union member is safe; reading one back is not.
    attr.batch.map_fd = map.as_fd().as_raw_fd() as u32;
    attr.batch.keys = keys as u64;
    attr.batch.values = values as u64;
    attr.batch.count = count as u32;
    sys_bpf(bpf_cmd::BPF_MAP_UPDATE_BATCH, &mut attr)?;
    // SAFETY: the kernel wrote back how many elements it processed.
    let done = unsafe { attr.batch.count } as usize;
    if done != count {
        return Err(std::io::Error::other(format!("the kernel wrote {done} of {count} elements")));
    }
    Ok(())
}

/// Reads every element of an array map, in batches of up to 4,096.
pub fn read_array<V: Pod, M: IterableMap<u32, V>>(map: &M) -> std::io::Result<Vec<V>> {
    read_all::<u32, V>(map.map().fd()).map(|all| all.into_iter().map(|(_, v)| v).collect())
}

/// Reads every key and value of a map (array or hash), in batches of up to 4,096. A hash map
/// changing meanwhile may be read partly before and partly after the change.
pub fn read_all<K: Pod, V: Pod>(map: &impl AsFd) -> std::io::Result<Vec<(K, V)>> {
    const CHUNK: usize = 4096;
    let fd = map.as_fd().as_raw_fd() as u32;
    let mut out = Vec::new();
    // SAFETY: `K` and `V` are `Pod`, so all-zero bytes are valid values.
    let mut keys: Vec<K> = vec![unsafe { std::mem::zeroed() }; CHUNK];
    // SAFETY: as above.
    let mut values: Vec<V> = vec![unsafe { std::mem::zeroed() }; CHUNK];
    // Arrays and hash tables both take a 32-bit position as the batch token.
    let mut token = 0u32;
    let mut first = true;
    loop {
        // SAFETY: as in `update_raw`.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // The buffers outlive the call.
        attr.batch.map_fd = fd;
        attr.batch.in_batch = if first { 0 } else { std::ptr::addr_of!(token) as u64 };
        attr.batch.out_batch = std::ptr::addr_of_mut!(token) as u64;
        attr.batch.keys = keys.as_mut_ptr() as u64;
        attr.batch.values = values.as_mut_ptr() as u64;
        attr.batch.count = CHUNK as u32;
        first = false;
        let result = sys_bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // SAFETY: the kernel wrote back how many elements it returned.
        let got = unsafe { attr.batch.count } as usize;
        out.extend(keys[..got].iter().copied().zip(values[..got].iter().copied()));
        match result {
            Ok(()) => {}
            // ENOENT: the last batch (possibly partial) has been returned.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
    }
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid, fully initialised `bpf_attr` of the size we pass.
    let ret = unsafe {
        libc::syscall(libc::SYS_bpf, cmd as libc::c_int, attr as *mut bpf_attr, size_of::<bpf_attr>() as u32)
    };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// The kernel's memory accounting for a map (`memlock` in `/proc/self/fdinfo`), in bytes.
pub fn memlock(map: &impl AsFd) -> Option<u64> {
    let fd = map.as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}
