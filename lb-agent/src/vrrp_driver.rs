//! The VRRP driver: the sans-IO router ([`crate::vrrp::router`]) with a raw socket for each
//! interface and family it runs instances on. The shell between the router and the network:
//! it opens and closes the sockets the plan needs, sends what the router returns (logging
//! failures once in a while, not at every advertisement), and reads what arrives.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use tokio::time::Instant;
use tracing::warn;

use crate::{
    node_plan::NodePlan,
    vrrp::{
        family::IpFamily,
        router::{Outgoing, Router},
        socket::{Arrived, VrrpSocket},
    },
};

/// At most this many queued datagrams per socket are read before the timers are handled, so
/// a flood cannot starve them. Far more than a stall leaves queued (8 nodes × 56 instances at
/// 10 ms put 5,600 a second on the segment: 280 in a 50 ms stall): a timer fired before the
/// advertisements that reset it were read would take over from a live master (seen as a
/// storm at 10,000 VIPs with a limit of 64).
const DRAIN_LIMIT: usize = 4096;

/// A VRRP socket's key: its interface and family.
pub type SocketKey = (String, IpFamily);

/// The VRRP driver: the router and a socket for each interface and family it runs instances
/// on.
pub struct Vrrp {
    pub router: Router,
    pub sockets: BTreeMap<SocketKey, VrrpSocket>,
    /// Per socket: when a failed send was last logged, and the failures since. A send fails
    /// while the source address is gone (an IPv6 link-local address is removed while its
    /// interface is down, and tentative for a while after), at every advertisement: logged
    /// once per [`SEND_FAILURE_LOG_EVERY`].
    send_failures: BTreeMap<SocketKey, (Option<Instant>, u64)>,
}

/// At most one log line per VRRP socket whose sends fail, this often.
const SEND_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

impl Vrrp {
    pub fn new(router: Router) -> Self {
        Self { router, sockets: BTreeMap::new(), send_failures: BTreeMap::new() }
    }

    /// Sends the router's datagrams out of their interface's socket of their family.
    pub fn send(&mut self, out: &[Outgoing]) {
        for o in out {
            let key = (o.interface.clone(), IpFamily::of(o.destination));
            let Some(socket) = self.sockets.get(&key) else {
                warn!(interface = %o.interface, "no VRRP socket on the interface: advertisement not sent");
                continue;
            };
            let Err(e) = socket.send_to(&o.payload, o.destination) else { continue };
            let now = Instant::now();
            let (logged, unlogged) = self.send_failures.entry(key).or_default();
            if logged.is_some_and(|at| now < at + SEND_FAILURE_LOG_EVERY) {
                *unlogged += 1;
                continue;
            }
            warn!(
                interface = %o.interface,
                source = %socket.source(),
                destination = %o.destination,
                error = %e,
                since_last_log = *unlogged,
                "sending a VRRP advertisement failed"
            );
            (*logged, *unlogged) = (Some(now), 0);
        }
    }

    /// Opens a socket for each interface and family the plan runs instances of, from this
    /// node's address there, where none is open from it yet (`ifindex` finds the interfaces),
    /// for the caller to add. An address this node does not have is the config's mistake: the
    /// error names the interface, the family and what was expected.
    pub fn open_missing(
        &self,
        plan: &NodePlan,
        ifindex: impl Fn(&str) -> Option<(u32, Option<crate::vrrp::tagged::Link>)>,
    ) -> std::result::Result<BTreeMap<SocketKey, VrrpSocket>, (SocketKey, String)> {
        let mut opened = BTreeMap::new();
        let wanted: BTreeMap<SocketKey, IpAddr> = plan
            .instances
            .iter()
            .filter_map(|i| {
                let key = (i.interface.clone(), i.family);
                let local = *plan.locals.get(&key)?;
                Some((key, local))
            })
            .collect();
        for (key, local) in wanted {
            if self.sockets.get(&key).is_some_and(|s| s.source() == local) {
                continue;
            }
            let name = key.0.as_str();
            let Some((index, vlan)) = ifindex(name) else { continue };
            let socket = match VrrpSocket::open(name, index, local, vlan) {
                Ok(socket) => socket,
                Err(e) => {
                    let expected = if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                        format!(
                            "an address of {name} on this node, but {local} is not (or is still tentative)"
                        )
                    } else {
                        format!("an address the VRRP socket on {name} can use ({local}: {e})")
                    };
                    return Err((key, expected));
                }
            };
            opened.insert(key, socket);
        }
        Ok(opened)
    }

    /// Closes the sockets of interfaces where the plan runs no instance any more: called once
    /// the router has sent its last advertisements out of them. Closed on a blocking thread:
    /// leaving the multicast group takes RTNL, which another link change may hold for a while.
    pub fn close_unused_sockets(&mut self, plan: &NodePlan) {
        let unused: Vec<SocketKey> = self
            .sockets
            .keys()
            .filter(|(name, family)| {
                !plan.instances.iter().any(|i| i.interface == *name && i.family == *family)
            })
            .cloned()
            .collect();
        let closing: Vec<VrrpSocket> = unused.iter().filter_map(|key| self.sockets.remove(key)).collect();
        if !closing.is_empty() {
            drop_off_loop(closing);
        }
    }

    /// Handles the datagrams already waiting on the sockets, without waiting for more, and
    /// sends what they call for; true when there were any.
    pub fn drain(&mut self, buf: &mut [u8]) -> bool {
        let mut out = Vec::new();
        let mut received = false;
        for ((name, _), socket) in &self.sockets {
            for _ in 0..DRAIN_LIMIT {
                let Ok(arrived) = socket.try_recv(buf) else { break };
                received = true;
                out.extend(self.router.on_datagram(Instant::now().into_std(), name, arrived.datagram(buf)));
            }
        }
        self.send(&out);
        received
    }
}

/// The next datagram on any of `vrrp`'s sockets, if it runs and has one.
pub fn receive<'a>(
    vrrp: &'a Option<Vrrp>,
    turn: &'a mut usize,
    buf: &'a mut [u8],
) -> Option<impl std::future::Future<Output = (SocketKey, std::io::Result<Arrived>)> + 'a> {
    let vrrp = vrrp.as_ref().filter(|v| !v.sockets.is_empty())?;
    Some(VrrpSocket::recv_any(&vrrp.sockets, turn, buf))
}

/// Drops `value` on a blocking thread: closing a socket or a BPF link waits for the kernel
/// (RTNL, an RCU grace period), and the VRRP loop must not wait with it.
pub(crate) fn drop_off_loop<T: Send + 'static>(value: T) {
    drop(tokio::task::spawn_blocking(move || drop(value)));
}
