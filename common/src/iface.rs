//! The per-interface fast path of the TC programs: the `IPQ_IFACES` array.
//!
//! Nearly every packet of a pod carries one of the pod's own addresses. The agent writes, for each
//! workload interface, the addresses it holds without any conflict into a slot of a plain array
//! indexed by `ifindex % IFACE_SLOTS`, which the verifier turns into pointer arithmetic. A packet
//! whose address is found in its interface's slot passes without a hash lookup. The slot is a
//! cache: on a miss (another interface in the slot, or an address not listed) the program falls
//! back to the `IPQ_ADDRS` hash map, which is always authoritative.

use crate::addr::AddrKey;

/// Slots in `IPQ_IFACES` (a power of two). Interfaces whose ifindex collide share a slot; the
/// agent gives it to one of them, and the others take the hash-map path.
pub const IFACE_SLOTS: u32 = 4096;

/// Own addresses one slot can list; more addresses of one interface take the hash-map path.
pub const IFACE_OWN_ADDRS: usize = 4;

#[inline(always)]
pub const fn iface_slot(ifindex: u32) -> u32 {
    ifindex & (IFACE_SLOTS - 1)
}

/// Value of `IPQ_IFACES`. Unused address slots are [`AddrKey::UNSPECIFIED`], which no packet
/// address that matters can equal (`::` is never registered).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct IfaceEntry {
    /// The interface this slot describes; 0 for an empty slot.
    pub ifindex: u32,
    /// Reserved; zero.
    pub _reserved: u32,
    /// Addresses this interface holds with no conflict: no fence, no other holder.
    pub own: [AddrKey; IFACE_OWN_ADDRS],
}
crate::assert_layout!(IfaceEntry, size = 72, align = 4);
crate::assert_offsets!(IfaceEntry {
    ifindex: 0,
    _reserved: 4,
    own: 8,
});

impl IfaceEntry {
    /// Whether `addr` is one of this interface's conflict-free addresses.
    #[inline(always)]
    pub fn owns(&self, addr: &AddrKey) -> bool {
        // Unrolled comparisons of four words each: no loop for the verifier, no branch per byte.
        // The destructuring ties the unrolling to IFACE_OWN_ADDRS: changing the constant
        // without this line does not compile, so no slot is ever left unchecked.
        let [a, b, c, d] = &self.own;
        a == addr || b == addr || c == addr || d == addr
    }
}
