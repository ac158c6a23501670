//! The routed VIPs' device lives in a small process of its own, the keeper, so that the agent's
//! routes end within a bound however the agent fails:
//!
//! - killed (SIGKILL, a crash, the OOM killer): the keeper's standard input, a pipe only the
//!   agent writes, reads end of file; the keeper exits at once and the kernel deletes the
//!   device with its routes;
//! - frozen (SIGSTOP, an event loop that stopped turning): the agent's event loop sends a
//!   heartbeat every third of `routes.holdTime`; a keeper that hears none for `holdTime`
//!   exits, and the routes go the same way. A process that shared the agent's fate (a thread
//!   of it, a descriptor it holds) could not tell a frozen agent from a busy one.
//!
//! The keeper is this binary again (`lb-agent keep-routes`, hidden), so it needs nothing the
//! agent does not ship. It ignores the signals meant for the agent (systemd's stop reaches every
//! process of the unit, a terminal's ^C the whole group): a graceful stop withdraws through the
//! agent, which then drains, and the keeper goes when the agent has gone.

use std::{
    io::{self, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin, Command},
    sync::watch,
};

/// The keeper's line on its standard output once the device exists.
const READY: &str = "ready";

/// The keeper process: makes the TUN device `name` and holds it while the agent is heard from
/// at least every `hold`. Returns when the agent ends (end of file); an error when it went
/// unheard.
pub fn keep(name: &str, hold: Duration) -> io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: SIG_IGN for a catchable signal; no handler runs.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let _device = open_tun(name)?;
    let mut stdout = io::stdout();
    writeln!(stdout, "{READY}")?;
    stdout.flush()?;
    let hold_ms = i32::try_from(hold.as_millis()).unwrap_or(i32::MAX);
    let mut buf = [0u8; 64];
    loop {
        let mut stdin = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd that lives across the call.
        let ready = unsafe { libc::poll(&mut stdin, 1, hold_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if ready == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the agent went unheard for {hold:?} (routes.holdTime): its routes end now"),
            ));
        }
        // SAFETY: reads into a buffer this function owns, at most its length.
        let read = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        match read {
            0 => return Ok(()),
            n if n > 0 => {}
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
}

/// The agent's side: the keeper process. Its heartbeats go down its pipe from a task of their
/// own, so that route work in the apply loop never holds them back.
pub struct Keeper {
    child: Child,
}

impl Keeper {
    /// Starts a keeper for the device `name` and waits (a few seconds at most) until the
    /// device exists.
    pub async fn spawn(name: &str, hold: Duration, alive: watch::Receiver<u64>) -> io::Result<Keeper> {
        // This very binary, even when an upgrade has replaced the file on disk since it started.
        let mut child = Command::new("/proc/self/exe")
            .arg("keep-routes")
            .arg("--device")
            .arg(name)
            .arg("--hold")
            .arg(humantime::format_duration(hold).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // A group of its own: a stop sent to the agent's group (^Z, `kill -STOP -PGID`)
            // must not freeze the keeper with it.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let heartbeat = child.stdin.take().expect("stdin was piped");
        let stdout = child.stdout.take().expect("stdout was piped");
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        match tokio::time::timeout(Duration::from_secs(5), stdout.read_line(&mut line)).await {
            Ok(Ok(_)) if line.trim_end() == READY => {
                tokio::spawn(pass_heartbeats(alive, heartbeat));
                Ok(Keeper { child })
            }
            Ok(Ok(_)) => {
                let status = child.wait().await?;
                Err(io::Error::other(format!("the routes' keeper ended before making {name}: {status}")))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other(format!("the routes' keeper did not make {name} within 5 s"))),
        }
    }

    /// Resolves when the keeper has ended, with its exit status.
    pub async fn ended(&mut self) -> io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }
}

/// Writes a byte to the keeper for each heartbeat of the event loop, until the keeper has gone
/// (or the agent's side of the channel has).
async fn pass_heartbeats(mut alive: watch::Receiver<u64>, mut pipe: ChildStdin) {
    while alive.changed().await.is_ok() {
        if pipe.write_all(b".").await.is_err() {
            return;
        }
    }
}

/// `TUNSETIFF` (`_IOW('T', 202, int)`) and its flags, from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// A new, non-persistent TUN device named `name`: the kernel removes it when the descriptor
/// closes.
fn open_tun(name: &str) -> io::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!("{name:?} is longer than an interface name may be")));
    }
    // SAFETY: a NUL-terminated path and flags; the result is checked.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid ifreq.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which lives across the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}
