//! Owned VIPs: whether an address is ours to answer for, on which interface, and under
//! which lease.
//!
//! Leases: the agent renews each VRRP instance's lease with every advertisement
//! it sends as master. When the agent dies or freezes, its lease runs out no later than a
//! backup takes over (see the agent's `vrrp::router::Claim`), and from then on this program
//! stops claiming the VIP (ARP, ping) while still forwarding flows that reach it.

use aya_ebpf::{helpers::bpf_ktime_get_ns, maps::HashMap, programs::XdpContext};
use lb_common::maps::{OwnedVip, Vip6Key, VipKey};

use crate::{
    maps::{OWNED_VIPS, OWNED_VIPS6, VIP_LEASES},
    uplink,
};

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

/// Whether `addr` is an owned VIP.
#[inline(always)]
pub fn is_owned(addr: [u8; 4]) -> bool {
    OWNED_VIPS.get_ptr(&VipKey::new(addr)).is_some()
}

/// Owned, only by us, and on the interface the frame came in by: traffic no service takes
/// is dropped rather than left to the kernel (which holds the address too in VIP mode `both`).
#[inline(always)]
pub fn is_owned_exclusively(ctx: &XdpContext, addr: [u8; 4]) -> bool {
    exclusively(ctx, &OWNED_VIPS, &VipKey::new(addr))
}

/// [`is_owned_exclusively`] for an IPv6 VIP.
#[inline(always)]
pub fn is_owned_exclusively6(ctx: &XdpContext, addr: [u8; 16]) -> bool {
    exclusively(ctx, &OWNED_VIPS6, &Vip6Key::new(addr))
}

#[inline(always)]
fn exclusively<K>(ctx: &XdpContext, owned_vips: &HashMap<K, OwnedVip>, key: &K) -> bool {
    // SAFETY: two bytes copied out at once.
    let owned = unsafe { owned_vips.get(key) }.map(|v| (v.kernel_too(), v.uplink));
    owned.is_some_and(|(kernel_too, slot)| !kernel_too && uplink::accepts(ctx, slot))
}
