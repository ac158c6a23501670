//! A new config (SIGHUP, or from the cluster): checked, its restart-only settings kept at their
//! running values (one table, `RESTART_ONLY`, drives the warning and the carry-over), handed to
//! the service sync, and committed to VRRP and ownership once its services are in the maps.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::{
    config::{Config, ConfigError},
    metrics::{ErrorLabels, GroupLabels, MemberLabels, ResultLabels, VridLabels, XdpLabels},
    node_plan::{NodePlan, node_plan},
    service_sync::SyncRequest,
    uplinks,
    vrrp::router::InstanceSpec,
    vrrp_driver::drop_off_loop,
};

use super::{
    Agent,
    startup::{attach, check_key_files, node_address_field, write_uplink_map},
};

/// A setting the running agent cannot change: a reload that changes it is warned about and
/// keeps the running value.
struct RestartOnly {
    /// As the config file names it.
    field: &'static str,
    /// Whether the new config's value differs from the running one.
    differs: fn(&Config, &Config) -> bool,
    /// Puts the running value into the new config.
    keep: fn(&mut Config, &Config),
}

/// `field => path` pairs into [`RestartOnly`] entries.
macro_rules! restart_only {
    ($($field:literal => $($path:ident).+),* $(,)?) => {
        &[$(RestartOnly {
            field: $field,
            differs: |new, running| new.$($path).+ != running.$($path).+,
            keep: |new, running| new.$($path).+ = running.$($path).+.clone(),
        }),*]
    };
}

/// Every restart-only setting (the per-interface `nodeAddresses` and `nodeAddresses6` aside:
/// the uplinks keep theirs, see [`Agent::apply_config`]).
const RESTART_ONLY: &[RestartOnly] = restart_only![
    "interface" => interface,
    "xdpMode" => xdp_mode,
    "listen" => listen,
    "adminSocket" => admin_socket,
    "node" => node,
    "nodeAddress" => node_address,
    "nodeAddress6" => node_address6,
    "dataplane.pinPath" => dataplane.pin_path,
    "dataplane.capacity" => dataplane.capacity,
    "dataplane.capacity6" => dataplane.capacity6,
    "routes.device" => routes.device,
    "routes.protocol" => routes.protocol,
    "routes.holdTime" => routes.hold_time,
    "routes.restartWindow" => routes.restart_window,
];

impl Agent {
    /// SIGHUP. A config that fails to validate leaves everything running as it was.
    pub(super) async fn reload(&mut self) {
        if self.cluster.is_some() {
            warn!(
                "SIGHUP ignored: with --kubernetes the cluster is the source of groups and services; restart to change agent settings"
            );
            return;
        }
        let new = match Config::load(&self.current.config_path) {
            Ok(mut new) => {
                self.current.overrides.apply(&mut new);
                new
            }
            Err(e) => {
                error!(error = %e, "SIGHUP: config rejected, keeping the running config");
                self.count_reload("rejected");
                self.count_error("config_reload", e.metric_label());
                return;
            }
        };
        if let Err((field, expected)) = check_key_files(&new, &self.current.node) {
            let error = ConfigError::new(field, expected);
            error!(%error, "SIGHUP: config rejected, keeping the running config");
            self.count_reload("rejected");
            self.count_error("config_reload", "config");
            return;
        }
        self.apply_config(new).await;
    }

    pub(super) fn count_reload(&self, result: &'static str) {
        self.state.metrics.config_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    fn count_error(&self, during: &'static str, error: &'static str) {
        self.state.metrics.errors.get_or_create(&ErrorLabels { during, error }).inc();
    }

    /// A new config, from the file (SIGHUP) or the cluster: applied by difference, or
    /// rejected whole with the running one kept.
    pub(super) async fn apply_config(&mut self, mut new: Config) {
        // An endpoint change (most cluster events) leaves groups and VIPs as they were: their
        // plan is kept, and nothing VRRP runs is touched.
        let (latest, latest_plan) = self
            .service_sync
            .pending
            .as_ref()
            .map_or((&self.current.config, &self.current.plan), |(_, config, plan)| (config, plan));
        let plan_kept = new.groups == latest.groups && new.vips == latest.vips;
        let new_plan =
            if plan_kept { latest_plan.clone() } else { Arc::new(node_plan(&new, &self.current.node)) };
        for setting in RESTART_ONLY {
            if (setting.differs)(&new, &self.current.config) {
                warn!(field = setting.field, "this only takes effect on restart; keeping the running value");
            }
        }
        let moved4 = new.node_addresses.iter().filter_map(|(interface, address)| {
            let moved = self.uplinks.get(interface).is_some_and(|u| u.node_address != *address);
            moved.then(|| format!("nodeAddresses.{interface}"))
        });
        let moved6 = new.node_addresses6.iter().filter_map(|(interface, address)| {
            let moved = self.uplinks.get(interface).is_some_and(|u| u.node_address6 != Some(*address));
            moved.then(|| format!("nodeAddresses6.{interface}"))
        });
        for field in moved4.chain(moved6) {
            warn!(%field, "this only takes effect on restart; keeping the running value");
        }
        // New uplinks are attached and their VRRP sockets opened now, so that a config this
        // node cannot serve is refused whole; uplinks it leaves go once it has handed over.
        let slots_before = self.uplinks.slots.clone();
        if let Err(error) = self.add_uplinks(&new, &new_plan).await {
            error!(%error, "config rejected, keeping the running config");
            self.count_reload("rejected");
            return;
        }
        for setting in RESTART_ONLY {
            (setting.keep)(&mut new, &self.current.config);
        }
        let config = Arc::new(new);
        let generation = self.service_sync.requests.borrow().generation + 1;
        // An endpoint change (most cluster events) keeps the VIPs and their uplinks: the map
        // of 10,000 VIPs is not rebuilt, and the sync task sees the same one.
        if !plan_kept || self.uplinks.slots != slots_before {
            self.ownership.vip_uplinks = self.uplinks.vip_slots(&config, &new_plan);
        }
        self.service_sync.requests.send_replace(SyncRequest {
            config: config.clone(),
            node: self.current.node.clone(),
            node_address: self.current.node_address,
            vip_uplinks: self.ownership.vip_uplinks.clone(),
            generation,
        });
        self.service_sync.pending = Some((generation, config, new_plan));
        self.count_reload("applied");
    }

    /// Resolves and attaches the uplinks `plan` adds, opens the VRRP sockets it needs, and
    /// gives the new uplinks slots. On an error nothing is left added.
    pub(super) async fn add_uplinks(
        &mut self,
        config: &Config,
        plan: &NodePlan,
    ) -> std::result::Result<(), String> {
        let known: BTreeSet<String> = self.uplinks.by_name.keys().cloned().collect();
        let found = uplinks::resolve(&self.netlink, config, plan, &known)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let index = |name: &str| {
            found.get(name).or_else(|| self.uplinks.get(name)).map(crate::uplinks::Uplinks::vrrp_link)
        };
        let sockets = match &self.vrrp {
            Some(vrrp) => vrrp.open_missing(plan, index).map_err(|((interface, family), expected)| {
                ConfigError::new(node_address_field(config, &self.current.node, &interface, family), expected)
                    .to_string()
            })?,
            None => BTreeMap::new(),
        };
        let mut attached = Vec::new();
        for (name, uplink) in &found {
            match attach(&mut self.dataplane, &self.state.metrics.xdp_attached, &uplink.interface) {
                Ok(true) => attached.push(uplink.interface.name.clone()),
                Ok(false) => {}
                Err(e) => {
                    for name in attached {
                        drop_off_loop(self.dataplane.detach(&name));
                    }
                    return Err(format!("attaching XDP to {name}: {}", crate::error::with_causes(&e)));
                }
            }
        }
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.sockets.extend(sockets);
        }
        if found.is_empty() {
            return Ok(());
        }
        self.uplinks.by_name.extend(found);
        if let Err(e) = write_uplink_map(&mut self.uplinks, &mut self.dataplane, plan) {
            error!(error = %e, "writing the uplink map failed");
        }
        Ok(())
    }

    /// Detaches from the uplinks the plan no longer uses, once their VIPs are gone from them
    /// (the uplink map is written after, by the caller).
    pub(super) fn retire_uplinks(&mut self) {
        let leaving: Vec<String> = self
            .uplinks
            .by_name
            .keys()
            .filter(|n| !self.current.plan.uplinks.contains(*n))
            .cloned()
            .collect();
        if leaving.is_empty() {
            return;
        }
        for name in &leaving {
            let Some(uplink) = self.uplinks.by_name.remove(name) else { continue };
            let device = uplink.interface.name;
            // The parent of a VLAN stays attached while another uplink (it, or a VLAN) uses it.
            if self.uplinks.by_name.values().any(|u| u.interface.name == device) {
                continue;
            }
            let mode = self.dataplane.mode_of(&device);
            self.state.metrics.xdp_attached.remove(&XdpLabels { interface: device.clone(), mode });
            match self.dataplane.detach(&device) {
                Ok(links) => drop_off_loop(links),
                Err(e) => error!(interface = %device, error = %e, "detaching XDP failed"),
            }
        }
        info!(interfaces = %leaving.join(", "), "no group uses these uplinks any more: detached");
    }

    /// Brings the VRRP instances to the plan. Each instance's lease-expiry counter starts at
    /// zero, so that its first expiry is an increase Prometheus can see.
    pub(super) fn reconfigure_vrrp(&mut self) {
        for spec in &self.current.plan.instances {
            let _ = self.state.metrics.lease_expiries.get_or_create(&VridLabels::of(spec.id()));
            for member in spec.peers.iter().chain(self.current.plan.locals.values()) {
                let _ = self
                    .state
                    .metrics
                    .impersonations
                    .get_or_create(&MemberLabels { member: member.to_string() });
            }
        }
        self.current.keys.refresh(self.current.plan.key_files.values());
        let specs = self.keyed_instances();
        if let Some(vrrp) = &mut self.vrrp {
            let out = vrrp.router.reconfigure(Instant::now().into_std(), specs);
            vrrp.send(&out);
        }
    }

    /// The plan's instances with their groups' keys; those of a group whose key file was never
    /// readable are left out (their absence is logged by [`KeyFiles`] and exported).
    pub(super) fn keyed_instances(&self) -> Vec<InstanceSpec> {
        for (group, path) in &self.current.plan.key_files {
            let loaded = self.current.keys.keys(path).map_or(0, |k| k.key_ids().len());
            self.state
                .metrics
                .authentication_keys
                .get_or_create(&GroupLabels { group: group.clone() })
                .set(loaded as i64);
        }
        self.current
            .plan
            .instances
            .iter()
            .filter_map(|spec| match self.current.plan.key_files.get(&spec.group) {
                None => Some(spec.clone()),
                Some(path) => {
                    Some(InstanceSpec { keys: Some(self.current.keys.keys(path)?), ..spec.clone() })
                }
            })
            .collect()
    }

    /// Follows a config whose services are in the maps: VRRP instances and owned VIPs. The
    /// slower rest, which no VIP waits on, is left to [`Agent::tidy_after_commit`] on the
    /// loop's next turn, so that advertisements that fell due meanwhile go out first: a
    /// loaded host can take a tenth of a second for each half, and a master's lease is three
    /// advertisement intervals (a group left alone by the new plan must not lapse).
    pub(super) async fn commit_config(&mut self, config: Arc<Config>, plan: Arc<NodePlan>) {
        self.current.config = config;
        if Arc::ptr_eq(&plan, &self.current.plan) {
            return;
        }
        let started = Instant::now();
        self.current.plan = plan;
        self.log_plan();
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.router.set_locals(self.current.plan.locals.clone());
        }
        self.reconfigure_vrrp();
        let reconfigured = started.elapsed();
        if let Some(vrrp) = &mut self.vrrp {
            vrrp.close_unused_sockets(&self.current.plan);
        }
        self.ownership.applied_epoch = None;
        self.apply_ownership().await;
        self.service_sync.tidy_pending = true;
        debug!(?reconfigured, applied = ?started.elapsed(), "new plan committed");
    }

    /// The committed plan's tidying: the per-VIP counters of VIPs it dropped, the uplinks it
    /// left (their VIPs are gone from them already), and the uplink map.
    pub(super) fn tidy_after_commit(&mut self) {
        let started = Instant::now();
        self.service_sync.tidy_pending = false;
        self.prune_vip_counters();
        self.retire_uplinks();
        // The uplinks left, and this node's VRRP addresses on those that stay, as planned now.
        if let Err(e) = write_uplink_map(&mut self.uplinks, &mut self.dataplane, &self.current.plan) {
            error!(error = %e, "writing the uplink map failed");
        }
        debug!(elapsed = ?started.elapsed(), "committed plan tidied");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restart_only_setting_is_noticed_and_kept_and_nothing_else() {
        let running = Config::parse("interface: eth0\n").unwrap();
        let new = Config::parse(
            "interface: eth1\nxdpMode: skb\nlisten: 127.0.0.1:9999\nadminSocket: /run/x.sock\nnode: n9\n\
             nodeAddress: 192.0.2.9\nnodeAddress6: '2001:db8::9'\ndataplane: {pinPath: /sys/fs/bpf/x, capacity: {services: 100}, capacity6: {services: 100}, keepOnExit: false}\n\
             routes: {device: vips9, protocol: 210, holdTime: 9s, restartWindow: 90s, drain: 9s}\n",
        )
        .unwrap();
        for setting in RESTART_ONLY {
            assert!((setting.differs)(&new, &running), "{} is not told apart", setting.field);
        }
        let mut kept = new.clone();
        for setting in RESTART_ONLY {
            (setting.keep)(&mut kept, &running);
        }
        for setting in RESTART_ONLY {
            assert!(!(setting.differs)(&kept, &running), "{} is not kept", setting.field);
        }
        // What a reload may change is the new config's.
        assert_eq!(kept.routes.drain, new.routes.drain);
        assert_eq!(kept.dataplane.keep_on_exit, new.dataplane.keep_on_exit);
        let reloadable = |c: &Config| Config {
            interface: String::new(),
            xdp_mode: running.xdp_mode,
            listen: running.listen,
            admin_socket: Default::default(),
            node: None,
            node_address: None,
            node_address6: None,
            dataplane: Default::default(),
            routes: Default::default(),
            ..c.clone()
        };
        assert_eq!(reloadable(&kept), reloadable(&new));
    }
}
