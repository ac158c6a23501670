//! The scale machinery against the real program (BPF_PROG_TEST_RUN): rings written through
//! a memory mapping, lookups through them, incremental changes, and maps that are full.
//!
//! As in `service_paths`, the runs happen inside a lab node, whose FIB and permanent
//! neighbour entries let the program forward DSR traffic towards the pods' node.

use std::net::Ipv4Addr;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, IterableMap, MapData},
    programs::Xdp,
};
use lb_agent::{
    config::Config,
    dataplane::{EMBEDDED_OBJECT, ServiceMaps, UPLINK_PROGRAM, batch, ring_memory},
    map_contents::{self, IncrementalContents},
};
use lb_common::{
    hash::flow_hash,
    maps::{OWNED_VIPS, OwnedVip, VipKey},
    service::{
        BACKENDS, FlowKey, INNER_MAP_FLAGS, MAGLEV_RINGS, RingEntry, SERVICES, ServiceKey, Settings,
        ring_entries,
    },
};
use lb_lab::{
    fixture::{CLIENT, CLIENT_MAC, NODE, NODE_MAC, VIP, XDP_DROP, XDP_TX, in_lab_node, run_uplink},
    packet::ipv4_frame,
};

#[test]
fn a_ring_written_through_memory_is_the_ring_written_slot_by_slot() {
    lb_lab::require_root();
    let ring_of = |seed: u32, size: u32| -> Vec<u32> {
        (0..size).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 7) % 70_000).collect()
    };
    for size in lb_agent::maglev::TABLE_SIZES {
        let (first, second) = (ring_of(0, size), ring_of(1, size));
        let entries = ring_entries(size);
        let mapped: Array<MapData, RingEntry> = Array::create(entries, INNER_MAP_FLAGS).unwrap();
        let mut one_by_one: Array<MapData, RingEntry> = Array::create(entries, INNER_MAP_FLAGS).unwrap();
        let read = |a: &Array<MapData, RingEntry>| {
            let mut slots: Vec<u32> = batch::read_array(a).expect("BPF_MAP_LOOKUP_BATCH").concat();
            slots.truncate(size as usize);
            slots
        };
        // A new ring, then the same ring rewritten in place.
        for ring in [&first, &second] {
            ring_memory::write(mapped.map().fd(), ring).expect("writing through the mapping");
            for (entry, pair) in ring.chunks(2).enumerate() {
                let pair: RingEntry = [pair[0], pair.get(1).copied().unwrap_or(0)];
                one_by_one.set(entry as u32, pair, 0).unwrap();
            }
            let (mapped, one_by_one) = (read(&mapped), read(&one_by_one));
            assert_eq!(mapped, one_by_one, "size {size}");
            assert_eq!(&mapped, ring, "size {size}");
        }
    }
}

/// A DSR service on port 80 with `endpoints` pods on node n1 (10.244.1.0/24, routed via the
/// peer), plus `extra` more single-endpoint services on ports 81….
fn config(endpoints: &[u8], extra: u16) -> Config {
    Config::parse(&config_yaml(endpoints, extra)).expect("a valid fixture config")
}

/// [`config`]'s YAML, for tests that add to it.
fn config_yaml(endpoints: &[u8], extra: u16) -> String {
    let mut yaml = String::from(
        "interface: eth0\nnode: n0\nvips: [{address: 198.51.100.10}]\ngroups: []\nservices:\n  - name: web\n    vip: 198.51.100.10\n    remoteMode: dsr\n    ports: [{port: 80, targetPort: 8080}]\n    endpoints:\n",
    );
    for host in endpoints {
        yaml.push_str(&format!("      - {{address: 10.244.1.{host}, node: n1}}\n"));
    }
    for i in 0..extra {
        yaml.push_str(&format!(
            "  - name: extra-{i}\n    vip: 198.51.100.10\n    remoteMode: dsr\n    ports: [{{port: {}, targetPort: 8080}}]\n    endpoints: [{{address: 10.244.1.{}, node: n1}}]\n",
            81 + i,
            200 + i
        ));
    }
    yaml
}

struct Fixture {
    ebpf: Ebpf,
    /// A second handle on `VIP_TRAFFIC`, which `maps` owns.
    vip_traffic: MapData,
    maps: ServiceMaps,
    planner: IncrementalContents,
    ifindex: u32,
}

impl Fixture {
    /// The object with its maps sized as `sizes` says (the rest as compiled).
    fn load(ifindex: u32, sizes: &[(&'static str, u32)]) -> Fixture {
        let mut loader = EbpfLoader::new();
        for (name, size) in sizes {
            loader.map_max_entries(name, *size);
        }
        let mut ebpf = loader.load(EMBEDDED_OBJECT).expect("loading the embedded object");
        let program: &mut Xdp = ebpf.program_mut(UPLINK_PROGRAM).unwrap().try_into().unwrap();
        program.load().expect("the verifier accepts lb_xdp");
        let mut owned: HashMap<_, VipKey, OwnedVip> =
            HashMap::try_from(ebpf.map_mut(OWNED_VIPS).unwrap()).unwrap();
        owned.insert(VipKey::new(VIP.octets()), OwnedVip::new(NODE_MAC), 0).unwrap();
        let vip_traffic = {
            let map = ebpf.map(lb_common::maps::VIP_TRAFFIC).unwrap();
            let array: aya::maps::PerCpuArray<_, lb_common::maps::PacketCounter> = map.try_into().unwrap();
            MapData::from_id(array.map().info().unwrap().id()).unwrap()
        };
        let mut maps = ServiceMaps::take(&mut ebpf, None, None).expect("the service maps");
        maps.set_settings(Settings {
            node_addr: NODE.octets(),
            snat_port_min: 61_000,
            snat_port_max: 65_535,
        })
        .unwrap();
        Fixture { ebpf, vip_traffic, maps, planner: IncrementalContents::default(), ifindex }
    }

    fn sync(&mut self, config: &Config) -> lb_agent::dataplane::services::SyncReport {
        let delta = self.planner.update(config, "n0");
        self.maps.apply_delta(&delta).expect("a sync")
    }

    /// The XDP verdict for a TCP SYN from the client's `sport` to VIP:`dport`, and the
    /// outer destination when it was encapsulated (DSR).
    fn send(&self, sport: u16, dport: u16) -> (u32, Option<Ipv4Addr>) {
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = 0x02;
        let input = ipv4_frame(CLIENT_MAC, NODE_MAC, CLIENT, VIP, 64, 6, &tcp);
        let (action, out) = run_uplink(&self.ebpf, &input, self.ifindex);
        let outer = (action == XDP_TX && out.len() > 34 && out[23] == 4)
            .then(|| Ipv4Addr::new(out[30], out[31], out[32], out[33]));
        (action, outer)
    }
}

/// The backend the plan's ring gives the client's `sport` → VIP:80 flow.
fn planned_backend(config: &Config, sport: u16) -> Ipv4Addr {
    let plan = map_contents::for_node(config, "n0");
    let service = &plan.services[&ServiceKey::new(VIP.octets(), 80, 6)];
    let flow = FlowKey::new(CLIENT.octets(), VIP.octets(), sport.to_be_bytes(), 80u16.to_be_bytes(), 6);
    let slot = flow_hash(&flow) % service.ring.len() as u32;
    Ipv4Addr::from(service.backends[service.ring[slot as usize] as usize].addr)
}

#[test]
fn lookups_through_the_program_follow_the_planned_ring_across_changes() {
    in_lab_node(|ifindex| {
        let mut f = Fixture::load(ifindex, &[]);
        let before = config(&(2..42).collect::<Vec<u8>>(), 0);
        let report = f.sync(&before);
        assert_eq!((report.services_added, report.rings_written, report.backends_added), (1, 1, 40));
        for sport in 20_000..20_400 {
            let (action, outer) = f.send(sport, 80);
            assert_eq!(action, XDP_TX, "flow from port {sport}");
            assert_eq!(outer, Some(planned_backend(&before, sport)), "flow from port {sport}");
        }

        // One endpoint replaced: one ring rewritten, one backend in and one out.
        let mut endpoints: Vec<u8> = (2..42).collect();
        endpoints[5] = 100;
        let after = config(&endpoints, 0);
        let report = f.sync(&after);
        assert_eq!(
            (report.services_changed, report.rings_written, report.backends_added, report.backends_removed),
            (1, 1, 1, 1),
            "{report:?}"
        );
        // New flows (new source ports) follow the new ring; established ones keep their backend.
        for sport in 30_000..30_400 {
            assert_eq!(f.send(sport, 80).1, Some(planned_backend(&after, sport)), "flow from port {sport}");
        }
        // (Flows whose endpoint was the replaced one are re-balanced.)
        let replaced = Ipv4Addr::new(10, 244, 1, 7);
        for sport in (20_000..20_100).filter(|p| planned_backend(&before, *p) != replaced) {
            assert_eq!(f.send(sport, 80).1, Some(planned_backend(&before, sport)), "established {sport}");
        }
        let unchanged = f.sync(&after);
        assert!(unchanged.is_empty(), "{unchanged:?}");
    });
}

#[test]
fn services_beyond_capacity_are_refused_and_the_rest_keeps_forwarding() {
    in_lab_node(|ifindex| {
        // Room for 3 service entries and 6 backends.
        let sizes = [(SERVICES, 3), (MAGLEV_RINGS, 6), (BACKENDS, 6), (lb_common::service::BACKEND_STATS, 6)];
        let mut f = Fixture::load(ifindex, &sizes);
        assert_eq!(f.maps.limits().services, 3);

        // web (2 backends) and extras on 81..=84 (one each): 81 and 82 fit, 83 and 84 do not.
        let full = config(&[2, 3], 4);
        let report = f.sync(&full);
        let refused: Vec<(u16, &str)> =
            report.refused.iter().map(|r| (entry_port(&r.entry), r.refusal.what)).collect();
        assert_eq!(refused, [(83, "services"), (84, "services")], "{report:?}");
        assert_eq!(report.refused[0].name, "extra-2");
        for port in [80, 81, 82] {
            assert_eq!(f.send(40_000, port).0, XDP_TX, "port {port} is served");
        }
        for port in [83, 84] {
            assert_eq!(f.send(40_000, port).0, XDP_DROP, "port {port} is not exposed");
        }

        // Removing extra-0 makes room: extra-2 (next in key order) is admitted on that sync,
        // without any change of its own.
        let mut fewer = config(&[2, 3], 4);
        fewer.services.retain(|s| s.name != "extra-0");
        let report = f.sync(&fewer);
        assert_eq!(report.services_added, 1, "{report:?}");
        assert_eq!(report.refused.len(), 1, "{report:?}");
        assert_eq!(f.send(40_001, 83).0, XDP_TX);
        assert_eq!(f.send(40_001, 81).0, XDP_DROP);

        // A change that needs more backends than are free is refused; the old version stays.
        let mut bigger = fewer.clone();
        let web = std::sync::Arc::make_mut(bigger.services.iter_mut().find(|s| s.name == "web").unwrap());
        for host in 50..55u8 {
            web.endpoints.push(lb_agent::config::Endpoint {
                address: Ipv4Addr::new(10, 244, 1, host).into(),
                node: "n1".into(),
            });
        }
        let report = f.sync(&bigger);
        assert!(report.refused.iter().any(|r| r.name == "web" && r.refusal.what == "backends"), "{report:?}");
        let (action, outer) = f.send(40_002, 80);
        assert_eq!(action, XDP_TX);
        assert!(
            matches!(outer, Some(a) if a == Ipv4Addr::new(10, 244, 1, 2) || a == Ipv4Addr::new(10, 244, 1, 3))
        );
    });
}

/// Traffic to a VIP's services is counted at the VIP's slot in `VIP_TRAFFIC` (an array, no
/// hash lookup per packet), shared by all its services; a VIP whose services are gone frees
/// its slot, and the next VIP to take it starts from zero.
#[test]
fn traffic_per_vip_is_counted_at_its_slot_and_a_reused_slot_starts_from_zero() {
    use aya::maps::PerCpuArray;
    use lb_common::maps::{PacketCounter, VIP_TRAFFIC};
    in_lab_node(|ifindex| {
        // Two slots: one per VIP here, so the third VIP can only reuse a freed one.
        let mut f = Fixture::load(ifindex, &[(SERVICES, 2), (VIP_TRAFFIC, 2)]);
        let vips_config = |vips: &[u8]| {
            let mut yaml = String::from("interface: eth0\nnode: n0\nvips:\n");
            for v in vips {
                yaml.push_str(&format!("  - address: 198.51.100.{v}\n"));
            }
            yaml.push_str("services:\n");
            for v in vips {
                yaml.push_str(&format!(
                    "  - name: s{v}\n    vip: 198.51.100.{v}\n    remoteMode: dsr\n    ports: [{{port: 80, targetPort: 8080}}]\n    endpoints: [{{address: 10.244.1.2, node: n1}}]\n"
                ));
            }
            Config::parse(&yaml).unwrap()
        };
        let send_to = |f: &Fixture, vip: u8, count: u16| {
            for sport in 0..count {
                let mut tcp = vec![0u8; 20];
                tcp[0..2].copy_from_slice(&(40_000 + sport).to_be_bytes());
                tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
                tcp[12] = 5 << 4;
                let input =
                    ipv4_frame(CLIENT_MAC, NODE_MAC, CLIENT, Ipv4Addr::new(198, 51, 100, vip), 64, 6, &tcp);
                assert_eq!(run_uplink(&f.ebpf, &input, f.ifindex).0, XDP_TX);
            }
        };
        let counted = |f: &Fixture, vip: u8| -> (u64, u32) {
            let slot = f.maps.vip_slots()[&Ipv4Addr::new(198, 51, 100, vip).into()];
            let array: PerCpuArray<_, PacketCounter> =
                PerCpuArray::try_from(aya::maps::Map::PerCpuArray(clone(&f.vip_traffic))).unwrap();
            (array.get(&slot, 0).unwrap().iter().map(|c| c.packets).sum(), slot)
        };

        f.sync(&vips_config(&[10, 11]));
        send_to(&f, 10, 3);
        send_to(&f, 11, 2);
        let ((ten, ten_slot), (eleven, eleven_slot)) = (counted(&f, 10), counted(&f, 11));
        assert_eq!((ten, eleven), (3, 2));
        assert_ne!(ten_slot, eleven_slot);

        // .10 leaves and .12 arrives in one sync: .12 takes the freed slot, from zero.
        let report = f.sync(&vips_config(&[11, 12]));
        assert_eq!((report.services_added, report.services_removed), (1, 1), "{report:?}");
        assert!(!f.maps.vip_slots().contains_key(&Ipv4Addr::new(198, 51, 100, 10).into()));
        assert_eq!(counted(&f, 12), (0, ten_slot), "the reused slot starts from zero");
        send_to(&f, 12, 1);
        assert_eq!(counted(&f, 12).0, 1);
        assert_eq!(counted(&f, 11), (2, eleven_slot), ".11 kept its slot and its count");
    });
}

/// The connection table keys a flow by its service's number: each installed service keeps
/// its own, distinct from the others', while it is installed; a removed service's number goes
/// to another service only after every other free number (late, as backend slots), so a new
/// service never meets a removed one's flows.
#[test]
fn service_numbers_are_distinct_kept_and_reused_late() {
    use lb_common::service::{ConnectionKey, FLOW_TABLE};
    in_lab_node(|ifindex| {
        let mut f = Fixture::load(ifindex, &[]);
        let number = |f: &Fixture, port: u16| {
            f.maps.installed(&ServiceKey::new(VIP.octets(), port, 6)).map(|s| s.number)
        };
        f.sync(&config(&[1], 2));
        let (web, first, second) =
            (number(&f, 80).unwrap(), number(&f, 81).unwrap(), number(&f, 82).unwrap());
        assert!(web != first && first != second && web != second, "{web} {first} {second}");

        // A flow to :80 is keyed by :80's number.
        assert_eq!(f.send(40_000, 80).0, XDP_TX);
        let flow =
            FlowKey::new(CLIENT.octets(), VIP.octets(), 40_000u16.to_be_bytes(), 80u16.to_be_bytes(), 6);
        let flows = lb_lab::fixture::flow_table(&f.ebpf, FLOW_TABLE);
        assert!(
            flows.lookup(&ConnectionKey::of(&flow, web)).is_some(),
            "the flow's entry under :80's number"
        );

        // :82 leaves and three services arrive: none takes :82's number, the others keep theirs.
        f.sync(&config(&[1], 1));
        assert_eq!(number(&f, 82), None);
        let mut yaml = config_yaml(&[1], 1);
        for port in [90, 91, 92] {
            yaml.push_str(&format!(
                "  - name: new-{port}\n    vip: 198.51.100.10\n    remoteMode: dsr\n    ports: [{{port: {port}, targetPort: 8080}}]\n    endpoints: [{{address: 10.244.1.9, node: n1}}]\n"
            ));
        }
        f.sync(&Config::parse(&yaml).unwrap());
        assert_eq!((number(&f, 80), number(&f, 81)), (Some(web), Some(first)));
        let new: Vec<u16> = [90, 91, 92].iter().map(|&p| number(&f, p).unwrap()).collect();
        assert!(!new.contains(&second) && !new.contains(&web) && !new.contains(&first), "{new:?}");
        assert_eq!(f.send(40_000, 80).0, XDP_TX, "the :80 flow carries on");
    });
}

/// A sync that fails (here: the outer ring map is full) installs none of its new services and
/// gives back the numbers they took, however often it is retried.
#[test]
fn a_failed_sync_gives_its_service_numbers_back() {
    use lb_common::service::MAX_SERVICE_NUMBERS;
    in_lab_node(|ifindex| {
        let mut f = Fixture::load(ifindex, &[(MAGLEV_RINGS, 1)]);
        let config = config(&[1], 2);
        for attempt in 0..3 {
            let plan = map_contents::for_node(&config, "n0");
            assert!(f.maps.apply(&plan).is_err(), "attempt {attempt}: three rings cannot fit");
            assert_eq!(f.maps.service_count(), 0, "attempt {attempt}");
            assert_eq!(f.maps.free_service_numbers(), MAX_SERVICE_NUMBERS as usize, "attempt {attempt}");
        }
    });
}

/// Another handle on the same map.
fn clone(map: &MapData) -> MapData {
    MapData::from_id(map.info().unwrap().id()).unwrap()
}

/// The port of a refused service's entry (`198.51.100.10:83/TCP`).
fn entry_port(entry: &str) -> u16 {
    entry.split(['/', ':']).nth(1).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("an entry: {entry}"))
}
