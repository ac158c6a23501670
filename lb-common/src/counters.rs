//! Why the XDP program did what it did: indices into the `REASON_STATS` per-CPU array.
//!
//! The action counters are indexed by the kernel's own XDP action codes; these reasons say which
//! path a packet took, so an operator can tell a malformed flood from ordinary pass-through.

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Shorter than an Ethernet header.
    MalformedEthernet = 0,
    /// An Ethernet/IPv4 ARP frame that is truncated, has impossible address lengths, or comes
    /// from a multicast/broadcast sender.
    MalformedArp = 1,
    /// ARP request for an owned VIP, answered with `XDP_TX`.
    ArpReplied = 2,
    /// ARP request for an address this node does not own: left to the kernel.
    ArpNotOwned = 3,
    /// ARP that is not a request we answer: replies, gratuitous announcements, other
    /// hardware or protocol types.
    ArpIgnored = 4,
    /// Not ARP: left to the kernel.
    NotArp = 5,
}

impl Reason {
    pub const COUNT: u32 = 6;
    pub const ALL: [Reason; Self::COUNT as usize] = [
        Reason::MalformedEthernet,
        Reason::MalformedArp,
        Reason::ArpReplied,
        Reason::ArpNotOwned,
        Reason::ArpIgnored,
        Reason::NotArp,
    ];

    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            Reason::MalformedEthernet => "malformed_ethernet",
            Reason::MalformedArp => "malformed_arp",
            Reason::ArpReplied => "arp_replied",
            Reason::ArpNotOwned => "arp_not_owned",
            Reason::ArpIgnored => "arp_ignored",
            Reason::NotArp => "not_arp",
        }
    }
}

/// The kernel's XDP action codes (`enum xdp_action`), which index `ACTION_STATS`.
pub const XDP_ACTION_COUNT: u32 = 5;

/// The metric label for an XDP action code.
pub const fn action_label(action: u32) -> &'static str {
    match action {
        0 => "aborted",
        1 => "drop",
        2 => "pass",
        3 => "tx",
        4 => "redirect",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_at_its_index() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
