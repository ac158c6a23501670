//! All of this node's virtual routers, of both families and on each of its interfaces: the
//! §7.1 receive checks (the arrival interface among them), dispatch by (family, VRID),
//! advertisement encoding, and the graceful handover on shutdown. VRIDs are unique across the
//! node's interfaces within a family (placement allocates them so), which keeps one lease
//! slot per instance.
//!
//! Still sans-IO: datagrams and time go in, [`Outgoing`] datagrams and the owned-VIP set come
//! out. The agent's shell owns the socket and the data plane.
//!
//! Here: the instances, their dispatch and what they own. Beside it: `wire` (datagrams in and
//! out, encoding, decoding, authentication), `replay` (sequences, anti-replay), `handover`
//! (shutdown), `foreign` (routers outside a group that use its VRIDs).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tracing::{debug, info, warn};

use super::{
    auth::Keyring,
    family::{InstanceId, IpFamily},
    instance::{Action, Ignored, Instance, InstanceConfig, State},
    metrics::{VrrpMetrics, drop_reason},
    packet::{ChecksumMode, Received},
};
use crate::logging::LogBudget;

mod foreign;
mod handover;
mod replay;
mod wire;

pub use foreign::FOREIGN_LOG_EVERY;
use foreign::ForeignRouter;
use handover::{HANDOVER_GRACE, Handover};
pub use wire::{Datagram, Outgoing};
use wire::{decode_authenticated, encode_adverts, same_addresses, unix_micros};

/// Multicast to the family's group (224.0.0.18, ff02::12), or unicast to each peer.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Transport {
    #[default]
    Multicast,
    Unicast,
}

/// What this node runs for one VRID of one family: derived from the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    pub group: String,
    /// The interface its adverts leave and must arrive by.
    pub interface: String,
    /// The family of its VIPs, its peers' addresses and its adverts.
    pub family: IpFamily,
    pub vrid: u8,
    pub priority: u8,
    pub advert_interval: Duration,
    pub preempt: bool,
    pub preempt_delay: Duration,
    pub vips: BTreeSet<IpAddr>,
    /// The other members' addresses (of `family`): the only accepted sources, and the unicast
    /// destinations.
    pub peers: BTreeSet<IpAddr>,
    pub transport: Transport,
    pub checksum: ChecksumMode,
    /// The group's keys when it authenticates (see [`super::auth`]): adverts are signed, and
    /// those without a valid tag are dropped.
    pub keys: Option<Arc<Keyring>>,
}

impl InstanceSpec {
    pub fn id(&self) -> InstanceId {
        InstanceId { family: self.family, vrid: self.vrid }
    }
}

/// One VRID's VIPs as this node claims them, and until when the data plane may go on claiming
/// them if the agent falls silent: the lease the shell writes beside the owned VIPs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub vips: BTreeSet<IpAddr>,
    pub until: Instant,
}

/// A master's lease runs three advertisement intervals past its last advertisement. A backup
/// takes over one Master_Down_Interval (3 × Master_Adver_Interval + Skew_Time, §6.1, with
/// Skew_Time > 0) after the last advertisement it heard, so a master that dies right after
/// advertising stops claiming before any backup starts to.
pub fn master_lease(last_advert: Instant, advert_interval: Duration) -> Instant {
    last_advert + advert_interval * 3
}

struct Running {
    spec: InstanceSpec,
    machine: Instance,
    /// When an advertisement for this VRID was last sent or accepted (for `lb-agent status`).
    last_advert: Option<Instant>,
    /// When this node last sent an advertisement for this VRID (a master's lease runs from it).
    last_sent: Option<Instant>,
    /// When this master last announced its VIPs again over a lower-priority one (see
    /// [`REANNOUNCE_EVERY`]).
    reannounced: Option<Instant>,
}

/// This node's address of each family on each interface it runs instances on: the source of
/// its advertisements there.
pub type Locals = BTreeMap<(String, IpFamily), IpAddr>;

pub struct Router {
    locals: Locals,
    /// Transition log lines: a burst, then a few a second (see [`TRANSITION_LOG`]).
    transition_log: LogBudget,
    /// Each instance's advertisements as last encoded, with the priority they carry: the same
    /// bytes every interval until the instance changes (unsigned groups only).
    encoded: BTreeMap<InstanceId, (u8, Vec<Outgoing>)>,
    instances: BTreeMap<InstanceId, Running>,
    /// VIPs of a master just preempted, still answered until the given time: the new master's
    /// gratuitous ARPs are on their way, and traffic still sent here is served meanwhile.
    lingering: BTreeMap<InstanceId, (BTreeSet<IpAddr>, Instant)>,
    handovers: BTreeMap<InstanceId, Handover>,
    metrics: VrrpMetrics,
    started: bool,
    /// Bumped whenever [`Router::owned_vips`] may have changed, so the shell re-applies
    /// ownership only then and not on every advertisement.
    ownership_epoch: u64,
    /// VIPs to announce again (gratuitous ARP) although ownership did not change.
    reannounce: BTreeSet<IpAddr>,
    /// Non-members heard advertising our VRIDs, by (instance, source).
    foreign: BTreeMap<(InstanceId, IpAddr), ForeignRouter>,
    /// VRIDs whose claim deadline moved without an ownership change (see
    /// [`Router::take_renewed`]).
    renewed: BTreeSet<InstanceId>,
    /// Masters found past their lease when another router had taken over (see
    /// [`Router::take_lapsed`]).
    lapsed: BTreeSet<InstanceId>,
    /// Maps instants to the wall clock for authentication sequences, fixed at start so that a
    /// clock step later never makes this node's sequences go backwards.
    wall_clock: (Instant, u64),
    /// The last sequence this node signed with.
    last_sequence: u64,
    /// The last authenticated sequence accepted, by (instance, sender).
    sequences: BTreeMap<(InstanceId, IpAddr), u64>,
}

/// Every transition of a start or a failover is logged (a node of a 16-node group runs up to
/// 240 instances); past that, ten lines a second, each saying how many were held back.
const TRANSITION_LOG: LogBudget = LogBudget::new(256, 10);

/// A master that keeps hearing a lower-priority router act as master (one that does not hear
/// it: a one-way partition, or a loaded segment dropping adverts) advertises over it every
/// time, but announces its VIPs again at most this often: each reannouncement is a broadcast
/// per VIP, and answering every advertisement with one is how a segment floods (keepalived
/// paces the same with `vrrp_garp_lower_prio_delay`).
pub const REANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// Whenever timers fire, masters due within this long advertise too (see
/// [`Instance::advertise_early`]).
pub const ADVERT_EARLY: Duration = Duration::from_millis(1);

impl Router {
    pub fn new(locals: Locals, metrics: VrrpMetrics) -> Self {
        Self {
            locals,
            transition_log: TRANSITION_LOG,
            encoded: BTreeMap::new(),
            instances: BTreeMap::new(),
            lingering: BTreeMap::new(),
            handovers: BTreeMap::new(),
            metrics,
            started: false,
            ownership_epoch: 0,
            reannounce: BTreeSet::new(),
            foreign: BTreeMap::new(),
            renewed: BTreeSet::new(),
            lapsed: BTreeSet::new(),
            wall_clock: (Instant::now(), unix_micros(SystemTime::now())),
            last_sequence: 0,
            sequences: BTreeMap::new(),
        }
    }

    /// This node's addresses by interface, for the instances of the next
    /// [`Router::reconfigure`] (an instance whose interface or address changes restarts).
    pub fn set_locals(&mut self, locals: Locals) {
        self.locals = locals;
        self.encoded.clear();
    }

    fn local(&self, spec: &InstanceSpec) -> IpAddr {
        running_local(&self.locals, spec)
    }

    /// Starts every instance (§6.4.1 Startup).
    pub fn start(&mut self, now: Instant) -> Vec<Outgoing> {
        self.started = true;
        let mut out = Vec::new();
        let ids: Vec<InstanceId> = self.instances.keys().copied().collect();
        for id in ids {
            let actions = self.instances.get_mut(&id).map(|r| r.machine.startup(now)).unwrap_or_default();
            self.carry_out(now, id, actions, &mut out);
        }
        out
    }

    /// Brings the instances in line with `specs`: new instances start, vanished ones resign,
    /// changed ones take their new priority, interval and VIPs without restarting.
    pub fn reconfigure(&mut self, now: Instant, specs: Vec<InstanceSpec>) -> Vec<Outgoing> {
        self.ownership_epoch += 1;
        let mut out = Vec::new();
        let wanted: BTreeMap<InstanceId, InstanceSpec> = specs.into_iter().map(|s| (s.id(), s)).collect();
        // An instance that moves to another interface (or address) restarts there: its
        // primary address, the tie-breaker, is the new one.
        let gone: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(id, r)| {
                wanted.get(id).is_none_or(|w| {
                    w.interface != r.spec.interface || self.local(w) != r.machine.primary_address()
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.lingering.remove(&id);
            self.encoded.remove(&id);
            if let Some(mut running) = self.instances.remove(&id) {
                let actions = running.machine.shutdown();
                self.record_state(now, id, &running.spec.group, running.machine.state());
                self.metrics.forget(&running.spec.group, id);
                // Nothing will take over this VRID: the VIPs moved to other instances.
                for action in actions {
                    if let Action::SendAdvert { priority } = action {
                        let sequence = self.next_sequence(now);
                        let local = running_local(&self.locals, &running.spec);
                        encode_adverts(local, &running.spec, priority, sequence, &mut out);
                    }
                }
            }
        }
        for (id, spec) in wanted {
            match self.instances.get_mut(&id) {
                Some(running) => {
                    self.encoded.remove(&id);
                    running.machine.set_priority(spec.priority);
                    running.machine.set_preempt(spec.preempt, spec.preempt_delay);
                    running.machine.set_advert_interval(spec.advert_interval);
                    running.spec = spec;
                }
                None => {
                    let machine = Instance::new(InstanceConfig {
                        vrid: id.vrid,
                        priority: spec.priority,
                        advert_interval: spec.advert_interval,
                        preempt: spec.preempt,
                        preempt_delay: spec.preempt_delay,
                        primary_address: self.local(&spec),
                    });
                    self.record_state(now, id, &spec.group, State::Initialize);
                    self.metrics.prepare(&spec.group, id, &spec.interface);
                    self.instances.insert(
                        id,
                        Running { spec, machine, last_advert: None, last_sent: None, reannounced: None },
                    );
                    if self.started {
                        let actions = self.instances.get_mut(&id).map(|r| r.machine.startup(now)).unwrap();
                        self.carry_out(now, id, actions, &mut out);
                    }
                }
            }
        }
        out
    }

    /// Handles one datagram from the raw socket of its family on `interface`.
    pub fn on_datagram(&mut self, now: Instant, interface: &str, datagram: Datagram) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let family = datagram.family();
        let Some(received) = self.verified(now, datagram) else { return out };
        let id = InstanceId { family, vrid: received.advert.vrid };
        if self.heard_successor(now, id, &received) {
            return out;
        }
        let Some(running) = self.instances.get_mut(&id) else {
            self.metrics.dropped(family, Some(id.vrid), drop_reason::UNKNOWN_VRID);
            return out;
        };
        // Another segment's router with the same VRID, or a frame bridged across: never ours.
        if running.spec.interface != interface {
            self.metrics.dropped(family, Some(id.vrid), drop_reason::WRONG_INTERFACE);
            return out;
        }
        // VRRPv3 has no authentication: only the group's members may speak for its VRIDs.
        if !running.spec.peers.contains(&received.source) {
            self.metrics.dropped(family, Some(id.vrid), drop_reason::NOT_MEMBER);
            let group = running.spec.group.clone();
            self.foreign_advert(now, group, id, received.source);
            return out;
        }
        self.metrics.received(&running.spec.group, id);
        if !same_addresses(&received.advert, &running.spec.vips) {
            // §7.1: "MAY verify … SHOULD log"; still processed, as the RFC allows.
            debug!(instance = %id, source = %received.source, "advertised addresses differ from ours");
            self.metrics.address_mismatch(&running.spec.group, id);
        }
        match running.machine.on_advert(now, received.source, &received.advert) {
            Ok(actions) => {
                if let Some(r) = self.instances.get_mut(&id) {
                    r.last_advert = Some(now);
                }
                self.carry_out(now, id, actions, &mut out)
            }
            Err(reason) => {
                let label = match reason {
                    Ignored::LowerPriority => drop_reason::LOWER_PRIORITY,
                    Ignored::WeAreOwner => drop_reason::WE_ARE_OWNER,
                    Ignored::NotRunning => drop_reason::NOT_RUNNING,
                };
                self.metrics.dropped(family, Some(id.vrid), label);
            }
        }
        out
    }

    /// The datagram decoded and, for a group with keys, authenticated and fresh; `None` (the
    /// drop counted) for our own, a replay, or one that does not decode.
    fn verified(&mut self, now: Instant, datagram: Datagram) -> Option<Received> {
        let family = datagram.family();
        // The checksum mode and keys are per instance, so find the instance before verifying.
        let spec = datagram.peek_id().and_then(|id| self.instances.get(&id)).map(|r| &r.spec);
        let (checksum, keys) = spec.map_or((ChecksumMode::Rfc, None), |s| (s.checksum, s.keys.clone()));
        let (received, sequence) = match decode_authenticated(datagram, checksum, keys.as_deref()) {
            Ok(decoded) => decoded,
            Err((error, label)) => {
                debug!(%error, family = family.as_str(), "VRRP datagram dropped");
                self.metrics.dropped(family, datagram.peek_vrid(), label);
                return None;
            }
        };
        let id = InstanceId { family, vrid: received.advert.vrid };
        if self.locals.values().any(|local| *local == received.source) {
            self.metrics.dropped(family, Some(id.vrid), drop_reason::OWN);
            return None;
        }
        if let Some(sequence) = sequence
            && !self.fresh(now, id, received.source, sequence)
        {
            self.metrics.dropped(family, Some(id.vrid), drop_reason::REPLAYED);
            return None;
        }
        Some(received)
    }

    /// Fires every timer due by `now`.
    pub fn on_timer(&mut self, now: Instant) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let due: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(_, r)| r.machine.next_deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let actions = self.instances.get_mut(&id).map(|r| r.machine.on_timer(now)).unwrap_or_default();
            self.carry_out(now, id, actions, &mut out);
        }
        let ids: Vec<InstanceId> = self.instances.keys().copied().collect();
        for id in ids {
            let actions = self.instances.get_mut(&id).map(|r| r.machine.advertise_early(now, ADVERT_EARLY));
            if let Some(actions) = actions.filter(|a| !a.is_empty()) {
                self.carry_out(now, id, actions, &mut out);
            }
        }
        let expired = self.lingering.len();
        self.lingering.retain(|_, (_, until)| *until > now);
        if self.lingering.len() != expired {
            self.ownership_epoch += 1;
        }
        let released: Vec<InstanceId> =
            self.handovers.iter().filter(|(_, h)| h.release_at <= now).map(|(id, _)| *id).collect();
        for id in released {
            if let Some(h) = self.handovers.remove(&id) {
                self.ownership_epoch += 1;
                info!(instance = %id, successor_heard = h.successor_heard, "handover done, VIPs released");
            }
        }
        out
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        let instances = self.instances.values().filter_map(|r| r.machine.next_deadline());
        instances
            .chain(self.handovers.values().map(|h| h.release_at))
            .chain(self.lingering.values().map(|(_, until)| *until))
            .min()
    }

    /// The VIPs this node must answer for now: those of Master instances and of handovers.
    pub fn owned_vips(&self) -> BTreeSet<IpAddr> {
        self.claims().into_values().flat_map(|c| c.vips).collect()
    }

    /// What this node claims, by instance: a master until its lease ([`master_lease`]) runs
    /// out, a handover or a preempted master until it lets go (both bounded already).
    pub fn claims(&self) -> BTreeMap<InstanceId, Claim> {
        let mut claims: BTreeMap<InstanceId, Claim> = BTreeMap::new();
        for (id, vips, until) in self.claimed() {
            let claim = claims.entry(id).or_insert_with(|| Claim { vips: BTreeSet::new(), until });
            claim.vips.extend(vips);
            claim.until = claim.until.max(until);
        }
        claims
    }

    /// Only the deadlines of [`Router::claims`], without copying VIPs: the shell renews the
    /// leases after every event, and a group may hold thousands of VIPs.
    pub fn lease_deadlines(&self) -> BTreeMap<InstanceId, Instant> {
        let mut deadlines: BTreeMap<InstanceId, Instant> = BTreeMap::new();
        for (id, _, until) in self.claimed() {
            let deadline = deadlines.entry(id).or_insert(until);
            *deadline = (*deadline).max(until);
        }
        deadlines
    }

    /// The shell is about to wait for events (see [`Instance::idle_since`]).
    pub fn idle(&mut self, now: Instant) {
        for running in self.instances.values_mut() {
            running.machine.idle_since(now);
        }
    }

    /// One instance's deadline in [`Router::claims`], if it claims anything.
    pub fn lease_deadline(&self, id: InstanceId) -> Option<Instant> {
        let master = self
            .instances
            .get(&id)
            .filter(|r| r.machine.state() == State::Master)
            .and_then(|r| Some(master_lease(r.last_sent?, r.spec.advert_interval)));
        let handover = self.handovers.get(&id).map(|h| h.release_at);
        let lingering = self.lingering.get(&id).map(|(_, until)| *until);
        [master, handover, lingering].into_iter().flatten().max()
    }

    /// The instances whose deadline may have moved since the last call without the ownership epoch
    /// changing (an advertisement sent, a successor heard): the shell renews just those, and
    /// rewrites all of them only when the epoch changes. Every instance advertises each
    /// interval, so renewing them all per event would cost instances² per interval.
    pub fn take_renewed(&mut self) -> BTreeSet<InstanceId> {
        std::mem::take(&mut self.renewed)
    }

    /// The masters found past their lease ([`Action::LeaseLapsed`]) since the last call. The
    /// shell counts a lease that ran out when it renews it; one of these it releases instead
    /// (the master follows the router that took over), and a release is no sign of a lapse
    /// by itself: a preempted master's or a handover's claim ends when its time is up.
    pub fn take_lapsed(&mut self) -> BTreeSet<InstanceId> {
        std::mem::take(&mut self.lapsed)
    }

    fn claimed(&self) -> impl Iterator<Item = (InstanceId, &BTreeSet<IpAddr>, Instant)> {
        // A master has always advertised: §6.4.2 sends one on the transition.
        let masters = self.instances.iter().filter(|(_, r)| r.machine.state() == State::Master).filter_map(
            |(id, r)| r.last_sent.map(|sent| (*id, &r.spec.vips, master_lease(sent, r.spec.advert_interval))),
        );
        let handovers = self.handovers.iter().map(|(id, h)| (*id, &h.vips, h.release_at));
        let lingering = self.lingering.iter().map(|(id, (vips, until))| (*id, vips, *until));
        masters.chain(handovers).chain(lingering)
    }

    /// VIPs to announce again since the last call (see [`Action::Reannounce`]).
    pub fn take_reannouncements(&mut self) -> BTreeSet<IpAddr> {
        std::mem::take(&mut self.reannounce)
    }

    /// Changes whenever [`Router::owned_vips`] may have changed.
    pub fn ownership_epoch(&self) -> u64 {
        self.ownership_epoch
    }

    /// When each instance's last advertisement was sent or accepted.
    pub fn last_adverts(&self) -> impl Iterator<Item = (InstanceId, Option<Instant>)> + '_ {
        self.instances.iter().map(|(id, r)| (*id, r.last_advert))
    }

    pub fn instances(&self) -> impl Iterator<Item = (&InstanceSpec, &Instance)> {
        self.instances.values().map(|r| (&r.spec, &r.machine))
    }

    fn carry_out(&mut self, now: Instant, id: InstanceId, actions: Vec<Action>, out: &mut Vec<Outgoing>) {
        let advertises = actions.iter().any(|a| matches!(a, Action::SendAdvert { .. }));
        if advertises && let Some(r) = self.instances.get_mut(&id) {
            r.last_advert = Some(now);
            r.last_sent = Some(now);
            self.renewed.insert(id);
        }
        let sequence = if advertises { self.next_sequence(now) } else { self.last_sequence };
        let Some(running) = self.instances.get(&id) else { return };
        let mut reannounced = false;
        for action in actions {
            match action {
                Action::SendAdvert { priority } => {
                    let (local, spec) = (running_local(&self.locals, &running.spec), &running.spec);
                    if spec.keys.is_some() {
                        // Signed: each advert carries its own sequence.
                        encode_adverts(local, spec, priority, sequence, out);
                    } else {
                        let (encoded_for, encoded) = self.encoded.entry(id).or_insert((priority, Vec::new()));
                        if *encoded_for != priority || encoded.is_empty() {
                            encoded.clear();
                            encode_adverts(local, spec, priority, sequence, encoded);
                            *encoded_for = priority;
                        }
                        out.extend(encoded.iter().cloned());
                    }
                    self.metrics.sent(&running.spec.group, id);
                }
                // Ownership is derived from the states (see `owned_vips`), not tracked twice.
                Action::TakeOwnership => {
                    self.ownership_epoch += 1;
                    self.lingering.remove(&id);
                }
                Action::ReleaseOwnership => {
                    self.ownership_epoch += 1;
                    self.lingering.insert(id, (running.spec.vips.clone(), now + HANDOVER_GRACE));
                }
                Action::LeaseLapsed => {
                    self.lapsed.insert(id);
                    let following = running.machine.state() == State::Backup;
                    warn!(
                        group = %running.spec.group,
                        instance = %id,
                        master = ?running.machine.master(),
                        "this master fell silent past its lease (the agent was frozen or stalled) and another \
                         router took over meanwhile: {}",
                        if following { "following it" } else { "reasserting (preempt)" }
                    );
                    if following {
                        self.ownership_epoch += 1;
                        self.lingering.remove(&id);
                    }
                }
                Action::Reannounce => {
                    self.metrics.reasserted(&running.spec.group, id);
                    if running.reannounced.is_some_and(|at| now < at + REANNOUNCE_EVERY) {
                        continue;
                    }
                    info!(group = %running.spec.group, instance = %id, "a lower-priority router acted as master; reasserting");
                    self.reannounce.extend(&running.spec.vips);
                    reannounced = true;
                }
            }
        }
        let (group, state, master) =
            (running.spec.group.clone(), running.machine.state(), running.machine.master());
        if reannounced && let Some(r) = self.instances.get_mut(&id) {
            r.reannounced = Some(now);
        }
        self.record_state(now, id, &group, state);
        self.metrics.master(&group, id, master);
    }

    /// Exports the instance's state; logs a transition while the log budget allows (a group
    /// in trouble may flap hundreds of times a second: the metric counts every one).
    fn record_state(&mut self, now: Instant, id: InstanceId, group: &str, state: State) {
        if let Some((from, to)) = self.metrics.state(group, id, state)
            && let Some(held_back) = self.transition_log.allow(now)
        {
            info!(group, instance = %id, from = from.as_str(), to = to.as_str(), held_back, "VRRP transition");
        }
    }
}

/// This node's address of `spec`'s family on its interface.
fn running_local(locals: &Locals, spec: &InstanceSpec) -> IpAddr {
    locals.get(&(spec.interface.clone(), spec.family)).copied().unwrap_or(spec.family.unspecified())
}

#[cfg(test)]
mod tests;
