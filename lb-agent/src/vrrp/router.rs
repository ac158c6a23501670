//! All of this node's virtual routers, on each of its interfaces: the §7.1 receive checks
//! (the arrival interface among them), dispatch by VRID, advertisement encoding, and the
//! graceful handover on shutdown. VRIDs are unique across the node's interfaces (the planner
//! allocates them so), which keeps one lease slot per VRID.
//!
//! Still sans-IO: datagrams and time go in, [`Outgoing`] datagrams and the owned-VIP set come
//! out. The agent's shell owns the socket and the data plane.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tracing::{debug, info, warn};

use super::{
    auth::{FRESHNESS, Keyring},
    instance::{Action, Ignored, Instance, InstanceConfig, PRIORITY_RESIGN, State},
    ipv4::{decode_ipv4, decode_ipv4_with_trailer},
    metrics::VrrpMetrics,
    packet::{Advertisement, ChecksumMode, DecodeError, VRRP_MULTICAST_V4},
};

/// Multicast to 224.0.0.18, or unicast to each peer.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Transport {
    #[default]
    Multicast,
    Unicast,
}

/// What this node runs for one VRID: derived from the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    pub group: String,
    /// The interface its adverts leave and must arrive by.
    pub interface: String,
    pub vrid: u8,
    pub priority: u8,
    pub advert_interval: Duration,
    pub preempt: bool,
    pub preempt_delay: Duration,
    pub vips: BTreeSet<Ipv4Addr>,
    /// The other members' addresses: the only accepted sources, and the unicast destinations.
    pub peers: BTreeSet<Ipv4Addr>,
    pub transport: Transport,
    pub checksum: ChecksumMode,
    /// The group's keys when it authenticates (see [`super::auth`]): adverts are signed, and
    /// those without a valid tag are dropped.
    pub keys: Option<Arc<Keyring>>,
}

/// One VRID's VIPs as this node claims them, and until when the data plane may go on claiming
/// them if the agent falls silent: the lease the shell writes beside the owned VIPs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub vips: BTreeSet<Ipv4Addr>,
    pub until: Instant,
}

/// A master's lease runs three advertisement intervals past its last advertisement. A backup
/// takes over one Master_Down_Interval (3 × Master_Adver_Interval + Skew_Time, §6.1, with
/// Skew_Time > 0) after the last advertisement it heard, so a master that dies right after
/// advertising stops claiming before any backup starts to.
pub fn master_lease(last_advert: Instant, advert_interval: Duration) -> Instant {
    last_advert + advert_interval * 3
}

/// A datagram for the shell to send, out of `interface`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub interface: String,
    pub destination: Ipv4Addr,
    pub payload: Vec<u8>,
}

/// Why a received datagram was dropped before or by the state machine (metric labels).
pub mod drop_reason {
    pub const OWN: &str = "own_advert";
    pub const UNKNOWN_VRID: &str = "unknown_vrid";
    pub const NOT_MEMBER: &str = "not_member";
    pub const LOWER_PRIORITY: &str = "lower_priority";
    pub const WE_ARE_OWNER: &str = "we_are_owner";
    pub const NOT_RUNNING: &str = "not_running";
    /// Authenticated, but not newer than the last one accepted from that sender (or, from a
    /// sender not heard yet, older than [`super::super::auth::FRESHNESS`]).
    pub const REPLAYED: &str = "replayed";
    /// For a VRID of this node's, but arrived by another interface than its group's.
    pub const WRONG_INTERFACE: &str = "wrong_interface";
}

struct Running {
    spec: InstanceSpec,
    machine: Instance,
    /// When an advertisement for this VRID was last sent or accepted (for `lb-agent status`).
    last_advert: Option<Instant>,
    /// When this node last sent an advertisement for this VRID (a master's lease runs from it).
    last_sent: Option<Instant>,
}

/// A resigned master that keeps its VIPs until a new master is heard (or a bound passes), so a
/// rolling restart never leaves the VIPs unanswered.
struct Handover {
    group: String,
    vips: BTreeSet<Ipv4Addr>,
    peers: BTreeSet<Ipv4Addr>,
    release_at: Instant,
    successor_heard: bool,
}

pub struct Router {
    /// This node's address on each interface it runs instances on.
    locals: BTreeMap<String, Ipv4Addr>,
    instances: BTreeMap<u8, Running>,
    /// VIPs of a master just preempted, still answered until the given time: the new master's
    /// gratuitous ARPs are on their way, and traffic still sent here is served meanwhile.
    lingering: BTreeMap<u8, (BTreeSet<Ipv4Addr>, Instant)>,
    handovers: BTreeMap<u8, Handover>,
    metrics: VrrpMetrics,
    started: bool,
    /// Bumped whenever [`Router::owned_vips`] may have changed, so the shell re-applies
    /// ownership only then and not on every advertisement.
    ownership_epoch: u64,
    /// VIPs to announce again (gratuitous ARP) although ownership did not change.
    reannounce: BTreeSet<Ipv4Addr>,
    /// Non-members heard advertising our VRIDs, by (VRID, source).
    foreign: BTreeMap<(u8, Ipv4Addr), ForeignRouter>,
    /// VRIDs whose claim deadline moved without an ownership change (see
    /// [`Router::take_renewed`]).
    renewed: BTreeSet<u8>,
    /// Maps instants to the wall clock for authentication sequences, fixed at start so that a
    /// clock step later never makes this node's sequences go backwards.
    wall_clock: (Instant, u64),
    /// The last sequence this node signed with.
    last_sequence: u64,
    /// The last authenticated sequence accepted, by (VRID, sender).
    sequences: BTreeMap<(u8, Ipv4Addr), u64>,
}

/// A router outside the group that advertises one of its VRIDs.
struct ForeignRouter {
    group: String,
    logged: Option<Instant>,
    /// Advertisements since the last log line.
    unlogged: u64,
}

impl ForeignRouter {
    /// Counts one more advertisement; `Some(unlogged since the last line)` when a line is due.
    fn log_now(&mut self, now: Instant) -> Option<u64> {
        if self.logged.is_some_and(|at| now < at + FOREIGN_LOG_EVERY) {
            self.unlogged += 1;
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// At most one log line per foreign router and VRID in this long.
pub const FOREIGN_LOG_EVERY: Duration = Duration::from_secs(60);
/// Foreign routers remembered at most.
const FOREIGN_MAX: usize = 256;

/// After the successor's first advertisement, keep answering this long: its gratuitous ARPs
/// are on their way to the clients, and traffic still addressed to us is served meanwhile.
const HANDOVER_GRACE: Duration = Duration::from_millis(150);

impl Router {
    pub fn new(locals: BTreeMap<String, Ipv4Addr>, metrics: VrrpMetrics) -> Self {
        Self {
            locals,
            instances: BTreeMap::new(),
            lingering: BTreeMap::new(),
            handovers: BTreeMap::new(),
            metrics,
            started: false,
            ownership_epoch: 0,
            reannounce: BTreeSet::new(),
            foreign: BTreeMap::new(),
            renewed: BTreeSet::new(),
            wall_clock: (Instant::now(), unix_micros(SystemTime::now())),
            last_sequence: 0,
            sequences: BTreeMap::new(),
        }
    }

    /// This node's addresses by interface, for the instances of the next
    /// [`Router::reconfigure`] (an instance whose interface or address changes restarts).
    pub fn set_locals(&mut self, locals: BTreeMap<String, Ipv4Addr>) {
        self.locals = locals;
    }

    fn local(&self, interface: &str) -> Ipv4Addr {
        self.locals.get(interface).copied().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// Starts every instance (§6.4.1 Startup).
    pub fn start(&mut self, now: Instant) -> Vec<Outgoing> {
        self.started = true;
        let mut out = Vec::new();
        let vrids: Vec<u8> = self.instances.keys().copied().collect();
        for vrid in vrids {
            let actions = self.instances.get_mut(&vrid).map(|r| r.machine.startup(now)).unwrap_or_default();
            self.carry_out(now, vrid, actions, &mut out);
        }
        out
    }

    /// Brings the instances in line with `specs`: new VRIDs start, vanished ones resign,
    /// changed ones take their new priority, interval and VIPs without restarting.
    pub fn reconfigure(&mut self, now: Instant, specs: Vec<InstanceSpec>) -> Vec<Outgoing> {
        self.ownership_epoch += 1;
        let mut out = Vec::new();
        let wanted: BTreeMap<u8, InstanceSpec> = specs.into_iter().map(|s| (s.vrid, s)).collect();
        // An instance that moves to another interface (or address) restarts there: its
        // primary address, the tie-breaker, is the new one.
        let gone: Vec<u8> = self
            .instances
            .iter()
            .filter(|(vrid, r)| {
                wanted.get(vrid).is_none_or(|w| {
                    w.interface != r.spec.interface || self.local(&w.interface) != r.machine.primary_address()
                })
            })
            .map(|(vrid, _)| *vrid)
            .collect();
        for vrid in gone {
            self.lingering.remove(&vrid);
            if let Some(mut running) = self.instances.remove(&vrid) {
                let actions = running.machine.shutdown();
                self.record_state(vrid, &running.spec.group, running.machine.state());
                self.metrics.forget(&running.spec.group, vrid);
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
        for (vrid, spec) in wanted {
            match self.instances.get_mut(&vrid) {
                Some(running) => {
                    running.machine.set_priority(spec.priority);
                    running.machine.set_preempt(spec.preempt, spec.preempt_delay);
                    running.machine.set_advert_interval(spec.advert_interval);
                    running.spec = spec;
                }
                None => {
                    let machine = Instance::new(InstanceConfig {
                        vrid,
                        priority: spec.priority,
                        advert_interval: spec.advert_interval,
                        preempt: spec.preempt,
                        preempt_delay: spec.preempt_delay,
                        primary_address: self.local(&spec.interface),
                    });
                    self.record_state(vrid, &spec.group, State::Initialize);
                    self.metrics.prepare(&spec.group, vrid, &spec.interface);
                    self.instances
                        .insert(vrid, Running { spec, machine, last_advert: None, last_sent: None });
                    if self.started {
                        let actions = self.instances.get_mut(&vrid).map(|r| r.machine.startup(now)).unwrap();
                        self.carry_out(now, vrid, actions, &mut out);
                    }
                }
            }
        }
        out
    }

    /// Handles one datagram from the raw socket on `interface` (IPv4 header included).
    pub fn on_datagram(&mut self, now: Instant, interface: &str, datagram: &[u8]) -> Vec<Outgoing> {
        let mut out = Vec::new();
        // The checksum mode and keys are per instance, so find the VRID before verifying.
        let spec = peek_vrid(datagram).and_then(|vrid| self.instances.get(&vrid)).map(|r| &r.spec);
        let (checksum, keys) = spec.map_or((ChecksumMode::Rfc, None), |s| (s.checksum, s.keys.clone()));
        let received = match decode_authenticated(datagram, checksum, keys.as_deref()) {
            Ok((received, sequence)) => {
                if self.locals.values().any(|local| *local == received.source) {
                    self.metrics.dropped(Some(received.advert.vrid), drop_reason::OWN);
                    return out;
                }
                if let Some(sequence) = sequence
                    && !self.fresh(now, received.advert.vrid, received.source, sequence)
                {
                    self.metrics.dropped(Some(received.advert.vrid), drop_reason::REPLAYED);
                    return out;
                }
                received
            }
            Err((error, label)) => {
                debug!(%error, "VRRP datagram dropped");
                self.metrics.dropped(peek_vrid(datagram), label);
                return out;
            }
        };
        let vrid = received.advert.vrid;
        if let Some(handover) = self.handovers.get_mut(&vrid)
            && handover.peers.contains(&received.source)
            && received.advert.priority != PRIORITY_RESIGN
        {
            if !handover.successor_heard {
                info!(vrid, successor = %received.source, "successor heard, releasing VIPs shortly");
                handover.successor_heard = true;
                handover.release_at = handover.release_at.min(now + HANDOVER_GRACE);
                self.renewed.insert(vrid);
            }
            self.metrics.received(&handover.group, vrid);
            return out;
        }
        let Some(running) = self.instances.get_mut(&vrid) else {
            self.metrics.dropped(Some(vrid), drop_reason::UNKNOWN_VRID);
            return out;
        };
        // Another segment's router with the same VRID, or a frame bridged across: never ours.
        if running.spec.interface != interface {
            self.metrics.dropped(Some(vrid), drop_reason::WRONG_INTERFACE);
            return out;
        }
        // VRRPv3 has no authentication: only the group's members may speak for its VRIDs.
        if !running.spec.peers.contains(&received.source) {
            self.metrics.dropped(Some(vrid), drop_reason::NOT_MEMBER);
            let group = running.spec.group.clone();
            self.foreign_advert(now, group, vrid, received.source);
            return out;
        }
        self.metrics.received(&running.spec.group, vrid);
        if !same_addresses(&received.advert, &running.spec.vips) {
            // §7.1: "MAY verify … SHOULD log"; still processed, as the RFC allows.
            debug!(vrid, source = %received.source, "advertised addresses differ from ours");
            self.metrics.address_mismatch(&running.spec.group, vrid);
        }
        match running.machine.on_advert(now, received.source, &received.advert) {
            Ok(actions) => {
                if let Some(r) = self.instances.get_mut(&vrid) {
                    r.last_advert = Some(now);
                }
                self.carry_out(now, vrid, actions, &mut out)
            }
            Err(reason) => {
                let label = match reason {
                    Ignored::LowerPriority => drop_reason::LOWER_PRIORITY,
                    Ignored::WeAreOwner => drop_reason::WE_ARE_OWNER,
                    Ignored::NotRunning => drop_reason::NOT_RUNNING,
                };
                self.metrics.dropped(Some(vrid), label);
            }
        }
        out
    }

    /// Fires every timer due by `now`.
    pub fn on_timer(&mut self, now: Instant) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let due: Vec<u8> = self
            .instances
            .iter()
            .filter(|(_, r)| r.machine.next_deadline().is_some_and(|d| d <= now))
            .map(|(v, _)| *v)
            .collect();
        for vrid in due {
            let actions = self.instances.get_mut(&vrid).map(|r| r.machine.on_timer(now)).unwrap_or_default();
            self.carry_out(now, vrid, actions, &mut out);
        }
        let expired = self.lingering.len();
        self.lingering.retain(|_, (_, until)| *until > now);
        if self.lingering.len() != expired {
            self.ownership_epoch += 1;
        }
        let released: Vec<u8> =
            self.handovers.iter().filter(|(_, h)| h.release_at <= now).map(|(v, _)| *v).collect();
        for vrid in released {
            if let Some(h) = self.handovers.remove(&vrid) {
                self.ownership_epoch += 1;
                info!(vrid, successor_heard = h.successor_heard, "handover done, VIPs released");
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

    /// SIGTERM: every master resigns with priority 0 and keeps its VIPs until a successor
    /// advertises (or three of its intervals pass, when nobody is there to take over).
    pub fn shutdown(&mut self, now: Instant) -> Vec<Outgoing> {
        self.ownership_epoch += 1;
        let mut out = Vec::new();
        let vrids: Vec<u8> = self.instances.keys().copied().collect();
        for vrid in vrids {
            let Some(running) = self.instances.get_mut(&vrid) else { continue };
            let was_master = running.machine.state() == State::Master;
            let actions = running.machine.shutdown();
            if was_master {
                let spec = &running.spec;
                let bound = spec.advert_interval * 3 + Duration::from_millis(100);
                self.handovers.insert(
                    vrid,
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
                    let spec = &self.instances[&vrid].spec;
                    encode_adverts(running_local(&self.locals, spec), spec, priority, sequence, &mut out);
                    self.metrics.sent(&self.instances[&vrid].spec.group, vrid);
                }
            }
            let group = self.instances[&vrid].spec.group.clone();
            self.record_state(vrid, &group, State::Initialize);
        }
        out
    }

    /// True while a handover still holds VIPs.
    pub fn handing_over(&self) -> bool {
        !self.handovers.is_empty()
    }

    /// The VIPs this node must answer for now: those of Master instances and of handovers.
    pub fn owned_vips(&self) -> BTreeSet<Ipv4Addr> {
        self.claims().into_values().flat_map(|c| c.vips).collect()
    }

    /// What this node claims, by VRID: a master until its lease ([`master_lease`]) runs out,
    /// a handover or a preempted master until it lets go (both bounded already).
    pub fn claims(&self) -> BTreeMap<u8, Claim> {
        let mut claims: BTreeMap<u8, Claim> = BTreeMap::new();
        for (vrid, vips, until) in self.claimed() {
            let claim = claims.entry(vrid).or_insert_with(|| Claim { vips: BTreeSet::new(), until });
            claim.vips.extend(vips);
            claim.until = claim.until.max(until);
        }
        claims
    }

    /// Only the deadlines of [`Router::claims`], without copying VIPs: the shell renews the
    /// leases after every event, and a group may hold thousands of VIPs.
    pub fn lease_deadlines(&self) -> BTreeMap<u8, Instant> {
        let mut deadlines: BTreeMap<u8, Instant> = BTreeMap::new();
        for (vrid, _, until) in self.claimed() {
            let deadline = deadlines.entry(vrid).or_insert(until);
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

    /// One VRID's deadline in [`Router::claims`], if it claims anything.
    pub fn lease_deadline(&self, vrid: u8) -> Option<Instant> {
        let master = self
            .instances
            .get(&vrid)
            .filter(|r| r.machine.state() == State::Master)
            .and_then(|r| Some(master_lease(r.last_sent?, r.spec.advert_interval)));
        let handover = self.handovers.get(&vrid).map(|h| h.release_at);
        let lingering = self.lingering.get(&vrid).map(|(_, until)| *until);
        [master, handover, lingering].into_iter().flatten().max()
    }

    /// The VRIDs whose deadline may have moved since the last call without the ownership epoch
    /// changing (an advertisement sent, a successor heard): the shell renews just those, and
    /// rewrites all of them only when the epoch changes. Every instance advertises each
    /// interval, so renewing them all per event would cost instances² per interval.
    pub fn take_renewed(&mut self) -> BTreeSet<u8> {
        std::mem::take(&mut self.renewed)
    }

    fn claimed(&self) -> impl Iterator<Item = (u8, &BTreeSet<Ipv4Addr>, Instant)> {
        // A master has always advertised: §6.4.2 sends one on the transition.
        let masters = self.instances.iter().filter(|(_, r)| r.machine.state() == State::Master).filter_map(
            |(vrid, r)| {
                r.last_sent.map(|sent| (*vrid, &r.spec.vips, master_lease(sent, r.spec.advert_interval)))
            },
        );
        let handovers = self.handovers.iter().map(|(vrid, h)| (*vrid, &h.vips, h.release_at));
        let lingering = self.lingering.iter().map(|(vrid, (vips, until))| (*vrid, vips, *until));
        masters.chain(handovers).chain(lingering)
    }

    /// The sequence for the adverts sent now: the wall clock in microseconds as it was at start
    /// plus the time since, and always past the last one.
    fn next_sequence(&mut self, now: Instant) -> u64 {
        self.last_sequence = self.wall_micros(now).max(self.last_sequence + 1);
        self.last_sequence
    }

    /// `now` on the wall clock, in microseconds, as mapped at start (see `wall_clock`).
    fn wall_micros(&self, now: Instant) -> u64 {
        let (at, micros) = self.wall_clock;
        micros + now.saturating_duration_since(at).as_micros() as u64
    }

    /// Whether an authenticated advert's sequence is new: past the last accepted from the same
    /// sender for the VRID, or, from a sender not heard yet, signed within [`FRESHNESS`].
    /// Remembered when it is.
    fn fresh(&mut self, now: Instant, vrid: u8, source: Ipv4Addr, sequence: u64) -> bool {
        let clock = self.wall_micros(now);
        let fresh = match self.sequences.get(&(vrid, source)) {
            Some(&last) => sequence > last,
            None => sequence.saturating_add(FRESHNESS.as_micros() as u64) >= clock,
        };
        if fresh {
            self.sequences.insert((vrid, source), sequence);
        } else {
            let age = Duration::from_micros(clock.saturating_sub(sequence));
            debug!(vrid, %source, ?age, "authenticated advert replayed, or the sender's clock is behind");
        }
        fresh
    }

    /// A router outside the group advertises one of our VRIDs: logged once per
    /// [`FOREIGN_LOG_EVERY`] per (VRID, source), with how many went unlogged, and remembered
    /// for [`Router::foreign_routers`].
    fn foreign_advert(&mut self, now: Instant, group: String, vrid: u8, source: Ipv4Addr) {
        if self.foreign.len() >= FOREIGN_MAX && !self.foreign.contains_key(&(vrid, source)) {
            return; // spoofed sources must not grow memory; the drop counter still counts them
        }
        let seen =
            self.foreign.entry((vrid, source)).or_insert(ForeignRouter { group, logged: None, unlogged: 0 });
        if let Some(since_last_log) = seen.log_now(now) {
            warn!(
                group = %seen.group,
                vrid,
                %source,
                since_last_log,
                "a router outside the group advertises this VRID; its advertisements are dropped (add the VRID \
                 to the group's excludedVrids, or find who sends them)"
            );
        }
    }

    /// Routers outside their group heard advertising one of its VRIDs: (group, VRID, source).
    pub fn foreign_routers(&self) -> impl Iterator<Item = (&str, u8, Ipv4Addr)> + '_ {
        self.foreign.iter().map(|((vrid, source), f)| (f.group.as_str(), *vrid, *source))
    }

    /// VIPs to announce again since the last call (see [`Action::Reannounce`]).
    pub fn take_reannouncements(&mut self) -> BTreeSet<Ipv4Addr> {
        std::mem::take(&mut self.reannounce)
    }

    /// Changes whenever [`Router::owned_vips`] may have changed.
    pub fn ownership_epoch(&self) -> u64 {
        self.ownership_epoch
    }

    /// Per-instance view for status and tests.
    /// When each VRID's last advertisement was sent or accepted.
    pub fn last_adverts(&self) -> impl Iterator<Item = (u8, Option<Instant>)> + '_ {
        self.instances.iter().map(|(v, r)| (*v, r.last_advert))
    }

    pub fn instances(&self) -> impl Iterator<Item = (&InstanceSpec, &Instance)> {
        self.instances.values().map(|r| (&r.spec, &r.machine))
    }

    fn carry_out(&mut self, now: Instant, vrid: u8, actions: Vec<Action>, out: &mut Vec<Outgoing>) {
        let advertises = actions.iter().any(|a| matches!(a, Action::SendAdvert { .. }));
        if advertises && let Some(r) = self.instances.get_mut(&vrid) {
            r.last_advert = Some(now);
            r.last_sent = Some(now);
            self.renewed.insert(vrid);
        }
        let sequence = if advertises { self.next_sequence(now) } else { self.last_sequence };
        let Some(running) = self.instances.get(&vrid) else { return };
        for action in actions {
            match action {
                Action::SendAdvert { priority } => {
                    encode_adverts(
                        running_local(&self.locals, &running.spec),
                        &running.spec,
                        priority,
                        sequence,
                        out,
                    );
                    self.metrics.sent(&running.spec.group, vrid);
                }
                // Ownership is derived from the states (see `owned_vips`), not tracked twice.
                Action::TakeOwnership => {
                    self.ownership_epoch += 1;
                    self.lingering.remove(&vrid);
                }
                Action::ReleaseOwnership => {
                    self.ownership_epoch += 1;
                    self.lingering.insert(vrid, (running.spec.vips.clone(), now + HANDOVER_GRACE));
                }
                Action::LeaseLapsed => {
                    warn!(
                        group = %running.spec.group,
                        vrid,
                        "this master fell silent past its lease (the agent was frozen or stalled): \
                         rejoining as backup"
                    );
                    self.ownership_epoch += 1;
                    self.lingering.remove(&vrid);
                }
                Action::Reannounce => {
                    info!(group = %running.spec.group, vrid, "a lower-priority router acted as master; reasserting");
                    self.metrics.reasserted(&running.spec.group, vrid);
                    self.reannounce.extend(&running.spec.vips);
                }
            }
        }
        let (group, state, master) =
            (running.spec.group.clone(), running.machine.state(), running.machine.master());
        self.record_state(vrid, &group, state);
        self.metrics.master(&group, vrid, master);
    }

    fn record_state(&mut self, vrid: u8, group: &str, state: State) {
        if let Some((from, to)) = self.metrics.state(group, vrid, state) {
            info!(group, vrid, from = from.as_str(), to = to.as_str(), "VRRP transition");
        }
    }
}

/// This node's address on `spec`'s interface.
fn running_local(locals: &BTreeMap<String, Ipv4Addr>, spec: &InstanceSpec) -> Ipv4Addr {
    locals.get(&spec.interface).copied().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// The advertisement for each destination; signed with `sequence` when the group
/// authenticates.
fn encode_adverts(
    local: Ipv4Addr,
    spec: &InstanceSpec,
    priority: u8,
    sequence: u64,
    out: &mut Vec<Outgoing>,
) {
    let advert = Advertisement {
        vrid: spec.vrid,
        priority,
        max_adver_int_cs: (spec.advert_interval.as_millis() / 10) as u16,
        addresses: spec.vips.iter().map(|v| (*v).into()).collect(),
    };
    let encode = |destination: Ipv4Addr| {
        let mut payload = advert.encode(local, destination, spec.checksum);
        if let Some(keys) = &spec.keys {
            let trailer = keys.sign(local, destination, &payload, sequence);
            payload.extend_from_slice(&trailer);
        }
        Outgoing { interface: spec.interface.clone(), destination, payload }
    };
    match spec.transport {
        Transport::Multicast => out.push(encode(VRRP_MULTICAST_V4)),
        Transport::Unicast => out.extend(spec.peers.iter().map(|&peer| encode(peer))),
    }
}

fn unix_micros(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// An IPv4 advertisement, as this router handles them.
struct Received4 {
    source: Ipv4Addr,
    advert: Advertisement,
}

/// Decodes, and for a group with keys authenticates: the sender, the advert and its sequence,
/// or the error and its drop label.
fn decode_authenticated(
    datagram: &[u8],
    checksum: ChecksumMode,
    keys: Option<&Keyring>,
) -> Result<(Received4, Option<u64>), (String, &'static str)> {
    let decode_error = |e: DecodeError| (e.to_string(), e.label());
    let v4 = |source: std::net::IpAddr| match source {
        std::net::IpAddr::V4(v4) => Ok(v4),
        std::net::IpAddr::V6(_) => Err(decode_error(DecodeError::NotVrrp)),
    };
    let Some(keys) = keys else {
        let received = decode_ipv4(datagram, checksum).map_err(decode_error)?;
        return Ok((Received4 { source: v4(received.source)?, advert: received.advert }, None));
    };
    let (received, message, trailer) = decode_ipv4_with_trailer(datagram, checksum).map_err(decode_error)?;
    match keys.verify(received.source, received.destination, message, trailer) {
        Ok(sequence) => {
            Ok((Received4 { source: v4(received.source)?, advert: received.advert }, Some(sequence)))
        }
        Err(e) => Err((format!("from {}: {e}", received.source), e.label())),
    }
}

/// The VRID byte of a VRRP datagram, before anything is verified.
fn peek_vrid(datagram: &[u8]) -> Option<u8> {
    let header_len = usize::from(*datagram.first()? & 0x0f) * 4;
    datagram.get(header_len + 1).copied()
}

fn same_addresses(advert: &Advertisement, ours: &BTreeSet<Ipv4Addr>) -> bool {
    let listed: BTreeSet<std::net::IpAddr> = advert.addresses.iter().copied().collect();
    // Large instances advertise only the first addresses (see packet::MAX_ADVERTISED_ADDRS).
    listed.len() == advert.addresses.len()
        && listed.iter().all(|a| matches!(a, std::net::IpAddr::V4(v4) if ours.contains(v4)))
        && (listed.len() == ours.len() || listed.len() == super::packet::MAX_ADVERTISED_ADDRS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
    const ROGUE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn spec(priority: u8, peers: &[Ipv4Addr], transport: Transport) -> InstanceSpec {
        InstanceSpec {
            group: "g".into(),
            interface: "eth0".into(),
            vrid: 9,
            priority,
            advert_interval: ms(100),
            preempt: true,
            preempt_delay: Duration::ZERO,
            vips: [VIP].into(),
            peers: peers.iter().copied().collect(),
            transport,
            checksum: ChecksumMode::Rfc,
            keys: None,
        }
    }

    fn router(local: Ipv4Addr, spec: InstanceSpec) -> (Router, Registry) {
        let mut registry = Registry::default();
        let metrics = VrrpMetrics::register(&mut registry);
        let mut r = Router::new([("eth0".to_owned(), local)].into(), metrics);
        r.reconfigure(Instant::now(), vec![spec]);
        (r, registry)
    }

    /// The datagram the kernel would deliver for `out` sent by `source`.
    fn on_wire(source: Ipv4Addr, out: &Outgoing, ttl: u8) -> Vec<u8> {
        let mut d = vec![0x45, 0xc0];
        d.extend_from_slice(&((20 + out.payload.len()) as u16).to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0, ttl, 112, 0, 0]);
        d.extend_from_slice(&source.octets());
        d.extend_from_slice(&out.destination.octets());
        d.extend_from_slice(&out.payload);
        d
    }

    fn text(registry: &Registry) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, registry).unwrap();
        s
    }

    fn assert_counted(registry: &Registry, samples: &[&str]) {
        let metrics = text(registry);
        for sample in samples {
            assert!(metrics.contains(sample), "{sample} missing from\n{metrics}");
        }
    }

    #[test]
    fn the_backup_takes_over_when_the_master_goes_silent() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        let (mut b, registry) = router(B, spec(100, &[A], Transport::Multicast));
        assert!(b.start(t0).is_empty());
        a.start(t0);
        // A becomes master after its own Master_Down (3 × 100 ms + 56/256 × 100 ms).
        let adverts = a.on_timer(t0 + ms(322));
        assert_eq!(a.owned_vips(), [VIP].into());
        assert_eq!(adverts.len(), 1);
        assert_eq!(adverts[0].destination, VRRP_MULTICAST_V4);
        assert!(b.on_datagram(t0 + ms(322), "eth0", &on_wire(A, &adverts[0], 255)).is_empty());
        assert!(b.owned_vips().is_empty());
        // A dies. B's down timer, reset at 322 ms: 300 ms + 156/256 × 100 ms = 360.9 ms later.
        assert!(b.on_timer(t0 + ms(682)).is_empty());
        let takeover = b.on_timer(t0 + ms(683));
        assert_eq!(takeover.len(), 1, "B advertises as it takes over");
        assert_eq!(b.owned_vips(), [VIP].into());
        let metrics = text(&registry);
        let transition = r#"vrrp_transitions_total{group="g",vrid="9",from="backup",to="master"} 1"#;
        assert!(metrics.contains(transition), "{metrics}");
    }

    #[test]
    fn a_silent_masters_claim_runs_out_before_any_backup_takes_over() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        a.start(t0);
        a.on_timer(t0 + ms(322));
        let claim = a.claims()[&9].clone();
        assert_eq!(claim, Claim { vips: [VIP].into(), until: t0 + ms(622) }, "three intervals");
        // Every advertisement renews it; this is the last one before A dies.
        let last = a.on_timer(t0 + ms(422));
        let until = a.claims()[&9].until;
        assert_eq!(until, t0 + ms(722));
        // The shell renews just the VRIDs that advertised, from their own deadline.
        assert_eq!(a.take_renewed(), [9].into());
        assert_eq!(a.lease_deadline(9), Some(until));
        assert!(a.take_renewed().is_empty(), "taken once");
        for priority in [1, 100, 199] {
            let (mut b, _) = router(B, spec(priority, &[A], Transport::Multicast));
            b.start(t0);
            b.on_datagram(t0 + ms(422), "eth0", &on_wire(A, &last[0], 255));
            let mut t = t0 + ms(422);
            while b.owned_vips().is_empty() {
                t += ms(1);
                b.on_timer(t);
            }
            assert!(t > until, "a backup of priority {priority} takes over at {:?}, after the claim", t - t0);
        }
        // A master that steps down claims nothing.
        let preempting =
            Advertisement { vrid: 9, priority: 250, max_adver_int_cs: 10, addresses: vec![VIP.into()] };
        let out = Outgoing {
            interface: "eth0".into(),
            destination: VRRP_MULTICAST_V4,
            payload: preempting.encode(B, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
        };
        a.on_datagram(t0 + ms(450), "eth0", &on_wire(B, &out, 255));
        assert!(a.claims().values().all(|c| c.until <= t0 + ms(450) + HANDOVER_GRACE), "{:?}", a.claims());
    }

    #[test]
    fn an_advert_on_another_interface_than_its_groups_is_dropped_and_counted() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        let (mut b, registry) = router(B, spec(100, &[A], Transport::Multicast));
        a.start(t0);
        b.start(t0);
        let adverts = a.on_timer(t0 + ms(322));
        // The member's own advert, but heard on another segment: it must not hold B back.
        b.on_datagram(t0 + ms(322), "eth1", &on_wire(A, &adverts[0], 255));
        assert_counted(&registry, &[r#"vrrp_adverts_dropped_total{vrid="9",reason="wrong_interface"} 1"#]);
        assert_eq!(b.on_timer(t0 + ms(400)).len(), 1, "B took over: it never heard A on eth0");
        assert_eq!(b.owned_vips(), [VIP].into());
    }

    #[test]
    fn instances_on_two_interfaces_advertise_out_of_each_from_the_address_there() {
        let t0 = Instant::now();
        let mut registry = Registry::default();
        let lan = Ipv4Addr::new(10, 30, 0, 10);
        let mut r = Router::new(
            [("eth0".to_owned(), A), ("eth0.30".to_owned(), lan)].into(),
            VrrpMetrics::register(&mut registry),
        );
        let other =
            InstanceSpec { vrid: 10, interface: "eth0.30".into(), ..spec(200, &[B], Transport::Unicast) };
        r.reconfigure(t0, vec![spec(200, &[B], Transport::Multicast), other]);
        r.start(t0);
        let out = r.on_timer(t0 + ms(400));
        let sent: Vec<(&str, Ipv4Addr)> = out.iter().map(|o| (o.interface.as_str(), o.destination)).collect();
        assert_eq!(sent, vec![("eth0", VRRP_MULTICAST_V4), ("eth0.30", B)]);
        let source = |o: &Outgoing| decode_ipv4(&on_wire(Ipv4Addr::UNSPECIFIED, o, 255), ChecksumMode::Rfc);
        // The checksum covers the source address: each advert verifies only from its own.
        assert!(decode_ipv4(&on_wire(A, &out[0], 255), ChecksumMode::Rfc).is_ok());
        assert!(decode_ipv4(&on_wire(lan, &out[1], 255), ChecksumMode::Rfc).is_ok());
        assert!(source(&out[1]).is_err());
        // Moved to the other interface, the instance restarts there.
        let moved = InstanceSpec { interface: "eth0.30".into(), ..spec(200, &[B], Transport::Multicast) };
        let other =
            InstanceSpec { vrid: 10, interface: "eth0.30".into(), ..spec(200, &[B], Transport::Unicast) };
        let resigned = r.reconfigure(t0 + ms(500), vec![moved, other]);
        assert_eq!(resigned.iter().map(|o| o.interface.as_str()).collect::<Vec<_>>(), vec!["eth0"]);
        assert!(r.instances().any(|(s, i)| s.vrid == 9 && i.primary_address() == lan));
    }

    #[test]
    fn non_members_and_broken_datagrams_are_dropped_and_counted() {
        let t0 = Instant::now();
        let (mut rogue, _) = router(ROGUE, spec(254, &[B], Transport::Multicast));
        rogue.start(t0);
        let adverts = rogue.on_timer(t0 + ms(400));
        let (mut b, registry) = router(B, spec(100, &[A], Transport::Multicast));
        b.start(t0);
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(ROGUE, &adverts[0], 255));
        assert_eq!(
            b.foreign_routers().collect::<Vec<_>>(),
            vec![("g", 9, ROGUE)],
            "remembered for the Event"
        );
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(A, &adverts[0], 64));
        // Our own advert looped back.
        let own = Advertisement { vrid: 9, priority: 100, max_adver_int_cs: 10, addresses: vec![VIP.into()] };
        let own = Outgoing {
            interface: "eth0".into(),
            destination: VRRP_MULTICAST_V4,
            payload: own.encode(B, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
        };
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(B, &own, 255));
        // A VRID nobody configured.
        let mut corrupted = adverts[0].clone();
        corrupted.payload[1] = 77;
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(A, &corrupted, 255));
        let foreign = Advertisement { vrid: 78, priority: 100, max_adver_int_cs: 10, addresses: vec![] };
        let foreign = Outgoing {
            interface: "eth0".into(),
            destination: VRRP_MULTICAST_V4,
            payload: foreign.encode(A, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
        };
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(A, &foreign, 255));
        b.on_datagram(t0 + ms(400), "eth0", &on_wire(A, &foreign, 255)[..27]);
        assert_counted(
            &registry,
            &[
                r#"vrrp_adverts_dropped_total{vrid="9",reason="not_member"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="9",reason="bad_ttl"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="78",reason="unknown_vrid"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="78",reason="truncated"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="9",reason="own_advert"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="77",reason="bad_checksum"} 1"#,
            ],
        );
        // The rogue's priority 254 did not keep B from taking over on schedule.
        b.on_timer(t0 + ms(361));
        assert_eq!(b.owned_vips(), [VIP].into());
    }

    fn keyed(spec: InstanceSpec, key: &str) -> InstanceSpec {
        InstanceSpec { keys: Some(Arc::new(Keyring::parse(key).unwrap())), ..spec }
    }

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn with_authentication_only_signed_fresh_adverts_count() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, keyed(spec(200, &[B], Transport::Multicast), KEY));
        let (mut b, registry) = router(B, keyed(spec(100, &[A], Transport::Multicast), KEY));
        a.start(t0);
        b.start(t0);
        let first = a.on_timer(t0 + ms(322));
        assert_eq!(first[0].payload.len(), 12 + super::super::auth::TRAILER_LEN, "signed");
        b.on_datagram(t0 + ms(322), "eth0", &on_wire(A, &first[0], 255));
        let second = a.on_timer(t0 + ms(422));
        b.on_datagram(t0 + ms(422), "eth0", &on_wire(A, &second[0], 255));

        // A spoofer with a member's address, unsigned: B's state machine never sees it.
        let spoof =
            |payload: Vec<u8>| Outgoing { interface: "eth0".into(), destination: VRRP_MULTICAST_V4, payload };
        let unsigned =
            Advertisement { vrid: 9, priority: 254, max_adver_int_cs: 10, addresses: vec![VIP.into()] }
                .encode(A, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        b.on_datagram(t0 + ms(430), "eth0", &on_wire(A, &spoof(unsigned), 255));
        // Signed with another key, or tampered with (priority raised after signing).
        let (mut other, _) = router(A, keyed(spec(200, &[B], Transport::Multicast), &"x".repeat(32)));
        other.start(t0);
        let foreign_key = other.on_timer(t0 + ms(322));
        b.on_datagram(t0 + ms(430), "eth0", &on_wire(A, &foreign_key[0], 255));
        let mut tampered = second[0].clone();
        tampered.payload[2] = 254;
        // The checksum fixed up, as a careful attacker would (it covers the message alone).
        tampered.payload[6..8].copy_from_slice(&[0, 0]);
        let sum =
            crate::vrrp::packet::checksum(&tampered.payload[..12], A, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
        tampered.payload[6..8].copy_from_slice(&sum.to_be_bytes());
        b.on_datagram(t0 + ms(430), "eth0", &on_wire(A, &tampered, 255));
        // The master's own advert, captured and sent again.
        b.on_datagram(t0 + ms(440), "eth0", &on_wire(A, &first[0], 255));

        assert_counted(
            &registry,
            &[
                r#"vrrp_adverts_dropped_total{vrid="9",reason="unauthenticated"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="9",reason="unknown_key"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="9",reason="bad_tag"} 1"#,
                r#"vrrp_adverts_dropped_total{vrid="9",reason="replayed"} 1"#,
                r#"vrrp_adverts_received_total{group="g",vrid="9"} 2"#,
            ],
        );
        // B still follows A's schedule: down 360.9 ms after A's last genuine advert (422 ms).
        b.on_timer(t0 + ms(782));
        assert!(b.owned_vips().is_empty());
        b.on_timer(t0 + ms(783));
        assert_eq!(b.owned_vips(), [VIP].into());

        // A router restarted later hears the captured advert first: too old to be news.
        let (mut c, registry) = router(B, keyed(spec(100, &[A], Transport::Multicast), KEY));
        c.wall_clock.1 += FRESHNESS.as_micros() as u64 + 1_000_000;
        c.on_datagram(t0 + ms(450), "eth0", &on_wire(A, &second[0], 255));
        assert!(text(&registry).contains(r#"reason="replayed"} 1"#));
        // An unauthenticated router drops a signed advert: its length disagrees with the count.
        let (mut plain, registry) = router(B, spec(100, &[A], Transport::Multicast));
        plain.on_datagram(t0 + ms(450), "eth0", &on_wire(A, &second[0], 255));
        assert!(text(&registry).contains(r#"reason="bad_count"} 1"#));
    }

    #[test]
    fn signed_sequences_always_increase() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, keyed(spec(200, &[B], Transport::Unicast), KEY));
        let sequences: Vec<u64> =
            [t0, t0, t0 + ms(5), t0 - ms(5)].iter().map(|&t| a.next_sequence(t)).collect();
        assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    }

    #[test]
    fn a_preempted_master_keeps_answering_briefly() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(100, &[B], Transport::Multicast));
        let (mut b, _) = router(B, spec(200, &[A], Transport::Multicast));
        a.start(t0);
        // A alone: master after Master_Down_Interval.
        a.on_timer(t0 + ms(400));
        assert_eq!(a.owned_vips(), [VIP].into());
        // B starts and preempts with its first advert; A advertises meanwhile.
        b.start(t0 + ms(500));
        for t in [500, 600, 700, 800] {
            a.on_timer(t0 + ms(t));
        }
        let b_takes = b.on_timer(t0 + ms(900));
        assert_eq!(b.owned_vips(), [VIP].into());
        a.on_datagram(t0 + ms(900), "eth0", &on_wire(B, &b_takes[0], 255));
        assert_eq!(a.owned_vips(), [VIP].into(), "A still answers while B's gratuitous ARPs land");
        assert!(a.next_deadline().is_some_and(|d| d <= t0 + ms(900) + HANDOVER_GRACE));
        a.on_timer(t0 + ms(900) + HANDOVER_GRACE - ms(1));
        assert_eq!(a.owned_vips(), [VIP].into(), "not yet");
        a.on_timer(t0 + ms(900) + HANDOVER_GRACE);
        assert!(a.owned_vips().is_empty(), "then lets go");
    }

    #[test]
    fn shutdown_resigns_and_holds_the_vips_until_the_successor_speaks() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        let (mut b, _) = router(B, spec(100, &[A], Transport::Multicast));
        a.start(t0);
        b.start(t0);
        let advert = a.on_timer(t0 + ms(322));
        b.on_datagram(t0 + ms(322), "eth0", &on_wire(A, &advert[0], 255));

        let resign = a.shutdown(t0 + ms(400));
        assert_eq!(resign.len(), 1);
        assert_eq!(resign[0].payload[2], 0, "priority 0");
        assert!(a.handing_over());
        assert_eq!(a.owned_vips(), [VIP].into(), "still serving while B takes over");

        b.on_datagram(t0 + ms(400), "eth0", &on_wire(A, &resign[0], 255));
        // B waits only Skew_Time: 156/256 × 100 ms = 60.9 ms.
        let takeover = b.on_timer(t0 + ms(461));
        assert_eq!(b.owned_vips(), [VIP].into());
        a.on_datagram(t0 + ms(461), "eth0", &on_wire(B, &takeover[0], 255));
        assert_eq!(a.next_deadline(), Some(t0 + ms(461) + HANDOVER_GRACE));
        a.on_timer(t0 + ms(461) + HANDOVER_GRACE);
        assert!(!a.handing_over());
        assert!(a.owned_vips().is_empty());
    }

    #[test]
    fn a_lone_master_releases_after_a_bound_when_nobody_takes_over() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        a.start(t0);
        a.on_timer(t0 + ms(322));
        a.shutdown(t0 + ms(400));
        a.on_timer(t0 + ms(799));
        assert!(a.handing_over());
        a.on_timer(t0 + ms(800));
        assert!(!a.handing_over());
    }

    #[test]
    fn unicast_sends_one_checksummed_copy_to_each_peer() {
        let t0 = Instant::now();
        let c = Ipv4Addr::new(192, 0, 2, 12);
        let (mut a, _) = router(A, spec(200, &[B, c], Transport::Unicast));
        a.start(t0);
        let out = a.on_timer(t0 + ms(322));
        assert_eq!(out.iter().map(|o| o.destination).collect::<Vec<_>>(), vec![B, c]);
        for o in &out {
            let received = decode_ipv4(&on_wire(A, o, 255), ChecksumMode::Rfc).unwrap();
            assert_eq!(received.advert.addresses, vec![std::net::IpAddr::V4(VIP)]);
        }
    }

    #[test]
    fn reconfigure_changes_priority_without_restarting_and_removes_vanished_vrids() {
        let t0 = Instant::now();
        let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
        a.start(t0);
        a.on_timer(t0 + ms(322));
        assert!(a.reconfigure(t0 + ms(330), vec![spec(150, &[B], Transport::Multicast)]).is_empty());
        assert_eq!(a.instances().next().unwrap().1.config().priority, 150);
        assert_eq!(a.owned_vips(), [VIP].into(), "still master");
        let resign = a.reconfigure(t0 + ms(340), vec![]);
        assert_eq!(resign.len(), 1);
        assert_eq!(resign[0].payload[2], 0);
        assert!(a.owned_vips().is_empty());
    }
}
