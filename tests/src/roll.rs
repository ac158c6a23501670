//! A routed cluster on Kubernetes as the lab plays it: three nodes behind an FRR ToR
//! ([`Fabric`]) run `lb-agent run --kubernetes` against the lab API server, each as its
//! DaemonSet pod (a Pod object with the DaemonSet's revision), with a LoadBalancerGroup
//! announcing over BGP and the Service `web` on pods on n0 and n1. The test plays the kubelet
//! in a roll: it deletes a pod, stops its agent and then its FRR sidecar (SIGTERM each), and
//! starts the next pod's agent and, once the sidecar's own wait lets it, FRR.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    Agent, Host,
    agent::AGENT_LISTEN,
    api_server::ApiServer,
    cluster::{LAB_VIP, ServiceLab, logs_and_reasons},
    cluster_api::{api_server_on, endpoint_slice, group, node_object, service, start_kubernetes_agent},
    fabric::{Fabric, TorDaemon},
};

/// The agents' namespace: their Pods, the DaemonSet's revisions and the Lease.
const SYSTEM: &str = "lb-agent";
const DAEMONSET_UID: &str = "0d5e7a1c-lb-agent-ds";
const CONVERGE: Duration = Duration::from_secs(30);

/// The cluster, its lab and its agents (`None` while a node's pod is replaced).
pub struct RoutedCluster {
    // Field order is drop order: agents, the server, its host, then the fabric.
    pub agents: Vec<Option<Agent>>,
    pub api: ApiServer,
    _api_host: Host,
    pub fabric: Fabric,
    /// The DaemonSet's newest revision.
    revision: i64,
    /// Each node's pod's revision.
    pods: Vec<i64>,
}

/// A ControllerRevision of the agents' DaemonSet.
fn revision(number: i64) -> Value {
    let hash = format!("r{number}");
    json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
           "metadata": {"name": format!("lb-agent-{hash}"), "namespace": SYSTEM,
                        "labels": {"app.kubernetes.io/name": "lb-agent", "controller-revision-hash": hash},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lb-agent",
                                             "uid": DAEMONSET_UID, "controller": true}]},
           "revision": number})
}

/// The DaemonSet's pod on node `node` of revision `number`. Its finalizer plays the kubelet: a
/// delete leaves the pod marked (`deletionTimestamp`) while its containers stop.
fn pod(node: usize, number: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": pod_name(node, number), "namespace": SYSTEM, "finalizers": ["lab.lb-agent.io/kubelet"],
                        "labels": {"app.kubernetes.io/name": "lb-agent", "controller-revision-hash": format!("r{number}")},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lb-agent",
                                             "uid": DAEMONSET_UID, "controller": true}]},
           "spec": {"nodeName": format!("n{node}"), "containers": [{"name": "lb-agent", "image": "lb-agent"}]}})
}

fn pod_name(node: usize, number: i64) -> String {
    format!("lb-agent-n{node}-r{number}")
}

impl RoutedCluster {
    /// Pods on n0 and n1 serving on 8080; the group `edge` (`announce: bgp`, DSR, the lab's
    /// VIP as its one address); `web` (port 80) to both pods; revision 1 and a pod of it with
    /// its agent on every node, routed from each by the ToR.
    pub fn start() -> RoutedCluster {
        Self::start_with_tor(TorDaemon::Frr)
    }

    /// As [`RoutedCluster::start`], the ToR running `tor`.
    pub fn start_with_tor(tor: TorDaemon) -> RoutedCluster {
        let cluster = ServiceLab::new(&[1, 1, 0], false, 8080, LAB_VIP, |_, _, _| String::new());
        let fabric = Fabric::with_tor(cluster, tor);
        let lab = &fabric.cluster.lab;
        let (api_host, api) = api_server_on(lab);
        api.put(group(json!({"announce": "bgp", "addressPools": [format!("{LAB_VIP}/32")]})));
        for node in &lab.nodes {
            api.put(node_object(node));
        }
        let pods: Vec<(IpAddr, &str)> = vec![(lab.pods[0].ip.into(), "n0"), (lab.pods[1].ip.into(), "n1")];
        api.put(service("web"));
        api.put(endpoint_slice("web", "web-1", "IPv4", &pods));
        api.put(revision(1));
        let mut cluster = RoutedCluster {
            agents: Vec::new(),
            api,
            _api_host: api_host,
            fabric,
            revision: 1,
            pods: vec![1; 3],
        };
        for node in 0..3 {
            let agent = cluster.start_agent(node);
            cluster.agents.push(Some(agent));
        }
        cluster.fabric.wait_next_hops(LAB_VIP.into(), &[0, 1, 2], CONVERGE);
        cluster.fabric.wait_bfd_up(CONVERGE);
        cluster
    }

    /// Every agent's log and non-zero path counters.
    pub fn logs(&self) -> String {
        self.agents
            .iter()
            .flatten()
            .map(|a| logs_and_reasons(std::slice::from_ref(a)))
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// The DaemonSet's template changes: a newer revision, which its pods are not of.
    pub fn new_revision(&mut self) {
        self.revision += 1;
        self.api.put(revision(self.revision));
    }

    /// The kubelet stops `node`'s pod, once deleted (`deleted`, as the DaemonSet controller
    /// deletes a replaced pod) or on its own (a node shutting down): SIGTERM to the agent, and
    /// once it has exited (0, or this panics), to the FRR sidecar. The exited agent, for its log.
    pub fn stop_pod(&mut self, node: usize, deleted: bool) -> Agent {
        let mut agent = self.agents[node].take().expect("a pod on the node");
        if deleted {
            self.api.delete("v1", "Pod", SYSTEM, &pod_name(node, self.pods[node]));
        }
        agent.signal(libc::SIGTERM);
        let status = agent.wait_exit(Duration::from_secs(20));
        assert!(status.success(), "{status}\n{}", agent.log_text());
        self.fabric.stop_node_frr(node);
        agent
    }

    /// The next pod on `node`, of the newest revision: its agent, then FRR once the sidecar's
    /// wait lets it (within 10 s); returns when the ToR's path through the node is fresh
    /// again (not stale from graceful restart).
    pub fn start_pod(&mut self, node: usize) {
        let agent = self.start_agent(node);
        assert!(
            self.fabric.frr_may_start(node, Duration::from_secs(10)),
            "the FRR sidecar still waits\n{}",
            agent.log_text()
        );
        self.agents[node] = Some(agent);
        self.fabric.start_node_frr(node);
        let deadline = Instant::now() + CONVERGE;
        // FRR marks the kept path stale until the node's End-of-RIB; BIRD shows the session.
        let back = || match &self.fabric.tor_frr {
            Some(tor) => !tor.vtysh(&format!("show bgp ipv4 unicast {LAB_VIP}/32")).contains("stale"),
            None => self.fabric.tor_show("", &format!("show protocols n{node}")).contains("Established"),
        };
        while !back() {
            let summary = self.fabric.tor_show("show bgp summary", "show protocols");
            assert!(Instant::now() < deadline, "n{node}'s session did not come back\n{summary}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_agent(&mut self, node: usize) -> Agent {
        self.pods[node] = self.revision;
        let name = pod_name(node, self.revision);
        self.api.put(pod(node, self.revision));
        let base = format!(
            "interface: eth0\nxdpMode: native\nlisten: {AGENT_LISTEN}\nroutes: {{drain: 2s, holdTime: 2s}}\n"
        );
        let env = [("RUST_LOG", "info"), ("POD_NAME", name.as_str())];
        let mut agent = start_kubernetes_agent(&self.fabric.cluster.lab, &self.api, node, &base, &env);
        agent.wait_ready_within(Duration::from_secs(30));
        agent
    }
}
