//! Conflict samples the kernel sends through the `IPQ_SAMPLES` ring buffer, at most one per
//! address per `sample_interval_ns`.

use crate::addr::AddrKey;

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConflictSample {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// The address in conflict.
    pub addr: AddrKey,
    /// Interface the packet was seen on.
    pub ifindex: u32,
    /// A `Hook` discriminant.
    pub hook: u32,
    /// A `Reason` discriminant.
    pub reason: u32,
    /// An `Action` discriminant.
    pub action: u32,
    /// The address's `AddrState` discriminant when the packet was seen.
    pub state: u32,
    /// The holder's interface recorded in the entry.
    pub holder_ifindex: u32,
    /// Source MAC of the frame (who sent it, for remote claims).
    pub src_mac: [u8; 6],
    pub _pad: [u8; 2],
    /// Length of the packet in bytes.
    pub pkt_len: u32,
    /// Reserved; zero.
    pub _reserved: u32,
}
crate::assert_layout!(ConflictSample, size = 64, align = 8);
crate::assert_offsets!(ConflictSample {
    ts_ns: 0,
    addr: 8,
    ifindex: 24,
    hook: 28,
    reason: 32,
    action: 36,
    state: 40,
    holder_ifindex: 44,
    src_mac: 48,
    _pad: 54,
    pkt_len: 56,
    _reserved: 60,
});
