//! The address registry's datapath mirror: key and value of the `IPQ_ADDRS` hash map.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IPv6 address, or an IPv4 address mapped into `::ffff:0:0/96`, as the 16 bytes it has on
/// the wire. One dual-stack key keeps a single map, a single lookup path and a single filter.
///
/// The words hold the wire bytes in memory order (not host integers), so the kernel can copy
/// them straight out of a packet and both sides hash the same memory.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct AddrKey {
    pub words: [u32; 4],
}
crate::assert_layout!(AddrKey, size = 16, align = 4);
crate::assert_offsets!(AddrKey { words: 0 });

/// The third word of an IPv4-mapped address: bytes `00 00 ff ff`.
pub const V4_MAPPED_MARKER: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

impl AddrKey {
    /// The all-zero key (`::`). Never a registered address, so it also marks unused slots.
    pub const UNSPECIFIED: Self = Self { words: [0; 4] };

    /// Builds the key of an IPv4 address from its four wire bytes read as one word.
    #[inline(always)]
    pub const fn from_v4_wire(word: u32) -> Self {
        Self {
            words: [0, 0, V4_MAPPED_MARKER, word],
        }
    }

    /// Builds the key of an IPv6 address from its sixteen wire bytes read as four words.
    #[inline(always)]
    pub const fn from_v6_wire(words: [u32; 4]) -> Self {
        Self { words }
    }

    pub const fn from_ipv4(addr: Ipv4Addr) -> Self {
        Self::from_v4_wire(u32::from_ne_bytes(addr.octets()))
    }

    pub const fn from_ipv6(addr: Ipv6Addr) -> Self {
        let o = addr.octets();
        Self::from_v6_wire([
            u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
            u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
            u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
            u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
        ])
    }

    pub const fn from_ip(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(v4) => Self::from_ipv4(v4),
            IpAddr::V6(v6) => Self::from_ipv6(v6),
        }
    }

    pub const fn is_v4(&self) -> bool {
        self.words[0] == 0 && self.words[1] == 0 && self.words[2] == V4_MAPPED_MARKER
    }

    /// The address this key stands for; IPv4-mapped keys come back as IPv4.
    pub fn to_ip(&self) -> IpAddr {
        if self.is_v4() {
            IpAddr::V4(Ipv4Addr::from(self.words[3].to_ne_bytes()))
        } else {
            let mut octets = [0u8; 16];
            let mut i = 0;
            while i < 4 {
                let b = self.words[i].to_ne_bytes();
                octets[i * 4] = b[0];
                octets[i * 4 + 1] = b[1];
                octets[i * 4 + 2] = b[2];
                octets[i * 4 + 3] = b[3];
                i += 1;
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
    }
}

impl From<IpAddr> for AddrKey {
    fn from(addr: IpAddr) -> Self {
        Self::from_ip(addr)
    }
}

impl core::fmt::Debug for AddrKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "AddrKey({})", self.to_ip())
    }
}

/// Lifecycle state of an address in the datapath. `Free` has no entry at all.
///
/// Stored in [`AddrEntry::state`] as its `u32` discriminant; read back with the derived
/// `from_repr`, which refuses values this build does not know.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, strum::FromRepr)]
#[cfg_attr(
    feature = "names",
    derive(
        strum::IntoStaticStr,
        strum::AsRefStr,
        strum::Display,
        strum::EnumString
    ),
    strum(serialize_all = "lowercase")
)]
#[derive(strum::VariantArray)]
pub enum AddrState {
    /// Held by a live holder.
    Active = 1,
    /// The holder is terminating but alive; its traffic still flows unless it is fenced.
    Draining = 2,
    /// The holder is gone; the address cools down and inbound traffic to it is stale.
    Quarantined = 3,
}

impl AddrState {}

/// `BPF_F_NO_PREALLOC`, the flag `IPQ_ADDRS` is created with: its elements are allocated per
/// update, and before Linux 6.1 an element the agent replaces or deletes is freed only after an
/// RCU grace period, so a program that looked an address up reads that address's value to the
/// end of its run. A preallocated map hands the element to the agent's next update at once (of
/// any address), which can copy another address's value under a program still reading it. From
/// 6.1 on both kinds may reuse an element at once (`bpf_mem_alloc`); the programs then rely on
/// `IPQ_SLOTS`, and read the hash map only when a probe overlapped a write (`ipq_common::slots`).
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// No interface: the holder is gone, or nothing is fenced.
pub const NO_IFINDEX: u32 = 0;

/// [`AddrEntry::flags`]: conflicts between workloads on this address are counted and sampled
/// but never dropped (`on_early_reuse = observe`); stale traffic still is, in enforce mode.
pub const FLAG_OBSERVE_ONLY: u32 = 1;

/// [`AddrEntry::flags`]: the address's holder (for a quarantine, the pod that left it) is in a
/// namespace the agent only observes (`observe_namespaces` / `enforce_namespaces`): every drop
/// on this address is counted as observed and let through, as under `mode = observe`.
pub const FLAG_OBSERVE_NAMESPACE: u32 = 2;

/// Value of the `IPQ_ADDRS` map: what the datapath must know of one address.
///
/// The first block is written by the agent only. `last_stale_ns` and `last_sample_ns` are written
/// by the kernel programs; the agent preserves them when it rewrites an entry.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AddrEntry {
    /// An [`AddrState`] discriminant.
    pub state: u32,
    /// Interface of the live holder whose traffic flows; [`NO_IFINDEX`] once the holder is gone.
    pub holder_ifindex: u32,
    /// Interface whose packets with this address are dropped in both directions (the old holder
    /// under `fence-old`, the new one under `refuse-new`); [`NO_IFINDEX`] when none.
    pub fenced_ifindex: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// CLOCK_MONOTONIC nanoseconds at which the address entered its current state.
    pub since_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds of the last stale packet seen for it (kernel-written).
    pub last_stale_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds of the last conflict sample sent for it (kernel-written):
    /// the per-address rate limit of the sample ring buffer.
    pub last_sample_ns: u64,
}
crate::assert_layout!(AddrEntry, size = 40, align = 8);
crate::assert_offsets!(AddrEntry {
    state: 0,
    holder_ifindex: 4,
    fenced_ifindex: 8,
    flags: 12,
    since_ns: 16,
    last_stale_ns: 24,
    last_sample_ns: 32,
});

impl AddrEntry {
    pub const fn new(state: AddrState, holder_ifindex: u32, since_ns: u64) -> Self {
        Self {
            state: state as u32,
            holder_ifindex,
            fenced_ifindex: NO_IFINDEX,
            flags: 0,
            since_ns,
            last_stale_ns: 0,
            last_sample_ns: 0,
        }
    }

    pub const fn with_fenced(mut self, ifindex: u32) -> Self {
        self.fenced_ifindex = ifindex;
        self
    }

    pub const fn state(&self) -> Option<AddrState> {
        AddrState::from_repr(self.state)
    }

    /// Whether `other` enforces the same thing: state, holder and fenced interface (the
    /// stamps and flags aside).
    pub const fn enforces_as(&self, other: &AddrEntry) -> bool {
        self.state == other.state
            && self.holder_ifindex == other.holder_ifindex
            && self.fenced_ifindex == other.fenced_ifindex
    }

    /// Whether `other` holds everything the agent writes the same (the kernel's stamps aside):
    /// a write of `other` over `self` would change nothing a program reads from the agent.
    pub const fn written_as(&self, other: &AddrEntry) -> bool {
        self.enforces_as(other) && self.flags == other.flags && self.since_ns == other.since_ns
    }
}
