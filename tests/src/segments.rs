//! More networks for the lab: further L2 segments, each another bridge, an interface on every
//! node and a client of its own.

use std::net::Ipv4Addr;

use crate::{Host, Lab, Netns, SEGMENT_PREFIX_LEN, format_mac};

impl Lab {
    /// A new segment `bridge`, with `interface` on every node at `prefix.(10 + i)` and a client
    /// of its own at `prefix.100`; returns the client. Node MACs there end in `0x20 + i`. The
    /// nodes' switch ports run a pass-only program, so native XDP works on `interface`.
    pub fn add_segment(&mut self, bridge: &str, interface: &str, prefix: [u8; 3]) -> Host {
        self.switch.run_cmd(&["ip", "link", "add", bridge, "type", "bridge"]);
        self.switch.run_cmd(&["ip", "link", "set", bridge, "up"]);
        let [a, b, c] = prefix;
        let mut ports = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let port = format!("p-{}-{bridge}", node.name);
            let mac = [0x02, 0x1b, c, 0, 0, 0x20 + i as u8];
            wire(&self.switch, bridge, &port, &node.ns, interface, mac);
            ports.push(port);
            let ip = Ipv4Addr::new(a, b, c, 10 + i as u8);
            node.ns.run_cmd(&["ip", "addr", "add", &format!("{ip}/{SEGMENT_PREFIX_LEN}"), "dev", interface]);
            // Hosts compute checksums in software, as a NIC would put them on the wire.
            node.ns.run_cmd(&["ethtool", "-K", interface, "tx", "off"]);
        }
        for port in ports {
            self.pass_on_switch_port(port);
        }
        let ns = Netns::create(format!("{}-cl-{bridge}", self.id));
        let port = format!("p-cl-{bridge}");
        let mac = [0x02, 0x1b, c, 0, 0, 0xcc];
        wire(&self.switch, bridge, &port, &ns, Host::IFACE, mac);
        let ip = Ipv4Addr::new(a, b, c, 100);
        ns.run_cmd(&["ip", "addr", "add", &format!("{ip}/{SEGMENT_PREFIX_LEN}"), "dev", Host::IFACE]);
        ns.run_cmd(&["ethtool", "-K", Host::IFACE, "tx", "off"]);
        Host { name: format!("cl-{bridge}"), ns, ip, mac, switch_port: port }
    }
}

/// A veth from `bridge` in the switch namespace to `interface` (with `mac`, up) in `ns`.
fn wire(switch: &Netns, bridge: &str, port: &str, ns: &Netns, interface: &str, mac: [u8; 6]) {
    switch.run_cmd(&[
        "ip",
        "link",
        "add",
        port,
        "type",
        "veth",
        "peer",
        "name",
        interface,
        "netns",
        ns.name(),
    ]);
    switch.run_cmd(&["ip", "link", "set", port, "master", bridge, "up"]);
    ns.run_cmd(&["ip", "link", "set", interface, "address", &format_mac(&mac), "up"]);
}
