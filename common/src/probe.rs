//! The co-tenant probe: a marked UDP datagram the agent sends through a workload interface's
//! TC hook to learn whether what runs ahead of ipq's program there (another tool's filter or
//! TCX program) hands packets on. ipq's program recognises it, counts it in `IPQ_PROBES` and
//! drops it: a probe never reaches a workload and is never counted as fenced traffic.
//!
//! The mark is the datagram's other end, an address of the benchmarking ranges (RFC 2544,
//! RFC 5180) that no workload talks to: a probe sent on ingress goes *to* it, one sent on
//! egress comes *from* it. Its last 32 bits are the same in both families, so the programs
//! test one word of an address they have already loaded ([`PROBE_PEER_WORD`]) and read the
//! rest (the full address, the port, the [`ProbeMark`] with the agent's cookie) only on a
//! match.

use crate::counters::Hook;

/// The IPv4 end of every probe: 198.18.0.73 (RFC 2544's benchmarking range).
pub const PROBE_PEER_V4: [u8; 4] = [198, 18, 0, 73];
/// The IPv6 end of every probe: 2001:2::c612:49 (RFC 5180's benchmarking range), ending in
/// the same 32 bits as [`PROBE_PEER_V4`].
pub const PROBE_PEER_V6: [u8; 16] = [0x20, 0x01, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 73];
/// The last word of either peer as an `AddrKey` holds it (wire bytes in memory order).
pub const PROBE_PEER_WORD: u32 = u32::from_ne_bytes(PROBE_PEER_V4);
const _: () = assert!(
    PROBE_PEER_WORD
        == u32::from_ne_bytes([
            PROBE_PEER_V6[12],
            PROBE_PEER_V6[13],
            PROBE_PEER_V6[14],
            PROBE_PEER_V6[15]
        ])
);

/// Both UDP ports of a probe ("IQ").
pub const PROBE_PORT: u16 = 0x4951;

/// The UDP payload of a probe, in host order (the agent and the programs run on one machine).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ProbeMark {
    /// The agent's cookie, from `DatapathConfig::probe_cookie`: a datagram without it is not
    /// a probe (a workload cannot make its own packets disappear as probes).
    pub cookie: u32,
    /// The interface the probe was sent through: counted only by ipq's program there.
    pub ifindex: u32,
    /// The [`Hook`] it was sent through.
    pub hook: u32,
    pub _reserved: u32,
}
crate::assert_layout!(ProbeMark, size = 16, align = 4);
crate::assert_offsets!(ProbeMark {
    cookie: 0,
    ifindex: 4,
    hook: 8,
    _reserved: 12,
});

/// Entries of `IPQ_PROBES`: one `u64` count per hook, indexed by the [`Hook`] discriminant.
pub const PROBE_SLOTS: u32 = Hook::COUNT;

/// Where the mark starts in a probe frame (no VLAN tag; the agent builds it so).
pub const PROBE_MARK_OFFSET_V4: usize = 14 + 20 + 8;
pub const PROBE_MARK_OFFSET_V6: usize = 14 + 40 + 8;
