//! The netns lab: a miniature bare-metal L2 segment built from network namespaces.
//!
//! ```text
//!            switch namespace (bridge br0)
//!        p-n0 ─┐   p-n1 ─┐  …    p-cl ─┐
//!   node n0: eth0   node n1: eth0   client: eth0
//! ```
//!
//! - Names carry the creating process id and a counter, so tests run in parallel.
//! - [`Lab`] tears everything down on drop, including after a panic; namespaces left behind by a
//!   process that died are swept when the next lab starts.
//! - Addresses are from the documentation ranges (192.0.2.0/24 for hosts, 198.51.100.0/24 for
//!   VIPs) and live only inside these namespaces: test traffic never leaves them.

pub mod agent;
pub mod api_server;
pub mod bench;
pub mod cases;
pub mod cluster;
pub mod cluster_api;
pub mod election;
pub mod fabric;
pub mod family;
pub mod fixture;
pub mod freeze;
pub mod katran;
mod netns;
pub mod packet;
pub mod roll;
pub mod scale;
mod segments;
pub mod vlans;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

pub use agent::{Agent, agent_binary};
pub use cluster::{Pod, Session};
pub use netns::Netns;
pub use netns::run_in;

/// Where tests take VIPs from (TEST-NET-2), on-link for the client.
pub const VIP_RANGE: &str = "198.51.100.0/24";
/// The IPv6 VIPs' prefix, on-link for the client (see [`Lab::enable_ipv6`]).
pub const VIP6_RANGE: &str = "2001:db8:6::/64";

/// The segment's prefix: nodes are .10, .11, …; the client is .100.
pub const SEGMENT_PREFIX_LEN: u8 = 24;

/// A host on the segment: a namespace whose `eth0` is plugged into the switch.
pub struct Host {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    /// The host's port on the bridge, in the switch namespace.
    pub switch_port: String,
}

impl Host {
    pub const IFACE: &'static str = "eth0";

    /// Runs a command here and reports whether it succeeded.
    pub fn output_ok(&self, argv: &[&str]) -> bool {
        self.ns.output(argv).status.success()
    }

    /// Starts a long-running command in this host's namespace; it is killed when the guard drops.
    pub fn spawn(&self, argv: &[&str]) -> Process {
        spawn_in(&self.ns, argv)
    }

    /// This host's IPv6 link-local address once [`Lab::enable_ipv6`] ran: fe80:: and the last
    /// octet of its IPv4 address (fe80::a for 192.0.2.10).
    pub fn link_local(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, u16::from(self.ip.octets()[3]))
    }

    /// This host's global IPv6 address on the segment once [`Lab::enable_ipv6`] ran.
    pub fn global6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, u16::from(self.ip.octets()[3]))
    }

    /// Polls (5 s) until `vip` is answered here, by ARP, from `mac` alone; `context` (the agents'
    /// logs, say) goes into the failure's message.
    pub fn wait_answered_by(&self, vip: Ipv4Addr, mac: [u8; 6], context: impl Fn() -> String) {
        let expected = format_mac(&mac);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let replies = self.arping(vip, 1);
            if replies == [expected.as_str()] {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{vip} from {}: {replies:?}, not {expected}\n{}",
                self.name,
                context()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Who answers Neighbor Discovery for `target`, by ndisc6: the first target link-layer
    /// address (lower case), or `None` when nobody did.
    pub fn ndisc(&self, target: Ipv6Addr) -> Option<String> {
        self.ndisc_answers(target, &["-1", "-r", "2"]).into_iter().next()
    }

    /// Every link-layer address that answers Neighbor Discovery for `target` within one wait
    /// (ndisc6 `-m`: duplicate advertisements too, lower case, in order of arrival): two nodes
    /// answering at once show as two.
    pub fn ndisc_all(&self, target: Ipv6Addr) -> Vec<String> {
        self.ndisc_answers(target, &["-m", "-r", "1"])
    }

    fn ndisc_answers(&self, target: Ipv6Addr, how: &[&str]) -> Vec<String> {
        let target = target.to_string();
        let args: Vec<&str> = ["ndisc6"]
            .into_iter()
            .chain(how.iter().copied())
            .chain(["-w", "300", &target, Self::IFACE])
            .collect();
        let out = self.ns.output(&args);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Target link-layer address:"))
            .map(|mac| mac.trim().to_lowercase())
            .collect()
    }

    /// A TCP server on `port` over IPv6 only that answers every connection with this host's
    /// name (beside [`Host::serve_name`] on IPv4).
    pub fn serve_name6(&self, port: u16) -> Process {
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_INET6)\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,1)\ns.bind(('::',{port}))\ns.listen(64)\nwhile True:\n \
             c,_=s.accept()\n c.sendall(b'{}')\n c.close()\n",
            self.name
        );
        self.spawn(&["python3", "-c", &script])
    }

    /// A TCP server on `port` that answers every connection with this host's name.
    pub fn serve_name(&self, port: u16) -> Process {
        let script = format!(
            "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('0.0.0.0',{port}))\ns.listen(64)\nwhile True:\n c,_=s.accept()\n c.sendall(b'{}')\n c.close()\n",
            self.name
        );
        self.spawn(&["python3", "-c", &script])
    }

    /// Connects to `addr:port` and returns what the server says (empty on failure).
    pub fn tcp_read(&self, addr: impl Into<std::net::IpAddr>, port: u16) -> String {
        let addr = addr.into();
        crate::netns::run_in(self.ns.name(), move || {
            use std::io::Read;
            let target = std::net::SocketAddr::from((addr, port));
            let Ok(mut stream) =
                std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_millis(500))
            else {
                return String::new();
            };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(500)));
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            text
        })
    }

    /// Starts `count` pings to `target`, one every 5 ms, in the background; join the handle
    /// for ping's output (its summary line says how many replies came back).
    pub fn ping_every_5ms(
        &self,
        target: Ipv4Addr,
        count: u32,
    ) -> std::thread::JoinHandle<std::process::Output> {
        self.ping_every(target.into(), "0.005", count)
    }

    /// As [`Host::ping_every_5ms`], to an address of either family every `interval` seconds
    /// (as ping's `-i` takes it).
    pub fn ping_every(
        &self,
        target: std::net::IpAddr,
        interval: &str,
        count: u32,
    ) -> std::thread::JoinHandle<std::process::Output> {
        let interval = interval.to_owned();
        let ns = self.ns.name().to_owned();
        std::thread::spawn(move || {
            std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns,
                    "ping",
                    "-n",
                    "-q",
                    "-i",
                    &interval,
                    "-c",
                    &count.to_string(),
                    "-W",
                    "1",
                ])
                .arg(target.to_string())
                .output()
                .expect("running ping")
        })
    }

    pub fn mac_string(&self) -> String {
        format_mac(&self.mac)
    }

    /// Sends ARP requests for `target` with arping and returns the MAC of every reply, in order.
    pub fn arping(&self, target: Ipv4Addr, count: u32) -> Vec<String> {
        let out = self.ns.output(&[
            "arping",
            "-i",
            Self::IFACE,
            "-c",
            &count.to_string(),
            "-W",
            "0.1",
            "-w",
            "2",
            "-r",
            &target.to_string(),
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_lowercase())
            .filter(|l| !l.is_empty())
            .collect()
    }
}

/// Starts a long-running command in `ns`; it is killed when the guard drops.
pub fn spawn_in(ns: &Netns, argv: &[&str]) -> Process {
    use std::os::unix::process::CommandExt;
    let child = ns
        .command(argv)
        // Its own process group, so daemons that fork helpers (keepalived) die whole.
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {argv:?}: {e}"));
    Process { child }
}

/// A child process that is killed when dropped.
pub struct Process {
    child: std::process::Child,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        // SAFETY: signalling the process group we created.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Lab {
    // Field order is drop order: programs first, then the pods and hosts, then the switch.
    pass_programs: Vec<aya::Ebpf>,
    pub pods: Vec<Pod>,
    pub id: String,
    pub nodes: Vec<Host>,
    pub client: Host,
    pub switch: Netns,
    dir: PathBuf,
    /// [`Lab::enable_ipv6`] ran: pods get IPv6 addresses too.
    ipv6: bool,
}

static LABS: AtomicU32 = AtomicU32::new(0);

impl Lab {
    /// A switch, `nodes` nodes and a client, all up and addressed.
    pub fn new(nodes: usize) -> Lab {
        require_root();
        mount_lab_bpffs();
        netns::sweep_orphans();
        let id = format!("lbt{}x{}", std::process::id(), LABS.fetch_add(1, Ordering::Relaxed));
        let dir = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&dir).expect("creating the lab directory");

        // Each Netns deletes itself on drop, so a panic half-way leaves nothing behind.
        let switch = Netns::create(format!("{id}-sw"));
        switch.run_cmd(&["ip", "link", "add", "br0", "type", "bridge"]);
        switch.run_cmd(&["ip", "link", "set", "br0", "up"]);
        // br_netfilter is built in here: keep bridged frames out of iptables.
        switch.sysctl_if_present("net.bridge.bridge-nf-call-iptables", "0");

        let nodes = (0..nodes)
            .map(|i| {
                let i = u8::try_from(i).expect("fewer than 90 nodes");
                plug(
                    &switch,
                    &id,
                    &format!("n{i}"),
                    Ipv4Addr::new(192, 0, 2, 10 + i),
                    [0x02, 0x1b, 0, 0, 0, 0x10 + i],
                )
            })
            .collect();
        let client = plug(&switch, &id, "cl", Ipv4Addr::new(192, 0, 2, 100), [0x02, 0x1b, 0, 0, 0, 0xcc]);
        // VIPs live on the segment: the client resolves them with ARP, as a host on the VIPs'
        // L2 network would.
        client.ns.run_cmd(&["ip", "route", "add", VIP_RANGE, "dev", Host::IFACE]);
        let lab =
            Lab { pass_programs: Vec::new(), pods: Vec::new(), id, nodes, client, switch, dir, ipv6: false };
        lab.make_nodes_routers();
        lab
    }

    /// Native XDP on a veth only delivers `XDP_TX` frames to a peer that runs NAPI, so the
    /// node's switch port gets a pass-only program.
    pub fn enable_native_xdp(&mut self, node: usize) {
        let port = self.nodes[node].switch_port.clone();
        self.pass_on_switch_port(port);
    }

    /// Keeps `ebpf`'s programs attached while the lab lives.
    pub(crate) fn keep_program(&mut self, ebpf: aya::Ebpf) {
        self.pass_programs.push(ebpf);
    }

    /// A pass-only program on the switch's `port`, for native XDP at its far end.
    pub fn pass_on_switch_port(&mut self, port: String) {
        let ebpf = self.switch.run(move || attach_pass_program(&port));
        self.pass_programs.push(ebpf);
    }

    /// Starts lb-agent on `node` with `config` (YAML).
    pub fn start_agent(&self, node: usize, config: &str) -> Agent {
        let host = &self.nodes[node];
        let path = self.dir.join(format!("{}.yaml", host.name));
        std::fs::write(&path, config).expect("writing the agent config");
        Agent::spawn(&host.ns, path, self.dir.join(format!("{}.log", host.name)), self.pin_path(node))
    }

    /// Starts lb-agent on `node` with extra `run` arguments and environment.
    pub fn start_agent_with(&self, node: usize, config: &str, args: &[&str], env: &[(&str, &str)]) -> Agent {
        self.start_agent_under(node, config, args, env, &[])
    }

    /// As [`Lab::start_agent_with`], started by `command` (see [`Agent::spawn_under`]).
    pub fn start_agent_under(
        &self,
        node: usize,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
        command: &[&str],
    ) -> Agent {
        let host = &self.nodes[node];
        let path = self.dir.join(format!("{}.yaml", host.name));
        std::fs::write(&path, config).expect("writing the agent config");
        Agent::spawn_under(
            &host.ns,
            path,
            self.dir.join(format!("{}.log", host.name)),
            self.pin_path(node),
            args,
            env,
            command,
        )
    }

    /// Another host on the segment (an API server's, say), at `ip` with `mac`.
    pub fn add_host(&self, short: &str, ip: Ipv4Addr, mac: [u8; 6]) -> Host {
        plug(&self.switch, &self.id, short, ip, mac)
    }

    /// Where `node`'s agent pins its data plane (bpffs is shared by every namespace).
    pub fn pin_path(&self, node: usize) -> PathBuf {
        PathBuf::from(BPFFS_LABS).join(&self.id).join(&self.nodes[node].name)
    }

    /// Hard failure, part one: the node's switch port goes down, so nothing it sends (not even
    /// a last advertisement) reaches the segment. Kill its processes afterwards.
    pub fn cut(&self, node: usize) {
        self.switch.run_cmd(&["ip", "link", "set", &self.nodes[node].switch_port, "down"]);
    }

    /// Gives every host the IPv6 addresses of [`Host::link_local`] and [`Host::global6`]
    /// (without DAD, and without the kernel's own link-local, so each host has exactly one),
    /// and the client an on-link route to [`VIP6_RANGE`].
    pub fn enable_ipv6(&mut self) {
        self.ipv6 = true;
        for host in self.nodes.iter().chain([&self.client]) {
            let conf = format!("net.ipv6.conf.{}", Host::IFACE);
            // Without bringing the link down, which would take the lab's routes with it.
            host.ns.run_cmd(&["sysctl", "-qw", &format!("{conf}.addr_gen_mode=1")]);
            // Namespaces start with IPv6 off (see `Netns::create`).
            for key in ["all", Host::IFACE] {
                host.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=0")]);
            }
            host.ns.run_cmd(&["sysctl", "-qw", &format!("{conf}.accept_dad=0")]);
            host.ns.run_cmd(&["ip", "-6", "addr", "flush", "dev", Host::IFACE]);
            for address in [format!("{}/64", host.link_local()), format!("{}/64", host.global6())] {
                host.ns.run_cmd(&["ip", "-6", "addr", "add", &address, "dev", Host::IFACE, "nodad"]);
            }
        }
        self.client.ns.run_cmd(&["ip", "-6", "route", "add", VIP6_RANGE, "dev", Host::IFACE]);
        self.route_pods6();
    }

    /// Plugs a cut node back in.
    pub fn restore(&self, node: usize) {
        self.switch.run_cmd(&["ip", "link", "set", &self.nodes[node].switch_port, "up"]);
    }

    /// Starts keepalived (VRRP only) on `node` with `config`; the guard kills its process group.
    pub fn start_keepalived(&self, node: usize, config: &str) -> Process {
        let conf = self.path(&format!("keepalived-{node}.conf"));
        std::fs::write(&conf, config).expect("writing the keepalived config");
        let pid = self.path(&format!("keepalived-{node}.pid"));
        let vrrp_pid = self.path(&format!("keepalived-vrrp-{node}.pid"));
        let path = |p: &PathBuf| p.to_str().expect("a UTF-8 lab path").to_owned();
        self.nodes[node].spawn(&[
            "keepalived",
            "--dont-fork",
            "--vrrp",
            "-f",
            &path(&conf),
            "-p",
            &path(&pid),
            "-r",
            &path(&vrrp_pid),
        ])
    }

    /// A path inside the lab's scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // Unpinning detaches whatever agents left running; the namespaces go next.
        let _ = std::fs::remove_dir_all(PathBuf::from(BPFFS_LABS).join(&self.id));
    }
}

/// Where lab agents pin, one directory per lab. Not under /sys: `ip netns exec` mounts a
/// fresh sysfs for the namespace, which hides /sys/fs/bpf from the agent.
pub const BPFFS_LABS: &str = "/run/lb-lab-bpffs";

/// Mounts the labs' bpffs once per boot.
fn mount_lab_bpffs() {
    let path = std::path::Path::new(BPFFS_LABS);
    std::fs::create_dir_all(path).expect("creating the lab bpffs mount point");
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(BPFFS_LABS)));
    if !mounted {
        let status = std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf", BPFFS_LABS])
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a bpffs at {BPFFS_LABS}");
    }
}

pub(crate) fn plug(switch: &Netns, lab_id: &str, short: &str, ip: Ipv4Addr, mac: [u8; 6]) -> Host {
    let ns = Netns::create(format!("{lab_id}-{short}"));
    let port = format!("p-{short}");
    switch.run_cmd(&[
        "ip",
        "link",
        "add",
        &port,
        "type",
        "veth",
        "peer",
        "name",
        Host::IFACE,
        "netns",
        ns.name(),
    ]);
    switch.run_cmd(&["ip", "link", "set", &port, "master", "br0", "up"]);
    ns.run_cmd(&["ip", "link", "set", Host::IFACE, "address", &format_mac(&mac), "up"]);
    ns.run_cmd(&["ip", "addr", "add", &format!("{ip}/{SEGMENT_PREFIX_LEN}"), "dev", Host::IFACE]);
    Host { name: short.to_owned(), ns, ip, mac, switch_port: port }
}

fn attach_pass_program(interface: &str) -> aya::Ebpf {
    use aya::programs::{Xdp, XdpMode};
    let mut ebpf = aya::Ebpf::load(lb_agent::dataplane::EMBEDDED_OBJECT).expect("loading the BPF object");
    let program: &mut Xdp = ebpf
        .program_mut(lb_agent::dataplane::PASS_PROGRAM)
        .expect("the pass program is in the object")
        .try_into()
        .expect("the pass program is XDP");
    program.load().expect("loading the pass program");
    program.attach(interface, XdpMode::Driver).expect("attaching the pass program");
    ebpf
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("the netns lab needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF): run the tests as root");
    }
}

/// The value of one sample in Prometheus text, e.g. `lbagent_owned_vips` or
/// `lbagent_arp_replies_total{vip="198.51.100.10"}`.
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The replies sent and received that the summary line of `ping`'s output reports ("N packets
/// transmitted, M received, …").
pub fn ping_counts(ping: &std::process::Output) -> (u64, u64) {
    let output = String::from_utf8_lossy(&ping.stdout);
    let line = output
        .lines()
        .find(|l| l.contains(" packets transmitted"))
        .unwrap_or_else(|| panic!("no summary in ping's output: {output}"));
    let numbers: Vec<u64> =
        line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}
