//! The VIP addresses lb-agent puts on its uplinks (VIP modes `netlink` and `both`), kept in
//! step by a task of their own: netlink can wait (on RTNL, held by another link change for tens
//! of milliseconds), and the VRRP loop must never wait with it, or a master misses its adverts.
//! The loop hands over what each uplink should hold and goes on; the task applies the
//! difference, retrying what failed on the next change or after a second.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use tokio::{sync::watch, task::JoinHandle};
use tracing::{error, info};

use crate::netdev;

/// What each uplink (name → (ifindex, VIPs)) should hold, and a number that grows with each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Wanted {
    generation: u64,
    by_interface: BTreeMap<String, (u32, BTreeSet<IpAddr>)>,
}

/// The loop's end of the task.
pub struct VipAddresses {
    wanted: watch::Sender<Wanted>,
    /// The generation last applied whole.
    applied: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

/// How soon a failed update is tried again without a new change.
const RETRY: Duration = Duration::from_secs(1);

impl VipAddresses {
    /// Starts the task. Its first job removes whatever an earlier run left on the uplinks.
    pub fn spawn(netlink: rtnetlink::Handle) -> Self {
        let (wanted, mut rx) = watch::channel(Wanted::default());
        let (done, applied) = watch::channel(0);
        let task = tokio::spawn(async move {
            // What each interface holds, as last synced; absent: unknown, so synced whole.
            let mut held: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
            loop {
                let want = rx.borrow_and_update().clone();
                let mut all_applied = true;
                for (name, (index, vips)) in &want.by_interface {
                    if held.get(name) == Some(vips) {
                        continue;
                    }
                    match netdev::sync_vip_addresses(&netlink, *index, vips).await {
                        Ok((added, removed)) => {
                            if !added.is_empty() || !removed.is_empty() {
                                info!(?added, ?removed, interface = %name, "VIP addresses updated");
                            }
                            held.insert(name.clone(), vips.clone());
                        }
                        Err(e) => {
                            all_applied = false;
                            held.remove(name);
                            error!(interface = %name, error = %e, "updating VIP addresses on the uplink failed");
                        }
                    }
                }
                held.retain(|name, _| want.by_interface.contains_key(name));
                if all_applied {
                    done.send_replace(want.generation);
                }
                let wait = async {
                    if all_applied { std::future::pending().await } else { tokio::time::sleep(RETRY).await }
                };
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    () = wait => {}
                }
            }
        });
        Self { wanted, applied, task }
    }

    /// From now on each uplink (name → (ifindex, VIPs)) should hold these; returns at once.
    pub fn set(&self, by_interface: BTreeMap<String, (u32, BTreeSet<IpAddr>)>) {
        self.wanted.send_if_modified(|current| {
            if current.by_interface == by_interface {
                return false;
            }
            current.generation += 1;
            current.by_interface = by_interface;
            true
        });
    }

    /// Waits (at most `bound`) until what was last set is on the uplinks: before the agent
    /// exits, so it leaves no VIP behind.
    pub async fn flush(&mut self, bound: Duration) {
        let target = self.wanted.borrow().generation;
        let _ = tokio::time::timeout(bound, self.applied.wait_for(|applied| *applied >= target)).await;
    }
}

impl Drop for VipAddresses {
    fn drop(&mut self) {
        self.task.abort();
    }
}
