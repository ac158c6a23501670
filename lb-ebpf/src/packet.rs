//! Bounds-checked views into the packet, in the shape the verifier accepts.

use aya_ebpf::programs::XdpContext;

/// A pointer to a `T` at `offset`, or `None` when the packet is too short to hold it.
#[inline(always)]
pub fn header<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// The frame's length in bytes.
#[inline(always)]
pub fn len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}
