//! The loop's state for `/status` (`lb-agent status`): VRRP instances, uplinks, routed VIPs.

use std::{collections::BTreeMap, net::IpAddr};

use crate::{dataplane::leases, http::InstanceSnapshot};

use super::Agent;

impl Agent {
    /// The VRRP instances as `/status` shows them.
    pub(super) fn instance_snapshot(&self) -> Vec<InstanceSnapshot> {
        let Some(vrrp) = &self.vrrp else { return Vec::new() };
        let adverts: BTreeMap<_, Option<std::time::Instant>> = vrrp.router.last_adverts().collect();
        let now_ns = leases::monotonic_ns();
        vrrp.router
            .instances()
            .map(|(spec, instance)| InstanceSnapshot {
                status: crate::status::InstanceStatus {
                    group: spec.group.clone(),
                    interface: spec.interface.clone(),
                    vrid: spec.vrid,
                    family: spec.family.as_str().to_owned(),
                    state: instance.state().as_str().to_owned(),
                    priority: spec.priority,
                    master: instance.master().map(|m| m.to_string()),
                    advert_age_ms: None,
                    lease_ms: self
                        .dataplane
                        .lease_remaining(spec.id().lease_slot(), now_ns)
                        .map(|d| d.as_millis() as u64),
                    vips: spec.vips.iter().map(IpAddr::to_string).collect(),
                },
                last_advert: adverts.get(&spec.id()).copied().flatten(),
            })
            .collect()
    }

    /// The routed VIPs as `/status` shows them: what the kernel holds now.
    pub(super) fn routed_snapshot(&self) -> Vec<crate::status::RoutedStatus> {
        self.routes
            .held()
            .into_iter()
            .map(|vip| {
                let settings = self.current.plan.vips.get(&vip);
                crate::status::RoutedStatus {
                    vip: vip.to_string(),
                    group: settings.map(|s| s.group.clone()).unwrap_or_default(),
                    announce: settings.map_or("", |s| s.announce.as_str()).to_owned(),
                }
            })
            .collect()
    }

    /// The uplinks as `/status` shows them.
    pub(super) fn uplink_snapshot(&self) -> Vec<crate::status::UplinkStatus> {
        self.uplinks
            .by_name
            .iter()
            .map(|(name, uplink)| crate::status::UplinkStatus {
                interface: name.clone(),
                xdp_mode: self.dataplane.mode_of(name).to_owned(),
                node_address: uplink.node_address.to_string(),
            })
            .collect()
    }
}
