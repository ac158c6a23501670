//! Carries the ownership decision ([`crate::ownership::wanted`]) out: the owned-VIP map, the
//! leases, the uplinks' addresses, the routes, and the gratuitous ARPs and NAs that announce it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::{
    announcer::Announcement,
    dataplane::leases,
    error::Result,
    metrics::VridLabels,
    ownership::{self, UplinkView, Wanted},
    routes,
    vip_addresses::ByInterface,
};

use super::{Agent, Stop};

impl Agent {
    /// Makes the data plane and the uplink's addresses match who owns what now. Cheap when
    /// nothing changed: most events are advertisements that change no ownership (they only
    /// move a lease).
    pub(super) async fn apply_ownership(&mut self) {
        if let Some(vrrp) = &mut self.vrrp {
            let again: Vec<IpAddr> = vrrp.router.take_reannouncements().into_iter().collect();
            self.announce(again);
        }
        self.renew_leases();
        self.publish_foreign();
        let epoch = self.vrrp.as_ref().map(|v| v.router.ownership_epoch());
        if epoch.is_some() && epoch == self.ownership.applied_epoch {
            return;
        }
        self.ownership.applied_epoch = epoch;
        self.publish_owners();
        let claims = self.vrrp.as_ref().map(|v| v.router.claims()).unwrap_or_default();
        let uplinks: BTreeMap<String, UplinkView> = self
            .uplinks
            .by_name
            .iter()
            .map(|(name, u)| {
                (name.clone(), UplinkView { mac: u.interface.mac, slot: self.uplinks.slots.for_vips(name) })
            })
            .collect();
        let mut wanted = ownership::wanted(&self.current.config, &self.current.plan, &uplinks, &claims);
        let graceful = self.stopping == Some(Stop::Graceful);
        if graceful {
            wanted = wanted.withdrawn();
        }
        let Wanted { xdp, kernel, listening, vrrp_owned, routes } = wanted;
        let why = if graceful { routes::Why::Stopping } else { routes::Why::Changed };
        self.routes.set(routes, why);
        match self.dataplane.set_owned_vips(&xdp) {
            Ok(applied) if !applied.is_empty() => {
                // Counts at info: a transition of a thousand-VIP instance is not a thousand
                // addresses in the log. Which ones, at debug.
                debug!(added = ?applied.added, changed = ?applied.changed, removed = ?applied.removed, "owned VIPs");
                info!(
                    added = applied.added.len(),
                    changed = applied.changed.len(),
                    removed = applied.removed.len(),
                    owned = xdp.len(),
                    "owned VIPs updated"
                );
            }
            Ok(_) => {}
            Err(e) => error!(error = %e, "updating the owned-VIP map failed"),
        }
        self.state.metrics.owned_vips.set(xdp.len() as i64);

        let newly_owned: Vec<IpAddr> = vrrp_owned.difference(&self.ownership.announced).copied().collect();
        self.announcing
            .announcer
            .withdraw(self.ownership.announced.difference(&vrrp_owned).copied().collect());
        self.ownership.announced = vrrp_owned;
        self.vip_addresses.set(self.with_ifindex(kernel), self.with_ifindex(listening));
        self.announce(newly_owned);
        self.schedule_announcement_refresh(Instant::now());
    }

    /// Drops the per-VIP counters of VIPs the config no longer has (after a new plan: it walks
    /// the counter maps, too slow for every ownership change).
    pub(super) fn prune_vip_counters(&self) {
        let configured: BTreeSet<IpAddr> = self
            .current
            .config
            .vips
            .iter()
            .map(|v| v.address)
            .chain(self.current.plan.vips.keys().copied())
            .collect();
        if let Ok(mut counters) = self.counters.lock()
            && let Err(e) = counters.retain_vips(|vip| configured.contains(vip))
        {
            warn!(error = %e, "pruning per-VIP counters failed");
        }
    }

    /// `by_name` with each uplink's ifindex; uplinks the agent does not have are left out.
    pub(super) fn with_ifindex<A>(&self, by_name: BTreeMap<String, BTreeSet<A>>) -> ByInterface<A> {
        by_name
            .into_iter()
            .filter_map(|(name, set)| Some((name.clone(), (self.uplinks.get(&name)?.interface.index, set))))
            .collect()
    }

    /// Writes each claimed VRID's lease deadline where it moved (after every advertisement sent
    /// as master), and counts the leases that had run out before they were renewed, or before
    /// their master heard that another router had taken over. All of them when ownership
    /// changed; otherwise only the instances the router names.
    pub(super) fn renew_leases(&mut self) {
        let (now, now_ns) = (std::time::Instant::now(), leases::monotonic_ns());
        let to_ns = |until| leases::to_monotonic_ns(until, now, now_ns);
        let epoch = self.vrrp.as_ref().map(|v| v.router.ownership_epoch());
        let renewed = self.vrrp.as_mut().map(|v| v.router.take_renewed()).unwrap_or_default();
        let renewed_late: Result<Vec<u16>> = if self.ownership.leases_epoch != Some(epoch) {
            self.ownership.leases_epoch = Some(epoch);
            let deadlines = self.vrrp.as_ref().map(|v| v.router.lease_deadlines()).unwrap_or_default();
            let deadlines: BTreeMap<u16, u64> =
                deadlines.into_iter().map(|(id, until)| (id.lease_slot(), to_ns(until))).collect();
            self.dataplane.set_leases(&deadlines, now_ns).map(|r| r.lapsed)
        } else {
            let mut lapsed = Vec::new();
            let mut result = Ok(());
            for id in renewed {
                let until = self.vrrp.as_ref().and_then(|v| v.router.lease_deadline(id));
                let slot = id.lease_slot();
                match self.dataplane.renew_lease(slot, until.map_or(0, to_ns), now_ns) {
                    Ok(true) => lapsed.push(slot),
                    Ok(false) => {}
                    Err(e) => result = Err(e),
                }
            }
            result.map(|()| lapsed)
        };
        // A master found past its lease after another router took over releases it instead.
        let overtaken = self.vrrp.as_mut().map(|v| v.router.take_lapsed()).unwrap_or_default();
        let mut lapsed: BTreeSet<u16> = overtaken.iter().map(|id| id.lease_slot()).collect();
        match renewed_late {
            Ok(slots) => lapsed.extend(slots),
            Err(e) => {
                // Rewrite them all on the next event.
                self.ownership.leases_epoch = None;
                error!(error = %e, "renewing the VIP leases failed");
            }
        }
        for slot in lapsed {
            if let Some(held_back) = self.ownership.lease_log.allow(now) {
                warn!(
                    lease = slot,
                    held_back,
                    "a VIP lease ran out before the agent renewed it (the agent was stalled, frozen or \
                     not running): the data plane stopped claiming its VIPs meanwhile"
                );
            }
            let Some(id) = crate::vrrp::family::InstanceId::from_lease_slot(slot) else { continue };
            self.state.metrics.lease_expiries.get_or_create(&VridLabels::of(id)).inc();
        }
    }

    /// Gratuitous ARPs (unsolicited NAs for IPv6) for VIPs just taken, in the background so the
    /// loop never waits on them.
    pub(super) fn announce(&self, vips: Vec<IpAddr>) {
        let bursts: Vec<(IpAddr, u32, Duration)> = vips
            .into_iter()
            .filter_map(|vip| {
                self.current
                    .plan
                    .vips
                    .get(&vip)
                    .map(|s| (vip, s.announcements.count, s.announcements.interval))
            })
            .filter(|(_, count, _)| *count > 0)
            .collect();
        self.send_announcements(bursts);
    }

    /// Groups the owned VIPs by their group's `garp.refresh` period (after an ownership
    /// change); a new period's first refresh is one period away, since taking over has its own
    /// burst.
    pub(super) fn schedule_announcement_refresh(&mut self, now: Instant) {
        if self.current.config.groups.iter().all(|g| g.announcements.refresh.is_zero()) {
            self.announcing.refresh.clear();
            return;
        }
        let mut by_period: BTreeMap<Duration, Vec<IpAddr>> = BTreeMap::new();
        for vip in &self.ownership.announced {
            if let Some(settings) = self.current.plan.vips.get(vip)
                && !settings.announcements.refresh.is_zero()
            {
                by_period.entry(settings.announcements.refresh).or_default().push(*vip);
            }
        }
        let previous = std::mem::take(&mut self.announcing.refresh);
        self.announcing.refresh = by_period
            .into_iter()
            .map(|(period, vips)| {
                let next = previous.get(&period).map_or(now + period, |(next, _)| *next);
                (period, (next, vips))
            })
            .collect();
    }

    /// `garp.refresh`: while Master, one gratuitous ARP per owned VIP every period.
    pub(super) fn refresh_announcements(&mut self, now: Instant) {
        let mut due = Vec::new();
        for (period, (next, vips)) in &mut self.announcing.refresh {
            if *next <= now {
                *next = now + *period;
                due.extend(vips.iter().map(|vip| (*vip, 1, Duration::ZERO)));
            }
        }
        self.send_announcements(due);
    }

    /// Has the announcer send `count` gratuitous ARPs for each VIP, `pause` apart, out of the
    /// VIP's group's uplink (paced, in the background: see [`crate::announcer`]).
    pub(super) fn send_announcements(&self, bursts: Vec<(IpAddr, u32, Duration)>) {
        let announcements = bursts
            .into_iter()
            .filter_map(|(vip, count, pause)| {
                let interface =
                    self.current.plan.vips.get(&vip).map_or(&self.current.config.interface, |s| &s.interface);
                let uplink = self.uplinks.get(interface)?;
                Some(Announcement {
                    vip,
                    count,
                    pause,
                    socket: uplink.announcements.clone(),
                    mac: uplink.interface.mac,
                })
            })
            .collect();
        self.announcing.announcer.announce(announcements);
    }

    /// The uplink lost or regained its link. Back up, this node announces what it owns again:
    /// while it was cut off, a backup took over and the clients and switches followed it, and
    /// VRRP alone may not bring them back (when the backup hears this master first, it yields
    /// without this master ever hearing it).
    pub(super) fn on_carrier(&mut self, ifindex: u32, up: bool) {
        let Some((name, _)) = self.uplinks.by_name.iter().find(|(_, u)| u.interface.index == ifindex) else {
            return;
        };
        if !up {
            warn!(interface = %name, "the uplink lost its link");
            return;
        }
        let on_it = |vip: &&IpAddr| self.current.plan.vips.get(*vip).is_some_and(|s| s.interface == *name);
        let owned: Vec<IpAddr> = self.ownership.announced.iter().filter(on_it).copied().collect();
        info!(interface = %name, owned = owned.len(), "the uplink has its link again: announcing the owned VIPs");
        self.announce(owned);
    }
}
