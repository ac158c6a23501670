//! The VRRPv3 state machine for one virtual router (RFC 5798 §6, as updated by RFC 9568 §6).
//!
//! Sans-IO: every input carries the current time, every output is an [`Action`] for the shell
//! to carry out, and timers are deadlines the shell sleeps until ([`Instance::next_deadline`]).
//! Nothing here reads a clock or touches a socket, so tests replay exact timelines: the
//! conformance cases are data, one directory each under `lb-agent/tests/conformance/vrrp/`.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use super::packet::Advertisement;

/// RFC 5798 §5.2.4: the priority of the router that owns the virtual addresses.
pub const PRIORITY_OWNER: u8 = 255;
/// RFC 5798 §5.2.4: priority 0 means the master is leaving.
pub const PRIORITY_RESIGN: u8 = 0;
/// One centisecond, the unit of Max Adver Int.
pub const CENTISECOND: Duration = Duration::from_millis(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceConfig {
    pub vrid: u8,
    /// 1..=254, or 255 for the address owner.
    pub priority: u8,
    /// Advertisement_Interval: a whole number of centiseconds, 10 ms to 40.95 s.
    pub advert_interval: Duration,
    pub preempt: bool,
    /// Not in the RFC (keepalived's `preempt_delay`): a higher-priority backup waits this long
    /// after first seeing a lower-priority master before preempting it, so a node that just
    /// booted does not take VIPs before it is fully ready.
    pub preempt_delay: Duration,
    /// This router's primary address: the tie-breaker between equal priorities (§6.4.3).
    pub primary_address: IpAddr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Initialize,
    Backup,
    Master,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Initialize => "initialize",
            State::Backup => "backup",
            State::Master => "master",
        }
    }
}

/// What the shell must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send an ADVERTISEMENT with this priority (0 when resigning).
    SendAdvert { priority: u8 },
    /// Became Master: answer for the virtual addresses and announce them (gratuitous ARP).
    TakeOwnership,
    /// Stopped being Master: stop answering for the virtual addresses.
    ReleaseOwnership,
    /// Still Master, but another router acted as one: announce the addresses again.
    Reannounce,
    /// This master fell silent past its lease and another router took over meanwhile. If the
    /// instance is Backup now it follows that router: stop answering at once (unlike
    /// [`Action::ReleaseOwnership`], no grace: the other router owns them). Still Master, it
    /// reasserts itself (preemption) and the actions that follow say so.
    LeaseLapsed,
}

/// Why a received advertisement changed nothing; counted by the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// §7.1: the address owner discards advertisements for its own VRID.
    WeAreOwner,
    /// Not running (Initialize): nothing to do.
    NotRunning,
    /// §6.4.2/§6.4.3: lower priority than ours (with preemption), so discarded.
    LowerPriority,
}

#[derive(Clone, Debug)]
pub struct Instance {
    config: InstanceConfig,
    state: State,
    /// Master_Adver_Interval: learned from the master's advertisements (§6.1).
    master_adver_interval: Duration,
    adver_timer: Option<Instant>,
    master_down_timer: Option<Instant>,
    /// The current master's address, as far as this router knows.
    master: Option<IpAddr>,
    /// When the last advertisement from the current master arrived.
    last_advert_at: Option<Instant>,
    /// When a lower-priority master was first tolerated (for `preempt_delay`).
    lower_master_since: Option<Instant>,
    /// When the shell last went back to waiting for events (see [`Instance::idle_since`]).
    idle_since: Option<Instant>,
}

impl Instance {
    pub fn new(config: InstanceConfig) -> Self {
        let master_adver_interval = config.advert_interval;
        Self {
            config,
            state: State::Initialize,
            master_adver_interval,
            adver_timer: None,
            master_down_timer: None,
            master: None,
            last_advert_at: None,
            lower_master_since: None,
            idle_since: None,
        }
    }

    pub fn config(&self) -> &InstanceConfig {
        &self.config
    }

    /// The address this router advertises from (§6.1 Primary_IP_Address).
    pub fn primary_address(&self) -> IpAddr {
        self.config.primary_address
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn master(&self) -> Option<IpAddr> {
        self.master
    }

    pub fn last_advert_at(&self) -> Option<Instant> {
        self.last_advert_at
    }

    pub fn master_adver_interval(&self) -> Duration {
        self.master_adver_interval
    }

    /// §6.1 Skew_Time: lower priorities wait longer, so the best backup wins the race.
    pub fn skew_time(&self) -> Duration {
        self.master_adver_interval * (256 - u32::from(self.config.priority)) / 256
    }

    /// §6.1 Master_Down_Interval.
    pub fn master_down_interval(&self) -> Duration {
        self.master_adver_interval * 3 + self.skew_time()
    }

    /// The earliest time [`Instance::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            State::Initialize => None,
            State::Backup => self.master_down_timer,
            State::Master => self.adver_timer,
        }
    }

    /// §6.4.1 Initialize, on a Startup event.
    pub fn startup(&mut self, now: Instant) -> Vec<Action> {
        if self.state != State::Initialize {
            return Vec::new();
        }
        if self.config.priority == PRIORITY_OWNER {
            return self.become_master(now);
        }
        self.master_adver_interval = self.config.advert_interval;
        self.become_backup(now);
        Vec::new()
    }

    /// §6.4.2/§6.4.3 Shutdown event. A master resigns with a priority-0 advertisement so that
    /// backups take over after Skew_Time rather than Master_Down_Interval.
    pub fn shutdown(&mut self) -> Vec<Action> {
        let actions = match self.state {
            State::Initialize => return Vec::new(),
            State::Backup => Vec::new(),
            State::Master => {
                vec![Action::SendAdvert { priority: PRIORITY_RESIGN }, Action::ReleaseOwnership]
            }
        };
        self.state = State::Initialize;
        self.adver_timer = None;
        self.master_down_timer = None;
        self.master = None;
        actions
    }

    /// Fires whichever timer has expired by `now`. A master whose lease ran out advertises
    /// now like any late master (see [`Instance::lapsed`]).
    pub fn on_timer(&mut self, now: Instant) -> Vec<Action> {
        match self.state {
            State::Initialize => Vec::new(),
            // §6.4.2: "If the Master_Down_Timer fires" → become Master.
            State::Backup if self.master_down_timer.is_some_and(|t| t <= now) => self.become_master(now),
            // §6.4.3: "If the Adver_Timer fires" → send an ADVERTISEMENT, reset the timer.
            State::Master if self.adver_timer.is_some_and(|t| t <= now) => {
                self.adver_timer = Some(now + self.config.advert_interval);
                vec![Action::SendAdvert { priority: self.config.priority }]
            }
            _ => Vec::new(),
        }
    }

    /// A master whose Adver_Timer fires within `early` of `now` advertises now and restarts
    /// it from now (§6.4.3, a little early): a node that is master of several instances then
    /// sends all their advertisements in one wake-up, their timers falling into one phase.
    /// Early by less than an interval, an advertisement never lets a backup's
    /// Master_Down_Timer (three intervals and more) fire.
    pub fn advertise_early(&mut self, now: Instant, early: Duration) -> Vec<Action> {
        if self.state != State::Master || early >= self.config.advert_interval {
            return Vec::new();
        }
        match self.adver_timer {
            Some(t) if t <= now + early => {
                self.adver_timer = Some(now + self.config.advert_interval);
                vec![Action::SendAdvert { priority: self.config.priority }]
            }
            _ => Vec::new(),
        }
    }

    /// Handles an advertisement for this VRID that passed the §7.1 packet checks.
    pub fn on_advert(
        &mut self,
        now: Instant,
        source: IpAddr,
        advert: &Advertisement,
    ) -> Result<Vec<Action>, Ignored> {
        if self.config.priority == PRIORITY_OWNER {
            return Err(Ignored::WeAreOwner);
        }
        if advert.priority != PRIORITY_RESIGN && self.lapsed(now) {
            return Ok(self.overtaken(now, source, advert));
        }
        match self.state {
            State::Initialize => Err(Ignored::NotRunning),
            State::Backup => self.backup_receives(now, source, advert),
            State::Master => self.master_receives(now, source, advert),
        }
    }

    /// A master that has not advertised for three of its intervals (its process was frozen,
    /// or its host stalled) has let its lease run out (`router::master_lease`): the data
    /// plane stopped claiming its VIPs, and a backup may have taken over.
    ///
    /// What it does next depends on whether one did. The shell reads every advertisement that
    /// queued up during the stall before it fires a timer, so a router that took over is
    /// heard first ([`Instance::overtaken`]). Without one, the master simply advertises late,
    /// as RFC 5798 has it: stepping down for a stall nobody acted on would make every node of
    /// a loaded group pay a transition for each scheduling hiccup, and the transitions' own
    /// cost starve the next agent (a storm that never settles). The address owner (priority
    /// 255) never lapses.
    ///
    /// Only a lease that ran out while the shell sat idle counts: one that ran out while the
    /// shell was busy with its own work (say, putting a thousand VIPs on the uplink) is a late
    /// advertisement, not a freeze.
    fn lapsed(&self, now: Instant) -> bool {
        let Some(lease_end) = self.adver_timer.map(|next| next + self.config.advert_interval * 2) else {
            return false;
        };
        self.state == State::Master
            && self.config.priority != PRIORITY_OWNER
            && now >= lease_end
            && self.idle_since.is_none_or(|idle| lease_end >= idle)
    }

    /// The shell went back to waiting for events at `at`: a lease running out from then on is
    /// a freeze (see [`Instance::lapsed`]).
    pub fn idle_since(&mut self, at: Instant) {
        self.idle_since = Some(at);
    }

    /// A master whose lease ran out hears another router that took over meanwhile. Without
    /// preemption it follows that router instead of fighting it ([`Action::LeaseLapsed`],
    /// then Backup); with preemption §6.4.3 decides as for any master (it reasserts over a
    /// lower priority, yields to a higher one), and the lapse is only reported.
    fn overtaken(&mut self, now: Instant, source: IpAddr, advert: &Advertisement) -> Vec<Action> {
        let mut actions = vec![Action::LeaseLapsed];
        if self.config.preempt {
            actions.extend(self.master_receives(now, source, advert).unwrap_or_default());
            return actions;
        }
        self.master_adver_interval = CENTISECOND * u32::from(advert.max_adver_int_cs);
        self.become_backup(now);
        self.master = Some(source);
        self.last_advert_at = Some(now);
        actions
    }

    /// §6.4.2 Backup: "If an ADVERTISEMENT is received".
    fn backup_receives(
        &mut self,
        now: Instant,
        source: IpAddr,
        advert: &Advertisement,
    ) -> Result<Vec<Action>, Ignored> {
        if advert.priority == PRIORITY_RESIGN {
            // "Set the Master_Down_Timer to Skew_Time."
            self.master_down_timer = Some(now + self.skew_time());
            self.master = None;
            return Ok(Vec::new());
        }
        if !self.config.preempt || advert.priority >= self.config.priority || self.delaying_preemption(now) {
            if advert.priority >= self.config.priority {
                self.lower_master_since = None;
            }
            // "Set Master_Adver_Interval to Adver Interval contained in the ADVERTISEMENT,
            //  Recompute the Master_Down_Interval, Reset the Master_Down_Timer."
            self.master_adver_interval = CENTISECOND * u32::from(advert.max_adver_int_cs);
            self.master_down_timer = Some(now + self.master_down_interval());
            self.master = Some(source);
            self.last_advert_at = Some(now);
            return Ok(Vec::new());
        }
        // "Otherwise: Discard the ADVERTISEMENT" (we will preempt when Master_Down fires).
        Err(Ignored::LowerPriority)
    }

    /// True while a tolerated lower-priority master is inside the preemption delay.
    fn delaying_preemption(&mut self, now: Instant) -> bool {
        if self.config.preempt_delay.is_zero() {
            return false;
        }
        let since = *self.lower_master_since.get_or_insert(now);
        now < since + self.config.preempt_delay
    }

    /// §6.4.3 Master: "If an ADVERTISEMENT is received".
    fn master_receives(
        &mut self,
        now: Instant,
        source: IpAddr,
        advert: &Advertisement,
    ) -> Result<Vec<Action>, Ignored> {
        if advert.priority == PRIORITY_RESIGN {
            // "Send an ADVERTISEMENT, Reset the Adver_Timer": tell the resigning router (and
            // everyone else) at once who the master is.
            self.adver_timer = Some(now + self.config.advert_interval);
            return Ok(vec![Action::SendAdvert { priority: self.config.priority }]);
        }
        let higher = advert.priority > self.config.priority;
        let tie_won_by_sender =
            advert.priority == self.config.priority && source > self.config.primary_address;
        if !(higher || tie_won_by_sender) {
            // The RFC discards this. But a lower-priority router advertising means it believed
            // itself Master (e.g. two backups racing after a resignation, their skews a few ms
            // apart) and has sent gratuitous ARPs for our addresses; when it yields, clients
            // keep sending to it until their ARP entries expire. So reassert at once: advertise
            // and announce again. keepalived does the same by default
            // (`vrrp_lower_prio_no_advert` off).
            self.adver_timer = Some(now + self.config.advert_interval);
            return Ok(vec![Action::SendAdvert { priority: self.config.priority }, Action::Reannounce]);
        }
        // "Cancel Adver_Timer, Set Master_Adver_Interval…, Recompute Master_Down_Interval,
        //  Set Master_Down_Timer…, Transition to the Backup state."
        self.master_adver_interval = CENTISECOND * u32::from(advert.max_adver_int_cs);
        self.become_backup(now);
        self.master = Some(source);
        self.last_advert_at = Some(now);
        Ok(vec![Action::ReleaseOwnership])
    }

    /// Changes this router's priority (a new plan). Takes effect through the normal protocol:
    /// a master that drops below a backup is preempted, a backup that rises above the master
    /// preempts it when its Master_Down_Timer fires.
    pub fn set_priority(&mut self, priority: u8) {
        self.config.priority = priority;
    }

    pub fn set_preempt(&mut self, preempt: bool, delay: Duration) {
        self.config.preempt = preempt;
        self.config.preempt_delay = delay;
    }

    /// Changes Advertisement_Interval; a master uses it from its next advertisement.
    pub fn set_advert_interval(&mut self, interval: Duration) {
        self.config.advert_interval = interval;
    }

    fn become_master(&mut self, now: Instant) -> Vec<Action> {
        // §6.4.1/§6.4.2: "Send an ADVERTISEMENT, broadcast a gratuitous ARP…, set the
        // Adver_Timer to Advertisement_Interval, transition to the Master state."
        self.state = State::Master;
        self.master_down_timer = None;
        self.adver_timer = Some(now + self.config.advert_interval);
        self.master = Some(self.config.primary_address);
        self.lower_master_since = None;
        vec![Action::SendAdvert { priority: self.config.priority }, Action::TakeOwnership]
    }

    fn become_backup(&mut self, now: Instant) {
        self.state = State::Backup;
        self.adver_timer = None;
        self.master_down_timer = Some(now + self.master_down_interval());
    }
}
