//! Leases on owned VIPs: the agent renews each VRRP instance's lease with every advertisement
//! it sends as master. When the agent dies or freezes, its lease runs out no later than a
//! backup takes over (see the agent's `vrrp::router::Claim`), and from then on this program
//! stops claiming the VIP (ARP, ping) while still forwarding flows that reach it.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use lb_common::maps::OwnedVip;

use crate::maps::VIP_LEASES;

/// True while `owned` may be claimed: it holds no lease, or its lease has not run out.
#[inline(always)]
pub fn live(owned: &OwnedVip) -> bool {
    if owned.lease == OwnedVip::NO_LEASE {
        return true;
    }
    // SAFETY: a helper without arguments or side effects.
    let now = unsafe { bpf_ktime_get_ns() };
    VIP_LEASES.get(u32::from(owned.lease)).is_some_and(|until| now < *until)
}
