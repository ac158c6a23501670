//! The lab as a miniature bare-metal cluster: node namespaces route, each node has a pod CIDR
//! (10.244.<node>.0/24) routed between nodes host-gw style, and "pods" are namespaces behind
//! veth pairs, CNI style (a /32 per pod, the node's .1 as gateway).

use std::{
    io::{BufRead, BufReader, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use crate::{Agent, Host, Lab, Netns, Process, netns::run_in, spawn_in};

/// A pod: a namespace with one interface towards its node.
pub struct Pod {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// Its IPv6 address, in a lab with IPv6 (see [`Lab::enable_ipv6`]).
    pub ip6: Option<Ipv6Addr>,
    pub node: usize,
}

impl Pod {
    /// Serves TCP and UDP on `port`: a TCP connection is greeted with
    /// `<pod> <client-ip>:<client-port>` and then gets every line echoed back prefixed with the
    /// pod's name; a UDP datagram is answered with the greeting.
    pub fn serve(&self, port: u16) -> Process {
        let script = format!(
            r#"
import socket, threading
name = {name:?}
def tcp():
    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", {port})); s.listen(256)
    while True:
        c, a = s.accept()
        threading.Thread(target=session, args=(c, a), daemon=True).start()
def peer(a):
    # An IPv4 client on the dual-stack socket shows as ::ffff:a.b.c.d.
    return a[0][7:] if a[0].startswith("::ffff:") else a[0]
def session(c, a):
    f = c.makefile("rwb", buffering=0)
    f.write(("%s %s:%d\n" % (name, peer(a), a[1])).encode())
    for line in f:
        f.write(name.encode() + b" " + line)
def udp():
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); s.bind(("::", {port}))
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(("%s %s:%d\n" % (name, peer(a), a[1])).encode(), a)
threading.Thread(target=udp, daemon=True).start()
tcp()
"#,
            name = self.name
        );
        spawn_in(&self.ns, &["python3", "-c", &script])
    }
}

impl Lab {
    /// Nodes forward, do not filter by reverse path, and route every other node's pod CIDR
    /// through that node. Hosts compute checksums in software, as a NIC would put them on
    /// the wire (XDP sees only what is in the frame).
    pub(crate) fn make_nodes_routers(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            node.ns.run_cmd(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            for key in ["all", "default", Host::IFACE] {
                node.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")]);
            }
            for (j, other) in self.nodes.iter().enumerate() {
                if i != j {
                    node.ns.run_cmd(&["ip", "route", "add", &pod_cidr(j), "via", &other.ip.to_string()]);
                }
            }
        }
        for host in self.nodes.iter().chain([&self.client]) {
            host.ns.run_cmd(&["ethtool", "-K", Host::IFACE, "tx", "off"]);
        }
    }

    /// Adds a pod on `node` and returns its index in `lab.pods`.
    pub fn add_pod(&mut self, node: usize) -> usize {
        let k = self.pods.iter().filter(|p| p.node == node).count();
        let ip = Ipv4Addr::new(10, 244, node as u8, 2 + k as u8);
        let name = format!("n{node}p{k}");
        let ns = Netns::create(format!("{}-{name}", self.id));
        let host_if = format!("pv{k}");
        let node_ns = &self.nodes[node].ns;
        node_ns.run_cmd(&[
            "ip",
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ]);
        node_ns.run_cmd(&["ip", "link", "set", &host_if, "up"]);
        node_ns.run_cmd(&["ip", "addr", "add", &format!("{}/32", gateway(node)), "dev", &host_if]);
        node_ns.run_cmd(&["ip", "route", "add", &format!("{ip}/32"), "dev", &host_if]);
        ns.run_cmd(&["ip", "link", "set", "lo", "up"]);
        ns.run_cmd(&["ip", "link", "set", "eth0", "up"]);
        ns.run_cmd(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
        ns.run_cmd(&["ip", "route", "add", &gateway(node).to_string(), "dev", "eth0"]);
        ns.run_cmd(&["ip", "route", "add", "default", "via", &gateway(node).to_string(), "dev", "eth0"]);
        // A veth delivers frames redirected into it by XDP only when its peer runs NAPI,
        // which GRO turns on.
        ns.run_cmd(&["ethtool", "-K", "eth0", "gro", "on"]);
        let ip6 = self.ipv6.then(|| {
            let ip6 = pod_ip6(node, 2 + k as u16);
            for (netns, dev) in [(node_ns, host_if.as_str()), (&ns, "eth0")] {
                for key in ["all", dev] {
                    netns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=0")]);
                }
                netns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{dev}.accept_dad=0")]);
            }
            let gateway6 = pod_ip6(node, 1);
            node_ns.run_cmd(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{gateway6}/128"),
                "dev",
                &host_if,
                "nodad",
            ]);
            node_ns.run_cmd(&["ip", "-6", "route", "add", &format!("{ip6}/128"), "dev", &host_if]);
            ns.run_cmd(&["ip", "-6", "addr", "add", &format!("{ip6}/128"), "dev", "eth0", "nodad"]);
            ns.run_cmd(&["ip", "-6", "route", "add", &gateway6.to_string(), "dev", "eth0"]);
            ns.run_cmd(&["ip", "-6", "route", "add", "default", "via", &gateway6.to_string(), "dev", "eth0"]);
            ip6
        });
        self.pods.push(Pod { name, ns, ip, ip6, node });
        self.pods.len() - 1
    }

    /// IPv6's pod routing, as [`Lab::make_nodes_routers`] does IPv4's: nodes forward IPv6 and
    /// route every other node's pod CIDR (fd00:10:244:<node>::/64) through its global address.
    pub(crate) fn route_pods6(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            node.ns.run_cmd(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
            for (j, other) in self.nodes.iter().enumerate() {
                if i != j {
                    node.ns.run_cmd(&[
                        "ip",
                        "-6",
                        "route",
                        "add",
                        &pod_cidr6(j),
                        "via",
                        &other.global6().to_string(),
                    ]);
                }
            }
        }
    }
}

/// A pod's IPv6 address on `node` (the node's gateway is host 1).
pub fn pod_ip6(node: usize, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, node as u16, 0, 0, 0, host)
}

pub fn pod_cidr6(node: usize) -> String {
    format!("fd00:10:244:{node}::/64")
}

pub fn pod_cidr(node: usize) -> String {
    format!("10.244.{node}.0/24")
}

fn gateway(node: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, node as u8, 1)
}

/// A TCP connection from a lab host to a pod server (see [`Pod::serve`]).
pub struct Session {
    reader: BufReader<TcpStream>,
    stream: TcpStream,
    /// The greeting: `<pod> <client-ip>:<client-port>` as the pod saw it.
    pub greeting: String,
}

impl Session {
    /// The client's source port.
    pub fn client_port(&self) -> u16 {
        self.stream.local_addr().map_or(0, |a| a.port())
    }

    /// The pod that answered.
    pub fn pod(&self) -> &str {
        self.greeting.split(' ').next().unwrap_or("")
    }

    /// The client address as the pod saw it.
    pub fn seen_client(&self) -> Ipv4Addr {
        seen_client(&self.greeting)
    }

    /// The client address as the pod saw it, of either family.
    pub fn seen_address(&self) -> IpAddr {
        seen_address(&self.greeting)
    }

    /// Sends `text` and returns the pod's echo, or `None` if none came within `timeout`.
    pub fn echo(&mut self, text: &str, timeout: Duration) -> Option<String> {
        let _ = self.stream.set_read_timeout(Some(timeout));
        self.stream.write_all(format!("{text}\n").as_bytes()).ok()?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim_end().to_owned()),
            _ => None,
        }
    }
}

/// The client address in a greeting.
/// Every session still answers within 5 s, from the pod that greeted it (`logs` for the
/// failure's message).
pub fn assert_all_answer(sessions: &mut [Session], after: &str, logs: impl Fn() -> String) {
    for (i, session) in sessions.iter_mut().enumerate() {
        let pod = session.pod().to_owned();
        let reply = session.echo(&format!("ping {i}"), Duration::from_secs(5));
        assert_eq!(
            reply.as_deref(),
            Some(format!("{pod} ping {i}").as_str()),
            "session {i} ({pod}) after {after}\n{}",
            logs()
        );
    }
}

pub fn seen_client(greeting: &str) -> Ipv4Addr {
    match seen_address(greeting) {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    }
}

/// The client address in a greeting (`<pod> <address>:<port>`), IPv4 or IPv6.
pub fn seen_address(greeting: &str) -> IpAddr {
    greeting
        .split(' ')
        .nth(1)
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(a, _)| a.parse().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Every agent's log and its non-zero path counters, for failure messages.
pub fn logs_and_reasons(agents: &[crate::Agent]) -> String {
    agents
        .iter()
        .map(|a| {
            let reasons: Vec<String> = a
                .metrics()
                .lines()
                .filter(|l| l.starts_with("lbagent_xdp_reason_packets_total") && !l.ends_with(" 0"))
                .map(|l| l.trim_start_matches("lbagent_xdp_reason_packets_total").to_owned())
                .collect();
            format!("{}\nreasons: {}", a.log_text(), reasons.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n----\n")
}

impl Host {
    /// A session to `addr:port`, retried for 5 s while the path settles (ARP or NDP,
    /// neighbours); panics with `logs()` when none opens.
    pub fn settled_session(&self, addr: impl Into<IpAddr>, port: u16, logs: impl Fn() -> String) -> Session {
        self.session_within(addr, port, Duration::from_secs(5), logs)
    }

    /// As [`Host::settled_session`], retried for `within`.
    pub fn session_within(
        &self,
        addr: impl Into<IpAddr>,
        port: u16,
        within: Duration,
        logs: impl Fn() -> String,
    ) -> Session {
        let addr: IpAddr = addr.into();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(s) = self.session(addr, port) {
                return s;
            }
            if std::time::Instant::now() > deadline {
                panic!("no session through {}:\n{}", SocketAddr::new(addr, port), logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Opens a session to `addr:port`; `None` if it cannot connect or gets no greeting.
    pub fn session(&self, addr: impl Into<IpAddr>, port: u16) -> Option<Session> {
        let addr: IpAddr = addr.into();
        let stream = run_in(self.ns.name(), move || {
            TcpStream::connect_timeout(&SocketAddr::from((addr, port)), Duration::from_millis(1000)).ok()
        })?;
        let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        let mut greeting = String::new();
        reader.read_line(&mut greeting).ok().filter(|n| *n > 0)?;
        Some(Session { reader, stream, greeting: greeting.trim_end().to_owned() })
    }

    /// Sends `count` UDP datagrams to `addr:port` from one socket, one every 5 ms, in the
    /// background; join the handle for (sent, answered), answers counted until 1 s after the
    /// last datagram.
    pub fn udp_every_5ms(
        &self,
        addr: Ipv4Addr,
        port: u16,
        count: u32,
    ) -> std::thread::JoinHandle<(u32, u32)> {
        let socket = run_in(self.ns.name(), || UdpSocket::bind("0.0.0.0:0").expect("a UDP socket"));
        std::thread::spawn(move || {
            socket.set_nonblocking(true).expect("a non-blocking socket");
            let mut buf = [0u8; 2048];
            let mut answered = 0;
            let mut drain = |answered: &mut u32| {
                while socket.recv(&mut buf).is_ok() {
                    *answered += 1;
                }
            };
            for _ in 0..count {
                let _ = socket.send_to(b"ping", (addr, port));
                std::thread::sleep(Duration::from_millis(5));
                drain(&mut answered);
            }
            let until = std::time::Instant::now() + Duration::from_secs(1);
            while std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                drain(&mut answered);
            }
            (count, answered)
        })
    }

    /// Sends one UDP datagram to `addr:port` and returns the answer (empty if none).
    pub fn udp_ask(&self, addr: impl Into<IpAddr>, port: u16) -> String {
        let addr: IpAddr = addr.into();
        let any = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let socket = run_in(self.ns.name(), move || UdpSocket::bind(any).expect("a UDP socket"));
        let _ = socket.set_read_timeout(Some(Duration::from_millis(1000)));
        let _ = socket.send_to(b"hello", (addr, port));
        let mut buf = [0u8; 2048];
        match socket.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).trim_end().to_owned(),
            Err(_) => String::new(),
        }
    }
}

/// The advertisement interval of [`agent_config`]. Labs that are not about failover speed run
/// many agents side by side on two cores, with debug builds: a 20 ms interval (a 60 ms lease)
/// is shorter than the stalls seen there, and every stall is a real failover.
pub const LAB_ADVERT_INTERVAL_MS: u64 = 100;

/// The service labs' cluster: pods with a server on one port in each, and an agent on every
/// node, each configured by `config(lab, node, services)`. Dropping it stops the servers and
/// agents before the lab.
pub struct ServiceLab {
    // Drop order: servers and agents before the lab.
    _servers: Vec<Process>,
    pub agents: Vec<Agent>,
    pub lab: Lab,
    vip: IpAddr,
    config: fn(&Lab, usize, &str) -> String,
}

impl ServiceLab {
    /// `pods[i]` pods on node i (with IPv6 addresses too when `ipv6`), native XDP everywhere,
    /// a server on `port` in every pod, no agents yet. Sessions go to `vip`.
    pub fn new(
        pods: &[usize],
        ipv6: bool,
        port: u16,
        vip: impl Into<IpAddr>,
        config: fn(&Lab, usize, &str) -> String,
    ) -> Self {
        let mut lab = Lab::new(pods.len());
        if ipv6 {
            lab.enable_ipv6();
        }
        for (node, &count) in pods.iter().enumerate() {
            lab.enable_native_xdp(node);
            for _ in 0..count {
                lab.add_pod(node);
            }
        }
        let servers = lab.pods.iter().map(|p| p.serve(port)).collect();
        ServiceLab { _servers: servers, agents: Vec::new(), lab, vip: vip.into(), config }
    }

    /// Starts every node's agent with `services`, and waits until n0 owns the VIP.
    pub fn start(&mut self, services: &str) {
        self.start_with(services, "", &[]);
    }

    /// As [`ServiceLab::start`], with `extra` (top-level YAML) in n0's config, each agent run
    /// through `wrapper` (see [`Agent::spawn_under`]).
    pub fn start_with(&mut self, services: &str, extra: &str, wrapper: &[&str]) {
        self.start_owning(services, extra, wrapper, 1.0);
    }

    /// As [`ServiceLab::start_with`], waiting until n0 owns `owned` VIPs.
    pub fn start_owning(&mut self, services: &str, extra: &str, wrapper: &[&str], owned: f64) {
        for i in 0..self.lab.nodes.len() {
            let head = if i == 0 { extra } else { "" };
            let config = format!("{head}{}", self.agent_config(i, services));
            let mut agent = self.lab.start_agent_under(i, &config, &[], &[], wrapper);
            agent.wait_ready();
            self.agents.push(agent);
        }
        self.agents[0].wait_metric("lbagent_owned_vips", owned);
    }

    /// `node`'s agent configuration with `services`, as [`ServiceLab::start`] gives it.
    pub fn agent_config(&self, node: usize, services: &str) -> String {
        (self.config)(&self.lab, node, services)
    }

    /// `node`'s count of packets that took the XDP path `reason`.
    pub fn reason(&self, node: usize, reason: &str) -> f64 {
        self.agents[node].metric(&format!("lbagent_xdp_reason_packets_total{{reason=\"{reason}\"}}"))
    }

    /// A session through the VIP, retried while the path settles.
    pub fn session(&self, port: u16) -> Session {
        self.lab.client.settled_session(self.vip, port, || self.logs())
    }

    /// Every agent's log and non-zero path counters, for failure messages.
    pub fn logs(&self) -> String {
        logs_and_reasons(&self.agents)
    }

    pub fn pod_name(&self, pod: usize) -> &str {
        &self.lab.pods[pod].name
    }
}

/// An agent config for `lab` node `me`: one VRRP group over every node at
/// [`LAB_ADVERT_INTERVAL_MS`], n0 preferred, then n1, then n2; the VIP 198.51.100.10; then
/// `services` (YAML list items).
pub fn agent_config(lab: &Lab, me: usize, services: &str) -> String {
    agent_config_advertising_every(lab, me, services, LAB_ADVERT_INTERVAL_MS)
}

/// As [`agent_config`], advertising every `interval_ms`.
pub fn agent_config_advertising_every(lab: &Lab, me: usize, services: &str, interval_ms: u64) -> String {
    group_config(lab, me, services, interval_ms, LAB_VIP.into())
}

/// As [`agent_config`], with the IPv6 VIP `vip`: the group speaks VRRPv3 over IPv6, from each
/// node's link-local address.
pub fn agent_config6(lab: &Lab, me: usize, services: &str, vip: Ipv6Addr) -> String {
    group_config(lab, me, services, LAB_ADVERT_INTERVAL_MS, vip.into())
}

fn group_config(lab: &Lab, me: usize, services: &str, interval_ms: u64, vip: IpAddr) -> String {
    let mut yaml = format!(
        "node: {}\ninterface: eth0\nxdpMode: native\nlisten: {}\ngroups:\n  - name: web\n    vrid: 20\n    \
         advertInterval: {interval_ms}ms\n    nodes:\n",
        lab.nodes[me].name,
        crate::agent::AGENT_LISTEN
    );
    for node in &lab.nodes {
        yaml.push_str(&format!("      - name: {}\n        address: {}\n", node.name, node.ip));
        if vip.is_ipv6() {
            yaml.push_str(&format!("        address6: {}\n", node.link_local()));
        }
    }
    yaml.push_str("    priorities:\n");
    for (i, node) in lab.nodes.iter().enumerate() {
        yaml.push_str(&format!("      {}: {}\n", node.name, 200 - 50 * i));
    }
    let vip = if vip.is_ipv6() { format!("'{vip}'") } else { vip.to_string() };
    yaml.push_str(&format!("    vips:\n      - address: {vip}\nservices:\n{services}"));
    yaml
}

/// The VIP [`agent_config`] puts in its group.
pub const LAB_VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// A service (YAML list item) on `vip:port`, TCP and UDP, to `target_port` of the given pods.
pub fn service_config(
    lab: &Lab,
    name: &str,
    vip: impl Into<IpAddr>,
    port: u16,
    target_port: u16,
    mode: &str,
    pods: &[usize],
) -> String {
    let vip: IpAddr = vip.into();
    let mut yaml = format!(
        "  - name: {name}\n    vip: '{vip}'\n    remoteMode: {mode}\n    ports:\n      - {{port: {port}, targetPort: {target_port}}}\n      \
         - {{port: {port}, protocol: UDP, targetPort: {target_port}}}\n    endpoints:\n"
    );
    for &p in pods {
        let pod = &lab.pods[p];
        let address: IpAddr = match vip {
            IpAddr::V4(_) => pod.ip.into(),
            IpAddr::V6(_) => pod.ip6.expect("a pod with IPv6 (Lab::enable_ipv6 before add_pod)").into(),
        };
        yaml.push_str(&format!("      - {{address: '{address}', node: {}}}\n", lab.nodes[pod.node].name));
    }
    yaml
}
