//! The connection table: each flow keeps the backend it was given (and its full-NAT source
//! port and next hop); a new flow's backend is its Maglev slot's.

use core::ptr::NonNull;

use lb_common::{
    hash::flow_hash,
    service::{Address, BackendOf, Delivery, Flow, FlowKeyOf, Service},
};

use crate::{family::Family, maps::MAGLEV_RINGS, route};

/// The backend a packet goes to, and its flow's entry when the flow had one.
pub struct Picked<A> {
    pub id: u32,
    pub backend: BackendOf<A>,
    /// The flow's entry in [`FLOWS`] (its cached next hop is refreshed in place); none for a
    /// new flow, which [`Picked::remember`] then records.
    /// (`NonNull`, so that none is a null pointer: an `Option<*mut _>`'s none leaves its
    /// pointer undefined, and a stage handed one reads a register the verifier calls unset.)
    pub(super) entry: Option<NonNull<Flow>>,
}

impl<A: Address> Picked<A> {
    /// The flow's entry, for [`route::cached_lookup`].
    #[inline(always)]
    pub fn entry(&mut self) -> Option<&mut Flow> {
        // SAFETY: a map value, valid while the program runs; LRU eviction only recycles it
        // after an RCU grace period.
        self.entry.map(|f| unsafe { &mut *f.as_ptr() })
    }

    /// Records a new flow with its backend, SNAT port and next hop; a known flow has its entry.
    #[inline(always)]
    pub fn remember<F: Family<Addr = A>>(
        &self,
        flow: &FlowKeyOf<A>,
        snat_port: [u8; 2],
        hop: &route::NextHop,
        now: u64,
    ) {
        if self.entry.is_some() {
            return;
        }
        let mut entry = Flow { backend: self.id, snat_port, ..Flow::default() };
        route::cache(&mut entry, hop, now);
        let _ = F::flows().insert(flow, &entry, 0);
    }

    pub(super) fn snat_port(&self) -> Option<[u8; 2]> {
        // SAFETY: as in `entry`; copied out.
        self.entry.map(|f| unsafe { (*f.as_ptr()).snat_port }).filter(|port| *port != [0, 0])
    }
}

/// The flow's backend: the one it already has if that still exists, else the Maglev choice.
#[inline(always)]
pub(super) fn pick_backend<F: Family>(
    flow: &FlowKeyOf<F::Addr>,
    service: &Service,
) -> Option<Picked<F::Addr>> {
    if let Some(entry) = F::flows().get_ptr_mut(flow) {
        // SAFETY: a map value, read at once.
        let id = unsafe { (*entry).backend };
        if let Some(backend) = F::backends().get(id).copied()
            && Delivery::from_u8(backend.delivery).is_some()
        {
            return Some(Picked { id, backend, entry: NonNull::new(entry) });
        }
    }
    if service.backend_count == 0 || service.ring_size == 0 {
        return None;
    }
    let slot = flow_hash(flow) % service.ring_size;
    // SAFETY: copied out at once; the agent rewrites a slot with one atomic store.
    let pair = unsafe { MAGLEV_RINGS.get_value(&service.ring_id, &(slot / 2)) }.copied()?;
    // Shifted, not indexed: LLVM turns an index into the stack copy into pointer arithmetic
    // (`fp | 4`) that the verifier refuses.
    let packed = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
    let id = (packed >> ((slot & 1) * 32)) as u32;
    let backend = F::backends().get(id).copied()?;
    Delivery::from_u8(backend.delivery)?;
    Some(Picked { id, backend, entry: None })
}
