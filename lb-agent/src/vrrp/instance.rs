//! The VRRPv3 state machine for one virtual router (RFC 5798 §6, as updated by RFC 9568 §6).
//!
//! Sans-IO: every input carries the current time, every output is an [`Action`] for the shell
//! to carry out, and timers are deadlines the shell sleeps until ([`Instance::next_deadline`]).
//! Nothing here reads a clock or touches a socket, so tests replay exact timelines.

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

#[cfg(test)]
mod tests {
    //! Conformance cases: exact timelines, with the RFC's numbers worked out in each.
    use super::*;

    const ME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 10));
    const LOWER_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 5));
    const HIGHER_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 20));

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn instance(priority: u8) -> Instance {
        Instance::new(InstanceConfig {
            vrid: 7,
            priority,
            advert_interval: ms(1000),
            preempt: true,
            preempt_delay: Duration::ZERO,
            primary_address: ME,
        })
    }

    /// A lone instance that started at `t0` and became Master when its down timer fired.
    fn master_at_4s(t0: Instant, priority: u8) -> Instance {
        let mut i = instance(priority);
        i.startup(t0);
        i.on_timer(t0 + ms(4000));
        assert_eq!(i.state(), State::Master);
        i
    }

    fn advert(priority: u8, interval_cs: u16) -> Advertisement {
        Advertisement { vrid: 7, priority, max_adver_int_cs: interval_cs, addresses: vec![] }
    }

    const SEND_OWN: fn(u8) -> Action = |priority| Action::SendAdvert { priority };

    #[test]
    fn a_master_frozen_past_its_lease_advertises_late_unless_another_took_over() {
        let t0 = Instant::now();
        // Master at 4 s, advertising every second: next advertisement due at 5 s, lease to 7 s.
        let mut late = master_at_4s(t0, 200);
        assert_eq!(late.on_timer(t0 + ms(6999)), vec![SEND_OWN(200)], "still inside its lease");
        // Frozen past its lease with nobody taking over: it advertises late and stays Master,
        // its next advertisement one interval on.
        let mut frozen = master_at_4s(t0, 200);
        frozen.idle_since(t0 + ms(4000));
        assert_eq!(frozen.on_timer(t0 + ms(7500)), vec![SEND_OWN(200)]);
        assert_eq!(frozen.state(), State::Master);
        assert_eq!(frozen.next_deadline(), Some(t0 + ms(8500)));

        // Woken by the advertisement of a (lower-priority) router that took over: without
        // preemption it follows it; with preemption it reasserts, as any master does.
        let mut no_preempt = master_at_4s(t0, 200);
        no_preempt.set_preempt(false, Duration::ZERO);
        let actions = no_preempt.on_advert(t0 + ms(9000), LOWER_IP, &advert(100, 100)).unwrap();
        assert_eq!(actions, vec![Action::LeaseLapsed]);
        assert_eq!((no_preempt.state(), no_preempt.master()), (State::Backup, Some(LOWER_IP)));
        let mut preempt = master_at_4s(t0, 200);
        assert_eq!(
            preempt.on_advert(t0 + ms(9000), LOWER_IP, &advert(100, 100)).unwrap(),
            vec![Action::LeaseLapsed, SEND_OWN(200), Action::Reannounce]
        );
        assert_eq!(preempt.state(), State::Master);
        // A higher priority took over: it yields to it like any master.
        let mut outranked = master_at_4s(t0, 200);
        assert_eq!(
            outranked.on_advert(t0 + ms(9000), HIGHER_IP, &advert(250, 100)).unwrap(),
            vec![Action::LeaseLapsed, Action::ReleaseOwnership]
        );
        assert_eq!((outranked.state(), outranked.master()), (State::Backup, Some(HIGHER_IP)));
        // A resignation is answered at once, lapsed or not.
        let mut resigned = master_at_4s(t0, 200);
        assert_eq!(
            resigned.on_advert(t0 + ms(9000), LOWER_IP, &advert(0, 100)).unwrap(),
            vec![SEND_OWN(200)]
        );

        // A lease that ran out while the shell was busy (idle again only at 7.5 s) is a late
        // advertisement, not a freeze: a lower master heard then is reasserted over, even
        // without preemption.
        let mut busy = master_at_4s(t0, 200);
        busy.set_preempt(false, Duration::ZERO);
        busy.idle_since(t0 + ms(7500));
        assert_eq!(
            busy.on_advert(t0 + ms(7500), LOWER_IP, &advert(100, 100)).unwrap(),
            vec![SEND_OWN(200), Action::Reannounce]
        );
        assert_eq!(busy.state(), State::Master);

        // The address owner never lapses.
        let mut owner = instance(PRIORITY_OWNER);
        owner.startup(t0);
        assert_eq!(owner.on_timer(t0 + ms(60_000)), vec![SEND_OWN(PRIORITY_OWNER)]);
    }

    #[test]
    fn a_master_advertises_a_little_early_only_as_master_and_only_within_its_slack() {
        let t0 = Instant::now();
        // Master at 4 s, next advertisement due at 5 s.
        let mut master = master_at_4s(t0, 200);
        assert!(master.advertise_early(t0 + ms(4900), ms(50)).is_empty(), "100 ms early is too early");
        assert_eq!(master.advertise_early(t0 + ms(4960), ms(50)), vec![SEND_OWN(200)]);
        assert_eq!(master.next_deadline(), Some(t0 + ms(5960)), "restarted from when it was sent");
        assert!(master.advertise_early(t0 + ms(5000), ms(1000)).is_empty(), "never a whole interval early");
        let mut backup = instance(100);
        backup.startup(t0);
        assert!(
            backup.advertise_early(t0 + ms(3500), ms(1000)).is_empty(),
            "a backup's timer never fires early"
        );
    }

    #[test]
    fn a_lone_backup_becomes_master_after_master_down_interval() {
        let t0 = Instant::now();
        let mut i = instance(100);
        assert!(i.startup(t0).is_empty());
        assert_eq!(i.state(), State::Backup);
        // Skew = (256 - 100) * 1 s / 256 = 609.375 ms; Master_Down = 3 s + skew.
        assert_eq!(i.skew_time(), Duration::from_micros(609_375));
        assert_eq!(i.next_deadline(), Some(t0 + ms(3000) + Duration::from_micros(609_375)));
        assert!(i.on_timer(t0 + ms(3609)).is_empty());
        assert_eq!(i.on_timer(t0 + ms(3610)), vec![SEND_OWN(100), Action::TakeOwnership]);
        assert_eq!(i.state(), State::Master);
        assert_eq!(i.master(), Some(ME));
        assert_eq!(i.next_deadline(), Some(t0 + ms(4610)));
    }

    #[test]
    fn a_master_advertises_every_interval() {
        let t0 = Instant::now();
        let mut i = instance(255);
        assert_eq!(i.startup(t0), vec![SEND_OWN(255), Action::TakeOwnership]);
        assert!(i.on_timer(t0 + ms(999)).is_empty());
        assert_eq!(i.on_timer(t0 + ms(1000)), vec![SEND_OWN(255)]);
        assert_eq!(i.next_deadline(), Some(t0 + ms(2000)));
    }

    #[test]
    fn the_owner_ignores_advertisements() {
        let t0 = Instant::now();
        let mut i = instance(255);
        i.startup(t0);
        assert_eq!(i.on_advert(t0, HIGHER_IP, &advert(254, 100)), Err(Ignored::WeAreOwner));
        assert_eq!(i.state(), State::Master);
    }

    #[test]
    fn a_backup_hearing_a_better_master_stays_backup_and_learns_its_interval() {
        let t0 = Instant::now();
        let mut i = instance(100);
        i.startup(t0);
        assert_eq!(i.on_advert(t0 + ms(500), HIGHER_IP, &advert(200, 5)), Ok(vec![]));
        assert_eq!(i.master(), Some(HIGHER_IP));
        // Master_Adver_Interval is now 50 ms: down = 150 ms + 156/256 × 50 ms = 180.47 ms.
        assert_eq!(i.master_down_interval(), Duration::from_micros(180_468) + Duration::from_nanos(750));
        assert_eq!(i.next_deadline(), Some(t0 + ms(500) + i.master_down_interval()));
    }

    #[test]
    fn a_resigning_master_is_replaced_after_skew_time_only() {
        let t0 = Instant::now();
        let mut i = instance(100);
        i.startup(t0);
        i.on_advert(t0, HIGHER_IP, &advert(200, 100)).unwrap();
        assert_eq!(i.on_advert(t0 + ms(100), HIGHER_IP, &advert(0, 100)), Ok(vec![]));
        assert_eq!(i.next_deadline(), Some(t0 + ms(100) + Duration::from_micros(609_375)));
        assert_eq!(i.on_timer(t0 + ms(710)), vec![SEND_OWN(100), Action::TakeOwnership]);
    }

    #[test]
    fn a_master_yields_to_higher_priority() {
        let t0 = Instant::now();
        let mut i = master_at_4s(t0, 100);
        assert_eq!(i.state(), State::Master);
        assert_eq!(
            i.on_advert(t0 + ms(4100), LOWER_IP, &advert(150, 100)),
            Ok(vec![Action::ReleaseOwnership])
        );
        assert_eq!(i.state(), State::Backup);
        assert_eq!(i.master(), Some(LOWER_IP));
    }

    #[test]
    fn equal_priority_is_won_by_the_higher_address() {
        let t0 = Instant::now();
        let mut i = master_at_4s(t0, 100);
        assert_eq!(
            i.on_advert(t0 + ms(4100), LOWER_IP, &advert(100, 100)),
            Ok(vec![SEND_OWN(100), Action::Reannounce])
        );
        assert_eq!(i.state(), State::Master);
        assert_eq!(
            i.on_advert(t0 + ms(4200), HIGHER_IP, &advert(100, 100)),
            Ok(vec![Action::ReleaseOwnership])
        );
        assert_eq!(i.state(), State::Backup);
    }

    #[test]
    fn a_master_hearing_a_lower_master_reasserts_itself() {
        let t0 = Instant::now();
        let mut i = master_at_4s(t0, 150);
        assert_eq!(
            i.on_advert(t0 + ms(4300), LOWER_IP, &advert(100, 1)),
            Ok(vec![SEND_OWN(150), Action::Reannounce])
        );
        assert_eq!(i.state(), State::Master);
        assert_eq!(i.next_deadline(), Some(t0 + ms(5300)), "the advert timer restarts");
    }

    #[test]
    fn a_master_answers_a_resignation_at_once() {
        let t0 = Instant::now();
        let mut i = master_at_4s(t0, 100);
        assert_eq!(i.on_advert(t0 + ms(4300), HIGHER_IP, &advert(0, 100)), Ok(vec![SEND_OWN(100)]));
        assert_eq!(i.next_deadline(), Some(t0 + ms(5300)));
    }

    #[test]
    fn with_preemption_a_better_backup_takes_over_from_a_lower_master() {
        let t0 = Instant::now();
        let mut i = instance(200);
        i.startup(t0);
        assert_eq!(i.on_advert(t0 + ms(100), LOWER_IP, &advert(100, 100)), Err(Ignored::LowerPriority));
        // The discarded advert did not reset the timer: down = 3 s + 56/256 s = 3.21875 s.
        assert_eq!(i.on_timer(t0 + ms(3219)), vec![SEND_OWN(200), Action::TakeOwnership]);
    }

    #[test]
    fn without_preemption_a_better_backup_accepts_a_lower_master() {
        let t0 = Instant::now();
        let mut i = instance(200);
        i.set_preempt(false, Duration::ZERO);
        i.startup(t0);
        assert_eq!(i.on_advert(t0 + ms(100), LOWER_IP, &advert(100, 100)), Ok(vec![]));
        assert!(i.on_timer(t0 + ms(3219)).is_empty());
        assert_eq!(i.state(), State::Backup);
    }

    #[test]
    fn preempt_delay_tolerates_a_lower_master_for_that_long() {
        let t0 = Instant::now();
        let mut i = instance(200);
        i.set_preempt(true, ms(2500));
        i.startup(t0);
        for k in 0..=2 {
            let t = t0 + ms(1000 * k);
            assert_eq!(i.on_advert(t, LOWER_IP, &advert(100, 100)), Ok(vec![]), "tolerated at {k} s");
        }
        assert_eq!(i.on_advert(t0 + ms(3000), LOWER_IP, &advert(100, 100)), Err(Ignored::LowerPriority));
        // Timer last reset at 2 s: fires at 2 s + 3.21875 s.
        assert!(i.on_timer(t0 + ms(5218)).is_empty());
        assert_eq!(i.on_timer(t0 + ms(5219)), vec![SEND_OWN(200), Action::TakeOwnership]);
    }

    #[test]
    fn shutdown_of_a_master_resigns_and_releases() {
        let t0 = Instant::now();
        let mut i = instance(255);
        i.startup(t0);
        assert_eq!(i.shutdown(), vec![SEND_OWN(0), Action::ReleaseOwnership]);
        assert_eq!(i.state(), State::Initialize);
        assert_eq!(i.next_deadline(), None);
        assert_eq!(i.on_advert(t0, HIGHER_IP, &advert(100, 100)), Err(Ignored::WeAreOwner));
    }

    #[test]
    fn shutdown_of_a_backup_is_silent() {
        let t0 = Instant::now();
        let mut i = instance(100);
        i.startup(t0);
        assert!(i.shutdown().is_empty());
        assert_eq!(i.on_advert(t0, HIGHER_IP, &advert(200, 100)), Err(Ignored::NotRunning));
    }

    #[test]
    fn ten_millisecond_intervals_fail_over_within_forty_milliseconds() {
        // The figure the product promises: 3 × 10 ms + skew (≤ 10 ms).
        let t0 = Instant::now();
        let mut i = Instance::new(InstanceConfig { advert_interval: ms(10), ..instance(100).config });
        i.startup(t0);
        i.on_advert(t0, HIGHER_IP, &advert(200, 1)).unwrap();
        assert!(i.master_down_interval() <= ms(40));
        assert_eq!(i.on_timer(t0 + i.master_down_interval()), vec![SEND_OWN(100), Action::TakeOwnership]);
    }
}
