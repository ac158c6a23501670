//! The lab's own clocks: one thread pinned to each CPU sleeps 5 ms at a time and records each
//! wake-up that came far later than asked, i.e. a time when that CPU ran nothing of ours.
//!
//! Measured on these VMs: while the disk takes a few GB of writes (a build's artefacts being
//! written back), a virtual CPU can stand still for 150–700 ms; every thread queued on it,
//! agents' VRRP loops included, waits that long (their schedstat run delays jump together) while
//! the other CPU runs on. An agent then misses its adverts and its VIP lease lapses exactly as
//! on a frozen node, by design; a test that counts replies or owners through such a freeze
//! measures the host, not the scenario. Tests use [`between`] to tell the two apart,
//! and say which it was. (With every CPU kept busy, e.g. under `perf record -a`, none happens.)

use std::{
    sync::{Mutex, Once},
    time::{Duration, Instant},
};

/// A wake-up later than this is a freeze (the clock threads ask for 5 ms).
pub const FREEZE: Duration = Duration::from_millis(100);

static FREEZES: Mutex<Vec<(Instant, Duration)>> = Mutex::new(Vec::new());
static START: Once = Once::new();

/// Starts the clock threads (once per test process); freezes are recorded from then on.
pub fn watch() {
    START.call_once(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for cpu in 0..cpus {
            std::thread::Builder::new()
                .name(format!("freeze-watch-{cpu}"))
                .spawn(move || {
                    pin_to(cpu);
                    let mut last = Instant::now();
                    loop {
                        std::thread::sleep(Duration::from_millis(5));
                        let now = Instant::now();
                        let gap = now - last;
                        if gap > FREEZE {
                            FREEZES.lock().unwrap().push((last, gap));
                        }
                        last = now;
                    }
                })
                .expect("starting the freeze watch");
        }
    });
}

/// Keeps the calling thread on `cpu` (best effort: unpinned, it still sees whole-machine freezes).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only read
    // and write that set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
/// The freezes that overlapped `from..to`, as seen from any CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frozen {
    /// How many separate times (overlapping freezes of several CPUs count once).
    pub times: usize,
    /// The time covered by at least one frozen CPU.
    pub total: Duration,
    pub longest: Duration,
}

pub fn between(from: Instant, to: Instant) -> Frozen {
    let mut spans: Vec<(Instant, Instant)> = FREEZES
        .lock()
        .unwrap()
        .iter()
        .map(|(start, gap)| (*start, *start + *gap))
        .filter(|(start, end)| *start < to && *end > from)
        .collect();
    spans.sort();
    let mut merged: Vec<(Instant, Instant)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    Frozen {
        times: merged.len(),
        total: merged.iter().map(|(s, e)| *e - *s).sum(),
        longest: merged.iter().map(|(s, e)| *e - *s).max().unwrap_or_default(),
    }
}

/// No ping reply (`ping`'s output, one every 5 ms from `since`) was lost; or no more than fit
/// in the time a CPU of this machine stood still, plus an advert (`advert_interval`) each time
/// for the owner to renew its VIP lease once it runs again, and an agent logged that lease
/// running out: the data plane rightly stopped claiming the VIP while its agent could not run.
/// The agents' logs (`logs`) are read only then, and shown on failure.
pub fn assert_no_reply_lost(
    ping: &std::process::Output,
    since: Instant,
    during: &str,
    advert_interval: Duration,
    logs: impl Fn() -> String,
) {
    let summary = String::from_utf8_lossy(&ping.stdout);
    let (sent, received) = crate::ping_counts(ping);
    let lost = sent - received;
    if lost == 0 {
        return;
    }
    let frozen = between(since, Instant::now());
    let excused = (frozen.total + advert_interval * frozen.times as u32).as_millis() as u64 / 5;
    let logs = logs();
    let lapsed = logs.contains("a VIP lease ran out before the agent renewed it");
    assert!(
        lapsed && lost <= excused,
        "{lost} ping replies lost {during} (CPUs frozen: {frozen:?}, which would excuse {excused}; lease \
         lapse logged: {lapsed}): {summary}\n{logs}"
    );
    eprintln!(
        "{lost} ping replies lost {during}, while CPUs of this machine stood still ({frozen:?}) and the \
         owner's VIP lease lapsed: the host's doing, not the scenario's"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_is_seen_frozen_and_a_running_one_is_not() {
        watch();
        let from = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(between(from, Instant::now()), Frozen::default(), "a quiet test process");
        // SIGSTOP to ourselves freezes every thread as the host does. The waker times the freeze
        // from when the kernel shows us stopped, so a slow fork under load cannot shorten it.
        let pid = std::process::id();
        let mut waker = std::process::Command::new("sh")
            .args([
                "-c",
                &format!(
                    "until grep -q '^State:[[:space:]]*T' /proc/{pid}/status; do sleep 0.01; done; \
                     sleep 0.4; kill -CONT {pid}"
                ),
            ])
            .spawn()
            .unwrap();
        let frozen_at = Instant::now();
        // SAFETY: kill(2) on our own pid with a signal number; no memory is touched.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
        // The stop lands asynchronously: wait until it has come and gone, then give the clock
        // threads, woken at the same moment as this one, a fresh 50 ms to record it.
        while frozen_at.elapsed() < Duration::from_millis(400) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        waker.wait().expect("the waker ran");
        let seen = between(frozen_at, Instant::now());
        assert_eq!(seen.times, 1, "every CPU's clock saw the one freeze: {seen:?}");
        assert!(seen.longest >= Duration::from_millis(250), "{seen:?}");
    }
}
