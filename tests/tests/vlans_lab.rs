//! VLANs on one parent interface, with real tagged frames: two nodes whose `eth0` is a trunk
//! of the lab switch, an untagged group and groups on VLANs 30 and 40 of `eth0`, a client on
//! each (see `lb_lab::vlans`: the switch's access ports tag and untag with TC programs, so no
//! 802.1Q module is needed, which this kernel lacks).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use lb_lab::{Agent, Host, Lab, agent::AGENT_LISTEN};

/// One group: its VLAN (none: untagged), the subnet its nodes' addresses are in, VRID,
/// priorities, VIP.
struct Group {
    name: &'static str,
    vlan: Option<u16>,
    subnet: [u8; 3],
    vrid: u8,
    priorities: [u8; 2],
    vip: Ipv4Addr,
}

const UNTAGGED: Group = Group {
    name: "untagged",
    vlan: None,
    subnet: [192, 0, 2],
    vrid: 10,
    priorities: [100, 200],
    vip: Ipv4Addr::new(198, 51, 100, 10),
};
const VLAN_30: Group = Group {
    name: "v30",
    vlan: Some(30),
    subnet: [10, 30, 0],
    vrid: 30,
    priorities: [200, 100],
    vip: Ipv4Addr::new(198, 51, 100, 30),
};
const VLAN_40: Group = Group {
    name: "v40",
    vlan: Some(40),
    subnet: [10, 40, 0],
    vrid: 40,
    priorities: [100, 200],
    vip: Ipv4Addr::new(198, 51, 100, 40),
};
const GROUPS: [&Group; 3] = [&UNTAGGED, &VLAN_30, &VLAN_40];

/// VLAN 30's further VIPs: served in full NAT and DSR from n1's endpoint (the first VIP from
/// n0's, locally).
const VIP_30_FULL_NAT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 31);
const VIP_30_DSR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 32);
/// VLAN 40's further VIP, served in full NAT from n0's endpoint by n1, which has no address on
/// VLAN 40.
const VIP_40_FULL_NAT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 41);
/// And its IPv6 VIP, likewise in full NAT from n0's endpoint.
const VIP6_40_FULL_NAT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x41);
const TARGET_PORT: u16 = 8080;
/// VLAN 30's IPv6 VIP, advertised from the nodes' link-local addresses on VLAN 30 (which the
/// config names: without a VLAN device the kernel has none there).
const VIP6_30: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x30);

fn config(me: usize, services: &str) -> String {
    let mut yaml = format!("node: n{me}\ninterface: eth0\nlisten: {AGENT_LISTEN}\ngroups:\n");
    for g in GROUPS {
        let [a, b, c] = g.subnet;
        let vlan = g.vlan.map_or(String::new(), |v| format!("    vlan: {v}\n"));
        // VLAN 30's members advertise IPv6 from a link-local address of their own there.
        let address6 = |node: u8| match g.vlan {
            Some(vlan) => format!(", address6: 'fe80::{vlan}:{node}'"),
            _ => String::new(),
        };
        yaml.push_str(&format!(
            "  - name: {}\n    interface: eth0\n{vlan}    vrid: {}\n    advertInterval: 50ms\n    nodes:\n      \
             - {{name: n0, address: {a}.{b}.{c}.10{}}}\n      - {{name: n1, address: {a}.{b}.{c}.11{}}}\n    \
             priorities: {{n0: {}, n1: {}}}\n    vips:\n      - address: {}\n",
            g.name,
            g.vrid,
            address6(10),
            address6(11),
            g.priorities[0],
            g.priorities[1],
            g.vip
        ));
        match g.vlan {
            Some(30) => {
                yaml.push_str(&format!(
                    "      - address: {VIP_30_FULL_NAT}\n      - address: {VIP_30_DSR}\n      - address: '{VIP6_30}'\n"
                ))
            }
            Some(40) => yaml.push_str(&format!(
                "      - address: {VIP_40_FULL_NAT}\n      - address: '{VIP6_40_FULL_NAT}'\n"
            )),
            _ => {}
        }
    }
    yaml.push_str(&format!("services:\n{services}"));
    yaml
}

struct Vlans {
    agents: Vec<Agent>,
    /// The clients on VLANs 30 and 40.
    clients: [Host; 2],
    lab: Lab,
}

/// The lab with agents running [`GROUPS`]; `prepare` sets it up further before they start
/// and returns their services.
fn vlans(prepare: impl Fn(&mut Lab) -> String) -> Vlans {
    let mut lab = Lab::new(2);
    for node in 0..2 {
        lab.enable_native_xdp(node);
    }
    lab.make_vlan_aware();
    lab.enable_ipv6();
    let services = prepare(&mut lab);
    let clients = [
        lab.add_vlan_client(30, Ipv4Addr::new(10, 30, 0, 100)),
        lab.add_vlan_client(40, Ipv4Addr::new(10, 40, 0, 100)),
    ];
    let agents = (0..2)
        .map(|i| {
            let mut agent = lab.start_agent(i, &config(i, &services));
            agent.wait_ready();
            agent
        })
        .collect();
    Vlans { agents, clients, lab }
}

impl Vlans {
    fn client(&self, g: &Group) -> &Host {
        match g.vlan {
            None => &self.lab.client,
            Some(30) => &self.clients[0],
            Some(_) => &self.clients[1],
        }
    }

    fn logs(&self) -> String {
        lb_lab::cluster::logs_and_reasons(&self.agents)
    }

    /// Polls until `g`'s VIP is answered on its VLAN by node `node`'s MAC alone.
    fn wait_answer(&self, g: &Group, node: usize) {
        self.client(g).wait_answered_by(g.vip, self.lab.nodes[node].mac, || self.logs());
    }

    /// Polls until VLAN 30's client resolves `vip` (IPv6) to node `node`'s MAC.
    fn wait_ndisc(&self, vip: Ipv6Addr, node: usize) {
        let expected = self.lab.nodes[node].mac_string();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let answer = self.clients[0].ndisc(vip);
            if answer.as_deref() == Some(expected.as_str()) {
                return;
            }
            assert!(Instant::now() < deadline, "{vip}: {answer:?}, not {expected}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn state(&self, node: usize, g: &Group, state: &str) -> f64 {
        self.agents[node].vrrp_state(g.name, g.vrid, state)
    }

    fn transitions(&self, node: usize, g: &Group) -> f64 {
        self.agents[node].vrrp_transitions(g.name, g.vrid)
    }

    /// VLAN 30's client sends advertisements with node `node`'s address there (priority 254):
    /// they arrive tagged 30, so that node's XDP counts its own address arriving on that
    /// uplink (the kernel drops it as a martian before the agent could see it), and the
    /// agent logs it; the node stays master.
    fn impersonate_on_vlan_30(&self, node: usize) {
        use lb_agent::vrrp::packet::{Advertisement, ChecksumMode, VRRP_MULTICAST_V4};
        use lb_lab::{
            family::ip_frame,
            packet::{multicast_mac, send_and_capture},
        };
        let [a, b, c] = VLAN_30.subnet;
        let own = IpAddr::V4(Ipv4Addr::new(a, b, c, 10 + node as u8));
        let group = IpAddr::V4(VRRP_MULTICAST_V4);
        let spoofed = Advertisement {
            vrid: VLAN_30.vrid,
            priority: 254,
            max_adver_int_cs: 5,
            addresses: vec![VLAN_30.vip.into()],
        }
        .encode(own, group, ChecksumMode::Rfc);
        let client = &self.clients[0];
        let frame = ip_frame((client.mac, multicast_mac(VRRP_MULTICAST_V4)), own, group, 255, 112, &spoofed);
        let sample = format!(r#"lbagent_vrrp_impersonated_adverts_total{{member="{own}"}}"#);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.agents[node].metric(&sample) == 0.0 {
            assert!(Instant::now() < deadline, "{sample} on n{node}\n{}", self.logs());
            send_and_capture(client.ns.name(), "eth0", vec![frame.clone(); 2], Duration::from_millis(20));
        }
        let log = self.agents[node].log_text();
        assert!(log.contains("impersonating") && log.contains("this node's own address"), "{log}");
        assert_eq!(self.state(node, &VLAN_30, "master"), 1.0, "{}", self.logs());
    }
}

/// The node whose priority is higher in `g`.
fn master_of(g: &Group) -> usize {
    usize::from(g.priorities[1] > g.priorities[0])
}

/// Each VLAN elects its own master from tagged advertisements (IPv4, and IPv6 on VLAN 30),
/// answers ARP, Neighbor Discovery and ping for its VIPs with its tag, and never for another
/// VLAN's VIPs (nor the untagged group's, nor the untagged client for theirs); a master sees
/// its own VLAN address impersonated there; when VLAN 30's master dies, VLAN 30 alone moves,
/// and its new master announces its VIPs tagged.
#[test]
fn vlans_elect_answer_isolate_and_fail_over_apart() {
    let mut net = vlans(|_| String::new());
    for g in GROUPS {
        net.wait_answer(g, master_of(g));
        for node in 0..2 {
            let state = if node == master_of(g) { "master" } else { "backup" };
            assert_eq!(net.state(node, g, state), 1.0, "{} on n{node}\n{}", g.name, net.logs());
        }
        let client = net.client(g);
        assert!(
            client.output_ok(&["ping", "-c", "2", "-i", "0.1", "-W", "1", &g.vip.to_string()]),
            "ping {} from {}\n{}",
            g.vip,
            client.name,
            net.logs()
        );
    }
    // IPv6 on VLAN 30: its own instance elects the same master from tagged advertisements,
    // which answers Neighbor Discovery and ping for the VIP there, and nowhere else.
    let master6 = r#"lbagent_vrrp_state{group="v30",vrid="30",family="ipv6",state="master"}"#;
    assert_eq!(net.agents[0].metric(master6), 1.0, "{}", net.logs());
    net.wait_ndisc(VIP6_30, 0);
    assert!(
        net.clients[0].output_ok(&["ping", "-6", "-c", "2", "-i", "0.1", "-W", "1", &VIP6_30.to_string()]),
        "ping {VIP6_30}\n{}",
        net.logs()
    );
    for client in [&net.clients[1], &net.lab.client] {
        assert_eq!(client.ndisc(VIP6_30), None, "{VIP6_30} answered to {}", client.name);
    }
    for g in GROUPS {
        for other in GROUPS.iter().filter(|o| o.name != g.name) {
            let client = net.client(other);
            assert!(
                client.arping(g.vip, 1).is_empty(),
                "{} answered to {}\n{}",
                g.vip,
                client.name,
                net.logs()
            );
        }
    }
    // The agents turned receive VLAN offload off on the parent, where a NIC would otherwise
    // strip the tags before XDP.
    for node in &net.lab.nodes {
        let features =
            String::from_utf8_lossy(&node.ns.run_cmd(&["ethtool", "-k", "eth0"]).stdout).into_owned();
        assert!(features.contains("rx-vlan-offload: off"), "{}: {features}", node.name);
    }
    // On the trunk to n1, n0's advertisements for VLAN 30 are tagged 30 (the capture reads the
    // tag from the packet's metadata, where the bridge keeps it).
    let capture = net.lab.switch.run_cmd(&[
        "timeout",
        "2",
        "tcpdump",
        "-i",
        &net.lab.nodes[1].switch_port,
        "-e",
        "-nn",
        "-c",
        "2",
        "vlan 30 and ip proto 112",
    ]);
    let capture = String::from_utf8_lossy(&capture.stdout);
    assert!(capture.contains("vlan 30") && capture.contains("10.30.0.10 > 224.0.0.18"), "{capture}");
    net.impersonate_on_vlan_30(master_of(&VLAN_30));
    let moves: Vec<f64> = [&UNTAGGED, &VLAN_40].iter().map(|g| net.transitions(1, g)).collect();
    // The new master's ARP announcements reach VLAN 30's client: they left n1 tagged 30, or
    // the client's access port would have dropped them.
    let capture = net.clients[0]
        .ns
        .command(&["timeout", "3", "tcpdump", "-l", "-t", "-nn", "-e", "arp"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    net.agents[0].kill();
    net.wait_answer(&VLAN_30, 1);
    net.wait_ndisc(VIP6_30, 1);
    let announced = String::from_utf8_lossy(&capture.wait_with_output().unwrap().stdout).into_owned();
    let n1 = lb_lab::format_mac(&net.lab.nodes[1].mac);
    let vip = VLAN_30.vip;
    assert!(
        announced.lines().any(|l| l.starts_with(&n1) && l.contains(&format!("who-has {vip} tell {vip}"))),
        "no announcement of {vip} from {n1} on VLAN 30:\n{announced}"
    );
    for (g, before) in [&UNTAGGED, &VLAN_40].iter().zip(moves) {
        assert_eq!(net.transitions(1, g), before, "{} moved", g.name);
        net.wait_answer(g, 1);
    }
    assert!(net.clients[0].output_ok(&["ping", "-c", "2", "-i", "0.1", "-W", "1", &VLAN_30.vip.to_string()]));
}

/// TCP from VLAN 30's client through its VIPs in each delivery mode: locally to n0's endpoint,
/// in full NAT and in DSR to n1's. The request arrives tagged and leaves the master untagged
/// towards the endpoint; the replies the kernel sends reach the VLAN through each node's
/// address there (a host with `eth0.30` would use that device; see `Lab::add_vlan_device`),
/// full NAT's go back tagged the way the client came. So full NAT needs no such address: VLAN
/// 40, where the nodes have none, is served in full NAT too, over IPv4 and IPv6.
#[test]
fn tcp_through_a_vlans_vips_in_every_delivery_mode() {
    let net = vlans(|lab| {
        lab.add_vlan_device(30, [10, 30, 0]);
        lab.add_pod(0);
        lab.add_pod(1);
        [
            (IpAddr::V4(VLAN_30.vip), "fullNat", 0),
            (VIP_30_FULL_NAT.into(), "fullNat", 1),
            (VIP_30_DSR.into(), "dsr", 1),
            (VIP_40_FULL_NAT.into(), "fullNat", 0),
            (VIP6_40_FULL_NAT.into(), "fullNat", 0),
        ]
        .iter()
        .enumerate()
        .map(|(i, (vip, mode, pod))| {
            lb_lab::cluster::service_config(lab, &format!("s{i}"), *vip, 80, TARGET_PORT, mode, &[*pod])
        })
        .collect()
    });
    let _servers: Vec<lb_lab::Process> = net.lab.pods.iter().map(|p| p.serve(TARGET_PORT)).collect();
    net.wait_answer(&VLAN_30, 0);
    net.wait_answer(&VLAN_40, 1);
    for (vlan, vip, pod, reason) in [
        (30, IpAddr::V4(VLAN_30.vip), 0, "forwarded_local"),
        (30, VIP_30_FULL_NAT.into(), 1, "forwarded_full_nat"),
        (30, VIP_30_DSR.into(), 1, "forwarded_dsr"),
        (40, VIP_40_FULL_NAT.into(), 0, "forwarded_full_nat"),
        (40, VIP6_40_FULL_NAT.into(), 0, "forwarded_full_nat"),
    ] {
        let (client, master) = if vlan == 30 { (&net.clients[0], 0) } else { (&net.clients[1], 1) };
        let sample = format!(r#"lbagent_xdp_reason_packets_total{{reason="{reason}"}}"#);
        let before = net.agents[master].metric(&sample);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut session = loop {
            if let Some(s) = client.session(vip, 80) {
                break s;
            }
            assert!(Instant::now() < deadline, "no session to {vip} from VLAN {vlan}\n{}", net.logs());
            std::thread::sleep(Duration::from_millis(100));
        };
        let expected = format!("{} over vlan {vlan}", net.lab.pods[pod].name);
        let said = session.echo(&format!("over vlan {vlan}"), Duration::from_secs(1));
        assert_eq!(said.as_deref(), Some(expected.as_str()), "{vip}");
        assert!(net.agents[master].metric(&sample) > before, "{vip}: {reason}\n{}", net.logs());
    }
}
