//! What `--kubernetes` adds to the loop: who owns what, foreign routers and impersonated
//! members, published for the cluster side's group status and Events.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    config::Config,
    error::{Error, Result},
    k8s::{
        controller::{ForeignRouters, FromAgent, Impersonations},
        departure::{self, Departure},
    },
    metrics::MemberLabels,
    netdev,
};

use super::{Agent, KubernetesSource, Signals, Stop, graceful_stop_signal, or_pending, within};

/// The agent's ends of the channels to the cluster side (`k8s::controller::Shell`).
pub(super) struct ClusterLink {
    /// Configs built from the cluster.
    pub configs: mpsc::Receiver<Config>,
    /// Who this node sees as Master of each VIP, for group status.
    pub owners: watch::Sender<BTreeMap<IpAddr, String>>,
    /// Routers outside a group heard on its VRIDs, for Events.
    pub foreign: watch::Sender<ForeignRouters>,
    /// Members impersonated on the segment, for Events.
    pub impersonated: watch::Sender<Impersonations>,
    /// Set when a graceful stop begins: a leading shell releases its Lease and ends.
    pub stopping: watch::Sender<bool>,
    /// The shell's task.
    pub shell: JoinHandle<()>,
    /// What [`ClusterLink::ask_departure`] needs.
    departure: DepartureCheck,
    /// At SIGTERM, the answer to whether this pod is replaced, while it is awaited.
    pub departing: Option<oneshot::Receiver<Stop>>,
}

/// The client and this agent's pod, for the question at SIGTERM.
struct DepartureCheck {
    client: kube::Client,
    namespace: String,
    pod: Option<String>,
    background: tokio::runtime::Handle,
}

/// How long a stopping agent waits for its shell to release the leader Lease.
const RELEASE_BOUND: Duration = Duration::from_secs(2);
/// How long SIGTERM waits for the API server to say whether this pod is replaced; a removal
/// after it.
const DEPARTURE_BOUND: Duration = Duration::from_secs(2);

/// What the cluster side has for the loop.
pub(super) enum FromCluster {
    /// A config built from the cluster (boxed: the other is a byte).
    Config(Box<Config>),
    /// SIGTERM's question answered: how to stop.
    Departure(Stop),
}

impl ClusterLink {
    /// The next config, or the answer to SIGTERM's question; none once the configs' channel
    /// has closed and no question is out.
    pub(super) async fn next_event(&mut self) -> Option<FromCluster> {
        tokio::select! {
            // A task that ended without answering (it panicked) is a removal.
            stop = or_pending(self.departing.as_mut()) => {
                self.departing = None;
                Some(FromCluster::Departure(stop.unwrap_or(Stop::Graceful)))
            }
            Some(config) = self.configs.recv() => Some(FromCluster::Config(Box::new(config))),
            else => None,
        }
    }

    /// Starts the cluster side (`k8s::controller::Shell`) on `background` and waits for its
    /// first config; `None` when a stop signal came first (nothing was attached).
    pub(super) async fn connect(
        source: KubernetesSource,
        config: &Config,
        node: &str,
        refused: watch::Receiver<BTreeMap<String, String>>,
        background: &tokio::runtime::Handle,
        signals: &mut Signals,
    ) -> Result<Option<(ClusterLink, Config)>> {
        // The client's buffer task runs where it is made.
        let (client, requests) = background
            .spawn(crate::k8s::controller::clients())
            .await
            .map_err(|e| Error::io("starting the Kubernetes client", std::io::Error::other(e)))?
            .map_err(Error::Kube)?;
        let (configs_tx, configs_rx) = mpsc::channel(4);
        let (owners_tx, owners_rx) = watch::channel(BTreeMap::new());
        let (foreign_tx, foreign_rx) = watch::channel(ForeignRouters::new());
        let (impersonated_tx, impersonated_rx) = watch::channel(Impersonations::new());
        let mut base = config.clone();
        base.node = Some(node.to_owned());
        let departure = DepartureCheck {
            client: client.clone(),
            namespace: source.namespace.clone(),
            pod: source.pod,
            background: background.clone(),
        };
        let shell = crate::k8s::controller::Shell {
            client,
            requests,
            netlink: within(background, netdev::connect)?,
            base,
            node: node.to_owned(),
            namespace: source.namespace,
        };
        let from_agent =
            FromAgent { owners: owners_rx, refused, foreign: foreign_rx, impersonated: impersonated_rx };
        let (stopping_tx, stopping_rx) = watch::channel(false);
        let mut link = ClusterLink {
            configs: configs_rx,
            owners: owners_tx,
            foreign: foreign_tx,
            impersonated: impersonated_tx,
            stopping: stopping_tx,
            shell: background.spawn(shell.run(configs_tx, from_agent, stopping_rx)),
            departure,
            departing: None,
        };
        info!("waiting for the cluster's groups and services");
        let first = tokio::select! {
            first = link.configs.recv() => Some(first),
            // A restart in place (SIGUSR2) waits for the loop: there is nothing to restart yet.
            () = graceful_stop_signal(&mut signals.stops) => None,
        };
        let Some(first) = first else {
            info!("stopped before the cluster's first config: nothing was attached");
            link.finish().await;
            return Ok(None);
        };
        let config = first
            .ok_or_else(|| Error::io("watching the cluster", std::io::Error::other("the watch ended")))?;
        Ok(Some((link, config)))
    }
    /// Waits (bounded) for the shell to finish after `stopping`: a leader's release then
    /// reaches the API server before the process exits.
    pub(super) async fn finish(self) {
        self.stopping.send_replace(true);
        if tokio::time::timeout(RELEASE_BOUND, self.shell).await.is_err() {
            warn!(
                "the cluster side did not finish within {RELEASE_BOUND:?}; the leader Lease, if held, expires instead"
            );
        }
    }
}

impl Agent {
    /// Whether SIGTERM's question (see [`Agent::ask_departure`]) is being answered.
    pub(super) fn asking_departure(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.departing.is_some())
    }

    /// The stop to begin now; or none while the API server is asked whether this pod is
    /// replaced by a roll (`k8s::departure`), when the question matters: a graceful stop with
    /// routed VIPs and a pod to look at. The answer arrives through `departing`, within
    /// [`DEPARTURE_BOUND`]; the loop runs on meanwhile, VRRP's adverts included.
    pub(super) fn ask_departure(&mut self, stop: Stop) -> Option<Stop> {
        let routed = !self.routes.held().is_empty();
        let Some(cluster) = self.cluster.as_mut().filter(|_| stop == Stop::Graceful && routed) else {
            return Some(stop);
        };
        let check = &cluster.departure;
        let Some(pod) = check.pod.clone() else {
            info!(
                "no pod name (--pod, POD_NAME; the FRR component sets it): this stop withdraws the routed VIPs, a roll's too"
            );
            return Some(stop);
        };
        let (answer, departing) = oneshot::channel();
        let (client, namespace) = (check.client.clone(), check.namespace.clone());
        check.background.spawn(async move {
            let asked = tokio::time::timeout(DEPARTURE_BOUND, departure::check(client, &namespace, &pod)).await;
            let stop = match asked {
                Ok(Ok(Departure::Replacement)) => {
                    info!(pod, "the pod is replaced by its DaemonSet's newer revision (a roll)");
                    Stop::Replaced
                }
                Ok(Ok(Departure::Removal(why))) => {
                    info!(pod, why, "the pod is removed, not replaced");
                    Stop::Graceful
                }
                Ok(Err(e)) => {
                    warn!(pod, error = %e, "asking whether the pod is replaced failed: stopping as a removal");
                    Stop::Graceful
                }
                Err(_) => {
                    warn!(pod, "the API server did not say within {DEPARTURE_BOUND:?} whether the pod is replaced: stopping as a removal");
                    Stop::Graceful
                }
            };
            let _ = answer.send(stop);
        });
        cluster.departing = Some(departing);
        None
    }

    /// Who this node sees as Master of each VIP, by node name, for the leader's group status.
    pub(super) fn publish_owners(&self) {
        let (Some(cluster), Some(vrrp)) = (&self.cluster, &self.vrrp) else { return };
        let owners = &cluster.owners;
        let names: BTreeMap<IpAddr, String> = self
            .current
            .config
            .groups
            .iter()
            .flat_map(|g| g.nodes.iter())
            .flat_map(|n| {
                let v6 = n.address6.map(|a| (IpAddr::V6(a), n.name.clone()));
                [(IpAddr::V4(n.address), n.name.clone())].into_iter().chain(v6)
            })
            .collect();
        let mut seen = BTreeMap::new();
        for (spec, instance) in vrrp.router.instances() {
            if let Some(name) = instance.master().and_then(|m| names.get(&m)) {
                seen.extend(spec.vips.iter().map(|vip| (*vip, name.clone())));
            }
        }
        owners.send_if_modified(|current| {
            let changed = *current != seen;
            *current = seen;
            changed
        });
    }

    /// Routers outside a group heard advertising its VRIDs, for the cluster side's Events.
    /// The router only ever adds to them, so a count tells whether anything is new.
    pub(super) fn publish_foreign(&self) {
        let (Some(cluster), Some(vrrp)) = (&self.cluster, &self.vrrp) else { return };
        let foreign = &cluster.foreign;
        if vrrp.router.foreign_routers().count() == foreign.borrow().len() {
            return;
        }
        let heard: ForeignRouters =
            vrrp.router.foreign_routers().map(|(group, id, source)| (group.to_owned(), id, source)).collect();
        foreign.send_replace(heard);
    }

    /// Advertisements that impersonate a member, as XDP counted them (a member's address from
    /// another MAC while its own is live, or this node's address from anywhere): counted,
    /// logged once a minute per member while they go on, and (with `--kubernetes`) passed on
    /// for an Event on the group.
    pub(super) fn check_impersonations(&mut self) {
        let now = Instant::now();
        let mut heard: Vec<(String, IpAddr, String, u64)> = Vec::new();
        for seen in self.dataplane.impersonations() {
            let own = self.current.plan.locals.values().any(|local| *local == seen.source);
            let member_of = |i: &&crate::vrrp::router::InstanceSpec| own || i.peers.contains(&seen.source);
            let Some(group) = self.current.plan.instances.iter().find(member_of).map(|i| i.group.clone())
            else {
                continue;
            };
            let how = if own {
                format!("from MAC {}, another host (this node's own address)", seen.other_mac)
            } else {
                format!("from MAC {} while it is at {}", seen.other_mac, seen.mac)
            };
            heard.push((group, seen.source, how, seen.adverts));
        }
        let mut counts: BTreeMap<IpAddr, u64> = BTreeMap::new();
        for (_, member, _, adverts) in &heard {
            *counts.entry(*member).or_default() += adverts;
        }
        for (member, total) in counts {
            let (counted, logged, at_log) =
                self.ownership.impersonations_seen.entry(member).or_insert((0, None, 0));
            if total <= *counted {
                continue;
            }
            self.state
                .metrics
                .impersonations
                .get_or_create(&MemberLabels { member: member.to_string() })
                .inc_by(total - *counted);
            *counted = total;
            if logged.is_none_or(|at| now >= at + crate::vrrp::router::FOREIGN_LOG_EVERY) {
                let how: Vec<&str> = heard.iter().filter(|h| h.1 == member).map(|h| h.2.as_str()).collect();
                warn!(
                    %member,
                    adverts = total - *at_log,
                    how = how.join("; "),
                    "VRRP advertisements with a member's address come from elsewhere: a host on the segment may \
                     be impersonating it (VRRPv3 has no authentication)"
                );
                *logged = Some(now);
                *at_log = total;
            }
        }
        if let Some(tx) = self.cluster.as_ref().map(|c| &c.impersonated) {
            let set: Impersonations = heard.into_iter().map(|(g, m, how, _)| (g, m, how)).collect();
            if *tx.borrow() != set {
                tx.send_replace(set);
            }
        }
    }
}
