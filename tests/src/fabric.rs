//! The routed-fabric lab: a ToR router on the nodes' segment running FRR (BGP with ECMP over L4
//! hashes, BFD at 100 ms × 3), a client on a subnet of its own behind it, and FRR on every node,
//! redistributing the kernel routes lb-agent makes for the VIPs it serves.
//!
//! FRR runs per namespace as these machines allow: `zebra`, `bfdd` and `bgpd` started with
//! `-N <namespace>` (their own path space under /var/run/frr), configured by `vtysh -N -f`.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
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
/// The VIP range the nodes' FRR redistributes.
pub const VIP_PREFIX: &str = "198.51.100.0/24";

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

impl Drop for Frr {
    fn drop(&mut self) {
        for daemon in ["bgpd", "bfdd", "zebra"] {
            let pid_file = self.run_dir().join(format!("{daemon}.pid"));
            if let Some(pid) =
                std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok())
            {
                // SAFETY: a plain kill(2) of a daemon this lab started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(self.run_dir());
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{}", self.name));
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
    config.push_str(" address-family ipv4 unicast\n  maximum-paths 16\n exit-address-family\nexit\n");
    config
}

/// A node: eBGP to the ToR, redistributing lb-agent's VIP routes (kernel routes in the VIP range).
pub fn node_config(node: Ipv4Addr) -> String {
    format!(
        "ip prefix-list LB-VIPS seq 5 permit {VIP_PREFIX} ge 32\nroute-map LB-VIPS permit 10\n \
         match ip address prefix-list LB-VIPS\nexit\n{BFD_PROFILE}router bgp {NODE_AS}\n bgp router-id {node}\n \
         no bgp ebgp-requires-policy\n neighbor {TOR} remote-as {TOR_AS}\n neighbor {TOR} bfd profile fast\n \
         address-family ipv4 unicast\n  redistribute kernel route-map LB-VIPS\n exit-address-family\nexit\n"
    )
}

/// A [`ServiceLab`] behind a ToR: FRR on the ToR and on every node, a client beyond the ToR.
/// Field order is drop order: the daemons before the namespaces they run in.
pub struct Fabric {
    pub node_frr: Vec<Option<Frr>>,
    pub tor_frr: Option<Frr>,
    /// The client beyond the ToR.
    pub far: Host,
    pub tor: Host,
    pub cluster: ServiceLab,
}

impl Fabric {
    /// Wires a ToR into `cluster`'s segment and a client behind it; starts FRR on the ToR and
    /// every node. Agents are the caller's.
    pub fn new(cluster: ServiceLab) -> Fabric {
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
        let addresses: Vec<Ipv4Addr> = lab.nodes.iter().map(|n| n.ip).collect();
        let tor_frr = Some(Frr::start(&tor.ns, &tor_config(&addresses)));
        let node_frr = lab.nodes.iter().map(|n| Some(Frr::start(&n.ns, &node_config(n.ip)))).collect();
        Fabric { node_frr, tor_frr, far, tor, cluster }
    }

    /// The next hops the ToR's kernel forwards `vip` to (none when it has no route).
    pub fn next_hops(&self, vip: IpAddr) -> BTreeSet<IpAddr> {
        let out = self.tor.ns.output(&["ip", "-j", "route", "show", &vip.to_string()]);
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
        let tor = self.tor_frr.as_ref().expect("the ToR runs FRR");
        loop {
            let peers = tor.vtysh("show bfd peers brief");
            let up = peers.lines().filter(|l| l.trim_end().ends_with(" up")).count();
            if up == self.cluster.lab.nodes.len() {
                return;
            }
            assert!(started.elapsed() < within, "BFD sessions not all up after {within:?}:\n{peers}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until the ToR forwards `vip` to exactly `nodes`' addresses; how long that took.
    pub fn wait_next_hops(&self, vip: IpAddr, nodes: &[usize], within: Duration) -> Duration {
        let want: BTreeSet<IpAddr> = nodes.iter().map(|i| self.cluster.lab.nodes[*i].ip.into()).collect();
        let started = Instant::now();
        loop {
            let hops = self.next_hops(vip);
            if hops == want {
                return started.elapsed();
            }
            if started.elapsed() > within {
                panic!(
                    "the ToR forwards {vip} to {hops:?}, not {want:?}, after {within:?}\nToR BGP:\n{}\n{}",
                    self.tor_frr.as_ref().map(|f| f.vtysh("show bgp summary")).unwrap_or_default(),
                    self.cluster.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
