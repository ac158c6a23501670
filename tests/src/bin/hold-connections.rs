//! Long-lived TCP connections that each send a request every interval, for the routed-fabric
//! benchmark (`cargo xtask bench bgp`). Rust on one thread, so that a thousand connections cost
//! the host little next to what is measured (asyncio saturated a core of this 2-core host at a
//! thousand, and the waits it added looked like the fabric's).
//!
//! Each connection talks to a lab pod's line echo server (`lb_lab::cluster::Pod::serve`): it
//! reads the greeting, then writes a line every interval and waits for its echo. A connection
//! that is reset or closed ends ("reset"); a request not answered within a second counts as
//! failed, and the connection goes on waiting. Runs until SIGTERM or the duration, then prints
//! one JSON array, an object per port: connections opened, refused, reset (and of those, reset
//! while others were still opening: before "ready"), requests sent,
//! answered, failed, answered after over 100 ms ("slow"), and the longest wait for an answer
//! any connection saw (the outage as a flow sees it). Only requests sent after "ready" count.
//!
//!     hold-connections VIP PORT[,PORT...] CONNECTIONS_PER_PORT INTERVAL_MS DURATION_S

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    signal::unix::{SignalKind, signal},
    sync::watch,
    time::{sleep, timeout},
};

/// How long a request may go unanswered before it counts as failed.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// Longer than this is "slow".
const SLOW: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct PortStats {
    opened: AtomicU64,
    refused: AtomicU64,
    reset: AtomicU64,
    /// Of `reset`, those that ended before every connection was open.
    reset_opening: AtomicU64,
    sent: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    slow: AtomicU64,
    max_wait_us: AtomicU64,
}

impl PortStats {
    fn json(&self, port: u16) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Relaxed);
        serde_json::json!({
            "port": port,
            "opened": n(&self.opened),
            "refused": n(&self.refused),
            "reset": n(&self.reset),
            "reset_opening": n(&self.reset_opening),
            "sent": n(&self.sent),
            "answered": n(&self.answered),
            "failed": n(&self.failed),
            "slow": n(&self.slow),
            "max_wait_ms": n(&self.max_wait_us) as f64 / 1000.0,
        })
    }
}

/// What every connection shares: its port's counters, whether requests count yet, and the
/// stop signal.
struct Shared {
    stats: Arc<PortStats>,
    measuring: Arc<AtomicBool>,
    stop: watch::Receiver<bool>,
}

impl Shared {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    fn count_reset(&self) {
        self.stats.reset.fetch_add(1, Relaxed);
        if !self.measuring.load(Relaxed) {
            self.stats.reset_opening.fetch_add(1, Relaxed);
        }
    }
}

async fn hold(addr: SocketAddr, interval: Duration, shared: Shared) {
    let connected = async {
        let stream = TcpStream::connect(addr).await?;
        let (read, write) = stream.into_split();
        let mut read = BufReader::new(read);
        let mut greeting = Vec::new();
        read.read_until(b'\n', &mut greeting).await?;
        std::io::Result::Ok((read, write))
    };
    let (mut read, mut write) = match timeout(CONNECT_TIMEOUT, connected).await {
        Ok(Ok(halves)) => halves,
        _ => {
            shared.stats.refused.fetch_add(1, Relaxed);
            return;
        }
    };
    shared.stats.opened.fetch_add(1, Relaxed);
    let mut line = Vec::new();
    for n in 1u64.. {
        if shared.stopped() {
            return;
        }
        let sent_at = Instant::now();
        if write.write_all(format!("r{n}\n").as_bytes()).await.is_err() {
            shared.count_reset();
            return;
        }
        // A request counts, with its answer or failure, if it was sent once all were open.
        let counted = shared.measuring.load(Relaxed);
        let count = |counter: &AtomicU64| {
            if counted {
                counter.fetch_add(1, Relaxed);
            }
        };
        count(&shared.stats.sent);
        line.clear();
        // `read_until` keeps what it read when timed out, so a late answer is still whole.
        loop {
            match timeout(ANSWER_TIMEOUT, read.read_until(b'\n', &mut line)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    shared.count_reset();
                    return;
                }
                Ok(Ok(_)) => break,
                Err(_) => {
                    count(&shared.stats.failed);
                    if shared.stopped() {
                        return;
                    }
                }
            }
        }
        let waited = sent_at.elapsed();
        count(&shared.stats.answered);
        if waited > SLOW {
            count(&shared.stats.slow);
        }
        if counted {
            shared.stats.max_wait_us.fetch_max(waited.as_micros() as u64, Relaxed);
        }
        sleep(interval.saturating_sub(waited)).await;
    }
}

fn usage() -> ! {
    eprintln!("usage: hold-connections VIP PORT[,PORT...] CONNECTIONS_PER_PORT INTERVAL_MS DURATION_S");
    std::process::exit(64);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [vip, ports, per_port, interval_ms, duration] = args.as_slice() else { usage() };
    let vip: IpAddr = vip.parse().unwrap_or_else(|_| usage());
    let ports: Vec<u16> = ports.split(',').map(|p| p.parse().unwrap_or_else(|_| usage())).collect();
    let per_port: u64 = per_port.parse().unwrap_or_else(|_| usage());
    let interval = Duration::from_millis(interval_ms.parse().unwrap_or_else(|_| usage()));
    let duration = Duration::from_secs_f64(duration.parse().unwrap_or_else(|_| usage()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(run(vip, &ports, per_port, interval, duration));
}

async fn run(vip: IpAddr, ports: &[u16], per_port: u64, interval: Duration, duration: Duration) {
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let (stop_tx, stop) = watch::channel(false);
    let measuring = Arc::new(AtomicBool::new(false));
    let stats: Vec<Arc<PortStats>> = ports.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for i in 0..per_port {
        for (port, stats) in ports.iter().zip(&stats) {
            let shared = Shared { stats: stats.clone(), measuring: measuring.clone(), stop: stop.clone() };
            tasks.push(tokio::spawn(hold(SocketAddr::new(vip, *port), interval, shared)));
        }
        // Opened in steps, as a client population would, not as one SYN burst.
        if i % 50 == 49 {
            sleep(Duration::from_millis(50)).await;
        }
    }
    let settled = || stats.iter().map(|s| s.opened.load(Relaxed) + s.refused.load(Relaxed)).sum::<u64>();
    while settled() < per_port * ports.len() as u64 {
        sleep(Duration::from_millis(50)).await;
    }
    measuring.store(true, Relaxed);
    println!("ready");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = sleep(duration) => {}
    }
    let _ = stop_tx.send(true);
    // Answers already on their way still count.
    sleep(ANSWER_TIMEOUT + Duration::from_millis(200)).await;
    for task in tasks {
        task.abort();
    }
    let summary: Vec<serde_json::Value> = ports.iter().zip(&stats).map(|(port, s)| s.json(*port)).collect();
    println!("{}", serde_json::Value::Array(summary));
}
