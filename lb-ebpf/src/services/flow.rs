//! The connection table: each flow keeps the backend it was given (and its full-NAT source
//! port); a new flow's backend is its Maglev slot's.

use lb_common::{
    hash::flow_hash,
    service::{
        Address, BackendOf, ConnectionKeyOf, Delivery, FLOW_CHECK_TICKS, Flow, FlowKeyOf, Service, flow_tick,
    },
};

use crate::{family::IpFamily, maps::MAGLEV_RINGS};

/// The backend a packet goes to, and what its flow's entry said. Plain values, no pointer
/// into the table: IPv6 hands them to a stage of its own through a tail call.
pub struct Picked<A> {
    pub id: u32,
    pub backend: BackendOf<A>,
    /// The service's [`Service::number`], for the flow's key.
    pub service: u16,
    /// Whether the flow has an entry; a new flow is recorded by [`Picked::remember`].
    pub known: bool,
    /// Full NAT's source port from the entry, `[0, 0]` for none.
    pub snat_port: [u8; 2],
    /// Whether the flow's periodic checks are due with this packet (a new flow's are): its
    /// entry's clock was moved on when it was read.
    pub check_due: bool,
}

impl<A: Address> Picked<A> {
    /// Records a new flow with its backend and SNAT port; a known flow has its entry.
    #[inline(always)]
    pub fn remember<F: IpFamily<Addr = A>>(&self, flow: &FlowKeyOf<A>, snat_port: [u8; 2], now: u64) {
        if !self.known {
            record::<F>(flow, self.service, self.id, snat_port, now);
        }
    }

    /// The flow's full-NAT source port, if it has one.
    pub(super) fn snat_port(&self) -> Option<[u8; 2]> {
        Some(self.snat_port).filter(|port| *port != [0, 0])
    }
}

/// Writes `flow`'s entry whole.
#[inline(always)]
pub(super) fn record<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    service: u16,
    id: u32,
    snat_port: [u8; 2],
    now: u64,
) {
    let entry = Flow { backend: id, snat_port, checked: flow_tick(now) };
    let _ = F::flows().insert(&ConnectionKeyOf::of(flow, service), &entry, 0);
}

/// The flow's backend: the one it already has if that still exists, else the Maglev choice.
#[inline(always)]
pub(super) fn pick_backend<F: IpFamily>(
    flow: &FlowKeyOf<F::Addr>,
    service: &Service,
    now: u64,
) -> Option<Picked<F::Addr>> {
    let key = ConnectionKeyOf::of(flow, service.number);
    if let Some(entry) = F::flows().get_ptr_mut(&key) {
        // SAFETY: a map value, copied out at once (eight bytes); LRU eviction only recycles it
        // after an RCU grace period. Only the clock is written back, and only when the checks
        // are due (once per interval per flow): a racing CPU writes the same tick.
        let (found, check_due) = unsafe {
            let found = *entry;
            let tick = flow_tick(now);
            let due = tick.wrapping_sub(found.checked) >= FLOW_CHECK_TICKS;
            if due {
                (*entry).checked = tick;
            }
            (found, due)
        };
        if let Some(backend) = F::backends().get(found.backend).copied()
            && Delivery::from_u8(backend.delivery).is_some()
        {
            return Some(Picked {
                id: found.backend,
                backend,
                service: service.number,
                known: true,
                snat_port: found.snat_port,
                check_due,
            });
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
    Some(Picked { id, backend, service: service.number, known: false, snat_port: [0; 2], check_due: true })
}
