use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use lb_agent::{agent, config::Config, routes::keeper::Handoff};
use tracing::error;

#[derive(Parser)]
#[command(version, about = "VRRP-driven XDP load balancer for bare-metal Kubernetes")]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LB_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter, in tracing's EnvFilter syntax (e.g. `info`, `lb_agent=debug`).
    #[arg(long, global = true, default_value = "info", env = "LB_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent from a standalone YAML config (no Kubernetes needed).
    Run {
        #[arg(long, short)]
        config: PathBuf,
        /// This node's name in the config's groups (default: the config's `node`, then
        /// $NODE_NAME, then the host name).
        #[arg(long)]
        node: Option<String>,
        /// Overrides the config's `dataplane.pinPath` (several agents on one host, as in the lab).
        #[arg(long, env = "LB_PIN_PATH")]
        pin_path: Option<PathBuf>,
        /// Overrides the config's `adminSocket`.
        #[arg(long, env = "LB_ADMIN_SOCKET")]
        admin_socket: Option<PathBuf>,
        /// Take groups and services from the cluster (LoadBalancerGroups, Services,
        /// EndpointSlices, Nodes) instead of the config file, which then holds only the
        /// agent's own settings.
        #[arg(long)]
        kubernetes: bool,
        /// With --kubernetes: the namespace of the leader Lease (the agent's own).
        #[arg(long, env = "POD_NAMESPACE", default_value = "lb-agent")]
        namespace: String,
        /// With --kubernetes: the agent's own pod, read at SIGTERM to tell a DaemonSet roll
        /// (routed VIPs left to the next agent) from a removal (withdrawn). Unset: every stop is
        /// a removal.
        #[arg(long, env = "POD_NAME")]
        pod: Option<String>,
    },
    /// Show what the local agent owns and forwards: each group's VRRP instances (state,
    /// master, advert age, VIPs) and the backends with their counters.
    Status {
        /// The agent's admin socket (`adminSocket`).
        #[arg(long, default_value = lb_agent::config::DEFAULT_ADMIN_SOCKET, env = "LB_ADMIN_SOCKET")]
        socket: PathBuf,
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print the local agent's log filter, or set it (tracing's EnvFilter syntax, e.g.
    /// `info,lb_agent::vrrp=debug`) until the agent restarts.
    LogLevel {
        /// The agent's admin socket (`adminSocket`).
        #[arg(long, default_value = lb_agent::config::DEFAULT_ADMIN_SOCKET, env = "LB_ADMIN_SOCKET")]
        socket: PathBuf,
        filter: Option<String>,
    },
    /// Print the LoadBalancerGroup CRD (the YAML in deploy/crds/).
    Crd,
    /// Detach the data plane and delete its pinned maps: for uninstalling, after the agent
    /// has stopped (it leaves forwarding running on exit by default).
    Cleanup {
        /// The pin directory, as `dataplane.pinPath`.
        #[arg(long, default_value = "/sys/fs/bpf/lb-agent")]
        pin_path: PathBuf,
    },
    /// Validate a config file and exit: 0 when valid, 64 with the offending field otherwise.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The agent's own: holds the routed VIPs' device while the agent is heard from on
    /// standard input (see `routes::keeper`).
    #[command(hide = true)]
    KeepRoutes {
        #[arg(long)]
        device: String,
        #[arg(long, value_parser = humantime::parse_duration)]
        hold: std::time::Duration,
        /// How long to wait for the agent after it said it is executing itself again (a keeper
        /// of an earlier build, which lacks the flag, is never told so).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
        restart_window: std::time::Duration,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// glibc's malloc raises its mmap threshold to the size of each large block freed (up to
/// 32 MiB), so after the first large transient buffer (a /metrics scrape at 100,000 backends
/// is ~30 MB of text; a relist's pages) every later one comes from the heap, whose top is then
/// rarely free to give back (`cargo xtask bench control` at 10,000 Services: RSS 60–100 MiB
/// over the live heap; ~20 MiB less with this). A fixed threshold keeps such buffers mapped,
/// and unmapped when freed.
#[cfg(target_env = "gnu")]
fn return_large_buffers() {
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
}

#[cfg(not(target_env = "gnu"))]
fn return_large_buffers() {}

fn main() -> ExitCode {
    return_large_buffers();
    // One TLS provider for the Kubernetes client, whatever else the build enabled.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log);
    let result = match cli.command {
        Command::Run { config, node, pin_path, admin_socket, kubernetes, namespace, pod } => {
            let source = kubernetes.then_some(agent::KubernetesSource { namespace, pod });
            match run_agent(config, node, agent::Overrides { pin_path, admin_socket }, source) {
                Ok(agent::Exit::Stopped) => Ok(()),
                Ok(agent::Exit::Restart(handoff)) => Err(execute_again(handoff)),
                Err(e) => Err(e),
            }
        }
        Command::LogLevel { socket, filter } => {
            let answer = match &filter {
                Some(filter) => lb_agent::admin::request(&socket, "PUT", "/loglevel", filter),
                None => lb_agent::admin::get(&socket, "/loglevel"),
            };
            match answer {
                Ok(current) => {
                    print!("{current}");
                    return ExitCode::SUCCESS;
                }
                Err(e) => {
                    eprintln!("lb-agent log-level: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        Command::Status { socket, output } => match lb_agent::status::fetch(&socket) {
            Ok(status) => {
                match output {
                    Output::Table => print!("{}", lb_agent::status::render(&status)),
                    Output::Json => {
                        println!("{}", serde_json::to_string_pretty(&status).expect("serialisable"))
                    }
                }
                Ok(())
            }
            Err(e) => {
                eprintln!("lb-agent status: {e}");
                return ExitCode::from(1);
            }
        },
        Command::Crd => {
            print!("{}", lb_agent::k8s::crd::crd_yaml());
            Ok(())
        }
        Command::Cleanup { pin_path } => lb_agent::dataplane::remove_pins(&pin_path)
            .map(|()| println!("removed {}: the data plane is detached", pin_path.display())),
        Command::CheckConfig { config } => {
            Config::load(&config).map(|_| println!("{}: valid", config.display()))
        }
        Command::KeepRoutes { device, hold, restart_window } => {
            lb_agent::routes::keeper::keep(&device, hold, restart_window)
                .map_err(|e| lb_agent::error::Error::io(format!("the routes' keeper of {device}"), e))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{}", lb_agent::error::with_causes(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// `lb-agent run`: the VRRP loop on this thread alone; everything else on two workers beside it
/// (see `agent::run`).
fn run_agent(
    config: std::path::PathBuf,
    node: Option<String>,
    overrides: agent::Overrides,
    source: Option<agent::KubernetesSource>,
) -> lb_agent::error::Result<agent::Exit> {
    agent::hold_signals();
    // Before any thread: it takes the variable out of the environment.
    let adopted = Handoff::take_from_env();
    let runtimes = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lb-agent-worker")
        .enable_all()
        .build()
        .and_then(|background| {
            Ok((tokio::runtime::Builder::new_current_thread().enable_all().build()?, background))
        })
        .map_err(|e| lb_agent::error::Error::io("starting the tokio runtime", e));
    runtimes.and_then(|(vrrp_loop, background)| {
        let run = agent::run(config, node, overrides, source, background.handle().clone(), adopted);
        let result = vrrp_loop.block_on(run);
        background.shutdown_timeout(std::time::Duration::from_secs(1));
        result
    })
}

/// SIGUSR2: this process executes its binary again, by the path it started from, so an upgrade
/// that replaced the file runs the new build; same arguments, the routes' keeper handed over.
/// Returns only if that failed (the keeper then ends with this process, and its routes).
fn execute_again(handoff: Option<Handoff>) -> lb_agent::error::Error {
    use std::os::unix::process::CommandExt;
    let binary = match std::env::current_exe() {
        // Replaced since it started: the link names the old file " (deleted)"; the path is the new one's.
        Ok(path) => PathBuf::from(path.to_string_lossy().trim_end_matches(" (deleted)")),
        Err(e) => return lb_agent::error::Error::io("finding this binary to execute it again", e),
    };
    let mut command = std::process::Command::new(&binary);
    command.args(std::env::args_os().skip(1));
    if let Some(handoff) = handoff {
        let (name, value) = handoff.env();
        command.env(name, value);
    }
    let error = command.exec();
    lb_agent::error::Error::io(format!("executing {} again", binary.display()), error)
}

fn init_logging(format: LogFormat, filter: &str) {
    lb_agent::logging::init(matches!(format, LogFormat::Json), std::io::stderr().is_terminal(), filter);
}
