//! The XDP data plane: the embedded BPF object, attaching it to the uplink, and its maps.
//!
//! - `vips`: the owned-VIP map, updated by difference.
//! - `counters`: the per-CPU counters, summed for metrics.

pub mod counters;
pub mod vips;

use aya::{
    Ebpf,
    maps::{HashMap, MapData},
    programs::{Xdp, XdpMode, xdp::XdpLinkId},
};
use lb_common::maps::{OWNED_VIPS, OwnedVip, VipKey};
use tracing::{info, warn};

use crate::{
    config::XdpModeSetting,
    error::{Error, Result},
    netdev::Interface,
};

pub use counters::XdpCounters;

/// The BPF object built by `cargo xtask build-ebpf`, embedded at compile time.
pub static EMBEDDED_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJECT"));

/// The uplink program's name in the object.
pub const UPLINK_PROGRAM: &str = "lb_xdp";
/// A pass-only program for the far end of a veth (see `lb-ebpf`).
pub const PASS_PROGRAM: &str = "lb_pass";

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

/// The loaded object, attached to the uplink. Dropping it detaches the program.
pub struct Dataplane {
    ebpf: Ebpf,
    link: Option<XdpLinkId>,
    pub interface: Interface,
    pub mode: AttachedMode,
    pub verified_instructions: Option<u32>,
    owned_vips: HashMap<MapData, VipKey, OwnedVip>,
}

impl Dataplane {
    /// Loads the embedded object and attaches `lb_xdp` to `interface`.
    ///
    /// `Auto` tries native mode first and falls back to generic SKB mode with a warning, since
    /// not every driver supports native XDP and a slow data plane beats none.
    pub fn attach(interface: &Interface, setting: XdpModeSetting) -> Result<(Self, XdpCounters)> {
        let mut ebpf = Ebpf::load(EMBEDDED_OBJECT)?;
        let program = uplink_program(&mut ebpf)?;
        program.load().map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
        let verified_instructions = program.info().ok().and_then(|i| i.verified_instruction_count());

        let (link, mode) = match setting {
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
        info!(interface = %interface.name, mode = mode.as_str(), verified_instructions, "XDP attached");

        let owned_vips = HashMap::try_from(take_map(&mut ebpf, OWNED_VIPS)?)
            .map_err(|source| Error::BpfMap { map: OWNED_VIPS, source })?;
        let counters = XdpCounters::take(&mut ebpf)?;
        let dataplane = Self {
            ebpf,
            link: Some(link),
            interface: interface.clone(),
            mode,
            verified_instructions,
            owned_vips,
        };
        Ok((dataplane, counters))
    }

    /// Makes the owned-VIP map equal `desired`, touching only entries that differ.
    pub fn set_owned_vips(&mut self, desired: &vips::OwnedSet) -> Result<vips::Applied> {
        vips::apply(&mut self.owned_vips, desired)
    }

    /// Detaches the program from the uplink now, rather than at drop.
    pub fn detach(&mut self) -> Result<()> {
        if let Some(link) = self.link.take() {
            uplink_program(&mut self.ebpf)?
                .detach(link)
                .map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })?;
            info!(interface = %self.interface.name, "XDP detached");
        }
        Ok(())
    }
}

fn uplink_program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    let program = ebpf.program_mut(UPLINK_PROGRAM).ok_or(Error::BpfProgram {
        program: UPLINK_PROGRAM,
        source: aya::programs::ProgramError::NotLoaded,
    })?;
    program.try_into().map_err(|source| Error::BpfProgram { program: UPLINK_PROGRAM, source })
}

fn attach_in(program: &mut Xdp, interface: &Interface, mode: AttachedMode) -> Result<XdpLinkId> {
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
