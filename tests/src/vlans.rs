//! VLANs on the lab's segment without the 802.1Q module: the switch's ports become access
//! ports and trunks by TC programs (`lab_access_in`, `lab_access_out`), which push and pop
//! tags with core networking helpers.

use std::net::Ipv4Addr;

use aya::{
    EbpfLoader,
    programs::{SchedClassifier, TcAttachType},
};

use crate::{Host, Lab, VIP_RANGE, plug};

impl Lab {
    /// Makes `br0` VLAN-aware: the client's port an untagged access port (tagged frames do not
    /// reach it), the nodes' ports trunks that write the tag into the frame (`txvlan off`), as
    /// a NIC without receive VLAN offload hands it to XDP. (With `txvlan on` the tag travels
    /// in the packet's metadata, where only the dev-bound `bpf_xdp_metadata_rx_vlan_tag` kfunc
    /// reads it from XDP.)
    pub fn make_vlan_aware(&mut self) {
        let port = self.client.switch_port.clone();
        self.access_port(&port, 0);
        for node in &self.nodes {
            self.switch.run_cmd(&["ethtool", "-K", &node.switch_port, "txvlan", "off"]);
        }
    }

    /// A client on VLAN `vlan` of `br0`, at `ip` (and `2001:db8:<vlan>::<ip's last octet>`), its
    /// port an access port of the VLAN; it reaches the VIP ranges on its link, as the lab's
    /// client does.
    pub fn add_vlan_client(&mut self, vlan: u16, ip: Ipv4Addr) -> Host {
        let [_, _, c, d] = ip.octets();
        let host = plug(&self.switch, &self.id, &format!("v{vlan}"), ip, [0x02, 0x1c, 0, c, 0, d]);
        host.ns.run_cmd(&["ip", "route", "add", VIP_RANGE, "dev", Host::IFACE]);
        // Checksums in software, as a NIC would put them on the wire.
        host.ns.run_cmd(&["ethtool", "-K", Host::IFACE, "tx", "off"]);
        // IPv6 too: 2001:db8:<vlan>::<last octet>, and the IPv6 VIP range on its link.
        for key in ["all", Host::IFACE] {
            host.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=0")]);
        }
        host.ns.run_cmd(&["sysctl", "-qw", &format!("net.ipv6.conf.{}.accept_dad=0", Host::IFACE)]);
        let address6 = format!("2001:db8:{vlan:x}::{d:x}/64");
        host.ns.run_cmd(&["ip", "-6", "addr", "add", &address6, "dev", Host::IFACE, "nodad"]);
        host.ns.run_cmd(&["ip", "-6", "route", "add", crate::VIP6_RANGE, "dev", Host::IFACE]);
        let port = host.switch_port.clone();
        self.access_port(&port, vlan);
        host
    }

    /// Gives every node an address on VLAN `vlan` of `eth0`, `prefix.(10 + i)`, on a stand-in
    /// for a VLAN device (this kernel cannot make one): a veth `v<vlan>` whose frames leave
    /// `eth0` tagged, and to which `eth0`'s frames of the VLAN come untagged (TC, after the
    /// agent's XDP). So a node reaches the VLAN's clients as a host with `eth0.<vlan>` would:
    /// its endpoints' replies and the routes full NAT looks up go there.
    pub fn add_vlan_device(&mut self, vlan: u16, prefix: [u8; 3]) {
        let [a, b, c] = prefix;
        let device = format!("v{vlan}");
        let peer = format!("v{vlan}p");
        for i in 0..self.nodes.len() {
            let ns = &self.nodes[i].ns;
            ns.run_cmd(&["ip", "link", "add", &device, "type", "veth", "peer", "name", &peer]);
            let address = format!("{a}.{b}.{c}.{}/24", 10 + i);
            ns.run_cmd(&["ip", "addr", "add", &address, "dev", &device]);
            for dev in [&device, &peer] {
                ns.run_cmd(&["ip", "link", "set", dev, "up"]);
                // Checksums in software, as for the node's other interfaces.
                ns.run_cmd(&["ethtool", "-K", dev, "tx", "off"]);
            }
            let parent = crate::fixture::ifindex_of(ns, Host::IFACE);
            let peer_index = crate::fixture::ifindex_of(ns, &peer);
            let (device_peer, parent_name) = (peer.clone(), Host::IFACE.to_owned());
            let ebpf = ns.run(move || {
                let mut ebpf = EbpfLoader::new()
                    .override_global("LAB_ACCESS_VLAN", &vlan, true)
                    .override_global("LAB_REDIRECT", &peer_index, true)
                    .load(lb_agent::dataplane::EMBEDDED_OBJECT)
                    .expect("loading the BPF object");
                attach_tc(&mut ebpf, "lab_vlan_device_in", &parent_name, TcAttachType::Ingress);
                let mut out = EbpfLoader::new()
                    .override_global("LAB_ACCESS_VLAN", &vlan, true)
                    .override_global("LAB_REDIRECT", &parent, true)
                    .load(lb_agent::dataplane::EMBEDDED_OBJECT)
                    .expect("loading the BPF object");
                attach_tc(&mut out, "lab_vlan_device_out", &device_peer, TcAttachType::Ingress);
                // XDP redirected into the device (full NAT's replies) needs a program on its peer.
                let pass: &mut aya::programs::Xdp =
                    out.program_mut(lb_agent::dataplane::PASS_PROGRAM).unwrap().try_into().unwrap();
                pass.load().expect("loading the pass program");
                pass.attach(&device_peer, aya::programs::XdpMode::Driver)
                    .expect("attaching the pass program");
                [ebpf, out]
            });
            for e in ebpf {
                self.keep_program(e);
            }
        }
    }

    /// The switch's `port` as an access port of `vlan` (0: untagged).
    fn access_port(&mut self, port: &str, vlan: u16) {
        let port = port.to_owned();
        let ebpf = self.switch.run(move || {
            let mut ebpf = EbpfLoader::new()
                .override_global("LAB_ACCESS_VLAN", &vlan, true)
                .load(lb_agent::dataplane::EMBEDDED_OBJECT)
                .expect("loading the BPF object");
            attach_tc(&mut ebpf, "lab_access_in", &port, TcAttachType::Ingress);
            attach_tc(&mut ebpf, "lab_access_out", &port, TcAttachType::Egress);
            ebpf
        });
        self.keep_program(ebpf);
    }
}

fn attach_tc(ebpf: &mut aya::Ebpf, program: &str, interface: &str, direction: TcAttachType) {
    let tc: &mut SchedClassifier = ebpf.program_mut(program).unwrap().try_into().unwrap();
    tc.load().unwrap_or_else(|e| panic!("loading {program}: {e}"));
    tc.attach(interface, direction).unwrap_or_else(|e| panic!("attaching {program} to {interface}: {e}"));
}
