//! VRRP metrics: state per instance, transitions, advertisements and drops, the current master.

use std::{collections::BTreeMap, net::Ipv4Addr};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::instance::State;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub group: String,
    pub vrid: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub group: String,
    pub vrid: u8,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub group: String,
    pub vrid: u8,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Empty when the datagram was too broken to name a VRID.
    pub vrid: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceLabels {
    pub group: String,
    pub vrid: u8,
    pub interface: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MasterLabels {
    pub group: String,
    pub vrid: u8,
    pub master: String,
}

const STATES: [State; 3] = [State::Initialize, State::Backup, State::Master];

#[derive(Clone, Default)]
pub struct VrrpMetrics {
    state: Family<StateLabels, Gauge>,
    transitions: Family<TransitionLabels, Counter>,
    sent: Family<InstanceLabels, Counter>,
    received: Family<InstanceLabels, Counter>,
    dropped: Family<DropLabels, Counter>,
    address_mismatch: Family<InstanceLabels, Counter>,
    reasserted: Family<InstanceLabels, Counter>,
    master: Family<MasterLabels, Gauge>,
    interface: Family<InterfaceLabels, Gauge>,
    last_interface: BTreeMap<(String, u8), String>,
    last_state: BTreeMap<(String, u8), State>,
    last_master: BTreeMap<(String, u8), Ipv4Addr>,
}

impl VrrpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Exported from the start (as zero), so dashboards and alerts see "none yet", not
        // "no such metric".
        let _ = m.dropped.get_or_create(&DropLabels {
            vrid: String::new(),
            reason: super::router::drop_reason::NOT_MEMBER,
        });
        registry.register(
            "vrrp_state",
            "1 for the state each VRRP instance is in, 0 for the others",
            m.state.clone(),
        );
        registry.register("vrrp_transitions", "VRRP state transitions", m.transitions.clone());
        registry.register("vrrp_adverts_sent", "VRRP advertisements sent", m.sent.clone());
        registry.register("vrrp_adverts_received", "VRRP advertisements accepted", m.received.clone());
        registry.register("vrrp_adverts_dropped", "VRRP datagrams dropped, by reason", m.dropped.clone());
        registry.register(
            "vrrp_address_mismatch",
            "Advertisements whose address list differs from ours (processed anyway)",
            m.address_mismatch.clone(),
        );
        registry.register(
            "vrrp_reassertions",
            "Times this master heard a lower-priority master and announced itself again",
            m.reasserted.clone(),
        );
        registry.register("vrrp_master", "1 for the current master of each VRRP instance", m.master.clone());
        registry.register(
            "vrrp_instance_interface",
            "1 for the interface each VRRP instance advertises on",
            m.interface.clone(),
        );
        m
    }

    /// Records the instance's state; returns the transition when it changed.
    pub fn state(&mut self, group: &str, vrid: u8, state: State) -> Option<(State, State)> {
        let previous = self.last_state.insert((group.to_owned(), vrid), state);
        for s in STATES {
            self.state
                .get_or_create(&StateLabels { group: group.to_owned(), vrid, state: s.as_str() })
                .set(i64::from(s == state));
        }
        match previous {
            Some(from) if from != state => {
                self.transitions
                    .get_or_create(&TransitionLabels {
                        group: group.to_owned(),
                        vrid,
                        from: from.as_str(),
                        to: state.as_str(),
                    })
                    .inc();
                Some((from, state))
            }
            _ => None,
        }
    }

    pub fn master(&mut self, group: &str, vrid: u8, master: Option<Ipv4Addr>) {
        let key = (group.to_owned(), vrid);
        let previous = match master {
            Some(m) => self.last_master.insert(key, m),
            None => self.last_master.remove(&key),
        };
        if previous == master {
            return;
        }
        if let Some(old) = previous {
            self.master.remove(&MasterLabels { group: group.to_owned(), vrid, master: old.to_string() });
        }
        if let Some(new) = master {
            self.master
                .get_or_create(&MasterLabels { group: group.to_owned(), vrid, master: new.to_string() })
                .set(1);
        }
    }

    pub fn sent(&self, group: &str, vrid: u8) {
        self.sent.get_or_create(&InstanceLabels { group: group.to_owned(), vrid }).inc();
    }

    pub fn received(&self, group: &str, vrid: u8) {
        self.received.get_or_create(&InstanceLabels { group: group.to_owned(), vrid }).inc();
    }

    pub fn dropped(&self, vrid: Option<u8>, reason: &'static str) {
        let vrid = vrid.map(|v| v.to_string()).unwrap_or_default();
        self.dropped.get_or_create(&DropLabels { vrid, reason }).inc();
    }

    pub fn address_mismatch(&self, group: &str, vrid: u8) {
        self.address_mismatch.get_or_create(&InstanceLabels { group: group.to_owned(), vrid }).inc();
    }

    pub fn reasserted(&self, group: &str, vrid: u8) {
        self.reasserted.get_or_create(&InstanceLabels { group: group.to_owned(), vrid }).inc();
    }

    /// Counters a new instance exports at zero from the start, so the first increment is an
    /// increase Prometheus can see (the foreign-VRID alert rests on this one), and the
    /// interface it runs on.
    pub fn prepare(&mut self, group: &str, vrid: u8, interface: &str) {
        let labels = DropLabels { vrid: vrid.to_string(), reason: super::router::drop_reason::NOT_MEMBER };
        let _ = self.dropped.get_or_create(&labels);
        let key = (group.to_owned(), vrid);
        if let Some(old) = self.last_interface.insert(key, interface.to_owned()) {
            self.interface.remove(&InterfaceLabels { group: group.to_owned(), vrid, interface: old });
        }
        self.interface
            .get_or_create(&InterfaceLabels {
                group: group.to_owned(),
                vrid,
                interface: interface.to_owned(),
            })
            .set(1);
    }

    /// Drops the label sets of an instance that no longer exists.
    pub fn forget(&mut self, group: &str, vrid: u8) {
        for s in STATES {
            self.state.remove(&StateLabels { group: group.to_owned(), vrid, state: s.as_str() });
        }
        self.last_state.remove(&(group.to_owned(), vrid));
        if let Some(interface) = self.last_interface.remove(&(group.to_owned(), vrid)) {
            self.interface.remove(&InterfaceLabels { group: group.to_owned(), vrid, interface });
        }
        self.master(group, vrid, None);
    }
}
