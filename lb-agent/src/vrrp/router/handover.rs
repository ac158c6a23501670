//! The graceful handover on shutdown: each master resigns (priority 0) and keeps answering for
//! its VIPs until a successor is heard, or a bound passes.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, Instant},
};

use super::{Outgoing, Router, encode_adverts, running_local};
use tracing::info;

use crate::vrrp::{
    family::InstanceId,
    instance::{Action, PRIORITY_RESIGN, State},
    packet::Received,
};

/// After the successor's first advertisement, keep answering this long: its gratuitous ARPs
/// are on their way to the clients, and traffic still addressed to us is served meanwhile.
pub(super) const HANDOVER_GRACE: Duration = Duration::from_millis(150);

/// A resigned master that keeps its VIPs until a new master is heard (or a bound passes), so a
/// rolling restart never leaves the VIPs unanswered.
pub(super) struct Handover {
    pub(super) group: String,
    pub(super) vips: BTreeSet<IpAddr>,
    pub(super) peers: BTreeSet<IpAddr>,
    pub(super) release_at: Instant,
    pub(super) successor_heard: bool,
}

impl Router {
    /// SIGTERM: every master resigns with priority 0 and keeps its VIPs until a successor
    /// advertises (or three of its intervals pass, when nobody is there to take over).
    pub fn shutdown(&mut self, now: Instant) -> Vec<Outgoing> {
        self.ownership_epoch += 1;
        let mut out = Vec::new();
        let ids: Vec<InstanceId> = self.instances.keys().copied().collect();
        for id in ids {
            let Some(running) = self.instances.get_mut(&id) else { continue };
            let was_master = running.machine.state() == State::Master;
            let actions = running.machine.shutdown();
            if was_master {
                let spec = &running.spec;
                let bound = spec.advert_interval * 3 + Duration::from_millis(100);
                self.handovers.insert(
                    id,
                    Handover {
                        group: spec.group.clone(),
                        vips: spec.vips.clone(),
                        peers: spec.peers.clone(),
                        release_at: now + bound,
                        successor_heard: false,
                    },
                );
            }
            // The Release is deferred to the handover; only the resignation goes out now.
            for action in actions {
                if let Action::SendAdvert { priority } = action {
                    let sequence = self.next_sequence(now);
                    let spec = &self.instances[&id].spec;
                    encode_adverts(running_local(&self.locals, spec), spec, priority, sequence, &mut out);
                    self.metrics.sent(&self.instances[&id].spec.group, id);
                }
            }
            let group = self.instances[&id].spec.group.clone();
            self.record_state(now, id, &group, State::Initialize);
        }
        out
    }

    /// True while a handover still holds VIPs.
    pub fn handing_over(&self) -> bool {
        !self.handovers.is_empty()
    }

    /// Whether `received` is a handover's successor speaking (not resigning): the first one
    /// starts the release's grace period. Such an advert is for the handover alone.
    pub(super) fn heard_successor(&mut self, now: Instant, id: InstanceId, received: &Received) -> bool {
        let Some(handover) = self.handovers.get_mut(&id) else { return false };
        if !handover.peers.contains(&received.source) || received.advert.priority == PRIORITY_RESIGN {
            return false;
        }
        if !handover.successor_heard {
            info!(instance = %id, successor = %received.source, "successor heard, releasing VIPs shortly");
            handover.successor_heard = true;
            handover.release_at = handover.release_at.min(now + HANDOVER_GRACE);
            self.renewed.insert(id);
        }
        self.metrics.received(&handover.group, id);
        true
    }
}
