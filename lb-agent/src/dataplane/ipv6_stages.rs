//! The IPv6 service path's stages: programs of their own in the pinned `IPV6_SERVICES` program
//! array, which the uplink program and `lb_xdp6` tail-call (see `lb-ebpf`'s `services::stages6`).

use aya::{
    Ebpf,
    maps::{MapData, ProgramArray},
    programs::Xdp,
};
use lb_common::service::{IPV6_SERVICE_PROGRAMS, IPV6_SERVICE_SLOTS, IPV6_SERVICES};

use crate::error::{Error, Result};

/// Loads the IPv6 service path's programs and puts each in its `IPV6_SERVICES` slot, where
/// the uplink program tail-calls them. The array is pinned with the maps, so a stopped agent's
/// data plane keeps serving IPv6; a new agent puts its own programs in, and empties the slots
/// of an earlier build's stages.
pub fn load_ipv6_path(ebpf: &mut Ebpf) -> Result<()> {
    load_ipv6_stages(ebpf, &IPV6_SERVICE_PROGRAMS)?;
    let mut slots = ipv6_services(ebpf)?;
    for slot in 0..IPV6_SERVICE_SLOTS {
        if !IPV6_SERVICE_PROGRAMS.iter().any(|(used, _)| *used == slot) {
            let _ = slots.clear_index(&slot);
        }
    }
    Ok(())
}

/// Loads each of `stages` (an `IPV6_SERVICES` slot and the program for it) and puts it in its
/// slot, leaving the other slots as they are: [`load_ipv6_path`]'s first half, and how a
/// benchmark loads an earlier build's object, which has fewer stages.
pub fn load_ipv6_stages(ebpf: &mut Ebpf, stages: &[(u32, &'static str)]) -> Result<()> {
    let mut fds = Vec::with_capacity(stages.len());
    for &(slot, name) in stages {
        let program: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(Error::BpfProgram { program: name, source: aya::programs::ProgramError::NotLoaded })?
            .try_into()
            .map_err(|source| Error::BpfProgram { program: name, source })?;
        program.load().map_err(|source| Error::BpfProgram { program: name, source })?;
        let fd = program.fd().map_err(|source| Error::BpfProgram { program: name, source })?;
        let fd = fd.try_clone().map_err(|e| Error::io(format!("duplicating the fd of program {name}"), e))?;
        fds.push((slot, fd));
    }
    let mut slots = ipv6_services(ebpf)?;
    // The pinned array is shared with the running programs: the stages go in before the entry
    // that calls them.
    for (slot, fd) in fds.iter().rev() {
        slots.set(*slot, fd, 0).map_err(|source| Error::BpfMap { map: IPV6_SERVICES, source })?;
    }
    Ok(())
}

/// The `IPV6_SERVICES` array, borrowed, not taken: the object keeps it open (without a pin, the
/// kernel empties a program array when its last open handle goes).
fn ipv6_services(ebpf: &mut Ebpf) -> Result<ProgramArray<&mut MapData>> {
    let map = ebpf.map_mut(IPV6_SERVICES).ok_or(Error::BpfMapMissing(IPV6_SERVICES))?;
    ProgramArray::try_from(map).map_err(|source| Error::BpfMap { map: IPV6_SERVICES, source })
}
