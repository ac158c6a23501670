//! The routed-fabric lab: a ToR router on the nodes' segment running FRR (BGP with ECMP over L4
//! hashes, BFD at 100 ms × 3), a client on a subnet of its own behind it, and FRR on every node,
//! redistributing the kernel routes lb-agent makes for the VIPs it serves.
//!
//! FRR runs per namespace as these machines allow: `zebra`, `bfdd` and `bgpd` started with
//! `-N <namespace>` (their own path space under /var/run/frr), configured by `vtysh -N -f`.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{Host, Netns, cluster::ServiceLab, format_mac};

/// The ToR's address on the nodes' segment, and its AS.
pub const TOR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const TOR_AS: u32 = 65000;
/// Every node's AS (one AS for the nodes: their paths are equal, so the ToR multipaths them).
pub const NODE_AS: u32 = 65001;
/// The client's subnet behind the ToR, and its address there.
pub const FAR_SUBNET: &str = "10.99.0.0/24";
pub const FAR_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
/// The VIP ranges the nodes' FRR redistributes.
pub const VIP_PREFIX: &str = "198.51.100.0/24";
pub const VIP6_PREFIX: &str = "2001:db8:6::/48";
/// The ToR's global IPv6 address on the segment ([`Host::global6`] of .1), and the client's
/// subnet and address behind it.
pub const TOR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
pub const FAR_SUBNET6: &str = "2001:db8:99::/64";
pub const FAR_CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 2);

/// FRR's daemons in one namespace; dropping it stops them.
pub struct Frr {
    name: String,
}

impl Frr {
    /// Starts zebra, bfdd and bgpd in `ns` (FRR's datacenter defaults) and loads `config`.
    pub fn start(ns: &Netns, config: &str) -> Frr {
        let name = ns.name().to_owned();
        let frr = Frr { name: name.clone() };
        for dir in [frr.run_dir(), PathBuf::from(format!("/etc/frr/{name}"))] {
            std::fs::create_dir_all(&dir).expect("making FRR's directories");
            ns.run_cmd(&["chown", "frr:frr", dir.to_str().expect("UTF-8")]);
        }
        // vtysh reads it if present and complains if not.
        let _ = std::fs::write(format!("/etc/frr/{name}/vtysh.conf"), "");
        for daemon in ["zebra", "bfdd", "bgpd"] {
            let status = ns
                .command(&[&format!("/usr/lib/frr/{daemon}"), "-N", &name, "-d", "-F", "datacenter"])
                .stderr(std::process::Stdio::null())
                .status()
                .expect("starting an FRR daemon");
            assert!(status.success(), "{daemon} did not start in {name}");
        }
        let path = frr.run_dir().join("lab.conf");
        std::fs::write(&path, config).expect("writing FRR's config");
        // The daemons take a moment to open their vty sockets.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = std::process::Command::new("vtysh")
                .args(["-N", &name, "-f", path.to_str().expect("UTF-8")])
                .output()
                .expect("running vtysh");
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "vtysh -f in {name}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        frr
    }

    fn run_dir(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/frr/{}", self.name))
    }

    /// A vtysh command's output.
    pub fn vtysh(&self, command: &str) -> String {
        let out = std::process::Command::new("vtysh")
            .args(["-N", &self.name, "-c", command])
            .output()
            .expect("running vtysh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Frr {
    /// Stops the daemons as a container runtime stops the FRR sidecar: SIGTERM, so that bgpd
    /// ends its sessions gracefully (with graceful restart, the ToR keeps this node's routes).
    /// Waits (10 s at most) until they have exited.
    pub fn stop(self) {
        let pids = self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: signal 0 only checks that the process exists.
        while pids.iter().any(|pid| unsafe { libc::kill(*pid, 0) } == 0) {
            assert!(Instant::now() < deadline, "FRR's daemons in {} did not stop on SIGTERM", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
        // Their pids may be another process's by now: dropping must not signal them.
        for daemon in ["bgpd", "bfdd", "zebra"] {
            let _ = std::fs::remove_file(self.run_dir().join(format!("{daemon}.pid")));
        }
    }

    /// Sends `signal` to each daemon still running; their pids.
    fn signal(&self, signal: libc::c_int) -> Vec<i32> {
        let mut pids = Vec::new();
        for daemon in ["bgpd", "bfdd", "zebra"] {
            let pid_file = self.run_dir().join(format!("{daemon}.pid"));
            if let Some(pid) =
                std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok())
            {
                // SAFETY: a plain kill(2) of a daemon this lab started.
                unsafe { libc::kill(pid, signal) };
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(self.run_dir());
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{}", self.name));
    }
}

/// The wait in front of FRR's start in the FRR sidecar (`deploy/frr/frr-sidecar.yaml`): until
/// a routed VIPs' device a replaced agent left is taken over by the next one. Read from the
/// manifest, so the lab runs what the DaemonSet does.
pub fn sidecar_wait() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/frr/frr-sidecar.yaml");
    let manifest: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("reading the FRR sidecar")).expect("YAML");
    let frr = manifest["spec"]["template"]["spec"]["initContainers"]
        .as_sequence()
        .and_then(|c| c.iter().find(|c| c["name"] == "frr"))
        .expect("the frr sidecar");
    let script =
        frr["command"].as_sequence().and_then(|c| c.last()).and_then(|s| s.as_str()).expect("a command");
    let (wait, start) = script.split_once("; exec ").expect("a wait, then the image's start");
    assert_eq!(start, "/usr/lib/frr/docker-start", "the FRR image's own start after the wait");
    wait.to_owned()
}

impl Fabric {
    /// Whether the FRR sidecar's wait ([`sidecar_wait`]) in `node` would let FRR start within
    /// `within`.
    pub fn frr_may_start(&self, node: usize, within: Duration) -> bool {
        let ns = &self.cluster.lab.nodes[node].ns;
        let seconds = format!("{}", within.as_secs_f64());
        ns.output(&["timeout", &seconds, "sh", "-c", &sidecar_wait()]).status.success()
    }

    /// Stops `node`'s FRR as the kubelet stops the sidecar (see [`Frr::stop`]).
    pub fn stop_node_frr(&mut self, node: usize) {
        self.node_frr[node].take().expect("FRR runs on the node").stop();
    }

    /// Starts `node`'s FRR again, as a new pod's sidecar does once its wait is over.
    pub fn start_node_frr(&mut self, node: usize) {
        let host = &self.cluster.lab.nodes[node];
        self.node_frr[node] = Some(Frr::start(&host.ns, &node_config(host.ip)));
    }
}

/// BFD at 100 ms × 3, as the routed-fabric targets assume.
const BFD_PROFILE: &str = "bfd\n profile fast\n  detect-multiplier 3\n  receive-interval 100\n  transmit-interval 100\n exit\nexit\n";

/// The ToR: eBGP to every node, ECMP over them.
pub fn tor_config(nodes: &[Ipv4Addr]) -> String {
    let mut config = format!(
        "{BFD_PROFILE}router bgp {TOR_AS}\n bgp router-id {TOR}\n no bgp ebgp-requires-policy\n \
         neighbor NODES peer-group\n neighbor NODES remote-as {NODE_AS}\n neighbor NODES bfd profile fast\n"
    );
    for node in nodes {
        config.push_str(&format!(" neighbor {node} peer-group NODES\n"));
    }
    for family in ["ipv4", "ipv6"] {
        config.push_str(&format!(" address-family {family} unicast\n  neighbor NODES activate\n  maximum-paths 16\n exit-address-family\n"));
    }
    config.push_str("exit\n");
    config
}

/// A node: eBGP to the ToR, redistributing lb-agent's VIP routes (kernel routes in the VIP range).
/// IPv6 routes travel over the IPv4 session (MP-BGP), with the node's global and link-local
/// addresses on the segment as their next hops. As `deploy/frr/frr.conf`: graceful restart
/// with the forwarding state kept, so the ToR keeps the routes while a replaced agent's pod
/// and its FRR restart (the ToR's restart timer: [`GRACEFUL_RESTART_TIME`]); BFD for the ToR's
/// detection only (a configured peer, not BGP's: see that file); the ToR's address bound to
/// its peer group last, so the session opens with every family and policy in place.
pub fn node_config(node: Ipv4Addr) -> String {
    format!(
        "ip prefix-list LB-VIPS seq 5 permit {VIP_PREFIX} ge 32\nroute-map LB-VIPS permit 10\n \
         match ip address prefix-list LB-VIPS\nexit\n\
         ipv6 prefix-list LB-VIPS6 seq 5 permit {VIP6_PREFIX} ge 128\n\
         route-map LB-VIPS6 permit 10\n match ipv6 address prefix-list LB-VIPS6\nexit\n\
         {BFD_PROFILE}bfd\n peer {TOR}\n  profile fast\n exit\nexit\n\
         router bgp {NODE_AS}\n bgp router-id {node}\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n \
         bgp graceful-restart\n bgp graceful-restart preserve-fw-state\n \
         bgp graceful-restart restart-time {restart}\n \
         neighbor TOR peer-group\n neighbor TOR remote-as {TOR_AS}\n \
         address-family ipv4 unicast\n  redistribute kernel route-map LB-VIPS\n  neighbor TOR activate\n exit-address-family\n \
         address-family ipv6 unicast\n  redistribute kernel route-map LB-VIPS6\n  neighbor TOR activate\n exit-address-family\n \
         neighbor {TOR} peer-group TOR\nexit\n",
        restart = GRACEFUL_RESTART_TIME.as_secs(),
    )
}

/// The nodes' graceful-restart time: how long the ToR keeps the routes of a node whose BGP
/// session ended gracefully (its FRR stopped) and has not come back.
pub const GRACEFUL_RESTART_TIME: Duration = Duration::from_secs(8);

/// What the ToR runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorDaemon {
    Frr,
    /// BIRD 2, so nothing rests on FRR-to-FRR quirks.
    Bird,
}

/// The ToR as BIRD 2: eBGP to every node with BFD, routes of equal preference merged into one
/// multipath kernel route. A session BFD took down is retried after a second, not BIRD's
/// default minute (a node's BFD comes up a moment after its BGP).
pub fn bird_config(nodes: &[Ipv4Addr]) -> String {
    let mut config = format!(
        "router id {TOR};\nprotocol device {{}}\n\
         protocol kernel k4 {{ ipv4 {{ import none; export all; }}; merge paths on limit 16; }}\n\
         protocol kernel k6 {{ ipv6 {{ import none; export all; }}; merge paths on limit 16; }}\n\
         protocol bfd {{ interface \"{iface}\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }}; }}\n\
         template bgp nodes {{\n  local {TOR} as {TOR_AS};\n  bfd on;\n  \
         connect delay time 1;\n  error wait time 1, 10;\n  ipv4 {{ import all; export none; }};\n  \
         ipv6 {{ import all; export none; }};\n}}\n",
        iface = Host::IFACE
    );
    for (i, node) in nodes.iter().enumerate() {
        config.push_str(&format!("protocol bgp n{i} from nodes {{ neighbor {node} as {NODE_AS}; }}\n"));
    }
    config
}

/// Starts BIRD in `ns` with [`bird_config`], its files under `dir`.
fn start_bird(ns: &Netns, dir: &std::path::Path, nodes: &[Ipv4Addr]) -> (crate::Process, PathBuf) {
    std::fs::create_dir_all(dir).expect("making BIRD's directory");
    let config = dir.join("bird.conf");
    std::fs::write(&config, bird_config(nodes)).expect("writing BIRD's config");
    let socket = dir.join("bird.ctl");
    let check = ns.output(&["bird", "-p", "-c", config.to_str().expect("UTF-8")]);
    assert!(check.status.success(), "BIRD's config: {}", String::from_utf8_lossy(&check.stderr));
    let path = |p: &PathBuf| p.to_str().expect("UTF-8").to_owned();
    let process = crate::spawn_in(ns, &["bird", "-f", "-c", &path(&config), "-s", &path(&socket)]);
    (process, socket)
}

/// A [`ServiceLab`] behind a ToR: FRR on the ToR and on every node, a client beyond the ToR.
/// Field order is drop order: the daemons before the namespaces they run in.
pub struct Fabric {
    pub node_frr: Vec<Option<Frr>>,
    /// The ToR's routing daemon: FRR, or BIRD 2 (with its control socket).
    pub tor_frr: Option<Frr>,
    tor_bird: Option<(crate::Process, PathBuf)>,
    /// The client beyond the ToR.
    pub far: Host,
    pub tor: Host,
    pub cluster: ServiceLab,
}

impl Fabric {
    /// Wires a ToR into `cluster`'s segment and a client behind it; starts FRR on the ToR and
    /// every node. Agents are the caller's.
    pub fn new(cluster: ServiceLab) -> Fabric {
        Self::with_tor(cluster, TorDaemon::Frr)
    }

    /// As [`Fabric::new`], the ToR running `daemon`.
    pub fn with_tor(cluster: ServiceLab, daemon: TorDaemon) -> Fabric {
        let lab = &cluster.lab;
        let tor = crate::plug(&lab.switch, &lab.id, "rt", TOR, [0x02, 0x1b, 0, 0, 0, 0x01]);
        let far_ns = Netns::create(format!("{}-far", lab.id));
        tor.ns.run_cmd(&[
            "ip",
            "link",
            "add",
            "far0",
            "type",
            "veth",
            "peer",
            "name",
            Host::IFACE,
            "netns",
            far_ns.name(),
        ]);
        tor.ns.run_cmd(&["ip", "addr", "add", "10.99.0.1/24", "dev", "far0"]);
        tor.ns.run_cmd(&["ip", "link", "set", "far0", "up"]);
        for key in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=0",
        ] {
            tor.ns.run_cmd(&["sysctl", "-qw", key]);
        }
        let far_mac = [0x02, 0x1b, 0x99, 0, 0, 0x02];
        far_ns.run_cmd(&["ip", "link", "set", "lo", "up"]);
        far_ns.run_cmd(&["ip", "link", "set", Host::IFACE, "address", &format_mac(&far_mac), "up"]);
        far_ns.run_cmd(&["ip", "addr", "add", &format!("{FAR_CLIENT}/24"), "dev", Host::IFACE]);
        far_ns.run_cmd(&["ip", "route", "add", "default", "via", "10.99.0.1"]);
        // Checksums in software, as a NIC would put them on the wire (XDP sees the frame).
        far_ns.run_cmd(&["ethtool", "-K", Host::IFACE, "tx", "off"]);
        tor.ns.run_cmd(&["ethtool", "-K", Host::IFACE, "tx", "off"]);
        let far =
            Host { name: "far".into(), ns: far_ns, ip: FAR_CLIENT, mac: far_mac, switch_port: String::new() };
        for node in &lab.nodes {
            node.ns.run_cmd(&["ip", "route", "add", FAR_SUBNET, "via", &TOR.to_string()]);
        }
        if lab.pods.iter().any(|p| p.ip6.is_some()) {
            wire_ipv6(&tor, &far, lab);
        }
        let addresses: Vec<Ipv4Addr> = lab.nodes.iter().map(|n| n.ip).collect();
        let (tor_frr, tor_bird) = match daemon {
            TorDaemon::Frr => (Some(Frr::start(&tor.ns, &tor_config(&addresses))), None),
            TorDaemon::Bird => (None, Some(start_bird(&tor.ns, &lab.path("bird"), &addresses))),
        };
        let node_frr = lab.nodes.iter().map(|n| Some(Frr::start(&n.ns, &node_config(n.ip)))).collect();
        Fabric { node_frr, tor_frr, tor_bird, far, tor, cluster }
    }

    /// Hard loss of `node` as a fabric sees it: every frame to or from its switch port is
    /// dropped (nftables' bridge family), while every link keeps its carrier, so only BFD (or
    /// BGP's hold timer) notices. Taking the port down instead would also flush the switch's
    /// entry for the node's MAC, and the flooded frames would reach the other nodes, whose XDP
    /// would serve them: no loss to notice.
    pub fn fail_hard(&self, node: usize) {
        let switch = &self.cluster.lab.switch;
        let port = &self.cluster.lab.nodes[node].switch_port;
        switch.run_cmd(&["nft", "add", "table", "bridge", "lab"]);
        switch.run_cmd(&[
            "nft",
            "add",
            "chain",
            "bridge",
            "lab",
            "forward",
            "{ type filter hook forward priority 0; }",
        ]);
        for direction in ["oifname", "iifname"] {
            let out =
                switch.output(&["nft", "add", "rule", "bridge", "lab", "forward", direction, port, "drop"]);
            assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// A show command's output from the ToR's daemon: `frr` for FRR's vtysh, `bird` for birdc.
    pub fn tor_show(&self, frr: &str, bird: &str) -> String {
        if let Some(tor) = &self.tor_frr {
            return tor.vtysh(frr);
        }
        let Some((_, socket)) = &self.tor_bird else { return String::new() };
        let out = std::process::Command::new("birdc")
            .args(["-s", socket.to_str().expect("UTF-8"), bird])
            .output()
            .expect("running birdc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The next hops the ToR's kernel forwards `vip` to (none when it has no route).
    pub fn next_hops(&self, vip: IpAddr) -> BTreeSet<IpAddr> {
        let family = if vip.is_ipv6() { "-6" } else { "-4" };
        let out = self.tor.ns.output(&["ip", family, "-j", "route", "show", &vip.to_string()]);
        let routes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let mut hops = BTreeSet::new();
        for route in routes.as_array().into_iter().flatten() {
            let gateways = route["nexthops"].as_array().cloned().unwrap_or_else(|| vec![route.clone()]);
            hops.extend(gateways.iter().filter_map(|g| g["gateway"].as_str()?.parse::<IpAddr>().ok()));
        }
        hops
    }

    /// Polls until the ToR's BFD sessions to every node are up: only then does BFD notice a
    /// node's loss (before, BGP's hold timer would, in seconds).
    pub fn wait_bfd_up(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let peers = self.tor_show("show bfd peers brief", "show bfd sessions");
            let up = peers
                .lines()
                .filter(|l| l.trim_end().ends_with(" up") || l.split_whitespace().nth(2) == Some("Up"))
                .count();
            if up == self.cluster.lab.nodes.len() {
                return;
            }
            assert!(started.elapsed() < within, "BFD sessions not all up after {within:?}:\n{peers}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes the ToR forwards `vip` to, by index: an IPv6 next hop is a node's global or
    /// link-local address (FRR prefers the link-local one on a shared segment).
    pub fn next_hop_nodes(&self, vip: IpAddr) -> BTreeSet<usize> {
        let nodes = &self.cluster.lab.nodes;
        self.next_hops(vip)
            .into_iter()
            .filter_map(|hop| {
                nodes.iter().position(|n| {
                    hop == IpAddr::V4(n.ip)
                        || hop == IpAddr::V6(n.global6())
                        || hop == IpAddr::V6(n.link_local())
                })
            })
            .collect()
    }

    /// Starts recording every change to the ToR's IPv4 routes (`ip monitor route`).
    pub fn watch_routes(&self) -> RouteWatch {
        let monitor = self
            .tor
            .ns
            .command(&["ip", "-4", "monitor", "route"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("running ip monitor");
        RouteWatch { monitor }
    }

    /// Polls until the ToR forwards `vip` to exactly `nodes`; how long that took.
    pub fn wait_next_hops(&self, vip: IpAddr, nodes: &[usize], within: Duration) -> Duration {
        let want: BTreeSet<usize> = nodes.iter().copied().collect();
        let started = Instant::now();
        loop {
            let hops = self.next_hop_nodes(vip);
            if hops == want && self.next_hops(vip).len() == want.len() {
                return started.elapsed();
            }
            if started.elapsed() > within {
                panic!(
                    "the ToR forwards {vip} to nodes {hops:?} ({:?}), not {want:?}, after {within:?}\nToR BGP:\n{}\n{}",
                    self.next_hops(vip),
                    self.tor_show("show bgp summary", "show protocols")
                        + &self
                            .tor_frr
                            .as_ref()
                            .map(|f| f.vtysh(&format!("show bgp ipv6 unicast {vip}/128")))
                            .unwrap_or_default()
                        + &String::from_utf8_lossy(&self.tor.ns.output(&["ip", "-6", "addr"]).stdout)
                        + &self.node_frr[0]
                            .as_ref()
                            .map(|f| f.vtysh("show bgp ipv6 unicast") + &f.vtysh("show ipv6 route"))
                            .unwrap_or_default()
                        + &String::from_utf8_lossy(
                            &self.cluster.lab.nodes[0].ns.output(&["ip", "-6", "route"]).stdout
                        ),
                    self.cluster.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// IPv6 through the ToR, for a lab with IPv6 (see [`crate::Lab::enable_ipv6`]): the ToR's
/// addresses on the segment and towards the client, forwarding with L4 multipath hashing, and
/// the nodes' route back to the client.
fn wire_ipv6(tor: &Host, far: &Host, lab: &crate::Lab) {
    for (host, dev) in [(tor, Host::IFACE), (tor, "far0"), (far, Host::IFACE)] {
        for key in ["all", dev] {
            host.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=0")]);
        }
        host.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{dev}.accept_dad=0")]);
    }
    for key in ["net.ipv6.conf.all.forwarding=1", "net.ipv6.fib_multipath_hash_policy=1"] {
        tor.ns.run_cmd(&["sysctl", "-qw", key]);
    }
    tor.ns.run_cmd(&["ip", "-6", "addr", "add", &format!("{TOR6}/64"), "dev", Host::IFACE, "nodad"]);
    tor.ns.run_cmd(&["ip", "-6", "addr", "add", "2001:db8:99::1/64", "dev", "far0", "nodad"]);
    far.ns.run_cmd(&["ip", "-6", "addr", "add", &format!("{FAR_CLIENT6}/64"), "dev", Host::IFACE, "nodad"]);
    far.ns.run_cmd(&["ip", "-6", "route", "add", "default", "via", "2001:db8:99::1"]);
    for node in &lab.nodes {
        node.ns.run_cmd(&["ip", "-6", "route", "add", FAR_SUBNET6, "via", &TOR6.to_string()]);
    }
}

/// Changes to the ToR's routes as they happen, from [`Fabric::watch_routes`].
pub struct RouteWatch {
    monitor: std::process::Child,
}

impl RouteWatch {
    /// Stops watching; the changes seen to `vip`'s route, each with its next hops.
    pub fn changes_to(self, vip: Ipv4Addr) -> Vec<String> {
        // SAFETY: a signal to this watch's own child.
        unsafe { libc::kill(self.monitor.id() as i32, libc::SIGTERM) };
        let out = self.monitor.wait_with_output().expect("ip monitor");
        let vip = format!("{vip} ");
        // A multipath route's next hops follow its line, indented: one change each.
        let mut changes: Vec<String> = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match changes.last_mut() {
                Some(change) if line.starts_with(char::is_whitespace) => change.push_str(line),
                _ => changes.push(line.to_owned()),
            }
        }
        changes.retain(|c| c.contains(&vip));
        changes
    }
}
