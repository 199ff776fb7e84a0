//! Layout of the per-CPU `IPQ_COUNTERS` array: packets and bytes by action, hook and reason.

/// Where a packet was seen.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hook {
    /// TC ingress of a workload interface: what the workload sends.
    TcIngress = 0,
    /// TC egress of a workload interface: what the workload receives.
    TcEgress = 1,
    /// XDP on an uplink: what arrives from other machines.
    Xdp = 2,
}

impl Hook {
    pub const ALL: [Hook; 3] = [Self::TcIngress, Self::TcEgress, Self::Xdp];
    /// Tied to `ALL`: a hook added to one and not the other does not compile.
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// The hook of a discriminant read from a map or a sample; `None` for a value this build
    /// does not know (written by another program version).
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(Self::TcIngress),
            1 => Some(Self::TcEgress),
            2 => Some(Self::Xdp),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TcIngress => "tc_ingress",
            Self::TcEgress => "tc_egress",
            Self::Xdp => "xdp",
        }
    }
}

/// Why a packet was (or, in `observe` mode, would have been) dropped or reported.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reason {
    /// The address is fenced on this interface (the old holder of an early reuse, or the new
    /// holder refused).
    Fenced = 0,
    /// The address belongs to a holder on another interface.
    DuplicateSource = 1,
    /// Inbound traffic on an uplink for a quarantined address.
    StaleTraffic = 2,
    /// A workload interface used a quarantined address it does not hold.
    Quarantined = 3,
    /// An ARP/NDP announcement from another machine for an address held here.
    RemoteClaim = 4,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Self::Fenced,
        Self::DuplicateSource,
        Self::StaleTraffic,
        Self::Quarantined,
        Self::RemoteClaim,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(Self::Fenced),
            1 => Some(Self::DuplicateSource),
            2 => Some(Self::StaleTraffic),
            3 => Some(Self::Quarantined),
            4 => Some(Self::RemoteClaim),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fenced => "fenced",
            Self::DuplicateSource => "duplicate_source",
            Self::StaleTraffic => "stale_traffic",
            Self::Quarantined => "quarantined",
            Self::RemoteClaim => "remote_claim",
        }
    }
}

/// What the program did with a packet it counted.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Action {
    /// Dropped (`enforce` mode).
    Dropped = 0,
    /// Would have been dropped; passed because the mode is `observe`.
    Observed = 1,
    /// Passed and reported (a remote claim is evidence, not a reason to drop).
    Reported = 2,
}

impl Action {
    pub const ALL: [Action; 3] = [Self::Dropped, Self::Observed, Self::Reported];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(Self::Dropped),
            1 => Some(Self::Observed),
            2 => Some(Self::Reported),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Dropped => "dropped",
            Self::Observed => "observed",
            Self::Reported => "reported",
        }
    }
}

/// Index of the counter for one (action, hook, reason).
#[inline(always)]
pub const fn counter_index(action: Action, hook: Hook, reason: Reason) -> u32 {
    ((action as u32 * Hook::COUNT) + hook as u32) * Reason::COUNT + reason as u32
}

/// Index of the counter of conflict samples lost because the ring buffer was full.
pub const SAMPLES_LOST_INDEX: u32 = Action::COUNT * Hook::COUNT * Reason::COUNT;

/// Entries of `IPQ_COUNTERS`.
pub const COUNTER_SLOTS: u32 = SAMPLES_LOST_INDEX + 1;

/// One per-CPU counter slot.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
crate::assert_layout!(Counter, size = 16, align = 8);
crate::assert_offsets!(Counter {
    packets: 0,
    bytes: 8
});

/// Every `from_raw` must invert the discriminant of every value in `ALL`, in order: the kernel
/// writes discriminants, user space reads them back through `from_raw`.
const _: () = {
    let mut i = 0;
    while i < Hook::ALL.len() {
        assert!(Hook::ALL[i] as u32 == i as u32);
        assert!(matches!(Hook::from_raw(i as u32), Some(h) if h as u32 == i as u32));
        i += 1;
    }
    assert!(Hook::from_raw(Hook::COUNT).is_none());
    let mut i = 0;
    while i < Reason::ALL.len() {
        assert!(Reason::ALL[i] as u32 == i as u32);
        assert!(matches!(Reason::from_raw(i as u32), Some(r) if r as u32 == i as u32));
        i += 1;
    }
    assert!(Reason::from_raw(Reason::COUNT).is_none());
    let mut i = 0;
    while i < Action::ALL.len() {
        assert!(Action::ALL[i] as u32 == i as u32);
        assert!(matches!(Action::from_raw(i as u32), Some(a) if a as u32 == i as u32));
        i += 1;
    }
    assert!(Action::from_raw(Action::COUNT).is_none());
};
