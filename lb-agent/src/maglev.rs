//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4), computed in userspace.
//!
//! The data plane hashes a flow's 5-tuple to a slot of the lookup table and forwards to the
//! backend in that slot. Every agent computes the same table from the same backend set, so in
//! DSR mode a flow keeps its backend when another LB node takes over the VIP; and a backend
//! change moves only about 1/N of the slots.

use crate::name_hash;

/// Table sizes: primes, so every skip is coprime with the size and each backend's permutation
/// visits every slot. [`table_size`] picks the smallest that is at least 100 × the backends
/// (the paper's bound for near-perfect balance).
pub const TABLE_SIZES: [u32; 9] = [251, 509, 1021, 2039, 4093, 8191, 16_381, 32_749, 65_521];

/// The smallest table size that keeps the imbalance small for `backends` backends, and at
/// most `largest` (the configured `dataplane.capacity.ringSize`).
pub fn table_size(backends: usize, largest: u32) -> u32 {
    let wanted = (backends as u64).saturating_mul(100);
    let allowed = || TABLE_SIZES.iter().copied().filter(|&m| m <= largest);
    allowed().find(|&m| u64::from(m) >= wanted).or_else(|| allowed().next_back()).unwrap_or(TABLE_SIZES[0])
}

/// The lookup table: `table[slot]` is an index into `backends`. Empty when there are no
/// backends. `backends` are identified by stable names (e.g. `10.0.1.5:8080`), and the result
/// does not depend on their order.
pub fn lookup_table(backends: &[String], size: u32) -> Vec<u32> {
    if backends.is_empty() || size == 0 {
        return Vec::new();
    }
    // Sort so that the index each backend gets, and the fill order, depend only on the set.
    let mut order: Vec<usize> = (0..backends.len()).collect();
    order.sort_by(|a, b| backends[*a].cmp(&backends[*b]));
    order.dedup_by(|a, b| backends[*a] == backends[*b]);

    let m = u64::from(size);
    let permutation: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| {
            let name = &backends[i];
            let offset = name_hash::of(&format!("maglev-offset/{name}")) % m;
            let skip = name_hash::of(&format!("maglev-skip/{name}")) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();

    const EMPTY: u32 = u32::MAX;
    let mut table = vec![EMPTY; size as usize];
    let mut next = vec![0u64; order.len()];
    let mut filled = 0usize;
    // §3.4 Pseudocode 1: backends take turns claiming their next preferred free slot.
    'fill: loop {
        for (turn, &backend) in order.iter().enumerate() {
            let (offset, skip) = permutation[turn];
            let mut slot = (offset + next[turn] * skip) % m;
            while table[slot as usize] != EMPTY {
                next[turn] += 1;
                slot = (offset + next[turn] * skip) % m;
            }
            table[slot as usize] = backend as u32;
            next[turn] += 1;
            filled += 1;
            if filled == table.len() {
                break 'fill;
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.{}.{}:8080", i / 250, i % 250 + 1)).collect()
    }

    fn counts(table: &[u32], n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for &b in table {
            c[b as usize] += 1;
        }
        c
    }

    #[test]
    fn every_slot_is_filled_and_shares_are_even() {
        for n in [1, 2, 3, 10, 100, 600] {
            let b = backends(n);
            let size = table_size(n, u32::MAX);
            let table = lookup_table(&b, size);
            assert_eq!(table.len(), size as usize);
            let c = counts(&table, n);
            let (min, max) = (*c.iter().min().unwrap(), *c.iter().max().unwrap());
            // The paper: with M ≥ 100·N, shares differ by at most about 1% of M/N… plus 1 slot.
            let mean = f64::from(size) / n as f64;
            assert!((max - min) as f64 <= mean * 0.02 + 1.0, "n={n}: min {min} max {max} mean {mean:.1}");
        }
    }

    #[test]
    fn sizes_are_prime_and_at_least_a_hundred_per_backend() {
        for m in TABLE_SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m} is prime");
        }
        assert_eq!(table_size(1, u32::MAX), 251);
        assert_eq!(table_size(3, u32::MAX), 509);
        assert_eq!(table_size(163, u32::MAX), 16_381);
        assert_eq!(table_size(164, u32::MAX), 32_749);
        assert_eq!(table_size(10_000, u32::MAX), 65_521);
        // The configured cap wins over balance.
        assert_eq!(table_size(164, 16_381), 16_381);
        assert_eq!(table_size(3, 1021), 509);
    }

    #[test]
    fn the_table_depends_on_the_set_not_the_order() {
        let b = backends(7);
        let mut shuffled = b.clone();
        shuffled.reverse();
        shuffled.swap(1, 4);
        let by_name = |backends: &[String], table: Vec<u32>| -> Vec<String> {
            table.into_iter().map(|i| backends[i as usize].clone()).collect()
        };
        assert_eq!(by_name(&b, lookup_table(&b, 1021)), by_name(&shuffled, lookup_table(&shuffled, 1021)));
    }

    #[test]
    fn removing_a_backend_moves_few_other_slots() {
        let n = 20;
        let b = backends(n);
        let before = lookup_table(&b, 4093);
        let mut fewer = b.clone();
        let gone = fewer.remove(7);
        let after = lookup_table(&fewer, 4093);
        let name = |set: &[String], i: u32| set[i as usize].clone();
        let moved = before
            .iter()
            .zip(&after)
            .filter(|(x, y)| name(&b, **x) != gone && name(&b, **x) != name(&fewer, **y))
            .count();
        // Only the removed backend's slots must move; Maglev disturbs a few more (§3.4).
        let others = before.iter().filter(|x| name(&b, **x) != gone).count();
        assert!((moved as f64) < others as f64 * 0.05, "{moved} of {others} untouched slots moved");
    }

    #[test]
    fn no_backends_no_table() {
        assert!(lookup_table(&[], 251).is_empty());
    }
}
