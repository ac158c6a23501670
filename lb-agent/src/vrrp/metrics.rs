//! VRRP metrics: state per instance, transitions, advertisements and drops, the current master.

use std::{collections::BTreeMap, net::IpAddr};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    family::{InstanceId, IpFamily},
    instance::State,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub group: String,
    pub vrid: u8,
    pub family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub group: String,
    pub vrid: u8,
    pub family: &'static str,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub group: String,
    pub vrid: u8,
    pub family: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Empty when the datagram was too broken to name a VRID.
    pub vrid: String,
    pub family: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceLabels {
    pub group: String,
    pub vrid: u8,
    pub family: &'static str,
    pub interface: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MasterLabels {
    pub group: String,
    pub vrid: u8,
    pub family: &'static str,
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
    last_interface: BTreeMap<(String, InstanceId), String>,
    /// By instance (unique on a node): its group, and what was last exported. Looked up
    /// without building labels, since every advertisement sent or accepted reports them.
    last_state: BTreeMap<InstanceId, (String, State)>,
    last_master: BTreeMap<InstanceId, (String, IpAddr)>,
    /// Each instance's group and its (sent, received) counters, for the same reason.
    adverts: BTreeMap<InstanceId, (String, Counter, Counter)>,
}

/// Why a received datagram was dropped before or by the state machine (metric labels).
pub mod drop_reason {
    pub const OWN: &str = "own_advert";
    pub const UNKNOWN_VRID: &str = "unknown_vrid";
    pub const NOT_MEMBER: &str = "not_member";
    pub const LOWER_PRIORITY: &str = "lower_priority";
    pub const WE_ARE_OWNER: &str = "we_are_owner";
    pub const NOT_RUNNING: &str = "not_running";
    /// Authenticated, but not newer than the last one accepted from that sender (or, from a
    /// sender not heard yet, older than [`crate::vrrp::auth::FRESHNESS`]).
    pub const REPLAYED: &str = "replayed";
    /// For a VRID of this node's, but arrived by another interface than its group's.
    pub const WRONG_INTERFACE: &str = "wrong_interface";
}

impl VrrpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Exported from the start (as zero), so dashboards and alerts see "none yet", not
        // "no such metric".
        for family in [IpFamily::V4, IpFamily::V6] {
            let _ = m.dropped.get_or_create(&DropLabels {
                vrid: String::new(),
                family: family.as_str(),
                reason: drop_reason::NOT_MEMBER,
            });
        }
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
    pub fn state(&mut self, group: &str, id: InstanceId, state: State) -> Option<(State, State)> {
        if self.last_state.get(&id).is_some_and(|(g, s)| g == group && *s == state) {
            return None;
        }
        let previous = self
            .last_state
            .insert(id, (group.to_owned(), state))
            .and_then(|(g, s)| (g == group).then_some(s));
        for s in STATES {
            self.state.get_or_create(&state_labels(group, id, s)).set(i64::from(s == state));
        }
        match previous {
            Some(from) if from != state => {
                self.transitions
                    .get_or_create(&TransitionLabels {
                        group: group.to_owned(),
                        vrid: id.vrid,
                        family: id.family.as_str(),
                        from: from.as_str(),
                        to: state.as_str(),
                    })
                    .inc();
                Some((from, state))
            }
            _ => None,
        }
    }

    pub fn master(&mut self, group: &str, id: InstanceId, master: Option<IpAddr>) {
        let current = self.last_master.get(&id).map(|(g, m)| (g.as_str(), *m));
        if current == master.map(|m| (group, m)) {
            return;
        }
        let labels = |group: &str, master: IpAddr| MasterLabels {
            group: group.to_owned(),
            vrid: id.vrid,
            family: id.family.as_str(),
            master: master.to_string(),
        };
        if let Some((old_group, old)) = self.last_master.remove(&id) {
            self.master.remove(&labels(&old_group, old));
        }
        if let Some(new) = master {
            self.master.get_or_create(&labels(group, new)).set(1);
            self.last_master.insert(id, (group.to_owned(), new));
        }
    }

    /// The instance's (sent, received) counters, made once per instance and group.
    fn advert_counters(&mut self, group: &str, id: InstanceId) -> &(String, Counter, Counter) {
        if self.adverts.get(&id).is_none_or(|(g, _, _)| g != group) {
            let labels = instance_labels(group, id);
            let sent = self.sent.get_or_create(&labels).clone();
            let received = self.received.get_or_create(&labels).clone();
            self.adverts.insert(id, (group.to_owned(), sent, received));
        }
        &self.adverts[&id]
    }

    pub fn sent(&mut self, group: &str, id: InstanceId) {
        self.advert_counters(group, id).1.inc();
    }

    pub fn received(&mut self, group: &str, id: InstanceId) {
        self.advert_counters(group, id).2.inc();
    }

    /// A datagram of `family` dropped; `vrid` when it was whole enough to name one.
    pub fn dropped(&self, family: IpFamily, vrid: Option<u8>, reason: &'static str) {
        let vrid = vrid.map(|v| v.to_string()).unwrap_or_default();
        self.dropped.get_or_create(&DropLabels { vrid, family: family.as_str(), reason }).inc();
    }

    pub fn address_mismatch(&self, group: &str, id: InstanceId) {
        self.address_mismatch.get_or_create(&instance_labels(group, id)).inc();
    }

    pub fn reasserted(&self, group: &str, id: InstanceId) {
        self.reasserted.get_or_create(&instance_labels(group, id)).inc();
    }

    /// Counters a new instance exports at zero from the start, so the first increment is an
    /// increase Prometheus can see (the foreign-VRID alert rests on this one), and the
    /// interface it runs on.
    pub fn prepare(&mut self, group: &str, id: InstanceId, interface: &str) {
        let labels = DropLabels {
            vrid: id.vrid.to_string(),
            family: id.family.as_str(),
            reason: drop_reason::NOT_MEMBER,
        };
        let _ = self.dropped.get_or_create(&labels);
        let interface_labels = |interface: String| InterfaceLabels {
            group: group.to_owned(),
            vrid: id.vrid,
            family: id.family.as_str(),
            interface,
        };
        if let Some(old) = self.last_interface.insert((group.to_owned(), id), interface.to_owned()) {
            self.interface.remove(&interface_labels(old));
        }
        self.interface.get_or_create(&interface_labels(interface.to_owned())).set(1);
    }

    /// Drops the label sets of an instance that no longer exists.
    pub fn forget(&mut self, group: &str, id: InstanceId) {
        for s in STATES {
            self.state.remove(&state_labels(group, id, s));
        }
        self.last_state.remove(&id);
        self.adverts.remove(&id);
        if let Some(interface) = self.last_interface.remove(&(group.to_owned(), id)) {
            self.interface.remove(&InterfaceLabels {
                group: group.to_owned(),
                vrid: id.vrid,
                family: id.family.as_str(),
                interface,
            });
        }
        self.master(group, id, None);
    }
}

fn instance_labels(group: &str, id: InstanceId) -> InstanceLabels {
    InstanceLabels { group: group.to_owned(), vrid: id.vrid, family: id.family.as_str() }
}

fn state_labels(group: &str, id: InstanceId, state: State) -> StateLabels {
    StateLabels { group: group.to_owned(), vrid: id.vrid, family: id.family.as_str(), state: state.as_str() }
}
