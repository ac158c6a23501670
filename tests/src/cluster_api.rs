//! A lab cluster: agents run `--kubernetes` against one lab API server ([`crate::api_server`])
//! on the segment, each with the DaemonSet's ServiceAccount as RBAC sees it. The test writes
//! objects as an admin would; the leader allocates addresses and writes status; every agent
//! reads it back through its watches, elects each VIP's owner and forwards to the pods.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{Agent, Host, Lab, agent::AGENT_LISTEN, api_server::ApiServer, freeze};

pub const API: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 250);
pub const API_PORT: u16 = 6443;
/// Where the Services live.
pub const NAMESPACE: &str = "shop";
/// The group's VRRP advert interval in [`ClusterLab::new`].
const ADVERT_INTERVAL: Duration = Duration::from_millis(100);

pub struct ClusterLab {
    // Field order is drop order: agents, then the server, its host, the lab.
    pub agents: Vec<Option<Agent>>,
    pub api: ApiServer,
    api_host: Host,
    pub lab: Lab,
    /// The pod (on n1) `web`'s EndpointSlice names.
    pub pod: usize,
}

/// A LoadBalancer Service in [`NAMESPACE`], port 80 to the pods' 8080.
pub fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

/// An EndpointSlice of `service`'s with one ready endpoint per `(address, node)`.
pub fn endpoint_slice(service: &str, name: &str, family: &str, endpoints: &[(IpAddr, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip.to_string()], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": service}},
           "ports": [{"port": 8080}], "endpoints": endpoints})
}

/// The LoadBalancerGroup `edge` every node joins, with `spec` (the interface is eth0).
pub fn group(spec: Value) -> Value {
    let mut group = json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge"},
                           "spec": {"interface": "eth0", "default": true, "remoteMode": "dsr"}});
    crate::api_server::store::merge_patch(&mut group["spec"], &spec);
    group
}

/// The lab's API server, on a host of its own on the segment at [`API`]:[`API_PORT`].
pub fn api_server_on(lab: &Lab) -> (Host, ApiServer) {
    let host = lab.add_host("api", API, [0x02, 0x1b, 0, 0, 0, 0xaa]);
    let api = ApiServer::start(Some(&host.ns), SocketAddr::from((API, API_PORT)));
    (host, api)
}

/// A lab node's Node object: its name and InternalIP.
pub fn node_object(node: &Host) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name},
           "status": {"addresses": [{"type": "InternalIP", "address": node.ip.to_string()}]}})
}

/// Starts `node`'s agent with `--kubernetes` against `api` (as the DaemonSet's ServiceAccount,
/// its Lease in `lb-agent`), `base` as its config file, and `env` besides.
pub fn start_kubernetes_agent(
    lab: &Lab,
    api: &ApiServer,
    node: usize,
    base: &str,
    env: &[(&str, &str)],
) -> Agent {
    let name = lab.nodes[node].name.clone();
    let kubeconfig = api.kubeconfig(&lab.path(""), &name, false);
    let mut env = env.to_vec();
    env.extend([("KUBECONFIG", kubeconfig.to_str().unwrap()), ("POD_NAMESPACE", "lb-agent")]);
    lab.start_agent_with(node, base, &["--kubernetes", "--node", &name], &env)
}

impl ClusterLab {
    /// Three nodes, group `edge` (one IPv4 pool, VRRP every 100 ms), and `web` with its pod
    /// on n1; an agent on each node.
    pub fn new() -> ClusterLab {
        ClusterLab::with(
            3,
            false,
            json!({"addressPools": ["198.51.100.0/29"], "advertInterval": format!("{}ms", ADVERT_INTERVAL.as_millis())}),
            |lab, pod| {
                vec![
                    service("web"),
                    endpoint_slice("web", "web-1", "IPv4", &[(lab.pods[pod].ip.into(), "n1")]),
                ]
            },
        )
    }

    /// `nodes` nodes with native XDP (and IPv6 when `ipv6`), a pod on n1, the group `edge`
    /// with `group_spec`, a Node for each node, then `objects(lab, pod)`; an agent on each node.
    pub fn with(
        nodes: usize,
        ipv6: bool,
        group_spec: Value,
        objects: impl FnOnce(&Lab, usize) -> Vec<Value>,
    ) -> ClusterLab {
        freeze::watch();
        let mut lab = Lab::new(nodes);
        if ipv6 {
            lab.enable_ipv6();
        }
        for node in 0..nodes {
            lab.enable_native_xdp(node);
        }
        let pod = lab.add_pod(1);
        let (api_host, api) = api_server_on(&lab);
        api.put(group(group_spec));
        for n in &lab.nodes {
            api.put(node_object(n));
        }
        for object in objects(&lab, pod) {
            api.put(object);
        }
        let mut cluster = ClusterLab { agents: Vec::new(), api, api_host, lab, pod };
        for node in 0..nodes {
            let agent = cluster.start_agent(node);
            cluster.agents.push(Some(agent));
        }
        cluster
    }

    pub fn start_agent(&self, node: usize) -> Agent {
        let base = format!("interface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\n");
        let mut agent = start_kubernetes_agent(&self.lab, &self.api, node, &base, &[("RUST_LOG", "info")]);
        agent.wait_ready_within(Duration::from_secs(30));
        agent
    }

    pub fn logs(&self) -> String {
        self.agents.iter().flatten().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n")
    }

    /// The Service's addresses, as the leader published them.
    pub fn addresses(&self, name: &str) -> Vec<IpAddr> {
        let Some(service) = self.api.get("v1", "Service", NAMESPACE, name) else { return Vec::new() };
        let ingress = service.pointer("/status/loadBalancer/ingress").and_then(Value::as_array);
        ingress.into_iter().flatten().filter_map(|i| i["ip"].as_str()?.parse().ok()).collect()
    }

    /// The Service's (first) IPv4 address, once the leader has published it.
    pub fn address(&self, name: &str) -> Option<Ipv4Addr> {
        self.addresses(name).into_iter().find_map(|ip| match ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
    }

    pub fn wait_address(&self, name: &str, within: Duration) -> Ipv4Addr {
        let deadline = Instant::now() + within;
        loop {
            if let Some(ip) = self.address(name) {
                return ip;
            }
            assert!(
                Instant::now() < deadline,
                "no address published for {name} within {within:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The leader Lease's holder, if any.
    pub fn leader(&self) -> Option<String> {
        let lease = self.api.get("coordination.k8s.io/v1", "Lease", "lb-agent", "lb-agent-leader")?;
        lease.pointer("/spec/holderIdentity")?.as_str().map(str::to_owned)
    }

    pub fn node_of(&self, name: &str) -> usize {
        self.lab.nodes.iter().position(|n| n.name == name).expect("a node's name")
    }

    /// Waits for a session through `vip`:80 to reach `pod`, and returns it.
    pub fn session_to(&self, vip: impl Into<IpAddr>, pod: usize) -> crate::cluster::Session {
        let vip = vip.into();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(s) = self.lab.client.session(vip, 80)
                && s.pod() == self.lab.pods[pod].name
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no session through [{vip}]:80 to {}:\n{}",
                self.lab.pods[pod].name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Serves `web`'s pod, waits for `web`'s address and a session through it to the pod;
    /// returns the pod's server and the address.
    pub fn serve_web(&self) -> (crate::Process, Ipv4Addr) {
        let server = self.lab.pods[self.pod].serve(8080);
        let vip = self.wait_address("web", Duration::from_secs(20));
        self.wait_session(vip);
        (server, vip)
    }

    /// Waits for a session through `vip`:80 to `web`'s pod.
    pub fn wait_session(&self, vip: Ipv4Addr) {
        self.session_to(vip, self.pod);
    }

    /// Makes the API server unreachable (`true`: every packet to or from it dropped, so
    /// connections hang rather than fail, as behind a partition), or reachable again.
    pub fn set_unreachable(&self, unreachable: bool) {
        let ns = &self.api_host.ns;
        if unreachable {
            let rules = "table inet partition {\n\
                 chain in { type filter hook input priority 0; policy drop; }\n\
                 chain out { type filter hook output priority 0; policy drop; }\n}\n";
            let file = self.lab.path("partition.nft");
            std::fs::write(&file, rules).expect("writing the partition rules");
            let out = ns.run_cmd(&["nft", "-f", file.to_str().unwrap()]);
            assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
        } else {
            ns.run_cmd(&["nft", "delete", "table", "inet", "partition"]);
        }
    }

    /// VIPs owned, summed over the running agents.
    pub fn owned(&self) -> f64 {
        self.agents.iter().flatten().map(|a| a.metric("lbagent_owned_vips")).sum()
    }

    /// Exactly one agent owns the VIP; or, just after a CPU of this machine stood still longer
    /// than a backup waits for its master (3 adverts), more than one for a moment: every
    /// agent's timers ran out at once, as on a frozen node, and VRRP settles it on the next
    /// adverts. That is said, and one owner must be back within a second.
    pub fn assert_one_owner(&self, during: &str) {
        let owned = self.owned();
        if owned == 1.0 {
            return;
        }
        let now = Instant::now();
        let frozen = freeze::between(now - Duration::from_secs(3), now);
        if frozen.longest < 3 * ADVERT_INTERVAL {
            panic!("{owned} owners of the VIP {during} (CPUs frozen: {frozen:?}):\n{}", self.logs());
        }
        eprintln!(
            "{owned} owners {during}, just after a CPU of this machine stood still for {:?}",
            frozen.longest
        );
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(self.owned(), 1.0, "one owner again a second after the freeze:\n{}", self.logs());
    }

    /// See [`freeze::assert_no_reply_lost`].
    pub fn assert_no_reply_lost(&self, ping: &std::process::Output, since: Instant, during: &str) {
        freeze::assert_no_reply_lost(ping, since, during, ADVERT_INTERVAL, || self.logs());
    }
}

impl Default for ClusterLab {
    fn default() -> Self {
        ClusterLab::new()
    }
}
