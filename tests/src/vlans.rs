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

    /// A client on VLAN `vlan` of `br0`, at `ip`, its port an access port of the VLAN; it
    /// reaches the VIP range on its link, as the lab's client does.
    pub fn add_vlan_client(&mut self, vlan: u16, ip: Ipv4Addr) -> Host {
        let [_, _, c, d] = ip.octets();
        let host = plug(&self.switch, &self.id, &format!("v{vlan}"), ip, [0x02, 0x1c, 0, c, 0, d]);
        host.ns.run_cmd(&["ip", "route", "add", VIP_RANGE, "dev", Host::IFACE]);
        let port = host.switch_port.clone();
        self.access_port(&port, vlan);
        host
    }

    /// The switch's `port` as an access port of `vlan` (0: untagged).
    fn access_port(&mut self, port: &str, vlan: u16) {
        let port = port.to_owned();
        let ebpf = self.switch.run(move || {
            let mut ebpf = EbpfLoader::new()
                .override_global("LAB_ACCESS_VLAN", &vlan, true)
                .load(lb_agent::dataplane::EMBEDDED_OBJECT)
                .expect("loading the BPF object");
            for (program, direction) in
                [("lab_access_in", TcAttachType::Ingress), ("lab_access_out", TcAttachType::Egress)]
            {
                let tc: &mut SchedClassifier = ebpf.program_mut(program).unwrap().try_into().unwrap();
                tc.load().unwrap_or_else(|e| panic!("loading {program}: {e}"));
                tc.attach(&port, direction).unwrap_or_else(|e| panic!("attaching {program} to {port}: {e}"));
            }
            ebpf
        });
        self.keep_program(ebpf);
    }
}
