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
    assert_eq!(resigned.on_advert(t0 + ms(9000), LOWER_IP, &advert(0, 100)).unwrap(), vec![SEND_OWN(200)]);

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
    assert!(backup.advertise_early(t0 + ms(3500), ms(1000)).is_empty(), "a backup's timer never fires early");
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
    assert_eq!(i.on_advert(t0 + ms(4100), LOWER_IP, &advert(150, 100)), Ok(vec![Action::ReleaseOwnership]));
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
    assert_eq!(i.on_advert(t0 + ms(4200), HIGHER_IP, &advert(100, 100)), Ok(vec![Action::ReleaseOwnership]));
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
