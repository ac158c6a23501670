//! An lb-agent process running inside a lab namespace.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::Netns;

/// Where lab configs put the agent's HTTP endpoint (each node has its own loopback).
pub const AGENT_LISTEN: &str = "127.0.0.1:9105";

/// A field of a process's `/proc/<pid>/status` (`VmRSS`, `SigBlk`, `CapEff`, …), trimmed; none
/// when the process or the field is not there.
/// The line each image of the agent logs once it runs.
const RUNNING: &str = "lb-agent running";

pub fn proc_status(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    Some(value.trim().to_owned())
}

/// A process's resident memory (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS").and_then(|v| v.split_whitespace().next()?.parse().ok()).expect("VmRSS")
}

pub struct Agent {
    child: Child,
    ns_name: String,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Its admin socket (`/status`, `/loglevel`): beside its config, one per agent.
    pub admin_socket: PathBuf,
}

/// The lb-agent binary under test: `$LB_AGENT_BIN`, or the one cargo built beside this test.
pub fn agent_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("LB_AGENT_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // Tests run from target/<profile>/deps/, binaries from target/<profile>/.
    let mut dir = exe.parent().expect("a cargo target dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("a cargo profile dir");
    }
    let bin = dir.join("lb-agent");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p lb-agent` (cargo xtask test does)",
        bin.display()
    );
    bin
}

impl Agent {
    /// Starts lb-agent in `ns`, pinning its data plane under `pin_path`, and appending its
    /// output to `log` (a restarted agent adds to the same log).
    pub fn spawn(ns: &Netns, config: PathBuf, log: PathBuf, pin_path: PathBuf) -> Agent {
        Self::spawn_under(ns, config, log, pin_path, &[], &[], &[])
    }

    /// As [`Agent::spawn`], with extra `run` arguments and environment, started by `command`:
    /// the argv up to and including the agent's program (e.g. `setpriv … -- <agent>`); empty
    /// for the agent built in this workspace, run directly.
    pub fn spawn_under(
        ns: &Netns,
        config: PathBuf,
        log: PathBuf,
        pin_path: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
        command: &[&str],
    ) -> Agent {
        let log_file =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("creating the agent log");
        let bin = agent_binary();
        let admin_socket = config.with_extension("admin.sock");
        // `ip netns exec` execs the agent in place (wrappers exec too), so the child's pid is
        // the agent's.
        let mut argv = if command.is_empty() { vec![bin.to_str().unwrap()] } else { command.to_vec() };
        argv.extend(["run", "--config", config.to_str().unwrap()]);
        argv.extend_from_slice(args);
        let child = ns
            .command(&argv)
            .envs(env.iter().copied())
            .env("LB_LOG", "info,lb_agent=debug")
            .env("LB_PIN_PATH", &pin_path)
            .env("LB_ADMIN_SOCKET", &admin_socket)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting lb-agent");
        Agent { child, ns_name: ns.name().to_owned(), config, log, admin_socket }
    }

    /// One request on the admin socket: the body of a 200 answer, or the error.
    pub fn admin(&self, method: &str, path: &str, body: &str) -> Result<String, String> {
        lb_agent::admin::request(&self.admin_socket, method, path, body)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `/readyz` answers 200; panics with the log if the agent exits or stalls.
    pub fn wait_ready(&mut self) -> &mut Self {
        self.wait_ready_within(Duration::from_secs(10))
    }

    /// As [`Agent::wait_ready`], for a start that may take up to `timeout` (large configs).
    pub fn wait_ready_within(&mut self, timeout: Duration) -> &mut Self {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("lb-agent exited with {status} before it was ready:\n{}", self.log_text());
            }
            if self
                .try_get("/readyz")
                .is_some_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
            {
                return self;
            }
            if Instant::now() > deadline {
                panic!("lb-agent not ready after {timeout:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The body of `/metrics`.
    pub fn metrics(&self) -> String {
        let response =
            self.try_get("/metrics").unwrap_or_else(|| panic!("GET /metrics failed:\n{}", self.log_text()));
        response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
    }

    /// One sample from `/metrics`, 0 when absent.
    pub fn metric(&self, sample: &str) -> f64 {
        crate::metric(&self.metrics(), sample).unwrap_or(0.0)
    }

    /// `lbagent_vrrp_state` of IPv4 instance `vrid` of `group` in `state`: 1 or 0.
    pub fn vrrp_state(&self, group: &str, vrid: u8, state: &str) -> f64 {
        self.metric(&format!(
            r#"lbagent_vrrp_state{{group="{group}",vrid="{vrid}",family="ipv4",state="{state}"}}"#
        ))
    }

    /// The transitions of IPv4 instance `vrid` of `group` between master and backup, both ways.
    pub fn vrrp_transitions(&self, group: &str, vrid: u8) -> f64 {
        [("master", "backup"), ("backup", "master")]
            .iter()
            .map(|(from, to)| {
                self.metric(&format!(
                    r#"lbagent_vrrp_transitions_total{{group="{group}",vrid="{vrid}",family="ipv4",from="{from}",to="{to}"}}"#
                ))
            })
            .sum()
    }

    /// Polls `/metrics` until `sample` equals `value`.
    pub fn wait_metric(&self, sample: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.metric(sample) != value {
            if Instant::now() > deadline {
                panic!(
                    "{sample} is {} after 5 s, expected {value}:\n{}",
                    self.metric(sample),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A GET against the agent's HTTP endpoint: the raw response, or `None` if it failed.
    pub fn try_get(&self, path: &str) -> Option<String> {
        self.request("GET", path, "")
    }

    /// Any request to the agent's HTTP endpoint: the raw response, or `None` if it failed.
    pub fn request(&self, method: &str, path: &str, body: &str) -> Option<String> {
        let (method, path, body) = (method.to_owned(), path.to_owned(), body.to_owned());
        crate::netns::run_in(&self.ns_name, move || {
            let mut stream =
                TcpStream::connect_timeout(&AGENT_LISTEN.parse().unwrap(), Duration::from_secs(1)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            write!(
                stream,
                "{method} {path} HTTP/1.0\r\nHost: lab\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .ok()?;
            let mut response = String::new();
            stream.read_to_string(&mut response).ok()?;
            Some(response)
        })
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill with a pid we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for the agent to exit, panicking after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                panic!("lb-agent still running after {timeout:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGUSR2, an upgrade in place: waits (10 s at most) until the agent, executing its binary
    /// again in the same process, runs and is ready once more. `during` is called each poll
    /// (e.g. to check that something holds throughout).
    pub fn restart_in_place(&mut self, mut during: impl FnMut()) {
        let started = self.log_text().matches(RUNNING).count();
        self.signal(libc::SIGUSR2);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.log_text().matches(RUNNING).count() == started {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "lb-agent exited with {status} instead of executing itself again:\n{}",
                    self.log_text()
                );
            }
            assert!(Instant::now() < deadline, "no new image ran after SIGUSR2:\n{}", self.log_text());
            during();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_ready();
    }

    /// SIGKILL: no resignation, no cleanup (the crash case).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
