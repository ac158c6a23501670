use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;
use crate::vrrp::{
    auth::FRESHNESS,
    ipv4, ipv6,
    packet::{Advertisement, VRRP_MULTICAST_V4, VRRP_MULTICAST_V6},
};
use prometheus_client::registry::Registry;

const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
const ROGUE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);
const VIP: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10));
const ID: InstanceId = InstanceId::v4(9);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn spec(priority: u8, peers: &[Ipv4Addr], transport: Transport) -> InstanceSpec {
    InstanceSpec {
        group: "g".into(),
        interface: "eth0".into(),
        family: IpFamily::V4,
        vrid: 9,
        priority,
        advert_interval: ms(100),
        preempt: true,
        preempt_delay: Duration::ZERO,
        vips: [VIP].into(),
        peers: peers.iter().map(|p| IpAddr::V4(*p)).collect(),
        transport,
        checksum: ChecksumMode::Rfc,
        keys: None,
    }
}

fn router(local: Ipv4Addr, spec: InstanceSpec) -> (Router, Registry) {
    let mut registry = Registry::default();
    let metrics = VrrpMetrics::register(&mut registry);
    let mut r = Router::new([(("eth0".to_owned(), IpFamily::V4), local.into())].into(), metrics);
    r.reconfigure(Instant::now(), vec![spec]);
    (r, registry)
}

/// The datagram the kernel would deliver for `out` sent by `source`.
fn on_wire(source: Ipv4Addr, out: &Outgoing, ttl: u8) -> Vec<u8> {
    let mut d = vec![0x45, 0xc0];
    d.extend_from_slice(&((20 + out.payload.len()) as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0, 0, 0, ttl, 112, 0, 0]);
    d.extend_from_slice(&source.octets());
    let IpAddr::V4(destination) = out.destination else { panic!("an IPv4 advert") };
    d.extend_from_slice(&destination.octets());
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
    assert!(b.on_datagram(t0 + ms(322), "eth0", Datagram::V4(&on_wire(A, &adverts[0], 255))).is_empty());
    assert!(b.owned_vips().is_empty());
    // A dies. B's down timer, reset at 322 ms: 300 ms + 156/256 × 100 ms = 360.9 ms later.
    assert!(b.on_timer(t0 + ms(682)).is_empty());
    let takeover = b.on_timer(t0 + ms(683));
    assert_eq!(takeover.len(), 1, "B advertises as it takes over");
    assert_eq!(b.owned_vips(), [VIP].into());
    let metrics = text(&registry);
    let transition =
        r#"vrrp_transitions_total{group="g",vrid="9",family="ipv4",from="backup",to="master"} 1"#;
    assert!(metrics.contains(transition), "{metrics}");
}

#[test]
fn a_master_hearing_a_lower_master_advertises_every_time_but_reannounces_once_a_second() {
    let t0 = Instant::now();
    let (mut a, registry) = router(A, spec(200, &[B], Transport::Multicast));
    let (mut b, _) = router(B, spec(100, &[A], Transport::Multicast));
    a.start(t0);
    b.start(t0);
    a.on_timer(t0 + ms(322));
    // B does not hear A (a one-way partition) and believes itself master.
    let b_advert = b.on_timer(t0 + ms(361)).remove(0);
    let heard = |a: &mut Router, at| a.on_datagram(at, "eth0", Datagram::V4(&on_wire(B, &b_advert, 255)));
    assert_eq!(heard(&mut a, t0 + ms(400)).len(), 1, "A advertises over B");
    assert_eq!(a.take_reannouncements(), [VIP].into());
    for at in [410, 500, 1399] {
        assert_eq!(heard(&mut a, t0 + ms(at)).len(), 1, "A advertises over B every time");
        assert!(a.take_reannouncements().is_empty(), "but announces its VIPs again only once a second");
    }
    heard(&mut a, t0 + ms(1400));
    assert_eq!(a.take_reannouncements(), [VIP].into());
    let metrics = text(&registry);
    assert!(metrics.contains(r#"vrrp_reassertions_total{group="g",vrid="9",family="ipv4"} 5"#), "{metrics}");
}

#[test]
fn a_silent_masters_claim_runs_out_before_any_backup_takes_over() {
    let t0 = Instant::now();
    let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
    a.start(t0);
    a.on_timer(t0 + ms(322));
    let claim = a.claims()[&ID].clone();
    assert_eq!(claim, Claim { vips: [VIP].into(), until: t0 + ms(622) }, "three intervals");
    // Every advertisement renews it; this is the last one before A dies.
    let last = a.on_timer(t0 + ms(422));
    let until = a.claims()[&ID].until;
    assert_eq!(until, t0 + ms(722));
    // The shell renews just the VRIDs that advertised, from their own deadline.
    assert_eq!(a.take_renewed(), [ID].into());
    assert_eq!(a.lease_deadline(ID), Some(until));
    assert!(a.take_renewed().is_empty(), "taken once");
    for priority in [1, 100, 199] {
        let (mut b, _) = router(B, spec(priority, &[A], Transport::Multicast));
        b.start(t0);
        b.on_datagram(t0 + ms(422), "eth0", Datagram::V4(&on_wire(A, &last[0], 255)));
        let mut t = t0 + ms(422);
        while b.owned_vips().is_empty() {
            t += ms(1);
            b.on_timer(t);
        }
        assert!(t > until, "a backup of priority {priority} takes over at {:?}, after the claim", t - t0);
    }
    // A master that steps down claims nothing.
    let preempting = Advertisement { vrid: 9, priority: 250, max_adver_int_cs: 10, addresses: vec![VIP] };
    let out = Outgoing {
        interface: "eth0".into(),
        destination: VRRP_MULTICAST_V4.into(),
        payload: preempting.encode(B, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
    };
    a.on_datagram(t0 + ms(450), "eth0", Datagram::V4(&on_wire(B, &out, 255)));
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
    b.on_datagram(t0 + ms(322), "eth1", Datagram::V4(&on_wire(A, &adverts[0], 255)));
    assert_counted(
        &registry,
        &[r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="wrong_interface"} 1"#],
    );
    assert_eq!(b.on_timer(t0 + ms(400)).len(), 1, "B took over: it never heard A on eth0");
    assert_eq!(b.owned_vips(), [VIP].into());
}

#[test]
fn instances_on_two_interfaces_advertise_out_of_each_from_the_address_there() {
    let t0 = Instant::now();
    let mut registry = Registry::default();
    let lan = Ipv4Addr::new(10, 30, 0, 10);
    let mut r = Router::new(
        [(("eth0".to_owned(), IpFamily::V4), A.into()), (("eth0.30".to_owned(), IpFamily::V4), lan.into())]
            .into(),
        VrrpMetrics::register(&mut registry),
    );
    let other = InstanceSpec { vrid: 10, interface: "eth0.30".into(), ..spec(200, &[B], Transport::Unicast) };
    r.reconfigure(t0, vec![spec(200, &[B], Transport::Multicast), other]);
    r.start(t0);
    let out = r.on_timer(t0 + ms(400));
    let sent: Vec<(&str, IpAddr)> = out.iter().map(|o| (o.interface.as_str(), o.destination)).collect();
    assert_eq!(sent, vec![("eth0", VRRP_MULTICAST_V4.into()), ("eth0.30", B.into())]);
    let source = |o: &Outgoing| ipv4::decode(&on_wire(Ipv4Addr::UNSPECIFIED, o, 255), ChecksumMode::Rfc);
    // The checksum covers the source address: each advert verifies only from its own.
    assert!(ipv4::decode(&on_wire(A, &out[0], 255), ChecksumMode::Rfc).is_ok());
    assert!(ipv4::decode(&on_wire(lan, &out[1], 255), ChecksumMode::Rfc).is_ok());
    assert!(source(&out[1]).is_err());
    // Moved to the other interface, the instance restarts there.
    let moved = InstanceSpec { interface: "eth0.30".into(), ..spec(200, &[B], Transport::Multicast) };
    let other = InstanceSpec { vrid: 10, interface: "eth0.30".into(), ..spec(200, &[B], Transport::Unicast) };
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
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(ROGUE, &adverts[0], 255)));
    assert_eq!(
        b.foreign_routers().collect::<Vec<_>>(),
        vec![("g", ID, IpAddr::V4(ROGUE))],
        "remembered for the Event"
    );
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(A, &adverts[0], 64)));
    // Our own advert looped back.
    let own = Advertisement { vrid: 9, priority: 100, max_adver_int_cs: 10, addresses: vec![VIP] };
    let own = Outgoing {
        interface: "eth0".into(),
        destination: VRRP_MULTICAST_V4.into(),
        payload: own.encode(B, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
    };
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(B, &own, 255)));
    // A VRID nobody configured.
    let mut corrupted = adverts[0].clone();
    corrupted.payload[1] = 77;
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(A, &corrupted, 255)));
    let foreign = Advertisement { vrid: 78, priority: 100, max_adver_int_cs: 10, addresses: vec![] };
    let foreign = Outgoing {
        interface: "eth0".into(),
        destination: VRRP_MULTICAST_V4.into(),
        payload: foreign.encode(A, VRRP_MULTICAST_V4, ChecksumMode::Rfc),
    };
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(A, &foreign, 255)));
    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(A, &foreign, 255)[..27]));
    assert_counted(
        &registry,
        &[
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="not_member"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="bad_ttl"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="78",family="ipv4",reason="unknown_vrid"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="78",family="ipv4",reason="truncated"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="own_advert"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="77",family="ipv4",reason="bad_checksum"} 1"#,
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
    b.on_datagram(t0 + ms(322), "eth0", Datagram::V4(&on_wire(A, &first[0], 255)));
    let second = a.on_timer(t0 + ms(422));
    b.on_datagram(t0 + ms(422), "eth0", Datagram::V4(&on_wire(A, &second[0], 255)));

    // A spoofer with a member's address, unsigned: B's state machine never sees it.
    let spoof = |payload: Vec<u8>| Outgoing {
        interface: "eth0".into(),
        destination: VRRP_MULTICAST_V4.into(),
        payload,
    };
    let unsigned = Advertisement { vrid: 9, priority: 254, max_adver_int_cs: 10, addresses: vec![VIP] }
        .encode(A, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
    b.on_datagram(t0 + ms(430), "eth0", Datagram::V4(&on_wire(A, &spoof(unsigned), 255)));
    // Signed with another key, or tampered with (priority raised after signing).
    let (mut other, _) = router(A, keyed(spec(200, &[B], Transport::Multicast), &"x".repeat(32)));
    other.start(t0);
    let foreign_key = other.on_timer(t0 + ms(322));
    b.on_datagram(t0 + ms(430), "eth0", Datagram::V4(&on_wire(A, &foreign_key[0], 255)));
    let mut tampered = second[0].clone();
    tampered.payload[2] = 254;
    // The checksum fixed up, as a careful attacker would (it covers the message alone).
    tampered.payload[6..8].copy_from_slice(&[0, 0]);
    let sum = crate::vrrp::packet::checksum(&tampered.payload[..12], A, VRRP_MULTICAST_V4, ChecksumMode::Rfc);
    tampered.payload[6..8].copy_from_slice(&sum.to_be_bytes());
    b.on_datagram(t0 + ms(430), "eth0", Datagram::V4(&on_wire(A, &tampered, 255)));
    // The master's own advert, captured and sent again.
    b.on_datagram(t0 + ms(440), "eth0", Datagram::V4(&on_wire(A, &first[0], 255)));

    assert_counted(
        &registry,
        &[
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="unauthenticated"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="unknown_key"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="bad_tag"} 1"#,
            r#"vrrp_adverts_dropped_total{vrid="9",family="ipv4",reason="replayed"} 1"#,
            r#"vrrp_adverts_received_total{group="g",vrid="9",family="ipv4"} 2"#,
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
    c.on_datagram(t0 + ms(450), "eth0", Datagram::V4(&on_wire(A, &second[0], 255)));
    assert!(text(&registry).contains(r#"reason="replayed"} 1"#));
    // An unauthenticated router drops a signed advert: its length disagrees with the count.
    let (mut plain, registry) = router(B, spec(100, &[A], Transport::Multicast));
    plain.on_datagram(t0 + ms(450), "eth0", Datagram::V4(&on_wire(A, &second[0], 255)));
    assert!(text(&registry).contains(r#"reason="bad_count"} 1"#));
}

#[test]
fn signed_sequences_always_increase() {
    let t0 = Instant::now();
    let (mut a, _) = router(A, keyed(spec(200, &[B], Transport::Unicast), KEY));
    let sequences: Vec<u64> = [t0, t0, t0 + ms(5), t0 - ms(5)].iter().map(|&t| a.next_sequence(t)).collect();
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
    a.on_datagram(t0 + ms(900), "eth0", Datagram::V4(&on_wire(B, &b_takes[0], 255)));
    assert_eq!(a.owned_vips(), [VIP].into(), "A still answers while B's gratuitous ARPs land");
    assert!(a.next_deadline().is_some_and(|d| d <= t0 + ms(900) + HANDOVER_GRACE));
    a.on_timer(t0 + ms(900) + HANDOVER_GRACE - ms(1));
    assert_eq!(a.owned_vips(), [VIP].into(), "not yet");
    a.on_timer(t0 + ms(900) + HANDOVER_GRACE);
    assert!(a.owned_vips().is_empty(), "then lets go");
    assert!(a.take_lapsed().is_empty(), "its time was up: no lapse");
}

#[test]
fn a_master_past_its_lease_is_reported_lapsed_once() {
    let t0 = Instant::now();
    // Frozen: A, master from 322 ms (its lease to 622), sits idle from 330 and hears nothing
    // of itself until B, which took over at 691, is heard at 700.
    let follower =
        |priority, peer| InstanceSpec { preempt: false, ..spec(priority, &[peer], Transport::Multicast) };
    let (mut a, _) = router(A, follower(200, B));
    let (mut b, _) = router(B, follower(100, A));
    a.start(t0);
    a.on_timer(t0 + ms(322));
    a.idle(t0 + ms(330));
    b.start(t0 + ms(330));
    let b_takes = b.on_timer(t0 + ms(691));
    assert_eq!(b.owned_vips(), [VIP].into());
    a.on_datagram(t0 + ms(700), "eth0", Datagram::V4(&on_wire(B, &b_takes[0], 255)));
    assert!(a.owned_vips().is_empty(), "A follows B");
    assert_eq!(a.take_lapsed(), [ID].into());
    assert!(a.take_lapsed().is_empty(), "reported once");
}

#[test]
fn shutdown_resigns_and_holds_the_vips_until_the_successor_speaks() {
    let t0 = Instant::now();
    let (mut a, _) = router(A, spec(200, &[B], Transport::Multicast));
    let (mut b, _) = router(B, spec(100, &[A], Transport::Multicast));
    a.start(t0);
    b.start(t0);
    let advert = a.on_timer(t0 + ms(322));
    b.on_datagram(t0 + ms(322), "eth0", Datagram::V4(&on_wire(A, &advert[0], 255)));

    let resign = a.shutdown(t0 + ms(400));
    assert_eq!(resign.len(), 1);
    assert_eq!(resign[0].payload[2], 0, "priority 0");
    assert!(a.handing_over());
    assert_eq!(a.owned_vips(), [VIP].into(), "still serving while B takes over");

    b.on_datagram(t0 + ms(400), "eth0", Datagram::V4(&on_wire(A, &resign[0], 255)));
    // B waits only Skew_Time: 156/256 × 100 ms = 60.9 ms.
    let takeover = b.on_timer(t0 + ms(461));
    assert_eq!(b.owned_vips(), [VIP].into());
    a.on_datagram(t0 + ms(461), "eth0", Datagram::V4(&on_wire(B, &takeover[0], 255)));
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
    assert_eq!(out.iter().map(|o| o.destination).collect::<Vec<_>>(), vec![IpAddr::V4(B), IpAddr::V4(c)]);
    for o in &out {
        let received = ipv4::decode(&on_wire(A, o, 255), ChecksumMode::Rfc).unwrap();
        assert_eq!(received.advert.addresses, vec![VIP]);
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

const A6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa);
const B6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb);
const VIP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10));

/// An IPv4 and an IPv6 instance, both VRID 9, on one router.
fn dual_stack(local4: Ipv4Addr, local6: Ipv6Addr, priority: u8, peer4: Ipv4Addr, peer6: Ipv6Addr) -> Router {
    let v6 = InstanceSpec {
        family: IpFamily::V6,
        vips: [VIP6].into(),
        peers: [IpAddr::V6(peer6)].into(),
        ..spec(priority, &[peer4], Transport::Multicast)
    };
    let locals = [
        (("eth0".to_owned(), IpFamily::V4), local4.into()),
        (("eth0".to_owned(), IpFamily::V6), local6.into()),
    ];
    let mut r = Router::new(locals.into(), VrrpMetrics::register(&mut Registry::default()));
    r.reconfigure(Instant::now(), vec![spec(priority, &[peer4], Transport::Multicast), v6]);
    r
}

/// What a raw IPv6 socket delivers for `out` sent from `source`.
fn received6(source: Ipv6Addr, out: &Outgoing, hop_limit: u8) -> (ipv6::Header, Vec<u8>) {
    let IpAddr::V6(destination) = out.destination else { panic!("an IPv6 advert") };
    (ipv6::Header { source, destination, hop_limit }, out.payload.clone())
}

#[test]
fn an_ipv4_and_an_ipv6_instance_share_a_vrid_and_decide_apart() {
    let t0 = Instant::now();
    let mut a = dual_stack(A, A6, 200, B, B6);
    a.start(t0);
    let adverts = a.on_timer(t0 + ms(322));
    let destinations: Vec<IpAddr> = adverts.iter().map(|o| o.destination).collect();
    assert_eq!(destinations, vec![IpAddr::V4(VRRP_MULTICAST_V4), IpAddr::V6(VRRP_MULTICAST_V6)]);
    assert_eq!(a.owned_vips(), [VIP, VIP6].into());
    let ids: Vec<InstanceId> = a.claims().into_keys().collect();
    assert_eq!(ids, vec![InstanceId::v4(9), InstanceId::v6(9)]);
    assert_ne!(ids[0].lease_slot(), ids[1].lease_slot());
    // The IPv6 advert is RFC 5798 §5.1.2's: checksummed with the link-local source.
    let (header, payload) = received6(A6, &adverts[1], 255);
    let decoded = ipv6::decode(&payload, header, ChecksumMode::Rfc).unwrap();
    assert_eq!((decoded.advert.vrid, decoded.advert.addresses.clone()), (9, vec![VIP6]));

    // B, a higher-priority IPv6 router, takes over the IPv6 instance only.
    let mut b = dual_stack(B, B6, 250, A, A6);
    b.start(t0);
    let b_adverts = b.on_timer(t0 + ms(400));
    let (header, payload) = received6(B6, &b_adverts[1], 255);
    a.on_datagram(t0 + ms(401), "eth0", Datagram::V6 { header, payload: &payload });
    a.on_timer(t0 + ms(560)); // past the handover grace
    assert_eq!(a.owned_vips(), [VIP].into(), "the IPv6 VIP is B's now, the IPv4 one still A's");
    let states: Vec<(IpFamily, State)> = a.instances().map(|(s, i)| (s.family, i.state())).collect();
    assert_eq!(states, vec![(IpFamily::V4, State::Master), (IpFamily::V6, State::Backup)]);
    assert_eq!(a.instances().nth(1).unwrap().1.master(), Some(B6.into()));
    // An IPv6 advert with a hop limit other than 255 is dropped (§7.1).
    let mut c = dual_stack(A, A6, 200, B, B6);
    c.start(t0);
    c.on_timer(t0 + ms(322));
    let (header, payload) = received6(B6, &b_adverts[1], 64);
    c.on_datagram(t0 + ms(401), "eth0", Datagram::V6 { header, payload: &payload });
    assert_eq!(c.owned_vips(), [VIP, VIP6].into());
}

#[test]
fn an_ipv6_tie_is_won_by_the_higher_link_local_address() {
    let t0 = Instant::now();
    let mut a = dual_stack(A, A6, 200, B, B6);
    let mut b = dual_stack(B, B6, 200, A, A6);
    a.start(t0);
    b.start(t0);
    let a_adverts = a.on_timer(t0 + ms(322));
    let b_adverts = b.on_timer(t0 + ms(322));
    // Both masters at once; each hears the other. fe80::b > fe80::a: B keeps IPv6.
    let (header, payload) = received6(B6, &b_adverts[1], 255);
    a.on_datagram(t0 + ms(323), "eth0", Datagram::V6 { header, payload: &payload });
    let (header, payload) = received6(A6, &a_adverts[1], 255);
    b.on_datagram(t0 + ms(323), "eth0", Datagram::V6 { header, payload: &payload });
    let ipv6_state = |r: &Router| r.instances().find(|(s, _)| s.family == IpFamily::V6).unwrap().1.state();
    assert_eq!((ipv6_state(&a), ipv6_state(&b)), (State::Backup, State::Master));
}

#[test]
fn ipv6_adverts_are_signed_and_checked_with_their_ipv6_addresses() {
    let t0 = Instant::now();
    let keyed6 = |r: &mut Router, priority: u8, peer: Ipv6Addr| {
        let v6 = InstanceSpec {
            family: IpFamily::V6,
            vips: [VIP6].into(),
            peers: [IpAddr::V6(peer)].into(),
            ..keyed(spec(priority, &[], Transport::Multicast), KEY)
        };
        r.reconfigure(t0, vec![v6]);
    };
    let mut a = dual_stack(A, A6, 200, B, B6);
    let mut b = dual_stack(B, B6, 100, A, A6);
    keyed6(&mut a, 200, B6);
    keyed6(&mut b, 100, A6);
    a.start(t0);
    b.start(t0);
    let advert = a.on_timer(t0 + ms(322));
    assert_eq!(advert[0].payload.len(), 24 + super::super::auth::TRAILER_LEN, "signed");
    let (header, payload) = received6(A6, &advert[0], 255);
    b.on_datagram(t0 + ms(322), "eth0", Datagram::V6 { header, payload: &payload });
    assert_eq!(b.instances().next().unwrap().1.master(), Some(A6.into()), "accepted");
    // Sent again to another destination, its checksum fixed up: the tag, which covers both
    // addresses, no longer verifies.
    let (mut c, registry) = {
        let mut registry = Registry::default();
        let locals = [(("eth0".to_owned(), IpFamily::V6), IpAddr::V6(B6))];
        (Router::new(locals.into(), VrrpMetrics::register(&mut registry)), registry)
    };
    keyed6(&mut c, 100, A6);
    c.start(t0);
    let mut moved = payload.clone();
    moved[6..8].copy_from_slice(&[0, 0]);
    let sum = crate::vrrp::packet::checksum(&moved[..24], A6, B6, ChecksumMode::Rfc);
    moved[6..8].copy_from_slice(&sum.to_be_bytes());
    let unicast = ipv6::Header { destination: B6, ..header };
    c.on_datagram(t0 + ms(322), "eth0", Datagram::V6 { header: unicast, payload: &moved });
    assert_eq!(c.instances().next().unwrap().1.master(), None, "dropped");
    assert_counted(&registry, &[r#"vrrp_adverts_dropped_total{vrid="9",family="ipv6",reason="bad_tag"} 1"#]);
}
