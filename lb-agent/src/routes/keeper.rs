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
//!
//! An upgrade in place (SIGUSR2: the agent executes its binary again in the same process) hands
//! the keeper over instead: the agent writes [`RESTARTING`], which gives the next heartbeat
//! `routes.restartWindow` instead of `holdTime`, and leaves the pipe open across `exec`. The
//! keeper is still this process's child, so the new image adopts it ([`Handoff`]) and the routes
//! never change. The pipe's bytes are the protocol between two builds: keep them compatible.
//!
//! A replacement by another process on this node (a Kubernetes DaemonSet roll, where the pod
//! with the keeper goes) leaves the device instead: the agent writes [`LEAVING`], and the keeper
//! makes the device persistent and exits, so the device and its routes outlive it. The next
//! agent's keeper attaches to the device, and it is not persistent from then on. Until then
//! nothing on the node withdraws the routes: the bound is outside the agent (the FRR sidecar
//! waits for the adoption, and the ToR's graceful-restart timer ends the routes of a node whose
//! BGP does not come back; the book, "Routed fabrics").

use std::{
    io::{self, Write},
    os::{
        fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd},
        unix::process::{CommandExt, ExitStatusExt},
    },
    process::{ExitStatus, Stdio},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest, unix::AsyncFd},
    net::unix::pipe,
    sync::watch,
    task::JoinHandle,
};

/// The keeper's line on its standard output once the device exists.
const READY: &str = "ready";
/// A heartbeat.
const BEAT: u8 = b'.';
/// The agent is executing itself again: the next heartbeat may take `routes.restartWindow`.
const RESTARTING: u8 = b'R';
/// The agent is stopping for a replacement on this node: leave the device and its routes to the
/// next agent.
const LEAVING: u8 = b'P';
/// Where a re-executing agent tells its next image about the keeper: `<pid>:<fd>`.
const HANDOFF_ENV: &str = "LB_AGENT_ROUTES_KEEPER";

/// The keeper process: makes the TUN device `name` (or attaches to the one a replaced agent
/// left) and holds it while the agent is heard from at least every `hold` (`window` after a
/// [`RESTARTING`]). Returns when the agent ends (end of file) or leaves the device to the next
/// one ([`LEAVING`]); an error when it went unheard.
pub fn keep(name: &str, hold: Duration, window: Duration) -> io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: SIG_IGN for a catchable signal; no handler runs.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let device = open_tun(name)?;
    let mut stdout = io::stdout();
    writeln!(stdout, "{READY}")?;
    stdout.flush()?;
    let mut wait = hold;
    let mut buf = [0u8; 64];
    loop {
        let mut stdin = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
        let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one pollfd that lives across the call.
        let ready = unsafe { libc::poll(&mut stdin, 1, wait_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if ready == 0 {
            let what = if wait == hold { "routes.holdTime" } else { "routes.restartWindow, restarting" };
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the agent went unheard for {wait:?} ({what}): its routes end now"),
            ));
        }
        // SAFETY: reads into a buffer this function owns, at most its length.
        let read = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        match read {
            0 => return Ok(()),
            n if n > 0 && buf[..n as usize].contains(&LEAVING) => return set_persistent(&device, true),
            n if n > 0 => wait = next_wait(&buf[..n as usize], hold, window),
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
}

/// How long the keeper waits for the agent after reading `bytes`: the restart window when the
/// last of them says the agent is executing itself again, the hold time after a heartbeat.
fn next_wait(bytes: &[u8], hold: Duration, window: Duration) -> Duration {
    if bytes.last() == Some(&RESTARTING) { window } else { hold }
}

/// The keeper as a re-executing agent passes it to its next image: its pid, and the heartbeat
/// pipe's descriptor, left open across `exec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handoff {
    pid: libc::pid_t,
    pipe: RawFd,
}

impl Handoff {
    /// The variable for the next image's environment.
    pub fn env(&self) -> (&'static str, String) {
        (HANDOFF_ENV, format!("{}:{}", self.pid, self.pipe))
    }

    /// The keeper the previous image handed over, if any; the variable is removed, so no child
    /// inherits it. Call before any thread starts (it changes the environment).
    pub fn take_from_env() -> Option<Handoff> {
        let value = std::env::var(HANDOFF_ENV).ok()?;
        // SAFETY: called by `main` before any thread exists, so nothing reads the environment
        // concurrently.
        unsafe { std::env::remove_var(HANDOFF_ENV) };
        let (pid, pipe) = value.split_once(':')?;
        Some(Handoff { pid: pid.parse().ok()?, pipe: pipe.parse().ok()? })
    }
}

/// The agent's side: the keeper process, a child of this process (also after an `exec`, which
/// keeps the pid). Its heartbeats go down its pipe from a task of their own, so that route work
/// in the apply loop never holds them back.
pub struct Keeper {
    pid: libc::pid_t,
    /// A pidfd: readable once the keeper has exited.
    exited: AsyncFd<OwnedFd>,
    /// The heartbeat pipe, kept for a hand-over (the task writes through a copy of its own).
    pipe: Option<OwnedFd>,
    beats: JoinHandle<()>,
    /// Reaped or handed over: nothing to end when dropped.
    gone: bool,
}

impl Keeper {
    /// Starts a keeper for the device `name` and waits (a few seconds at most) until the
    /// device exists.
    pub async fn spawn(
        name: &str,
        (hold, window): (Duration, Duration),
        alive: watch::Receiver<u64>,
    ) -> io::Result<Keeper> {
        let format = |d: Duration| humantime::format_duration(d).to_string();
        // This very binary, even when an upgrade has replaced the file on disk since it started.
        let mut child = std::process::Command::new("/proc/self/exe")
            .args([
                "keep-routes",
                "--device",
                name,
                "--hold",
                &format(hold),
                "--restart-window",
                &format(window),
            ])
            .env_remove(HANDOFF_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // A group of its own: a stop sent to the agent's group (^Z, `kill -STOP -PGID`)
            // must not freeze the keeper with it.
            .process_group(0)
            .spawn()?;
        let pid = child.id() as libc::pid_t;
        let heartbeat = OwnedFd::from(child.stdin.take().expect("stdin was piped"));
        let stdout = OwnedFd::from(child.stdout.take().expect("stdout was piped"));
        let keeper = Keeper::attach(pid, heartbeat, alive)?;
        let mut line = String::new();
        let mut stdout = BufReader::new(pipe::Receiver::from_owned_fd(stdout)?);
        match tokio::time::timeout(Duration::from_secs(5), stdout.read_line(&mut line)).await {
            Ok(Ok(_)) if line.trim_end() == READY => Ok(keeper),
            // Its error went to the agent's standard error.
            Ok(Ok(_)) => Err(io::Error::other(format!("the routes' keeper ended before making {name}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other(format!("the routes' keeper did not make {name} within 5 s"))),
        }
    }

    /// The keeper an earlier image of this process handed over.
    pub fn adopt(handoff: Handoff, alive: watch::Receiver<u64>) -> io::Result<Keeper> {
        // SAFETY: the previous image left this descriptor open for this one, and nothing else
        // in this process took it.
        let pipe = unsafe { OwnedFd::from_raw_fd(handoff.pipe) };
        set_close_on_exec(&pipe, true)?;
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", handoff.pid))?;
        if !cmdline.split(|b| *b == 0).any(|arg| arg == b"keep-routes") {
            return Err(io::Error::other(format!("process {} is not a routes' keeper", handoff.pid)));
        }
        Keeper::attach(handoff.pid, pipe, alive)
    }

    fn attach(pid: libc::pid_t, pipe: OwnedFd, alive: watch::Receiver<u64>) -> io::Result<Keeper> {
        // SAFETY: the pidfd is owned by the AsyncFd, and closed only with it.
        let exited = unsafe { AsyncFd::register_with_interest(pidfd_open(pid)?, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let beats = pipe::Sender::from_owned_fd(pipe.try_clone()?)?;
        let beats = tokio::spawn(pass_heartbeats(alive, beats));
        Ok(Keeper { pid, exited, pipe: Some(pipe), beats, gone: false })
    }

    /// Resolves when the keeper has ended, with its exit status. Cancel-safe.
    pub async fn ended(&mut self) -> io::Result<ExitStatus> {
        loop {
            let mut ready = self.exited.readable().await?;
            if let Some(status) = reap(self.pid, libc::WNOHANG)? {
                self.gone = true;
                return Ok(status);
            }
            ready.clear_ready();
        }
    }

    /// Hands the keeper to this process's next image: no more heartbeats from this one, the
    /// restart window opened, the pipe left open across `exec`.
    pub async fn hand_over(mut self) -> io::Result<Handoff> {
        let pipe = self.last_word(RESTARTING).await?;
        set_close_on_exec(&pipe, false)?;
        self.gone = true;
        Ok(Handoff { pid: self.pid, pipe: pipe.into_raw_fd() })
    }

    /// Leaves the device and its routes to the next agent on this node (see [`LEAVING`]), and
    /// waits (2 s at most) for the keeper to have made it persistent and exited.
    pub async fn leave(mut self) -> io::Result<()> {
        let _pipe = self.last_word(LEAVING).await?;
        match tokio::time::timeout(Duration::from_secs(2), self.ended()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(io::Error::other(format!("the routes' keeper ended with {status}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("the routes' keeper did not leave its device within 2 s")),
        }
    }

    /// Stops the heartbeats and writes `byte`, the last the keeper hears from this image;
    /// returns the pipe. The heartbeat task may be writing a beat on another worker: it is
    /// waited for, so that no beat follows (after [`RESTARTING`] the keeper would then give the
    /// next image `holdTime` instead of the window).
    async fn last_word(&mut self, byte: u8) -> io::Result<OwnedFd> {
        self.beats.abort();
        let _ = (&mut self.beats).await;
        let pipe = self.pipe.take().expect("taken only by the last word");
        // SAFETY: writes one byte from a live buffer to a descriptor this keeper owns.
        if unsafe { libc::write(pipe.as_raw_fd(), [byte].as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
        Ok(pipe)
    }
}

/// A child's status once it has exited (`flags`: 0 to wait, `WNOHANG` not to).
fn reap(pid: libc::pid_t, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    // SAFETY: waits for this process's own child; `status` lives across the call.
    match unsafe { libc::waitpid(pid, &mut status, flags) } {
        0 => Ok(None),
        reaped if reaped == pid => Ok(Some(ExitStatus::from_raw(status))),
        _ => Err(io::Error::last_os_error()),
    }
}

impl Drop for Keeper {
    /// A keeper this agent no longer wants ends now, and its routes with it.
    fn drop(&mut self) {
        self.beats.abort();
        if !self.gone {
            // SAFETY: a signal to this process's own, not yet reaped, child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = reap(self.pid, 0);
        }
    }
}

/// Writes a byte to the keeper for each heartbeat of the event loop, until the keeper has gone
/// (or the agent's side of the channel has).
async fn pass_heartbeats(mut alive: watch::Receiver<u64>, mut pipe: pipe::Sender) {
    while alive.changed().await.is_ok() {
        if pipe.write_all(&[BEAT]).await.is_err() {
            return;
        }
    }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just made for this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn set_close_on_exec(fd: &OwnedFd, on: bool) -> io::Result<()> {
    let flags = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD on a descriptor this process owns.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `TUNSETIFF` (`_IOW('T', 202, int)`), `TUNSETPERSIST` (`_IOW('T', 203, int)`) and the
/// flags, from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The TUN device named `name`, made new or, when a replaced agent left it persistent, attached
/// to; not persistent either way, so the kernel removes it (with its routes) when the
/// descriptor closes. Another process's device is refused (EBUSY).
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
        let error = io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::EBUSY) => {
                io::Error::other(format!("{name} is held by another process (another agent's keeper?)"))
            }
            _ => io::Error::other(format!("making or attaching to the TUN device {name}: {error}")),
        });
    }
    set_persistent(&fd, false)?;
    Ok(fd)
}

/// Whether the device outlives its descriptor.
fn set_persistent(device: &OwnedFd, persistent: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value.
    if unsafe { libc::ioctl(device.as_raw_fd(), TUNSETPERSIST as _, libc::c_ulong::from(persistent)) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_opens_the_window_for_the_next_beat_only() {
        let (hold, window) = (Duration::from_secs(3), Duration::from_secs(30));
        assert_eq!(next_wait(b".", hold, window), hold);
        assert_eq!(next_wait(b"..R", hold, window), window);
        // The new image's first heartbeat closes it.
        assert_eq!(next_wait(b"R.", hold, window), hold);
    }

    #[test]
    fn a_handoff_goes_through_the_environment_and_only_once() {
        let handoff = Handoff { pid: 4242, pipe: 7 };
        let (name, value) = handoff.env();
        assert_eq!(value, "4242:7");
        // SAFETY: this test alone uses the variable, and sets it before reading it.
        unsafe { std::env::set_var(name, value) };
        assert_eq!(Handoff::take_from_env(), Some(handoff));
        assert_eq!(Handoff::take_from_env(), None);
    }
}
