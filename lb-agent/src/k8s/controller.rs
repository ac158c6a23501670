//! The Kubernetes shell: watches LoadBalancerGroups, Services, EndpointSlices and Nodes, turns
//! them into a `Config` for the agent (every agent, the same way), and, on the agent holding
//! the Lease, writes addresses, finalizers, Events and group status.
//!
//! Watches reconnect with backoff. The agent keeps the last config it got, so VRRP failover and
//! forwarding go on unchanged while the API server is away.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{
    crd::LoadBalancerGroup,
    lease::LeaseLock,
    source::{ClusterState, translate},
    status,
    writer::StatusWriter,
};
use crate::config::Config;

/// How long the Lease lasts, and how often the leader renews it and re-checks status.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const LEADER_TICK: Duration = Duration::from_secs(5);
/// Changes arriving together are handled once.
const DEBOUNCE: Duration = Duration::from_millis(200);

pub struct Shell {
    pub client: Client,
    /// The agent-level settings (interface, listen, data plane) the cluster's groups and
    /// services are added to.
    pub base: Config,
    pub node: String,
    /// Where the Lease lives: the agent's own namespace.
    pub namespace: String,
}

fn watch_into<K>(api: Api<K>) -> (Store<K>, BoxStream<'static, ()>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects()
        .filter_map(move |event| {
            let kind = kind.clone();
            async move {
                if let Err(e) = event {
                    warn!(kind, error = %e, "watch failed; retrying with backoff");
                }
                Some(())
            }
        })
        .boxed();
    (reader, stream)
}

fn snapshot<K: Resource + Clone>(store: &Store<K>) -> Vec<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

impl Shell {
    /// Runs until the agent stops: sends each new config on `configs`; `owners` is who this
    /// node's VRRP sees as Master of each VIP (for group status).
    pub async fn run(self, configs: mpsc::Sender<Config>, owners: watch::Receiver<BTreeMap<Ipv4Addr, String>>) {
        let (groups, g) = watch_into(Api::<LoadBalancerGroup>::all(self.client.clone()));
        let (services, s) = watch_into(Api::<Service>::all(self.client.clone()));
        let (slices, e) = watch_into(Api::<EndpointSlice>::all(self.client.clone()));
        let (nodes, n) = watch_into(Api::<Node>::all(self.client.clone()));
        let mut changes = futures::stream::select_all([g, s, e, n]);
        let lease = LeaseLock::new(self.client.clone(), &self.namespace, self.node.clone(), LEASE_DURATION);
        let writer = StatusWriter::new(self.client.clone(), self.node.clone());
        let mut tick = tokio::time::interval(LEADER_TICK);
        let mut leading = false;
        let mut last: Option<Config> = None;
        loop {
            tokio::select! {
                change = changes.next() => {
                    if change.is_none() {
                        return;
                    }
                    // Let a burst of changes settle, then handle them once.
                    tokio::time::sleep(DEBOUNCE).await;
                    while let Some(Some(())) = changes.next().now_or_never() {}
                }
                _ = tick.tick() => {
                    let was = leading;
                    leading = lease.try_lead().await.unwrap_or_else(|e| {
                        warn!(error = %e, "renewing the leader Lease failed");
                        false
                    });
                    if leading != was {
                        info!(leading, "leader Lease");
                    }
                }
            }
            let ready = [groups.is_ready(), services.is_ready(), slices.is_ready(), nodes.is_ready()];
            if ready.contains(&false) {
                continue;
            }
            let state = ClusterState {
                groups: snapshot(&groups),
                services: snapshot(&services),
                slices: snapshot(&slices),
                nodes: snapshot(&nodes),
            };
            match translate(&state, &self.base) {
                Ok(translation) if last.as_ref() != Some(&translation.config) => {
                    last = Some(translation.config.clone());
                    if configs.send(translation.config).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "the cluster's objects give an invalid config; keeping the last one"),
            }
            if leading {
                let plan = status::plan(&state, &owners.borrow().clone(), &Timestamp::now().to_string());
                if plan != status::StatusPlan::default()
                    && let Err(e) = writer.apply(&plan).await
                {
                    warn!(error = %e, "writing status failed; retrying on the next change");
                }
            }
        }
    }
}


trait Ready {
    fn is_ready(&self) -> bool;
}

impl<K: Resource + Clone> Ready for Store<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The first list has arrived, so the snapshot is the cluster's, not an empty start.
    fn is_ready(&self) -> bool {
        self.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
    }
}
