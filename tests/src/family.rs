//! Each address family's side of the data-path fixtures: the lab's addresses in that family and
//! the frames built from them, so one table of cases runs for both (`service_paths.rs`). A case
//! names addresses by their role (`f.vip()`, `f.client()`); the builders take either family's
//! addresses and build that family's frame.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::{
    Ebpf,
    maps::{HashMap, PerCpuHashMap},
};
use lb_agent::{
    config::Config,
    dataplane::ServiceMapsByFamily,
    map_contents::{self, MapContents},
};
use lb_common::{
    counters::Reason,
    hash::flow_hash,
    maps::{
        OWNED_VIPS, OWNED_VIPS6, OwnedVip, UplinkKey, VIP_STATS, VIP_STATS6, VRRP_SPEAKERS, VRRP_SPEAKERS6,
        Vip6Key, VipKey, VipStats, VrrpSpeaker,
    },
    service::{Addr4, Addr6, FlowKey, FlowKey6, Settings, UPLINK_ADDRS6},
};

pub use lb_agent::vrrp::family::IpFamily;

use crate::{
    cluster::pod_ip6,
    fixture::{
        CLIENT, CLIENT_MAC, NODE, NODE_MAC, PEER, PEER_MAC, VIP, ifindex_of, load_uplink_from, mac_of,
        permanent_neighbour,
    },
    packet::{
        arp_frame, arp_request, checksum, checksums_valid, icmpv6, ipv4_frame, ipv6_frame,
        neighbor_solicitation, transport, transport_checksum6, transport6,
    },
};

/// The families every shared case runs in.
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// The lab's addresses and the family's layout, by role.
pub trait LabFamily: Copy {
    /// The VIP the fixtures own (198.51.100.10, 2001:db8:6::10).
    fn vip(self) -> IpAddr;
    /// The client on the segment (192.0.2.100, 2001:db8:2::64).
    fn client(self) -> IpAddr;
    /// Node n0 on the segment: full NAT's and DSR's source (192.0.2.10, 2001:db8:2::a).
    fn node(self) -> IpAddr;
    /// Node n1 on the segment, the way to its pods (192.0.2.11, 2001:db8:2::b).
    fn peer(self) -> IpAddr;
    /// Pod `host` behind node `node` (10.244.n.h, fd00:10:244:n::h).
    fn pod(self, node: u8, host: u8) -> IpAddr;
    /// The counter for a packet of this family passed to the kernel as not ours.
    fn passed(self) -> Reason;
    /// The counter for a header this family's parser refuses.
    fn malformed(self) -> Reason;
    /// The counter for a header between IP and TCP/UDP the fast path does not parse.
    fn unparsed_header(self) -> Reason;
    fn ether_type(self) -> [u8; 2];
    /// Where the TTL (IPv4) or hop limit (IPv6) is in an Ethernet frame.
    fn hop_limit_at(self) -> usize;
    /// The other family.
    fn other(self) -> IpFamily;
    /// `v4` or `v6`, as the family is: a row's family-specific part.
    fn pick<T>(self, v4: T, v6: T) -> T;
}

impl LabFamily for IpFamily {
    fn vip(self) -> IpAddr {
        match self {
            IpFamily::V4 => VIP.into(),
            IpFamily::V6 => Ipv6Addr::new(0x2001, 0xdb8, 6, 0, 0, 0, 0, 0x10).into(),
        }
    }
    fn client(self) -> IpAddr {
        self.on_segment(CLIENT)
    }
    fn node(self) -> IpAddr {
        self.on_segment(NODE)
    }
    fn peer(self) -> IpAddr {
        self.on_segment(PEER)
    }
    fn pod(self, node: u8, host: u8) -> IpAddr {
        match self {
            IpFamily::V4 => Ipv4Addr::new(10, 244, node, host).into(),
            IpFamily::V6 => pod_ip6(node.into(), host.into()).into(),
        }
    }
    fn passed(self) -> Reason {
        self.pick(Reason::Ipv4Passed, Reason::Ipv6Passed)
    }
    fn malformed(self) -> Reason {
        self.pick(Reason::MalformedIpv4, Reason::MalformedIpv6)
    }
    fn unparsed_header(self) -> Reason {
        self.pick(Reason::IpOptions, Reason::Ipv6Extension)
    }
    fn ether_type(self) -> [u8; 2] {
        self.pick([0x08, 0x00], [0x86, 0xdd])
    }
    fn hop_limit_at(self) -> usize {
        self.pick(22, 21)
    }
    fn other(self) -> IpFamily {
        self.pick(IpFamily::V6, IpFamily::V4)
    }
    fn pick<T>(self, v4: T, v6: T) -> T {
        match self {
            IpFamily::V4 => v4,
            IpFamily::V6 => v6,
        }
    }
}

trait OnSegment {
    fn on_segment(self, v4: Ipv4Addr) -> IpAddr;
}

impl OnSegment for IpFamily {
    /// A segment host's address in this family: IPv6's is `Host::global6`'s, 2001:db8:2::<last octet>.
    fn on_segment(self, v4: Ipv4Addr) -> IpAddr {
        match self {
            IpFamily::V4 => v4.into(),
            IpFamily::V6 => Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, v4.octets()[3].into()).into(),
        }
    }
}

/// Both addresses of one family, or a panic naming the pair: a case mixing families is a bug.
fn same_family(src: IpAddr, dst: IpAddr) -> Result<(Ipv4Addr, Ipv4Addr), (Ipv6Addr, Ipv6Addr)> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ok((s, d)),
        (IpAddr::V6(s), IpAddr::V6(d)) => Err((s, d)),
        _ => panic!("a frame from {src} to {dst}: expected addresses of one family"),
    }
}

/// An IP frame of the addresses' family, `macs` as (source, destination).
pub fn ip_frame(
    macs: ([u8; 6], [u8; 6]),
    src: IpAddr,
    dst: IpAddr,
    ttl: u8,
    proto: u8,
    payload: &[u8],
) -> Vec<u8> {
    match same_family(src, dst) {
        Ok((s, d)) => ipv4_frame(macs.0, macs.1, s, d, ttl, proto, payload),
        Err((s, d)) => ipv6_frame(macs.0, macs.1, s, d, ttl, proto, payload),
    }
}

/// A TCP/UDP segment with a valid checksum, carrying `data`.
pub fn segment(proto: u8, src: IpAddr, dst: IpAddr, ports: (u16, u16), data: &[u8]) -> Vec<u8> {
    match same_family(src, dst) {
        Ok((s, d)) => transport(proto, s, d, ports.0, ports.1, data),
        Err((s, d)) => transport6(proto, s, d, ports.0, ports.1, data),
    }
}

/// A frame with a valid TCP/UDP segment, `macs` as (source, destination).
pub fn segment_frame(
    macs: ([u8; 6], [u8; 6]),
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    ttl: u8,
    proto: u8,
    ports: (u16, u16),
) -> Vec<u8> {
    let (src, dst) = (src.into(), dst.into());
    ip_frame(macs, src, dst, ttl, proto, &segment(proto, src, dst, ports, b"fixture"))
}

/// The tunnel the load balancer sends DSR in: IPIP (DF set, TTL 64, protocol 4) or IPv6 in
/// IPv6 (RFC 2473: the inner traffic class and flow label, hop limit 64, next header 41).
pub fn encapsulated(
    macs: ([u8; 6], [u8; 6]),
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    inner_frame: &[u8],
) -> Vec<u8> {
    match same_family(src.into(), dst.into()) {
        Ok((s, d)) => {
            let inner = &inner_frame[14..];
            let mut header = vec![0x45, inner[1]];
            header.extend_from_slice(&((20 + inner.len()) as u16).to_be_bytes());
            header.extend_from_slice(&[0, 0, 0x40, 0, 64, 4, 0, 0]);
            header.extend_from_slice(&s.octets());
            header.extend_from_slice(&d.octets());
            let sum = checksum(&header);
            header[10..12].copy_from_slice(&sum.to_be_bytes());
            let mut frame = [&macs.1[..], &macs.0[..], &[0x08, 0x00]].concat();
            frame.extend_from_slice(&header);
            frame.extend_from_slice(inner);
            frame
        }
        Err((s, d)) => {
            let mut frame = ipv6_frame(macs.0, macs.1, s, d, 64, 41, &inner_frame[14..]);
            frame[14..18].copy_from_slice(&inner_frame[14..18]);
            frame
        }
    }
}

/// An ICMP or ICMPv6 echo request (or reply) with a fixed identifier, sequence and body.
pub fn echo(macs: ([u8; 6], [u8; 6]), src: IpAddr, dst: IpAddr, request: bool, ttl: u8) -> Vec<u8> {
    let body = [0x12, 0x34, 0, 1, b'p', b'i', b'n', b'g'];
    match same_family(src, dst) {
        Ok(_) => {
            let mut message = [&[if request { 8 } else { 0 }, 0, 0, 0][..], &body].concat();
            let sum = checksum(&message);
            message[2..4].copy_from_slice(&sum.to_be_bytes());
            ip_frame(macs, src, dst, ttl, 1, &message)
        }
        Err((s, d)) => {
            ip_frame(macs, src, dst, ttl, 58, &icmpv6(if request { 128 } else { 129 }, 0, &body, s, d))
        }
    }
}

/// The flow's full-NAT source port: `first` + its flow hash modulo `span` (the BPF program's rule).
pub fn snat_port(client: IpAddr, vip: IpAddr, ports: (u16, u16), proto: u8, first: u16, span: u32) -> u16 {
    let (sport, dport) = (ports.0.to_be_bytes(), ports.1.to_be_bytes());
    let hash = match same_family(client, vip) {
        Ok((c, v)) => flow_hash(&FlowKey::new(c.octets(), v.octets(), sport, dport, proto)),
        Err((c, v)) => flow_hash(&FlowKey6::new(c.octets(), v.octets(), sport, dport, proto)),
    };
    first + (hash % span) as u16
}

/// Whether a frame's checksums are right: IPv4's header and TCP/UDP's (a zero UDP checksum
/// counts as none); for IPv6, TCP/UDP's, the tunnelled packet's inside IPv6 in IPv6; behind
/// an 802.1Q tag, those of what it carries.
pub fn checksums_ok(frame: &[u8]) -> bool {
    match frame[12..14] {
        [0x81, 0x00] if frame.len() >= 18 => checksums_ok(&[&frame[..12], &frame[16..]].concat()),
        [0x08, 0x00] => checksums_valid(frame),
        [0x86, 0xdd] if frame[20] == 41 => checksums_ok(&[&frame[..14], &frame[54..]].concat()),
        [0x86, 0xdd] if matches!(frame[20], 6 | 17) => {
            let address = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&frame[at..at + 16]).unwrap());
            transport_checksum6(frame[20], address(22), address(38), &frame[54..]) == 0
        }
        _ => true,
    }
}

/// `frame` with `bytes` written at `at`, and an IPv4 header's checksum made right again.
pub fn patched(mut frame: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    frame[at..at + bytes.len()].copy_from_slice(bytes);
    if frame[12..14] == [0x08, 0x00] && frame[14] >> 4 == 4 {
        let ihl = usize::from(frame[14] & 0x0f) * 4;
        frame[24..26].copy_from_slice(&[0, 0]);
        if frame.len() >= 14 + ihl {
            let sum = checksum(&frame[14..14 + ihl]);
            frame[24..26].copy_from_slice(&sum.to_be_bytes());
        }
    }
    frame
}

/// `frame` cut to its IP header and `l4` bytes, the length field saying so.
pub fn cut_to(frame: Vec<u8>, f: IpFamily, l4: usize) -> Vec<u8> {
    match f {
        IpFamily::V4 => {
            let mut frame = frame;
            frame.truncate(14 + 20 + l4);
            patched(frame, 16, &((20 + l4) as u16).to_be_bytes())
        }
        IpFamily::V6 => {
            let mut frame = frame;
            frame.truncate(14 + 40 + l4);
            patched(frame, 18, &(l4 as u16).to_be_bytes())
        }
    }
}

/// `frame` with its length field (IPv4's total, IPv6's payload) saying `claimed`.
pub fn claiming_length(frame: Vec<u8>, f: IpFamily, claimed: u16) -> Vec<u8> {
    patched(frame, f.pick(16, 18), &claimed.to_be_bytes())
}

/// A TCP segment behind a header the fast path leaves to the kernel: IPv4 options (four NOPs,
/// a 24-byte header) or an IPv6 hop-by-hop header (a PadN option).
pub fn with_unparsed_header(
    macs: ([u8; 6], [u8; 6]),
    src: IpAddr,
    dst: IpAddr,
    ports: (u16, u16),
) -> Vec<u8> {
    let tcp = segment(6, src, dst, ports, b"fixture");
    match same_family(src, dst) {
        Ok(_) => {
            let mut frame = ip_frame(macs, src, dst, 64, 6, &tcp);
            frame.splice(34..34, [1, 1, 1, 1]);
            frame[14] = 0x46;
            let total = u16::from_be_bytes([frame[16], frame[17]]) + 4;
            patched(frame, 16, &total.to_be_bytes())
        }
        Err(_) => ip_frame(macs, src, dst, 64, 0, &[&[6, 0, 1, 4, 0, 0, 0, 0][..], &tcp].concat()),
    }
}

/// A fragment of a TCP packet: at `offset` (in 8-byte units), `more` fragments following; IPv4's
/// flags and offset, or an IPv6 fragment header.
pub fn fragment(
    macs: ([u8; 6], [u8; 6]),
    src: IpAddr,
    dst: IpAddr,
    ports: (u16, u16),
    offset: u16,
    more: bool,
) -> Vec<u8> {
    let tcp = segment(6, src, dst, ports, b"fixture");
    match same_family(src, dst) {
        Ok(_) => {
            let field = offset | if more { 0x2000 } else { 0 };
            patched(ip_frame(macs, src, dst, 64, 6, &tcp), 20, &field.to_be_bytes())
        }
        Err(_) => {
            let field = (offset << 3) | u16::from(more);
            let header = [&[6, 0][..], &field.to_be_bytes(), &[0, 0, 0, 7]].concat();
            ip_frame(macs, src, dst, 64, 44, &[&header[..], &tcp].concat())
        }
    }
}

/// A request to resolve `target`: an ARP request (broadcast) or a Neighbor Solicitation (to
/// the target's solicited-node group, with the source link-layer option unless `src` is
/// unspecified).
pub fn resolution_request(mac: [u8; 6], src: IpAddr, target: IpAddr) -> Vec<u8> {
    match same_family(src, target) {
        Ok((s, t)) => arp_request(mac, s, t),
        Err((s, t)) => neighbor_solicitation(mac, s, t),
    }
}

/// The answer the owner of `target` (at `owner_mac`) sends to `to`/`to_mac`: an ARP reply
/// (RFC 826), or a Neighbor Advertisement with `flags` (0x60: Solicited and Override, RFC 4861
/// §7.2.4) and the target link-layer option.
pub fn resolution_answer(
    owner_mac: [u8; 6],
    to_mac: [u8; 6],
    to: IpAddr,
    target: IpAddr,
    flags: u8,
) -> Vec<u8> {
    match same_family(target, to) {
        Ok((t, d)) => arp_frame(2, to_mac, owner_mac, t, to_mac, d),
        Err((t, d)) => {
            let body = [&[flags, 0, 0, 0][..], &t.octets(), &[2, 1], &owner_mac].concat();
            ipv6_frame(owner_mac, to_mac, t, d, 255, 58, &icmpv6(136, 0, &body, t, d))
        }
    }
}

/// Node n0's services in the service-path fixtures (`service_paths.rs`, `service_fixtures.rs`)
/// and `cargo xtask bench program`, on the family's VIP and pods: local delivery to n0's pod (TCP
/// and UDP :80), full NAT to n1's pod (UDP :81), DSR to n1's pod (TCP and UDP :82) and to n0's
/// own (TCP :84), and a service without endpoints (:85).
pub fn services_config(f: IpFamily) -> String {
    let (vip, here, there) = (f.vip(), f.pod(0, 2), f.pod(1, 2));
    format!(
        "
interface: eth0
node: n0
vips: [{{address: '{vip}'}}]
services:
  - name: local
    vip: '{vip}'
    ports: [{{port: 80, targetPort: 8080}}, {{port: 80, protocol: UDP, targetPort: 8080}}]
    endpoints: [{{address: '{here}', node: n0}}]
  - name: full-nat
    vip: '{vip}'
    ports: [{{port: 81, protocol: UDP, targetPort: 8080}}]
    endpoints: [{{address: '{there}', node: n1}}]
  - name: dsr
    vip: '{vip}'
    remoteMode: dsr
    ports: [{{port: 82, targetPort: 8080}}, {{port: 82, protocol: UDP, targetPort: 8080}}]
    endpoints: [{{address: '{there}', node: n1}}]
  - name: dsr-here
    vip: '{vip}'
    remoteMode: dsr
    ports: [{{port: 84, targetPort: 8080}}]
    endpoints: [{{address: '{here}', node: n0}}]
  - name: empty
    vip: '{vip}'
    ports: [{{port: 85}}]
"
    )
}

/// `object` loaded (the uplink program and the IPv6 path through the verifier) and set up to
/// serve `families`: each one's VIP owned by this node, the node's address as full NAT's
/// source (on `ifindex` for IPv6), full NAT's ports from `snat_first` up, and each one's
/// service maps synced from [`services_config`] by the agent's own code.
pub fn load_services_of(
    families: &[IpFamily],
    object: &[u8],
    ifindex: u32,
    snat_first: u16,
) -> (Ebpf, ServiceMapsByFamily) {
    let mut ebpf = load_uplink_from(object);
    let mut maps = ServiceMapsByFamily::take(&mut ebpf, None).expect("the service maps");
    let settings = Settings { node_addr: NODE.octets(), snat_port_min: snat_first, snat_port_max: 65_535 };
    maps.v4.set_settings(settings).unwrap();
    for &f in families {
        own_vip(&mut ebpf, f.vip(), OwnedVip::new(NODE_MAC));
        // IPv6's full NAT takes its source from the uplink's address (IPv4's from the settings).
        if let IpAddr::V6(node) = f.node() {
            let mut sources: HashMap<_, UplinkKey, Vip6Key> =
                HashMap::try_from(ebpf.map_mut(UPLINK_ADDRS6).unwrap()).unwrap();
            sources.insert(UplinkKey::new(ifindex, 0), Vip6Key::new(node.octets()), 0).unwrap();
        }
        let config = Config::parse(&services_config(f)).expect("the fixture config is valid");
        let planned = match f {
            IpFamily::V4 => {
                let contents: MapContents<Addr4> = map_contents::for_node(&config, "n0");
                maps.v4.apply(&contents).map(|_| contents.services.len())
            }
            IpFamily::V6 => {
                let contents: MapContents<Addr6> = map_contents::for_node(&config, "n0");
                maps.v6.apply(&contents).map(|_| contents.services.len())
            }
        };
        assert_eq!(planned.expect("syncing the fixture services"), 7, "every {f} service port planned");
    }
    (ebpf, maps)
}

/// Writes `vip` into its family's owned-VIP map.
pub fn own_vip(ebpf: &mut Ebpf, vip: IpAddr, owned: OwnedVip) {
    insert_by_address(ebpf, (OWNED_VIPS, OWNED_VIPS6), address_key(vip), owned);
}

/// An address as the maps key it: `VipKey` or `Vip6Key`.
enum AddressKey {
    V4(VipKey),
    V6(Vip6Key),
}

fn address_key(address: IpAddr) -> AddressKey {
    match address {
        IpAddr::V4(v4) => AddressKey::V4(VipKey::new(v4.octets())),
        IpAddr::V6(v6) => AddressKey::V6(Vip6Key::new(v6.octets())),
    }
}

/// Writes `value` under `key` into the map of its family among `maps` (IPv4's, IPv6's).
fn insert_by_address<V: aya::Pod>(ebpf: &mut Ebpf, maps: (&str, &str), key: AddressKey, value: V) {
    match key {
        AddressKey::V4(key) => {
            let mut map: HashMap<_, VipKey, V> = HashMap::try_from(ebpf.map_mut(maps.0).unwrap()).unwrap();
            map.insert(key, value, 0).unwrap();
        }
        AddressKey::V6(key) => {
            let mut map: HashMap<_, Vip6Key, V> = HashMap::try_from(ebpf.map_mut(maps.1).unwrap()).unwrap();
            map.insert(key, value, 0).unwrap();
        }
    }
}

/// The ARP replies or Neighbor Advertisements counted for `vip`, summed over CPUs.
pub fn vip_answers(ebpf: &Ebpf, vip: IpAddr) -> u64 {
    let sum = |per_cpu: Option<aya::maps::PerCpuValues<VipStats>>| {
        per_cpu.map_or(0, |v| v.iter().map(|s| s.arp_replies).sum())
    };
    match vip {
        IpAddr::V4(v) => {
            let stats: PerCpuHashMap<_, VipKey, VipStats> =
                PerCpuHashMap::try_from(ebpf.map(VIP_STATS).unwrap()).unwrap();
            sum(stats.get(&VipKey::new(v.octets()), 0).ok())
        }
        IpAddr::V6(v) => {
            let stats: PerCpuHashMap<_, Vip6Key, VipStats> =
                PerCpuHashMap::try_from(ebpf.map(VIP_STATS6).unwrap()).unwrap();
            sum(stats.get(&Vip6Key::new(v.octets()), 0).ok())
        }
    }
}

/// What the program learned of VRRP source `member`, from its family's speaker map.
pub fn vrrp_speaker(ebpf: &Ebpf, member: IpAddr) -> VrrpSpeaker {
    match member {
        IpAddr::V4(m) => {
            let map: HashMap<_, VipKey, VrrpSpeaker> =
                HashMap::try_from(ebpf.map(VRRP_SPEAKERS).unwrap()).unwrap();
            map.get(&VipKey::new(m.octets()), 0).unwrap()
        }
        IpAddr::V6(m) => {
            let map: HashMap<_, Vip6Key, VrrpSpeaker> =
                HashMap::try_from(ebpf.map(VRRP_SPEAKERS6).unwrap()).unwrap();
            map.get(&Vip6Key::new(m.octets()), 0).unwrap()
        }
    }
}

/// The MACs of the local pod and of its host-side interface.
#[derive(Clone, Copy, Debug)]
pub struct LocalMacs {
    pub pod: [u8; 6],
    pub host: [u8; 6],
}

/// Runs `f` (given eth0's ifindex and the local pod's MACs) inside lab node n0 with a local pod
/// (10.244.0.2, and fd00:10:244::2 when `family` is IPv6), the peer, the client and the pod as
/// permanent neighbours in IPv4 and, when `family` is IPv6, in IPv6 too (that lab is dual
/// stack): every next hop the fixtures expect is fixed.
pub fn in_node_with_local_pod(family: IpFamily, f: impl FnOnce(u32, LocalMacs) + Send + 'static) {
    let mut lab = crate::Lab::new(2);
    if family == IpFamily::V6 {
        lab.enable_ipv6();
    }
    lab.add_pod(0);
    let pod = &lab.pods[0];
    let ip: IpAddr = match family {
        IpFamily::V4 => pod.ip.into(),
        IpFamily::V6 => pod.ip6.expect("an IPv6 pod").into(),
    };
    assert_eq!(ip, family.pod(0, 2), "the local pod has the address the cases expect");
    let node = &lab.nodes[0].ns;
    let macs = LocalMacs { pod: mac_of(&lab.pods[0].ns, "eth0"), host: mac_of(node, "pv0") };
    let families: &[IpFamily] = family.pick(&[IpFamily::V4], &[IpFamily::V4, IpFamily::V6]);
    for &f in families {
        for (ip, mac, dev) in
            [(f.peer(), PEER_MAC, "eth0"), (f.client(), CLIENT_MAC, "eth0"), (f.pod(0, 2), macs.pod, "pv0")]
        {
            permanent_neighbour(node, ip, mac, dev);
        }
    }
    let ifindex = ifindex_of(node, "eth0");
    node.run(move || f(ifindex, macs));
}

/// One test per family for each scenario `fn name(f: IpFamily)`: `name::ipv4` and `name::ipv6`
/// (a module of the scenario's name beside it). A new family is an arm here, not a test per
/// scenario.
#[macro_export]
macro_rules! for_each_family {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[test]
            fn ipv4() {
                super::$scenario($crate::family::IpFamily::V4)
            }

            #[test]
            fn ipv6() {
                super::$scenario($crate::family::IpFamily::V6)
            }
        }
    )+};
}
