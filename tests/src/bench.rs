//! What the bench binaries (`src/bin/bench-*.rs`) share: order statistics over their runs, the
//! values given on their command lines, and `LB_BENCH_PERF`'s profiles.

use std::cmp::Ordering;

/// The value a fraction `q` of the way up `values` in order: 0 the least, ½ the median (the
/// upper middle one of an even count), ¼ the first quartile. `None` when there are none.
pub fn quantile<T: Copy + PartialOrd>(values: impl IntoIterator<Item = T>, q: f64) -> Option<T> {
    let mut sorted: Vec<T> = values.into_iter().collect();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    let last = sorted.len().checked_sub(1)?;
    sorted.get(((sorted.len() as f64 * q) as usize).min(last)).copied()
}

/// The median of `values` (the upper middle one of an even count); `None` when there are none.
pub fn median<T: Copy + PartialOrd>(values: impl IntoIterator<Item = T>) -> Option<T> {
    quantile(values, 0.5)
}

/// Every value given after `flag` on the command line, in order (`--against A --against B`).
pub fn arg_values(flag: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].clone()).collect()
}

/// The first value given after `flag` on the command line.
pub fn arg(flag: &str) -> Option<String> {
    arg_values(flag).into_iter().next()
}

/// A `perf record` of one thread or process running while this lives, into
/// `$LB_BENCH_PERF/<name>.data`; `None` when `LB_BENCH_PERF` is not set. `target` is perf's
/// (`-t <tid>` or `-p <pid>`), `hz` its sampling rate.
pub struct Profile(std::process::Child);

impl Profile {
    pub fn start(name: &str, target: [&str; 2], hz: u32) -> Option<Profile> {
        let dir = std::env::var("LB_BENCH_PERF").ok()?;
        let child = std::process::Command::new("perf")
            .args(["record", "-q", "-F", &hz.to_string(), "-g"])
            .args(target)
            .arg("-o")
            .arg(format!("{dir}/{name}.data"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("perf");
        Some(Profile(child))
    }
}

impl Drop for Profile {
    /// SIGINT makes perf write its file; waits for it.
    fn drop(&mut self) {
        // SAFETY: signalling the child we spawned.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_by_rank_and_none_of_nothing() {
        assert_eq!(median([3, 1, 2]), Some(2));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(3.0), "the upper middle of an even count");
        assert_eq!(quantile([8, 1, 7, 2, 6, 3, 5, 4], 0.25), Some(3));
        assert_eq!(quantile([5, 9], 1.0), Some(9), "the top rank is the largest");
        assert_eq!(median(Vec::<u64>::new()), None);
    }
}
