//! The data plane: the embedded BPF object, attached to each uplink, and its maps.
//!
//! Maps and program links are pinned under `<pinPath>/v<layout>/`. A starting agent reuses
//! what it finds there: the maps keep their contents (flows, translations, rings), and the new
//! programs replace the running ones atomically through the pinned links, so forwarding never
//! stops across a restart. A layout change bumps the directory, so incompatible maps are never
//! reused: an agent of a newer layout moves the program links out of the older directory
//! (its program replaces theirs in place, on fresh maps) and removes the rest. A pinned map
//! whose shape differs from this build's (size, key, value, flags) replaces the pinned maps
//! as a whole, so a program never runs with maps of mixed layouts; a counter map (which no
//! other map refers to) is replaced alone.
//!
//! One object serves every uplink: its XDP program is attached to each (links pinned per
//! interface), so all uplinks share the flows and services. `uplinks` gives each a slot,
//! which owned VIPs and services name so that a VIP is served only on its group's uplink.
//!
//! - `flow_tables`: the connection tables' keying, kept across restarts, and an earlier
//!   build's flows converted into them.
//! - `vips`: the owned-VIP map, updated by difference.
//! - `leases`: until when each VRRP instance's VIPs may be claimed without the agent.
//! - `services`: the service, backend, ring and endpoint maps, updated by difference.
//! - `counters`: the per-CPU counters, summed for metrics.
//! - `neighbors`: keeps next hops resolved, so the program can forward without the kernel.
//! - `ring_memory`: Maglev rings written through a memory mapping.
//! - `snat`: full NAT's source ports, expired when idle.
//! - `batch`: whole-batch map writes and reads.
//! - `uplinks`: the uplink map (slots, and this node's address on each).

pub mod batch;
pub mod counters;
pub mod flow_tables;
mod ipv6_stages;
pub mod leases;
pub mod neighbors;
mod pins;
pub mod ring_memory;
pub mod services;
pub mod snat;
pub mod speakers;
pub mod uplinks;
pub mod vips;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::HashMap,
    programs::{
        SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, LinkOrder, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};
use lb_common::{
    maps::{
        ACTION_STATS, OWNED_VIPS, OWNED_VIPS6, REASON_STATS, UPLINKS, VIP_LEASES, VIP_STATS, VIP_STATS6,
        VIP_TRAFFIC, VIP_TRAFFIC6, VRRP_SPEAKERS, VRRP_SPEAKERS6,
    },
    service::{
        BACKEND_STATS, BACKEND_STATS6, BACKENDS, BACKENDS6, ENDPOINT_SERVICES, ENDPOINT_SERVICES6,
        FLOW_TABLE, FLOW_TABLE6, IPV6_SERVICES, LAYOUT_VERSION, LOCAL_ENDPOINTS, LOCAL_ENDPOINTS6,
        MAGLEV_RINGS, NEXT_HOPS, NEXT_HOPS6, REPLY_NAT, REPLY_NAT6, SERVICES, SERVICES6, SETTINGS,
        SNAT_REPLIES, SNAT_REPLIES6, UPLINK_ADDRS6, VIP_FILTER, VIP_FILTER6,
    },
};
use tracing::{info, warn};

use crate::{
    config::{DataplaneConfig, XdpModeSetting},
    error::{Error, Result},
    netdev::Interface,
};

pub use counters::XdpCounters;
pub use ipv6_stages::{load_ipv6_path, load_ipv6_stages};
pub use services::{ServiceMaps, ServiceMapsByFamily};

pub use pins::remove_pins;
use pins::{
    prepare_pin_dir, remove_link_pins, replace_incompatible_maps, take_over_earlier_layouts, tc_pin_name,
    xdp_pin_name,
};

/// The BPF object built by `cargo xtask build-ebpf`, embedded at compile time.
pub static EMBEDDED_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJECT"));

/// The uplink program's name in the object.
pub const UPLINK_PROGRAM: &str = "lb_xdp";
/// A pass-only program for the far end of a veth (see `lb-ebpf`).
pub const PASS_PROGRAM: &str = "lb_pass";
/// The uplink's TC egress program.
pub const REPLY_PROGRAM: &str = "lb_reply";

/// Every map, pinned by name.
pub const PINNED_MAPS: [&str; 36] = [
    OWNED_VIPS,
    OWNED_VIPS6,
    VIP_LEASES,
    VIP_STATS,
    VIP_STATS6,
    VIP_TRAFFIC,
    ACTION_STATS,
    REASON_STATS,
    SERVICES,
    BACKENDS,
    BACKEND_STATS,
    MAGLEV_RINGS,
    FLOW_TABLE,
    NEXT_HOPS,
    REPLY_NAT,
    LOCAL_ENDPOINTS,
    ENDPOINT_SERVICES,
    SETTINGS,
    VRRP_SPEAKERS,
    VRRP_SPEAKERS6,
    UPLINKS,
    SNAT_REPLIES,
    SERVICES6,
    BACKENDS6,
    BACKEND_STATS6,
    VIP_TRAFFIC6,
    FLOW_TABLE6,
    NEXT_HOPS6,
    REPLY_NAT6,
    SNAT_REPLIES6,
    VIP_FILTER,
    VIP_FILTER6,
    LOCAL_ENDPOINTS6,
    ENDPOINT_SERVICES6,
    UPLINK_ADDRS6,
    // Holds the IPv6 path's programs: pinned, so they outlive the agent with the links.
    IPV6_SERVICES,
];

/// Maps no other map refers to, and whose loss costs only counts or what the agent writes
/// again at once: when one differs from this build's, it alone is replaced.
const STANDALONE_MAPS: [&str; 9] = [
    ACTION_STATS,
    REASON_STATS,
    VIP_STATS,
    VIP_STATS6,
    VRRP_SPEAKERS,
    VRRP_SPEAKERS6,
    UPLINKS,
    VIP_FILTER,
    VIP_FILTER6,
];

/// bpffs's magic number (`statfs.f_type`).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// How the program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    Native,
    Skb,
}

impl AttachedMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachedMode::Native => "native",
            AttachedMode::Skb => "skb",
        }
    }
}

/// The loaded object, attached to the uplinks.
pub struct Dataplane {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    /// The attached uplinks, by interface name.
    uplinks: BTreeMap<String, Attached>,
    setting: XdpModeSetting,
    pub verified_instructions: Option<u32>,
    owned_vips: vips::OwnedMaps,
    leases: leases::Leases,
    speakers: speakers::Speakers,
    uplink_map: uplinks::UplinkMap,
    /// IPv4's connection table, then IPv6's, mapped.
    flow_tables: Vec<flow_tables::FlowTable>,
}

/// One uplink's programs.
pub struct Attached {
    pub interface: Interface,
    pub mode: AttachedMode,
    /// True when a running program was taken over rather than attached fresh.
    pub resumed: bool,
    /// XDP, then TC egress, held while attached (their pins keep them attached meanwhile).
    _links: Vec<FdLink>,
}

/// The directory this build pins under.
pub fn pin_dir(pin_path: &Path) -> PathBuf {
    pin_path.join(format!("v{LAYOUT_VERSION}"))
}

impl Dataplane {
    /// Loads the embedded object, with its maps pinned under `pin_path`, ready for
    /// [`Dataplane::attach`]. `interfaces` are the uplinks about to be attached: their links
    /// pinned by an agent of another layout are taken over.
    pub fn load(
        interfaces: &[&str],
        setting: XdpModeSetting,
        pin_path: &Path,
        capacity: &DataplaneConfig,
    ) -> Result<(Self, XdpCounters, ServiceMapsByFamily)> {
        let pin_dir = pin_dir(pin_path);
        prepare_pin_dir(&pin_dir)?;
        take_over_earlier_layouts(pin_path, &pin_dir, interfaces)?;
        let sizes = map_sizes(capacity);
        replace_incompatible_maps(&pin_dir, &sizes)?;
        let headers = [capacity.capacity.flows, capacity.capacity6.flows]
            .iter()
            .zip(flow_tables::TABLES)
            .map(|(flows, names)| flow_tables::header_for(&pin_dir.join(names.table), *flows))
            .collect::<Result<Vec<_>>>()?;
        let mut loader = EbpfLoader::new();
        for (name, size) in &sizes {
            loader.map_max_entries(name, *size);
        }
        for (header, names) in headers.iter().zip(flow_tables::TABLES) {
            loader.override_global(names.keying_global, &header.keying, true);
        }
        for name in lb_common::service::bench::BENCH_TABLES {
            loader.map_max_entries(name, 1);
        }
        let map_pins: Vec<(&str, PathBuf)> = PINNED_MAPS.iter().map(|m| (*m, pin_dir.join(m))).collect();
        for (name, path) in &map_pins {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(EMBEDDED_OBJECT)?;
        let program = uplink_program(&mut ebpf)?;
        program.load().map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
        let verified_instructions = program.info().ok().and_then(|i| i.verified_instruction_count());
        reply_program(&mut ebpf)?
            .load()
            .map_err(|source| Error::BpfProgram { program: REPLY_PROGRAM, source })?;
        load_ipv6_path(&mut ebpf)?;

        let owned_vips = vips::OwnedMaps {
            v4: HashMap::try_from(take_map(&mut ebpf, OWNED_VIPS)?)
                .map_err(|source| Error::BpfMap { map: OWNED_VIPS, source })?,
            v6: HashMap::try_from(take_map(&mut ebpf, OWNED_VIPS6)?)
                .map_err(|source| Error::BpfMap { map: OWNED_VIPS6, source })?,
            held: None,
        };
        let leases = leases::Leases::take(take_map(&mut ebpf, VIP_LEASES)?)?;
        let speakers = speakers::Speakers::take(
            take_map(&mut ebpf, VRRP_SPEAKERS)?,
            take_map(&mut ebpf, VRRP_SPEAKERS6)?,
        )?;
        let uplink_map = uplinks::UplinkMap::take(&mut ebpf)?;
        let counters = XdpCounters::take(&mut ebpf)?;
        let flow_tables = headers
            .iter()
            .zip(flow_tables::TABLES)
            .map(|(header, names)| {
                let map = take_map(&mut ebpf, names.table)?;
                let aya::maps::Map::Array(data) = &map else { return Err(Error::BpfMapMissing(names.table)) };
                flow_tables::FlowTable::initialize(data, *header)
            })
            .collect::<Result<Vec<_>>>()?;
        let services = ServiceMapsByFamily::take(&mut ebpf, Some(&pin_dir))?;
        let dataplane = Self {
            ebpf,
            pin_dir,
            uplinks: BTreeMap::new(),
            setting,
            verified_instructions,
            owned_vips,
            leases,
            speakers,
            uplink_map,
            flow_tables,
        };
        Ok((dataplane, counters, services))
    }

    /// Attaches the programs to `interface`: through its pinned links when a previous agent
    /// left them (the new programs replace the running ones in place), else fresh.
    ///
    /// `Auto` tries native mode first and falls back to generic SKB mode with a warning, since
    /// not every driver supports native XDP and a slow data plane beats none.
    pub fn attach(&mut self, interface: &Interface) -> Result<&Attached> {
        let pin_dir = self.pin_dir.clone();
        let xdp_pin = |mode: AttachedMode| pin_dir.join(xdp_pin_name(&interface.name, mode));
        let program = uplink_program(&mut self.ebpf)?;
        let mut resumed_xdp = None;
        for mode in [AttachedMode::Native, AttachedMode::Skb] {
            let Ok(pinned) = PinnedLink::from_pin(xdp_pin(mode)) else { continue };
            match replace_xdp(program, pinned) {
                Ok(link) if resumed_xdp.is_none() => resumed_xdp = Some((link, mode)),
                Ok(_) => warn!(interface = %interface.name, "two pinned XDP links; keeping the first"),
                Err(e) => {
                    warn!(interface = %interface.name, error = %e, "the pinned XDP link is unusable; attaching afresh");
                    let _ = std::fs::remove_file(xdp_pin(mode));
                }
            }
        }
        let resumed = resumed_xdp.is_some();
        let (xdp_link, mode) = match resumed_xdp {
            Some(found) => found,
            None => {
                let (link, mode) = attach_xdp(program, interface, self.setting)?;
                (pin(link, &xdp_pin(mode))?, mode)
            }
        };
        let tc_link = attach_reply(&mut self.ebpf, interface, &pin_dir.join(tc_pin_name(&interface.name)))?;
        info!(
            interface = %interface.name,
            mode = mode.as_str(),
            verified_instructions = self.verified_instructions,
            resumed,
            pins = %pin_dir.display(),
            "XDP attached"
        );
        let attached =
            Attached { interface: interface.clone(), mode, resumed, _links: vec![xdp_link, tc_link] };
        self.uplinks.insert(interface.name.clone(), attached);
        Ok(&self.uplinks[&interface.name])
    }

    /// Detaches the programs from `name` (an uplink no group uses any more): removes its link
    /// pins and hands back its links, whose last close detaches the programs. That close waits
    /// for the kernel (RTNL, an RCU grace period), so the caller drops them where a wait costs
    /// nothing, not in the VRRP loop.
    pub fn detach(&mut self, name: &str) -> Result<Option<Attached>> {
        let Some(attached) = self.uplinks.remove(name) else { return Ok(None) };
        remove_link_pins(&self.pin_dir, |interface| interface == name)?;
        Ok(Some(attached))
    }

    /// Converts the flows an earlier build kept in `FLOWS`/`FLOWS6` into the connection tables
    /// (see [`flow_tables::convert_earlier`]); run once every uplink runs this build's program.
    pub fn convert_earlier_flows(&self) {
        use lb_common::service::{Addr4, Addr6};
        flow_tables::convert_earlier::<Addr4>(&self.pin_dir, flow_tables::TABLES[0], &self.flow_tables[0]);
        flow_tables::convert_earlier::<Addr6>(&self.pin_dir, flow_tables::TABLES[1], &self.flow_tables[1]);
    }

    /// The pins of the connection tables being migrated, for [`flow_tables::end_migrations`].
    pub fn migrating_flow_tables(&self) -> Vec<PathBuf> {
        self.flow_tables
            .iter()
            .zip(flow_tables::TABLES)
            .filter(|(table, _)| table.header.migrating)
            .map(|(_, names)| self.pin_dir.join(names.table))
            .collect()
    }

    /// Removes the link pins of interfaces that are not attached now: left by an earlier run
    /// whose config had uplinks this one has not.
    pub fn detach_strays(&self) -> Result<()> {
        remove_link_pins(&self.pin_dir, |interface| {
            let stray = !self.uplinks.contains_key(interface);
            if stray {
                warn!(
                    interface,
                    "an earlier run left XDP attached to an interface no group uses now: detaching"
                );
            }
            stray
        })
    }

    /// How `name` is attached, for labels ("none" when it is not).
    pub fn mode_of(&self, name: &str) -> &'static str {
        self.uplinks.get(name).map_or("none", |a| a.mode.as_str())
    }

    /// The attached uplinks, by interface name.
    pub fn uplinks(&self) -> &BTreeMap<String, Attached> {
        &self.uplinks
    }

    /// Makes the uplink map hold `wanted`, touching only entries that differ.
    pub fn set_uplinks(
        &mut self,
        wanted: &uplinks::UplinkSet,
        wanted6: &uplinks::Uplink6Set,
        own6: &uplinks::Uplink6Set,
    ) -> Result<()> {
        self.uplink_map.apply(wanted, wanted6, own6)
    }

    /// Makes the owned-VIP map equal `desired`, touching only entries that differ.
    pub fn set_owned_vips(&mut self, desired: &vips::OwnedSet) -> Result<vips::Applied> {
        vips::apply(&mut self.owned_vips, desired)
    }
    /// Makes the lease map hold `deadlines` (slot → CLOCK_MONOTONIC ns), writing what moved.
    pub fn set_leases(&mut self, deadlines: &BTreeMap<u16, u64>, now_ns: u64) -> Result<leases::Renewed> {
        self.leases.apply(deadlines, now_ns)
    }

    /// Writes one lease slot's deadline if it moved; true when it renews a lease that had run out.
    pub fn renew_lease(&mut self, slot: u16, deadline: u64, now_ns: u64) -> Result<bool> {
        self.leases.set(slot, deadline, now_ns)
    }

    /// How long lease `slot` still runs, if one is written.
    pub fn lease_remaining(&self, slot: u16, now_ns: u64) -> Option<std::time::Duration> {
        self.leases.remaining(slot, now_ns)
    }

    /// VRRP sources heard from another MAC than their learned one (see [`speakers`]).
    pub fn impersonations(&self) -> Vec<speakers::Impersonation> {
        self.speakers.impersonations()
    }

    /// Detaches the programs and deletes every pin, so nothing of the data plane remains.
    pub fn remove(mut self) -> Result<()> {
        let names: Vec<String> = self.uplinks.keys().cloned().collect();
        self.uplinks.clear();
        remove_pins(&self.pin_dir)?;
        info!(interfaces = %names.join(", "), "XDP detached");
        Ok(())
    }

    /// Leaves the programs attached and the maps pinned for the next agent.
    pub fn keep(self) {
        let names: Vec<&str> = self.uplinks.keys().map(String::as_str).collect();
        info!(interfaces = %names.join(", "), pins = %self.pin_dir.display(), "leaving the data plane running");
    }
}

/// The maps whose size `dataplane.capacity` sets. `MAGLEV_RINGS` holds twice the services:
/// a replaced ring stays registered until the sync has switched every service over.
/// `VIP_TRAFFIC` has a slot per service entry, so VIPs never outnumber its slots.
/// `SNAT_REPLIES` holds as many reply translations as `REPLY_NAT`.
/// The IPv6 maps take `capacity6`'s sizes. The rings of both families share `MAGLEV_RINGS`,
/// whose size stays twice `capacity.services` (`capacity6.services` is half of that by
/// default, which leaves room for replacements): a pinned map of another size would make an
/// upgrade replace every map, connections' state included.
pub fn map_sizes(config: &DataplaneConfig) -> [(&'static str, u32); 21] {
    let (capacity, six) = (&config.capacity, &config.capacity6);
    [
        (SERVICES, capacity.services),
        (VIP_TRAFFIC, capacity.services),
        (MAGLEV_RINGS, capacity.services.saturating_mul(2)),
        (BACKENDS, capacity.backends),
        (BACKEND_STATS, capacity.backends),
        (NEXT_HOPS, capacity.backends),
        (FLOW_TABLE, flow_tables::table_entries(capacity.flows)),
        (REPLY_NAT, capacity.reply_nat),
        (SNAT_REPLIES, capacity.reply_nat),
        (LOCAL_ENDPOINTS, capacity.local_endpoints),
        (ENDPOINT_SERVICES, capacity.local_endpoints),
        (SERVICES6, six.services),
        (VIP_TRAFFIC6, six.services),
        (BACKENDS6, six.backends),
        (BACKEND_STATS6, six.backends),
        (NEXT_HOPS6, six.backends),
        (FLOW_TABLE6, flow_tables::table_entries(six.flows)),
        (REPLY_NAT6, six.reply_nat),
        (SNAT_REPLIES6, six.reply_nat),
        (LOCAL_ENDPOINTS6, six.local_endpoints),
        (ENDPOINT_SERVICES6, six.local_endpoints),
    ]
}

fn replace_xdp(program: &mut Xdp, pinned: PinnedLink) -> Result<FdLink> {
    let link = XdpLink::try_from(FdLink::from(pinned))
        .map_err(|source| Error::BpfLink { program: UPLINK_PROGRAM, source })?;
    let id = program
        .attach_to_link(link)
        .map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
    let link =
        program.take_link(id).map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
    FdLink::try_from(link).map_err(|source| Error::BpfLink { program: UPLINK_PROGRAM, source })
}

fn attach_xdp(
    program: &mut Xdp,
    interface: &Interface,
    setting: XdpModeSetting,
) -> Result<(FdLink, AttachedMode)> {
    let (id, mode) = match setting {
        XdpModeSetting::Native => {
            (attach_in(program, interface, AttachedMode::Native)?, AttachedMode::Native)
        }
        XdpModeSetting::Skb => (attach_in(program, interface, AttachedMode::Skb)?, AttachedMode::Skb),
        XdpModeSetting::Auto => match attach_in(program, interface, AttachedMode::Native) {
            Ok(link) => (link, AttachedMode::Native),
            Err(e) => {
                warn!(interface = %interface.name, error = %e, "native XDP unavailable, falling back to SKB mode");
                (attach_in(program, interface, AttachedMode::Skb)?, AttachedMode::Skb)
            }
        },
    };
    let link =
        program.take_link(id).map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
    let link = FdLink::try_from(link).map_err(|source| Error::BpfLink { program: UPLINK_PROGRAM, source })?;
    Ok((link, mode))
}

/// Attaches (or, through its pin, replaces) the TC egress program that translates replies.
fn attach_reply(ebpf: &mut Ebpf, interface: &Interface, pin_path: &Path) -> Result<FdLink> {
    let program_err = |source| Error::BpfProgram { program: REPLY_PROGRAM, source };
    let link_err = |source| Error::BpfLink { program: REPLY_PROGRAM, source };
    let program = reply_program(ebpf)?;
    if let Ok(pinned) = PinnedLink::from_pin(pin_path) {
        let replaced = SchedClassifierLink::try_from(FdLink::from(pinned))
            .map_err(link_err)
            .and_then(|link| program.attach_to_link(link).map_err(program_err))
            .and_then(|id| program.take_link(id).map_err(program_err));
        match replaced {
            Ok(link) => return FdLink::try_from(link).map_err(link_err),
            Err(e) => {
                warn!(interface = %interface.name, error = %e, "the pinned TC link is unusable; attaching afresh");
                let _ = std::fs::remove_file(pin_path);
            }
        }
    }
    let id = program
        .attach_with_options(
            &interface.name,
            TcAttachType::Egress,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        )
        .map_err(program_err)?;
    let link = program.take_link(id).map_err(program_err)?;
    pin(FdLink::try_from(link).map_err(link_err)?, pin_path)
}

fn reply_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier> {
    ebpf.program_mut(REPLY_PROGRAM)
        .ok_or(Error::BpfProgram { program: REPLY_PROGRAM, source: aya::programs::ProgramError::NotLoaded })?
        .try_into()
        .map_err(|source| Error::BpfProgram { program: REPLY_PROGRAM, source })
}

fn pin(link: FdLink, path: &Path) -> Result<FdLink> {
    link.pin(path).map(FdLink::from).map_err(|e| Error::Pin { path: path.to_owned(), reason: e.to_string() })
}

fn uplink_program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    let program = ebpf.program_mut(UPLINK_PROGRAM).ok_or(Error::BpfProgram {
        program: UPLINK_PROGRAM,
        source: aya::programs::ProgramError::NotLoaded,
    })?;
    program.try_into().map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })
}

fn attach_in(
    program: &mut Xdp,
    interface: &Interface,
    mode: AttachedMode,
) -> Result<aya::programs::xdp::XdpLinkId> {
    let flags = match mode {
        AttachedMode::Native => XdpMode::Driver,
        AttachedMode::Skb => XdpMode::Skb,
    };
    program.attach_to_if_index(interface.index, flags).map_err(|source| Error::XdpAttach {
        interface: interface.name.clone(),
        mode: mode.as_str(),
        source,
    })
}

pub(crate) fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).ok_or(Error::BpfMapMissing(name))
}
