//! Service-path fixtures beyond the shared table (`service_paths.rs`) through
//! BPF_PROG_TEST_RUN, with the real object and map sync: replies verified by the connection
//! table, for both families; and for IPv4 (the agent's code is generic over the address),
//! uplinks, cached next hops, reply entries, full NAT's ports and an earlier build's flows.
//!
//! The program asks the kernel's FIB for next hops, so the runs happen inside a lab node's
//! namespace, with permanent neighbour entries: every MAC in the expected frames is known.

use std::net::{IpAddr, Ipv4Addr};

use aya::{Ebpf, maps::HashMap, programs::SchedClassifier};
use lb_agent::{
    config::Config,
    dataplane::{EMBEDDED_OBJECT, REPLY_PROGRAM, ServiceMaps, ServiceMapsByFamily},
    map_contents,
};
use lb_common::{
    counters::Reason,
    endpoint_services::EndpointKeyOf,
    hash::flow_hash,
    maps::OwnedVip,
    service::{
        Addr4, Addr6, Address, ConnectionKeyOf, Delivery, FlowKey, FlowKeyOf, ReplyNatOf, ServiceKeyOf,
        Settings,
    },
};
use lb_lab::{
    family::{
        IpFamily, LabFamily, checksums_ok, encapsulated, in_node_with_local_pod, load_services_of,
        segment_frame, services_config,
    },
    fixture::{
        CLIENT, CLIENT_MAC, NODE, NODE_MAC, PEER, PEER_MAC, VIP, XDP_PASS, XDP_REDIRECT, XDP_TX,
        reason_packets, run_reply, run_uplink,
    },
    packet::checksums_valid,
};

const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const SNAT_FIRST: u16 = 61_000;
const SNAT_SPAN: u32 = 4_536;

struct Fixture {
    ebpf: Ebpf,
    maps: ServiceMaps,
    ifindex: u32,
}

impl Fixture {
    fn load(ifindex: u32) -> Fixture {
        let (mut ebpf, maps) = load_services_of(&[IpFamily::V4], EMBEDDED_OBJECT, ifindex, SNAT_FIRST);
        let reply: &mut SchedClassifier = ebpf.program_mut(REPLY_PROGRAM).unwrap().try_into().unwrap();
        reply.load().expect("the verifier accepts lb_reply");
        let maps = maps.v4;
        Fixture { ebpf, maps, ifindex }
    }

    fn run(&self, input: &[u8]) -> (u32, Vec<u8>) {
        run_uplink(&self.ebpf, input, self.ifindex)
    }

    fn reason(&self, reason: Reason) -> u64 {
        reason_packets(&self.ebpf, reason)
    }
}

fn snat_port(sport: u16, dport: u16, proto: u8) -> u16 {
    lb_lab::family::snat_port(CLIENT.into(), VIP.into(), (sport, dport), proto, SNAT_FIRST, SNAT_SPAN)
}

/// With several uplinks: a service is served only on its VIP's uplink (elsewhere the packet
/// goes to the kernel untouched, counted), and full NAT and DSR take their source from the
/// uplink the packet leaves by.
#[test]
fn services_are_served_on_their_uplink_and_sourced_from_the_egress_one() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, local| {
        let mut f = Fixture::load(ifindex);
        let egress_source = Ipv4Addr::new(192, 0, 2, 77);
        let set_uplink = |f: &mut Fixture, slot: u8| {
            lb_lab::fixture::add_uplink(&mut f.ebpf, (ifindex, 0), slot, egress_source, NODE_MAC);
        };
        set_uplink(&mut f, 1);
        let moved = f.maps.set_vip_uplinks(std::sync::Arc::new([(VIP.into(), 2)].into())).unwrap();
        assert_eq!(moved, 7, "every service entry of the VIP took its uplink");
        let to_node = (CLIENT_MAC, NODE_MAC);

        // The VIP's uplink is slot 2; eth0 is slot 1.
        let input = segment_frame(to_node, CLIENT, VIP, 64, 6, (41_000, 80));
        let before = f.reason(Reason::WrongInterface);
        let (action, out) = f.run(&input);
        assert_eq!((action, &out), (XDP_PASS, &input), "served on another uplink: passed untouched");
        assert_eq!(f.reason(Reason::WrongInterface), before + 1);

        // eth0 is the VIP's uplink now: served, and full NAT and DSR leave from eth0's address.
        set_uplink(&mut f, 2);
        let expected = segment_frame((local.host, local.pod), CLIENT, LOCAL_POD, 63, 6, (41_000, 8080));
        check(&f, "local TCP on its uplink", &input, XDP_REDIRECT, &expected);
        let port = snat_port(41_001, 81, 17);
        let input = segment_frame(to_node, CLIENT, VIP, 64, 17, (41_001, 81));
        let expected = segment_frame((NODE_MAC, PEER_MAC), egress_source, REMOTE_POD, 63, 17, (port, 8080));
        check(&f, "full NAT from the egress uplink's address", &input, XDP_TX, &expected);
        let input = segment_frame((PEER_MAC, NODE_MAC), REMOTE_POD, egress_source, 64, 17, (8080, port));
        let expected = segment_frame((NODE_MAC, CLIENT_MAC), VIP, CLIENT, 63, 17, (81, 41_001));
        check(&f, "full NAT reply to the egress uplink's address", &input, XDP_TX, &expected);
        let input = segment_frame(to_node, CLIENT, VIP, 64, 6, (41_002, 82));
        let inner = segment_frame(to_node, CLIENT, VIP, 63, 6, (41_002, 82));
        let expected = encapsulated((NODE_MAC, PEER_MAC), egress_source, REMOTE_POD, &inner);
        check(&f, "DSR from the egress uplink's address", &input, XDP_TX, &expected);
    });
}

fn check(f: &Fixture, name: &str, input: &[u8], action: u32, expected: &[u8]) {
    let (got, out) = f.run(input);
    assert_eq!(got, action, "{name}: action");
    assert!(checksums_valid(&out), "{name}: checksums of {out:02x?}");
    assert_eq!(out, expected, "{name}: output frame");
}

/// The next hop towards a backend is cached (for every flow to it) and used without asking the
/// FIB, but only for `HOP_REFRESH_NS`: after that a replaced neighbour is followed, a removed
/// route is noticed, and a packet bigger than the cached MTU is always looked up again. A slot
/// another backend takes starts without one.
#[test]
fn cached_next_hops_are_refreshed_not_trusted_forever() {
    lb_lab::fixture::in_lab_node(next_hop_fixtures);
}

fn next_hop_fixtures(ifindex: u32) {
    use lb_common::service::{HOP_REFRESH_NS, NextHopEntry};
    const MOVED_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x99];
    let mut f = Fixture::load(ifindex);
    let to_node = (CLIENT_MAC, NODE_MAC);
    let input = segment_frame(to_node, CLIENT, VIP, 64, 17, (41_000, 81));
    let port = snat_port(41_000, 81, 17);
    let via =
        |mac: [u8; 6], port: u16| segment_frame((NODE_MAC, mac), NODE, REMOTE_POD, 63, 17, (port, 8080));
    let slot = *f
        .maps
        .backends()
        .iter()
        .find(|(b, _)| b.addr == REMOTE_POD.octets() && b.delivery == Delivery::FullNat as u8)
        .expect("the full-NAT backend's slot")
        .1;
    let cached = |f: &mut Fixture, change: &dyn Fn(&mut NextHopEntry)| -> NextHopEntry {
        let hops = f.maps.next_hops();
        let mut hop = hops.get(&slot, 0).unwrap();
        change(&mut hop);
        hops.set(slot, hop, 0).unwrap();
        hop
    };
    let age = |hop: &mut NextHopEntry| hop.checked_ns = hop.checked_ns.saturating_sub(HOP_REFRESH_NS);

    assert_eq!(cached(&mut f, &|_| {}).ifindex, 0, "nothing cached before the first packet");
    check(&f, "first packet: the FIB's hop", &input, XDP_TX, &via(PEER_MAC, port));
    let hop = cached(&mut f, &|_| {});
    assert_eq!((hop.dmac, hop.smac), (PEER_MAC, NODE_MAC));
    assert!(hop.ifindex == ifindex && hop.mtu == 1500, "{hop:?}");

    // The peer's MAC changes: the backend's cached hop is used until the refresh is due, by
    // this flow and by a new one…
    ip(&[
        "neigh",
        "replace",
        &PEER.to_string(),
        "lladdr",
        "02:1b:00:00:00:99",
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    check(&f, "neighbour replaced, hop still cached", &input, XDP_TX, &via(PEER_MAC, port));
    let other = segment_frame(to_node, CLIENT, VIP, 64, 17, (41_001, 81));
    let other_port = snat_port(41_001, 81, 17);
    check(&f, "a new flow, the cached hop", &other, XDP_TX, &via(PEER_MAC, other_port));
    // …and once the refresh is due, both follow the neighbour.
    cached(&mut f, &age);
    check(&f, "refresh due: the new neighbour", &input, XDP_TX, &via(MOVED_MAC, port));
    assert_eq!(cached(&mut f, &|_| {}).dmac, MOVED_MAC, "the cache holds the new hop");
    check(&f, "the other flow: the new neighbour", &other, XDP_TX, &via(MOVED_MAC, other_port));

    // A packet bigger than the cached MTU is looked up again (the FIB would report it too big).
    cached(&mut f, &|hop| hop.mtu = 20);
    check(&f, "bigger than the cached MTU", &input, XDP_TX, &via(MOVED_MAC, port));
    assert_eq!(cached(&mut f, &|_| {}).mtu, 1500, "looked up again, cached again");

    // The route goes away: noticed at the next refresh, and the packet is left to the kernel.
    ip(&["route", "del", "10.244.1.0/24"]);
    check(&f, "route gone, hop still cached", &input, XDP_TX, &via(MOVED_MAC, port));
    cached(&mut f, &age);
    let before = f.reason(Reason::NoRoute);
    let (action, out) = f.run(&input);
    assert_eq!((action, out), (XDP_PASS, input.clone()), "no route: passed untouched");
    assert_eq!(f.reason(Reason::NoRoute), before + 1);

    // A backend taking a slot takes it without a hop: every slot's is made stale-looking
    // first, and the endpoint is replaced by another.
    let poison = NextHopEntry { ifindex, mtu: 1500, checked_ns: u64::MAX / 2, ..hop };
    let slots = f.maps.next_hops().len();
    for s in 0..slots {
        f.maps.next_hops().set(s, poison, 0).unwrap();
    }
    let moved =
        services_config(IpFamily::V4).replacen("'10.244.1.2', node: n1}]", "'10.244.1.3', node: n1}]", 1);
    f.maps.apply(&map_contents::for_node(&Config::parse(&moved).unwrap(), "n0")).unwrap();
    let (_, &new_slot) =
        f.maps.backends().iter().find(|(b, _)| b.addr == [10, 244, 1, 3]).expect("the new endpoint's slot");
    let hop = f.maps.next_hops().get(&new_slot, 0).unwrap();
    assert_eq!(hop, NextHopEntry::default(), "the new backend's slot has no hop");
}

/// Full NAT's replies go back to their client by a next hop cached per CPU and client, without
/// asking the FIB, but only for `HOP_REFRESH_NS`: after that a replaced neighbour is followed.
/// Every reply to the client shares the client's hop, whichever flow it belongs to.
#[test]
fn cached_reply_hops_are_refreshed_not_trusted_forever() {
    lb_lab::fixture::in_lab_node(|ifindex| {
        const MOVED_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x98];
        let f = Fixture::load(ifindex);
        let flows = [41_000, 41_001].map(|sport| {
            let input = segment_frame((CLIENT_MAC, NODE_MAC), CLIENT, VIP, 64, 17, (sport, 81));
            let (action, _) = f.run(&input);
            assert_eq!(action, XDP_TX, "full NAT to the remote pod");
            let port = snat_port(sport, 81, 17);
            let reply = segment_frame((PEER_MAC, NODE_MAC), REMOTE_POD, NODE, 64, 17, (8080, port));
            let to_client = move |mac| segment_frame((NODE_MAC, mac), VIP, CLIENT, 63, 17, (81, sport));
            (reply, to_client)
        });
        let [(reply, to_client), (other_reply, other_to_client)] = &flows;
        check(&f, "first reply: the FIB's hop", reply, XDP_TX, &to_client(CLIENT_MAC));

        // The client's MAC changes: its cached hop is used until the refresh is due, by this
        // flow's replies and by another flow's to the same client…
        let moved = lb_lab::format_mac(&MOVED_MAC);
        ip(&["neigh", "replace", &CLIENT.to_string(), "lladdr", &moved, "dev", "eth0", "nud", "permanent"]);
        check(&f, "neighbour replaced, hop still cached", reply, XDP_TX, &to_client(CLIENT_MAC));
        check(&f, "another flow, the cached hop", other_reply, XDP_TX, &other_to_client(CLIENT_MAC));
        // …and once it is due, the new neighbour.
        let refresh = std::time::Duration::from_nanos(lb_common::service::HOP_REFRESH_NS);
        std::thread::sleep(refresh + std::time::Duration::from_millis(100));
        check(&f, "refresh due: the new neighbour", reply, XDP_TX, &to_client(MOVED_MAC));
        check(&f, "another flow: the new neighbour", other_reply, XDP_TX, &other_to_client(MOVED_MAC));
    });
}

/// Runs `ip` with `args` in this thread's namespace (a lab node's, inside `in_lab_node`): acts
/// on the tables the program's FIB lookups read.
fn ip(args: &[&str]) {
    let status = std::process::Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

/// Four more services on the local pod's port 8080, TCP and UDP: with `local` (and `dsr-here`
/// for TCP) more than an endpoint's listing holds, so TCP ports 92 and 93 and UDP port 93 are
/// not listed.
const CROWD: &str = "
  - name: crowd
    vip: 198.51.100.10
    ports: [{port: 90, targetPort: 8080}, {port: 91, targetPort: 8080}, {port: 92, targetPort: 8080},
            {port: 93, targetPort: 8080}, {port: 90, protocol: UDP, targetPort: 8080},
            {port: 91, protocol: UDP, targetPort: 8080}, {port: 92, protocol: UDP, targetPort: 8080},
            {port: 93, protocol: UDP, targetPort: 8080}]
    endpoints: [{address: 10.244.0.2, node: n0}]
";

impl Fixture {
    fn crowd(&mut self) {
        let config = Config::parse(&format!("{}{CROWD}", services_config(IpFamily::V4))).unwrap();
        self.maps.apply(&map_contents::for_node(&config, "n0")).expect("syncing the crowded services");
    }

    fn reply_entries(&mut self) -> HashMap<&mut aya::maps::MapData, FlowKey, lb_common::service::ReplyNat> {
        HashMap::try_from(self.ebpf.map_mut(lb_common::service::REPLY_NAT).unwrap()).unwrap()
    }

    fn marked(&self, port: u16, proto: u8) -> bool {
        let key = lb_common::service::ServiceKey::new(VIP.octets(), port, proto);
        self.maps.installed(&key).expect("the service is installed").replies_by_table()
    }
}

/// The key of the local pod's reply (from its port 8080) to the client's `sport`.
fn pod_reply_key(proto: u8, sport: u16) -> FlowKey {
    FlowKey::new(LOCAL_POD.octets(), CLIENT.octets(), 8080u16.to_be_bytes(), sport.to_be_bytes(), proto)
}

/// One family's maps and keys, as the reply fixtures use them (the table runs for both).
trait ReplyFamily: Address {
    const FAMILY: IpFamily;
    const FLOW_TABLE: &'static str;
    const REPLY_NAT: &'static str;
    fn maps(maps: &mut ServiceMapsByFamily) -> &mut ServiceMaps<Self>;
    fn addr(ip: IpAddr) -> Self {
        Self::from_ip(ip).expect("an address of the family")
    }
}

impl ReplyFamily for Addr4 {
    const FAMILY: IpFamily = IpFamily::V4;
    const FLOW_TABLE: &'static str = lb_common::service::FLOW_TABLE;
    const REPLY_NAT: &'static str = lb_common::service::REPLY_NAT;
    fn maps(maps: &mut ServiceMapsByFamily) -> &mut ServiceMaps<Self> {
        &mut maps.v4
    }
}

impl ReplyFamily for Addr6 {
    const FAMILY: IpFamily = IpFamily::V6;
    const FLOW_TABLE: &'static str = lb_common::service::FLOW_TABLE6;
    const REPLY_NAT: &'static str = lb_common::service::REPLY_NAT6;
    fn maps(maps: &mut ServiceMapsByFamily) -> &mut ServiceMaps<Self> {
        &mut maps.v6
    }
}

/// The local pod's services: `local` (TCP and UDP 80) and `dsr-here` (TCP 84, to
/// `dsr_target`), and with `crowd` four TCP and four UDP ports more on the same pod port, more
/// than an endpoint's listing holds (so TCP 92 and 93 and UDP 93 are not listed).
fn reply_config(f: IpFamily, dsr_target: u16, crowd: bool) -> String {
    let (vip, pod) = (f.vip(), f.pod(0, 2));
    let mut yaml = format!(
        "interface: eth0\nnode: n0\nvips: [{{address: '{vip}'}}]\nservices:\n\
         - {{name: local, vip: '{vip}', ports: [{{port: 80, targetPort: 8080}}, {{port: 80, protocol: UDP, targetPort: 8080}}], \
         endpoints: [{{address: '{pod}', node: n0}}]}}\n\
         - {{name: dsr-here, vip: '{vip}', remoteMode: dsr, ports: [{{port: 84, targetPort: {dsr_target}}}], \
         endpoints: [{{address: '{pod}', node: n0}}]}}\n"
    );
    if crowd {
        let ports: Vec<String> = (90..94)
            .flat_map(|p| {
                [
                    format!("{{port: {p}, targetPort: 8080}}"),
                    format!("{{port: {p}, protocol: UDP, targetPort: 8080}}"),
                ]
            })
            .collect();
        yaml.push_str(&format!(
            "- {{name: crowd, vip: '{vip}', ports: [{}], endpoints: [{{address: '{pod}', node: n0}}]}}\n",
            ports.join(", ")
        ));
    }
    yaml
}

/// The uplink program and `lb_reply` on fresh maps, the VIP owned, `yaml`'s services synced.
fn load_replies<A: ReplyFamily>(yaml: &str) -> (Ebpf, ServiceMapsByFamily) {
    let mut ebpf = lb_lab::fixture::load_uplink();
    let reply: &mut SchedClassifier = ebpf.program_mut(REPLY_PROGRAM).unwrap().try_into().unwrap();
    reply.load().expect("the verifier accepts lb_reply");
    lb_lab::family::own_vip(&mut ebpf, A::FAMILY.vip(), OwnedVip::new(NODE_MAC));
    let mut maps = ServiceMapsByFamily::take(&mut ebpf, None).expect("the service maps");
    sync::<A>(&mut maps, yaml);
    (ebpf, maps)
}

fn sync<A: ReplyFamily>(maps: &mut ServiceMapsByFamily, yaml: &str) {
    let config = Config::parse(yaml).expect("the fixture config is valid");
    A::maps(maps).apply(&map_contents::for_node::<A>(&config, "n0")).expect("syncing the fixture services");
}

fn marked<A: ReplyFamily>(maps: &mut ServiceMapsByFamily, port: u16, proto: u8) -> bool {
    let key = ServiceKeyOf::new(A::addr(A::FAMILY.vip()), port, proto);
    A::maps(maps).installed(&key).expect("the service is installed").replies_by_table()
}

/// The local pod's reply to the client's `sport` from its port 8080, and the same leaving with
/// the VIP's `vip_port` as its source.
fn pod_reply_in(f: IpFamily, proto: u8, sport: u16, vip_port: u16) -> (Vec<u8>, Vec<u8>) {
    let pod_mac = [0x02, 0, 0, 0, 0, 0x22];
    let (pod, vip, client) = (f.pod(0, 2), f.vip(), f.client());
    let from_pod = segment_frame((pod_mac, NODE_MAC), pod, client, 64, proto, (8080, sport));
    let from_vip = segment_frame((pod_mac, NODE_MAC), vip, client, 64, proto, (vip_port, sport));
    (from_pod, from_vip)
}

/// A local flow's replies are translated by the TC program from its connection-table entry
/// (the services listed for the pod's port, see `lb_common::endpoint_services`): nothing is
/// written per flow for them, and only a reply to a flow whose entry names this pod is
/// translated. A service past an endpoint's listing keeps `REPLY_NAT` entries.
fn a_local_flows_replies_are_verified_by_its_connection_table_entry(f: IpFamily) {
    in_node_with_local_pod(f, move |ifindex, _| match f {
        IpFamily::V4 => reply_verification_fixtures::<Addr4>(ifindex),
        IpFamily::V6 => reply_verification_fixtures::<Addr6>(ifindex),
    });
}

lb_lab::for_each_family!(a_local_flows_replies_are_verified_by_its_connection_table_entry);

fn reply_verification_fixtures<A: ReplyFamily>(ifindex: u32) {
    use lb_common::flow_table::{Entry, Fingerprint};
    let f = A::FAMILY;
    let (vip, client) = (f.vip(), f.client());
    let (ebpf, mut maps) = load_replies::<A>(&reply_config(f, 8080, false));
    let run = |input: &[u8]| run_uplink(&ebpf, input, ifindex).0;
    let to_vip = |proto: u8, sport: u16, port: u16| {
        segment_frame((CLIENT_MAC, NODE_MAC), client, vip, 64, proto, (sport, port))
    };
    let endpoint = EndpointKeyOf::new(A::addr(f.pod(0, 2)), 8080u16.to_be_bytes(), 6);
    let listed = A::maps(&mut maps).listings()[&endpoint];
    assert_eq!(listed.count, 2, "TCP 8080 is local:80 and dsr-here:84");
    assert!(marked::<A>(&mut maps, 80, 6) && marked::<A>(&mut maps, 80, 17) && marked::<A>(&mut maps, 84, 6));
    let reply_entries = |ebpf: &Ebpf, proto: u8, sport: u16| {
        let entries: HashMap<_, FlowKeyOf<A>, ReplyNatOf<A>> =
            HashMap::try_from(ebpf.map(A::REPLY_NAT).unwrap()).unwrap();
        let key = FlowKeyOf::new(
            A::addr(f.pod(0, 2)),
            A::addr(client),
            8080u16.to_be_bytes(),
            sport.to_be_bytes(),
            proto,
        );
        entries.get(&key, 0).is_ok()
    };

    for (proto, sport, vip_port) in [(6u8, 43_000u16, 80u16), (17, 43_001, 80), (6, 43_002, 84)] {
        let name = format!("{f:?} proto {proto} to port {vip_port}");
        assert_eq!(run(&to_vip(proto, sport, vip_port)), XDP_REDIRECT, "{name}");
        assert!(!reply_entries(&ebpf, proto, sport), "{name}: no reply entry written");
        let (from_pod, from_vip) = pod_reply_in(f, proto, sport, vip_port);
        let before = reason_packets(&ebpf, Reason::ReplyTranslated);
        let out = run_reply(&ebpf, &from_pod);
        assert_eq!(out, from_vip, "{name}: the reply leaves from the VIP");
        assert!(checksums_ok(&out), "{name}: checksums of {out:02x?}");
        assert_eq!(reason_packets(&ebpf, Reason::ReplyTranslated), before + 1, "{name}: counted");
    }

    // A reply to a client port with no flow is left alone.
    let (from_pod, _) = pod_reply_in(f, 6, 43_100, 80);
    assert_eq!(run_reply(&ebpf, &from_pod), from_pod, "no flow: untouched");

    // The flow's entry names another backend (the pod left the service, or a collision):
    // untouched; evicted: untouched until the client's next packet records it again.
    let number = A::maps(&mut maps).installed(&ServiceKeyOf::new(A::addr(vip), 80, 6)).unwrap().number;
    let flow_key =
        FlowKeyOf::new(A::addr(client), A::addr(vip), 43_000u16.to_be_bytes(), 80u16.to_be_bytes(), 6);
    let key = ConnectionKeyOf::of(&flow_key, number);
    let flows = lb_lab::fixture::flow_table(&ebpf, A::FLOW_TABLE);
    let entry = flows.lookup(&key).expect("the flow's entry");
    let elsewhere = Entry::new(Fingerprint::of(entry.fingerprint()), entry.backend() + 1, None, entry.tick());
    assert!(flows.replace(&key, Some(elsewhere)));
    let (from_pod, from_vip) = pod_reply_in(f, 6, 43_000, 80);
    assert_eq!(run_reply(&ebpf, &from_pod), from_pod, "the entry names another backend: untouched");
    assert!(flows.replace(&key, None));
    assert_eq!(run_reply(&ebpf, &from_pod), from_pod, "evicted: untouched");
    assert_eq!(run(&to_vip(6, 43_000, 80)), XDP_REDIRECT);
    assert_eq!(run_reply(&ebpf, &from_pod), from_vip, "recorded again by the client's next packet");

    // Past the listing: TCP ports 92 and 93 and UDP port 93 are not listed, their entries not
    // marked, and their flows' replies go through REPLY_NAT; the listed ones keep their places.
    sync::<A>(&mut maps, &reply_config(f, 8080, true));
    assert_eq!(
        A::maps(&mut maps).listings()[&endpoint].listed()[..2],
        listed.listed()[..2],
        "earlier listings kept"
    );
    for (port, proto, expected) in
        [(90, 6, true), (91, 6, true), (92, 6, false), (93, 6, false), (92, 17, true), (93, 17, false)]
    {
        assert_eq!(marked::<A>(&mut maps, port, proto), expected, "{f:?} port {port} proto {proto}");
    }
    assert_eq!(run(&to_vip(6, 43_200, 93)), XDP_REDIRECT);
    assert!(reply_entries(&ebpf, 6, 43_200), "an unlisted service's flow writes its reply entry");
    let (from_pod, from_vip) = pod_reply_in(f, 6, 43_200, 93);
    assert_eq!(run_reply(&ebpf, &from_pod), from_vip, "an unlisted service's reply, from REPLY_NAT");

    // dsr-here moves to another port: 92 takes the place it left, and is marked once listed.
    sync::<A>(&mut maps, &reply_config(f, 8081, true));
    assert!(
        marked::<A>(&mut maps, 92, 6) && !marked::<A>(&mut maps, 93, 6),
        "port 92 takes the place dsr-here left"
    );
}

/// A service past its endpoint's listing keeps reply entries: an entry evicted while its flow's
/// connection-table entry stays (a flood can do that to an LRU) is written again, by the next
/// packet for TCP, whose client would otherwise reset the connection on an untranslated reply;
/// at the flow's next-hop refresh for UDP.
#[test]
fn an_evicted_reply_entry_is_written_again() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, _| reply_entry_fixtures(ifindex));
}

fn reply_entry_fixtures(ifindex: u32) {
    use lb_common::{
        flow_table::{CHECK_TICKS, Tick},
        service::{ConnectionKey, FLOW_TABLE, ServiceKey},
    };
    let mut f = Fixture::load(ifindex);
    f.crowd();
    for (proto, sport) in [(6u8, 42_000u16), (17, 42_001)] {
        assert!(!f.marked(93, proto), "port 93 is past the listing");
        let input = segment_frame((CLIENT_MAC, NODE_MAC), CLIENT, VIP, 64, proto, (sport, 93));
        let reply_key = pod_reply_key(proto, sport);
        let flow_key =
            FlowKey::new(CLIENT.octets(), VIP.octets(), sport.to_be_bytes(), 93u16.to_be_bytes(), proto);
        assert_eq!(f.run(&input).0, XDP_REDIRECT);
        assert!(f.reply_entries().get(&reply_key, 0).is_ok(), "proto {proto}: written with the first packet");

        f.reply_entries().remove(&reply_key).unwrap();
        assert_eq!(f.run(&input).0, XDP_REDIRECT);
        let again = f.reply_entries().get(&reply_key, 0).is_ok();
        assert_eq!(again, proto == 6, "proto {proto}: written again by the next packet only for TCP");
        if proto == 17 {
            // UDP: at the flow's next periodic check.
            let number = f.maps.installed(&ServiceKey::new(VIP.octets(), 93, proto)).unwrap().number;
            let key = ConnectionKey::of(&flow_key, number);
            let flows = lb_lab::fixture::flow_table(&f.ebpf, FLOW_TABLE);
            let entry = flows.lookup(&key).expect("the flow's entry");
            let checked = Tick(entry.tick().0.wrapping_sub(CHECK_TICKS));
            assert!(flows.replace(&key, Some(entry.with_tick(checked))));
            assert_eq!(f.run(&input).0, XDP_REDIRECT);
            assert!(f.reply_entries().get(&reply_key, 0).is_ok(), "UDP: written again at the refresh");
        }
    }
}

/// Full NAT's source ports are never evicted: a flow whose connection-table entry is gone finds
/// its own port again, a port another flow holds is skipped, a reply whose entry an earlier
/// build left in `REPLY_NAT` is still translated, and the agent releases ports idle past the
/// timeout, only those.
#[test]
fn full_nat_ports_stay_with_their_flows() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, _| {
        use lb_common::service::{ConnectionKey, FLOW_TABLE, REPLY_NAT, ReplyNat, ServiceKey, SnatEntry};
        let mut f = Fixture::load(ifindex);
        let to_node = (CLIENT_MAC, NODE_MAC);
        let forward = |sport: u16, port: u16| {
            let input = segment_frame(to_node, CLIENT, VIP, 64, 17, (sport, 81));
            let expected = segment_frame((NODE_MAC, PEER_MAC), NODE, REMOTE_POD, 63, 17, (port, 8080));
            (input, expected)
        };
        let flow = |sport: u16| {
            FlowKey::new(CLIENT.octets(), VIP.octets(), sport.to_be_bytes(), 81u16.to_be_bytes(), 17)
        };
        let reply_key = |port: u16| {
            FlowKey::new(REMOTE_POD.octets(), NODE.octets(), 8080u16.to_be_bytes(), port.to_be_bytes(), 17)
        };

        // A flow's entry evicted from the connection table: its next packet keeps the port.
        let port = snat_port(41_100, 81, 17);
        let (input, expected) = forward(41_100, port);
        check(&f, "full NAT, first packet", &input, XDP_TX, &expected);
        let number = f.maps.installed(&ServiceKey::new(VIP.octets(), 81, 17)).unwrap().number;
        let flows = lb_lab::fixture::flow_table(&f.ebpf, FLOW_TABLE);
        assert!(flows.replace(&ConnectionKey::of(&flow(41_100), number), None), "the flow's entry");
        check(&f, "full NAT, flow entry evicted", &input, XDP_TX, &expected);

        // The first candidate port of a new flow is held by another client's flow: the next one.
        let first = snat_port(41_101, 81, 17);
        let mut other =
            ReplyNat::new(VIP.octets(), [192, 0, 2, 99], 81u16.to_be_bytes(), 41_101u16.to_be_bytes());
        other.peer_mac = PEER_MAC;
        let held = SnatEntry { reply: other, peer_ifindex: 0, last_seen_ns: 0 };
        f.maps.snat().map_mut().insert(reply_key(first), held, 0).unwrap();
        let next = SNAT_FIRST + ((first - SNAT_FIRST) as u32 + 1).rem_euclid(SNAT_SPAN) as u16;
        let (input, expected) = forward(41_101, next);
        check(&f, "full NAT, a held port skipped", &input, XDP_TX, &expected);

        // An entry left in REPLY_NAT by an earlier build still translates its replies.
        let snat = f.maps.snat().map_mut();
        let mine = snat.get(&reply_key(port), 0).unwrap();
        snat.remove(&reply_key(port)).unwrap();
        let mut old: HashMap<_, FlowKey, ReplyNat> =
            HashMap::try_from(f.ebpf.map_mut(REPLY_NAT).unwrap()).unwrap();
        old.insert(reply_key(port), mine.reply, 0).unwrap();
        let input = segment_frame((PEER_MAC, NODE_MAC), REMOTE_POD, NODE, 64, 17, (8080, port));
        let expected = segment_frame((NODE_MAC, CLIENT_MAC), VIP, CLIENT, 63, 17, (81, 41_100));
        check(&f, "full NAT reply from an earlier build's entry", &input, XDP_TX, &expected);

        // Idle past the timeout: the held port (seen at boot) goes, the live flow's stays.
        let now = lb_agent::dataplane::leases::monotonic_ns();
        let expiry = f.maps.expire_snat(now, std::time::Duration::from_secs(10)).unwrap();
        assert_eq!((expiry.removed, expiry.kept), (1, 1));
        let snat = f.maps.snat().map_mut();
        assert!(snat.get(&reply_key(first), 0).is_err() && snat.get(&reply_key(next), 0).is_ok());
    });
}

/// A known full-NAT flow's entry names the attempt that claimed its port; the port is checked
/// in the port table with each packet. After the port range changes, the attempt names another
/// port, here one another flow holds: the flow never goes out on it, it claims one of its own.
#[test]
fn a_changed_port_range_never_sends_a_flow_out_on_another_flows_port() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, _| {
        use lb_common::service::{ReplyNat, SnatEntry};
        let mut f = Fixture::load(ifindex);
        let to_node = (CLIENT_MAC, NODE_MAC);
        let input = segment_frame(to_node, CLIENT, VIP, 64, 17, (41_200, 81));
        let port = snat_port(41_200, 81, 17);
        let expected = segment_frame((NODE_MAC, PEER_MAC), NODE, REMOTE_POD, 63, 17, (port, 8080));
        check(&f, "full NAT, first packet", &input, XDP_TX, &expected);

        // The range moves up by one: the entry's attempt 0 now names `moved`, held by another.
        let (first, span) = (SNAT_FIRST + 1, SNAT_SPAN - 1);
        let flow =
            FlowKey::new(CLIENT.octets(), VIP.octets(), 41_200u16.to_be_bytes(), 81u16.to_be_bytes(), 17);
        let candidate = |attempt: u32| first + (flow_hash(&flow).wrapping_add(attempt) % span) as u16;
        let moved = candidate(0);
        assert_ne!(moved, port);
        let mut other =
            ReplyNat::new(VIP.octets(), [192, 0, 2, 99], 81u16.to_be_bytes(), 41_200u16.to_be_bytes());
        other.peer_mac = PEER_MAC;
        let reply_key =
            FlowKey::new(REMOTE_POD.octets(), NODE.octets(), 8080u16.to_be_bytes(), moved.to_be_bytes(), 17);
        let held = SnatEntry { reply: other, peer_ifindex: 0, last_seen_ns: 0 };
        f.maps.snat().map_mut().insert(reply_key, held, 0).unwrap();
        f.maps
            .set_settings(Settings { node_addr: NODE.octets(), snat_port_min: first, snat_port_max: 65_535 })
            .unwrap();

        let expected = segment_frame((NODE_MAC, PEER_MAC), NODE, REMOTE_POD, 63, 17, (candidate(1), 8080));
        check(&f, "full NAT after the range moved: a port of its own", &input, XDP_TX, &expected);
        check(&f, "full NAT after the range moved: kept", &input, XDP_TX, &expected);
    });
}

/// A known full-NAT flow's port is checked in the port table with every packet: once another
/// flow holds it (this one idled past the timeout, say), the flow claims a port of its own and
/// keeps that one. For IPv6 the check runs in `lb_xdp6` and the claim in a stage of its own
/// (`services::stages6`): the second packet crosses from one to the other.
fn a_flow_whose_port_another_flow_took_claims_one_of_its_own(f: IpFamily) {
    in_node_with_local_pod(f, move |ifindex, _| match f {
        IpFamily::V4 => port_taken_fixture::<Addr4>(ifindex),
        IpFamily::V6 => port_taken_fixture::<Addr6>(ifindex),
    });
}

lb_lab::for_each_family!(a_flow_whose_port_another_flow_took_claims_one_of_its_own);

fn port_taken_fixture<A: ReplyFamily>(ifindex: u32) {
    use lb_common::service::SnatEntryOf;
    let f = A::FAMILY;
    let (ebpf, mut maps) = load_services_of(&[f], EMBEDDED_OBJECT, ifindex, SNAT_FIRST);
    let (vip, client, node, there) = (f.vip(), f.client(), f.node(), f.pod(1, 2));
    let input = segment_frame((CLIENT_MAC, NODE_MAC), client, vip, 64, 17, (41_400, 81));
    let forwarded = |port: u16| segment_frame((NODE_MAC, PEER_MAC), node, there, 63, 17, (port, 8080));
    let run = |name: &str, port: u16| {
        let (action, out) = run_uplink(&ebpf, &input, ifindex);
        assert_eq!((action, out), (XDP_TX, forwarded(port)), "{}: {name}", f.as_str());
    };
    let first = lb_lab::family::snat_port(client, vip, (41_400, 81), 17, SNAT_FIRST, SNAT_SPAN);
    run("first packet", first);
    run("its port held", first);

    let other_client = match client {
        IpAddr::V4(c) => IpAddr::from([c.octets()[0], c.octets()[1], c.octets()[2], 99]),
        IpAddr::V6(c) => std::net::Ipv6Addr::from_bits(c.to_bits() ^ 0x99).into(),
    };
    let key = |port: u16| {
        FlowKeyOf::new(A::addr(there), A::addr(node), 8080u16.to_be_bytes(), port.to_be_bytes(), 17)
    };
    let others =
        ReplyNatOf::new(A::addr(vip), A::addr(other_client), 81u16.to_be_bytes(), 41_400u16.to_be_bytes());
    let taken = SnatEntryOf { reply: others, peer_ifindex: 0, last_seen_ns: 0 };
    A::maps(&mut maps).snat().map_mut().insert(key(first), taken, 0).unwrap();
    let next = SNAT_FIRST + ((first - SNAT_FIRST) as u32 + 1).rem_euclid(SNAT_SPAN) as u16;
    run("its port taken: one of its own", next);
    run("that one kept", next);
    let table = A::maps(&mut maps).snat().map_mut();
    let held = |port| table.get(&key(port), 0).ok().map(|e| e.reply.dst == A::addr(client));
    assert_eq!(
        (held(first), held(next)),
        (Some(false), Some(true)),
        "{}: the other flow's port left alone",
        f.as_str()
    );
}

/// An agent upgraded from a build whose connection table was the kernel's hash map (`FLOWS`)
/// converts its entries: a flow keeps the backend that table gave it, where a new flow of the
/// same service takes the ring's. Here the old entry of a flow to the DSR service names the
/// local pod's backend.
#[test]
fn an_earlier_builds_flows_are_converted_and_keep_their_backends() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, local| {
        use lb_agent::dataplane::flow_tables::{TABLES, convert_earlier};
        use lb_common::service::{Addr4, ConnectionKey, FLOW_TABLE, FLOWS, Flow, ServiceKey};
        let f = Fixture::load(ifindex);
        // The labs' bpffs (mounted by the lab this runs in): the host's /sys/fs/bpf need not be one.
        let dir = std::path::PathBuf::from(format!(
            "{}/lb-fixture-convert-{}",
            lb_lab::BPFFS_LABS,
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pinned = dir.join(FLOWS);
        let mut earlier = lb_lab::fixture::pin_earlier_flows(&pinned);
        let number = f.maps.installed(&ServiceKey::new(VIP.octets(), 82, 6)).unwrap().number;
        let (_, &local_slot) = f
            .maps
            .backends()
            .iter()
            .find(|(b, _)| b.addr == LOCAL_POD.octets())
            .expect("the local pod's slot");
        let flow =
            FlowKey::new(CLIENT.octets(), VIP.octets(), 41_300u16.to_be_bytes(), 82u16.to_be_bytes(), 6);
        let entry = Flow { backend: local_slot, snat_port: [0; 2], checked: 0 };
        earlier.insert(ConnectionKey::of(&flow, number), entry, 0).unwrap();
        drop(earlier);

        convert_earlier::<Addr4>(&dir, TABLES[0], &lb_lab::fixture::flow_table(&f.ebpf, FLOW_TABLE));
        assert!(!pinned.exists(), "the earlier table is unpinned once converted");
        std::fs::remove_dir(&dir).unwrap();

        let to_node = (CLIENT_MAC, NODE_MAC);
        let input = segment_frame(to_node, CLIENT, VIP, 64, 6, (41_300, 82));
        let expected = segment_frame((local.host, local.pod), CLIENT, LOCAL_POD, 63, 6, (41_300, 8080));
        check(&f, "a converted flow keeps its backend", &input, XDP_REDIRECT, &expected);
        let input = segment_frame(to_node, CLIENT, VIP, 64, 6, (41_301, 82));
        let inner = segment_frame(to_node, CLIENT, VIP, 63, 6, (41_301, 82));
        let expected = encapsulated((NODE_MAC, PEER_MAC), NODE, REMOTE_POD, &inner);
        check(&f, "a new flow takes the ring's backend", &input, XDP_TX, &expected);
    });
}

/// A table an earlier build kept chose its buckets by service too (`Scheme::ByService`).
/// Adopted, it is migrated: a flow's entry where that build put it is still found, keeps its
/// backend (here the local pod, where the ring now says the remote one), and is moved to the
/// flow's bucket by this build's scheme, its earlier slot cleared. Once the migration ends, an
/// entry left at an earlier position is not read: the flow takes the ring's backend, as after
/// an eviction.
#[test]
fn a_table_an_earlier_build_keyed_by_service_is_migrated_and_its_flows_keep_their_backends() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, local| {
        use std::sync::atomic::Ordering::Relaxed;

        use lb_agent::dataplane::flow_tables;
        use lb_common::{
            flow_table::{Entry, Header, earlier_bucket_hash, fingerprint},
            service::{ConnectionKey, FLOW_TABLE, ServiceKey},
        };
        let f = Fixture::load(ifindex);
        let table = lb_lab::fixture::flow_table(&f.ebpf, FLOW_TABLE);
        let number = f.maps.installed(&ServiceKey::new(VIP.octets(), 82, 6)).unwrap().number;
        let local_slot =
            f.maps.backends().iter().find(|(b, _)| b.addr == LOCAL_POD.octets()).map(|(_, s)| *s);
        let local_slot = local_slot.expect("the local pod's slot") as u16;
        let flow = |port: u16| {
            FlowKey::new(CLIENT.octets(), VIP.octets(), port.to_be_bytes(), 82u16.to_be_bytes(), 6)
        };
        let seed = table.header.keying.seed;
        // Where the earlier build put the flow's entry: a bucket other than this build's.
        let earlier_bucket = |port: u16| {
            let key = ConnectionKey::of(&flow(port), number);
            table.header.keying.bucket_at(earlier_bucket_hash(&key, seed))
        };
        let recorded_earlier = |port: u16| {
            let key = ConnectionKey::of(&flow(port), number);
            let entry = Entry::new(fingerprint(&key, seed), local_slot, None, flow_tables::now());
            let bucket = table.bucket(earlier_bucket(port));
            let slot = (0..bucket.len()).find(|s| bucket[*s].load(Relaxed) == 0).expect("a free slot");
            bucket[slot].store(entry.0, Relaxed);
            (key, entry)
        };
        let in_earlier_bucket = |port: u16, entry: Entry| {
            table.bucket(earlier_bucket(port)).iter().any(|s| s.load(Relaxed) == entry.0)
        };
        let to_node = (CLIENT_MAC, NODE_MAC);
        let to_local = |port| segment_frame((local.host, local.pod), CLIENT, LOCAL_POD, 63, 6, (port, 8080));
        let to_remote = |port| {
            let inner = segment_frame(to_node, CLIENT, VIP, 63, 6, (port, 82));
            encapsulated((NODE_MAC, PEER_MAC), NODE, REMOTE_POD, &inner)
        };
        let input = |port| segment_frame(to_node, CLIENT, VIP, 64, 6, (port, 82));
        check(&f, "the ring's backend for this service", &input(41_399), XDP_TX, &to_remote(41_399));

        table.write_header(Header { migrating: true, ..table.header });
        let (key, entry) = recorded_earlier(41_400);
        assert_ne!(
            earlier_bucket(41_400),
            table.header.keying.bucket(lb_common::flow_table::position(&key, seed))
        );
        assert_eq!(table.lookup(&key), None, "not where this build looks first");
        check(&f, "migrating: the earlier entry's backend", &input(41_400), XDP_REDIRECT, &to_local(41_400));
        assert_eq!(table.lookup(&key).map(|e| e.backend()), Some(local_slot), "moved to this build's bucket");
        assert!(!in_earlier_bucket(41_400, entry), "and cleared where it was");
        check(&f, "migrating: found in its new bucket", &input(41_400), XDP_REDIRECT, &to_local(41_400));

        table.end_migration();
        let (_, left) = recorded_earlier(41_401);
        check(&f, "migrated: an entry left behind is not read", &input(41_401), XDP_TX, &to_remote(41_401));
        assert!(in_earlier_bucket(41_401, left), "nor moved");
        check(
            &f,
            "migrated: a moved flow keeps its backend",
            &input(41_400),
            XDP_REDIRECT,
            &to_local(41_400),
        );
    });
}

/// The agent adopts a pinned table by its header: one an earlier build wrote (no scheme) is
/// migrated, this build's is not, one being migrated stays so, and one of a scheme this build
/// does not know is replaced.
#[test]
fn a_pinned_tables_header_decides_its_migration() {
    in_node_with_local_pod(IpFamily::V4, |_, _| {
        use std::sync::atomic::Ordering::Relaxed;

        use lb_agent::dataplane::flow_tables::{FlowTable, header_for};
        use lb_common::flow_table::{Header, Keying, Scheme};
        let path = std::path::PathBuf::from(format!(
            "{}/lb-fixture-scheme-{}",
            lb_lab::BPFFS_LABS,
            std::process::id()
        ));
        let flows = 1024;
        let keying = Keying { seed: 0x1234_5678, ..Keying::for_flows(flows, 0) };
        let pin = |scheme: u64, migrating: u64| {
            let _ = std::fs::remove_file(&path);
            let created = std::process::Command::new("bpftool")
                .args(["map", "create", path.to_str().unwrap(), "type", "array", "key", "4", "value", "64"])
                .args(["entries", &keying.entries().to_string(), "name", "FLOW_TABLE", "flags", "1024"])
                .output()
                .expect("running bpftool");
            assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
            let data = aya::maps::MapData::from_pin(&path).unwrap();
            let table = FlowTable::initialize(&data, Header::fresh(keying)).unwrap();
            let header = table.bucket(keying.buckets());
            header[2].store(scheme, Relaxed);
            header[3].store(migrating, Relaxed);
        };
        let migrating = |scheme: Scheme, migrating: bool| Header { keying, scheme, migrating };

        pin(0, 0);
        assert_eq!(
            header_for(&path, flows).unwrap(),
            migrating(Scheme::ByClient, true),
            "an earlier build's"
        );
        pin(2, 0);
        assert_eq!(header_for(&path, flows).unwrap(), migrating(Scheme::ByClient, false), "this build's");
        pin(2, 1);
        assert_eq!(header_for(&path, flows).unwrap(), migrating(Scheme::ByClient, true), "being migrated");
        pin(3, 0);
        let replaced = header_for(&path, flows).unwrap();
        assert!(!replaced.migrating && replaced.keying.mask == keying.mask, "{replaced:?}");
        assert!(!path.exists(), "a table of an unknown scheme is unpinned, its flows re-balanced");
    });
}

/// The service maps keep the VIP filter to the installed keys: a service's bit is set once it
/// is installed and cleared once it is removed, so only traffic that may be a service's
/// fetches a flow's line before the lookup.
#[test]
fn the_vip_filter_follows_the_installed_services() {
    in_node_with_local_pod(IpFamily::V4, |ifindex, _| {
        let mut f = Fixture::load(ifindex);
        let flagged = |f: &Fixture, port: u16, proto: u8| {
            f.maps.vip_filter().unwrap().may_serve(&VIP.octets(), port.to_be_bytes(), proto)
        };
        assert!(flagged(&f, 80, 6) && flagged(&f, 82, 6), "the fixture's services");
        assert!(!flagged(&f, 22, 6), "a port no service has");
        f.maps.apply(&map_contents::MapContents::default()).expect("removing every service");
        assert_eq!(f.maps.vip_filter().unwrap(), lb_common::vip_filter::VipFilter::default(), "no bit left");
    });
}
