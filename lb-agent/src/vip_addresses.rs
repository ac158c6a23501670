//! The VIP addresses lb-agent puts on its uplinks (VIP modes `netlink` and `both`), and the
//! solicited-node multicast groups of the IPv6 VIPs only XDP answers for, kept in step by a
//! task of their own: netlink and multicast joins can wait (on RTNL, held by another link
//! change for tens of milliseconds), and the VRRP loop must never wait with them, or a master
//! misses its adverts. The loop hands over what each uplink should hold and goes on; the task
//! applies the difference, retrying what failed on the next change or after a second.
//!
//! Why the groups: a Neighbor Solicitation goes to the target's solicited-node group
//! (RFC 4861 §7.2.2), and a switch that snoops MLD forwards it only to ports that joined that
//! group. The kernel joins it for an address it holds; for a VIP only XDP answers, this task
//! joins it, so the master's port gets the solicitations (as MetalLB's NDP responder does).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use lb_common::ndp;
use socket2::{Domain, Socket, Type};

use tokio::{sync::watch, task::JoinHandle};
use tracing::{error, info};

use crate::netdev;

/// Per uplink (name → (ifindex, addresses)).
pub type ByInterface<A> = BTreeMap<String, (u32, BTreeSet<A>)>;

/// What each uplink should hold (addresses, and the IPv6 VIPs whose solicited-node groups to
/// join), and a number that grows with each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Wanted {
    generation: u64,
    by_interface: ByInterface<IpAddr>,
    listening: ByInterface<Ipv6Addr>,
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
            let mut groups: BTreeMap<u32, SolicitedNodes> = BTreeMap::new();
            // The groups as last synced whole; `None`: unknown (never, or a failure).
            let mut groups_synced: Option<ByInterface<Ipv6Addr>> = None;
            loop {
                let want = rx.borrow_and_update().clone();
                let mut all_applied = true;
                // Most changes are addresses, or ownership of IPv4 VIPs: the groups stay.
                if groups_synced.as_ref() != Some(&want.listening) {
                    // Joining and leaving take RTNL: on a blocking thread, not a runtime worker.
                    let listening = want.listening.clone();
                    let synced = tokio::task::spawn_blocking(move || {
                        let failed = sync_groups(&mut groups, &listening);
                        (groups, failed)
                    })
                    .await;
                    match synced {
                        Ok((kept, failed)) => {
                            groups = kept;
                            all_applied &= !failed;
                            groups_synced = (!failed).then(|| want.listening.clone());
                        }
                        Err(e) => {
                            error!(error = %e, "the solicited-node group task failed; retrying");
                            groups = BTreeMap::new();
                            groups_synced = None;
                            all_applied = false;
                        }
                    }
                }
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

    /// From now on each uplink should hold these addresses, and listen on the solicited-node
    /// groups of these IPv6 VIPs; returns at once.
    pub fn set(&self, by_interface: ByInterface<IpAddr>, listening: ByInterface<Ipv6Addr>) {
        self.wanted.send_if_modified(|current| {
            if current.by_interface == by_interface && current.listening == listening {
                return false;
            }
            current.generation += 1;
            current.by_interface = by_interface;
            current.listening = listening;
            true
        });
    }

    /// Waits (at most `bound`) until what was last set is on the uplinks: at start, so a
    /// crashed run's VIPs are gone before VRRP runs, and before the agent exits, so it leaves
    /// no VIP behind.
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

/// Brings the joined groups of each interface to `listening`'s VIPs; true when any failed.
fn sync_groups(groups: &mut BTreeMap<u32, SolicitedNodes>, listening: &ByInterface<Ipv6Addr>) -> bool {
    let mut failed = false;
    groups.retain(|index, _| listening.values().any(|(i, _)| i == index));
    for (name, (index, vips)) in listening {
        let wanted: BTreeSet<Ipv6Addr> =
            vips.iter().map(|v| ndp::solicited_node(v.octets()).into()).collect();
        let joined = match groups.entry(*index) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => match SolicitedNodes::open() {
                Ok(nodes) => e.insert(nodes),
                Err(e) => {
                    failed = true;
                    error!(interface = %name, error = %e, "opening a socket for solicited-node groups failed");
                    continue;
                }
            },
        };
        if let Err(e) = joined.sync(*index, &wanted) {
            failed = true;
            error!(interface = %name, error = %e, "joining the VIPs' solicited-node groups failed");
        }
    }
    failed
}

/// One interface's joined solicited-node groups, through a socket that only holds them (it
/// never sends or binds; closing it leaves them all).
struct SolicitedNodes {
    socket: Socket,
    joined: BTreeSet<Ipv6Addr>,
}

impl SolicitedNodes {
    fn open() -> std::io::Result<Self> {
        Ok(Self { socket: Socket::new(Domain::IPV6, Type::DGRAM, None)?, joined: BTreeSet::new() })
    }

    /// Joins the groups of `wanted` not joined yet on `ifindex`, leaves the others.
    fn sync(&mut self, ifindex: u32, wanted: &BTreeSet<Ipv6Addr>) -> std::io::Result<()> {
        for group in wanted.difference(&self.joined.clone()) {
            self.socket.join_multicast_v6(group, ifindex)?;
            self.joined.insert(*group);
        }
        for group in self.joined.clone().difference(wanted) {
            self.socket.leave_multicast_v6(group, ifindex)?;
            self.joined.remove(group);
        }
        Ok(())
    }
}
