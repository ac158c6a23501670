//! A named network namespace that deletes itself on drop.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::{Command, Output},
};

pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace with loopback up and IPv6 off, so the segment carries only the
    /// traffic a test sends (no router solicitations or DAD to skew counters).
    pub fn create(name: String) -> Netns {
        run_checked(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        ns.run_cmd(&["ip", "link", "set", "lo", "up"]);
        ns.run_cmd(&[
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command run inside the namespace.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(argv);
        cmd
    }

    /// Runs a command inside the namespace; panics with its output when it fails.
    pub fn run_cmd(&self, argv: &[&str]) -> Output {
        run_checked(&mut self.command(argv))
    }

    /// Runs a command inside the namespace and returns its output, whatever its exit status.
    pub fn output(&self, argv: &[&str]) -> Output {
        self.command(argv).output().unwrap_or_else(|e| panic!("cannot start {argv:?}: {e}"))
    }

    pub fn sysctl_if_present(&self, key: &str, value: &str) {
        let _ = self.output(&["sysctl", "-qw", &format!("{key}={value}")]);
    }

    /// Runs `f` on a thread that has entered this namespace: sockets it opens live here.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        run_in(&self.name, f)
    }
}

/// Runs `f` on a thread that has entered the namespace called `name`.
pub fn run_in<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: a valid namespace fd; setns only changes this thread's namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            panic!("setns({path}): {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

fn run_checked(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Deletes lab namespaces whose creating process no longer exists: the leftovers of a test
/// binary that was killed before its destructors ran.
pub fn sweep_orphans() {
    // And their pinned data planes.
    if let Ok(entries) = std::fs::read_dir(crate::BPFFS_LABS) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("lbt").and_then(|rest| rest.split('x').next()) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("lbt").and_then(|rest| rest.split('x').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}
