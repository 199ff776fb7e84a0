//! Layout of the per-CPU `IPQ_COUNTERS` array: packets and bytes by action, hook and reason.

use strum::VariantArray as _;
/// Where a packet was seen. The discriminants are stable: they index the pinned
/// `IPQ_PROBES`, which agents of other versions share across upgrades and rollbacks, so a
/// new hook takes the next number and none is ever renumbered.
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
    strum(serialize_all = "snake_case")
)]
#[derive(strum::VariantArray)]
pub enum Hook {
    /// TC ingress of a workload interface: what the workload sends.
    TcIngress = 0,
    /// TC egress of a workload interface: what the workload receives.
    TcEgress = 1,
    /// XDP on an uplink: what arrives from other machines.
    Xdp = 2,
}

impl Hook {
    /// Derived from the variants (strum): a hook added is a slot more.
    pub const COUNT: u32 = Self::VARIANTS.len() as u32;
}

/// Why a packet was (or, in `observe` mode, would have been) dropped or reported.
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
    strum(serialize_all = "snake_case")
)]
#[derive(strum::VariantArray)]
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
    pub const COUNT: u32 = Self::VARIANTS.len() as u32;
}

/// What the program did with a packet it counted.
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
    strum(serialize_all = "snake_case")
)]
#[derive(strum::VariantArray)]
pub enum Action {
    /// Dropped (`enforce` mode).
    Dropped = 0,
    /// Would have been dropped; passed because the mode is `observe`.
    Observed = 1,
    /// Passed and reported (a remote claim is evidence, not a reason to drop).
    Reported = 2,
}

impl Action {
    pub const COUNT: u32 = Self::VARIANTS.len() as u32;
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

/// Every `from_repr` must invert the discriminant of every variant (strum's `VARIANTS`), in order: the kernel
/// writes discriminants, user space reads them back through `from_repr`.
const _: () = {
    let mut i = 0;
    while i < Hook::VARIANTS.len() {
        assert!(Hook::VARIANTS[i] as u32 == i as u32);
        assert!(matches!(Hook::from_repr(i as u32), Some(h) if h as u32 == i as u32));
        i += 1;
    }
    assert!(Hook::from_repr(Hook::COUNT).is_none());
    let mut i = 0;
    while i < Reason::VARIANTS.len() {
        assert!(Reason::VARIANTS[i] as u32 == i as u32);
        assert!(matches!(Reason::from_repr(i as u32), Some(r) if r as u32 == i as u32));
        i += 1;
    }
    assert!(Reason::from_repr(Reason::COUNT).is_none());
    let mut i = 0;
    while i < Action::VARIANTS.len() {
        assert!(Action::VARIANTS[i] as u32 == i as u32);
        assert!(matches!(Action::from_repr(i as u32), Some(a) if a as u32 == i as u32));
        i += 1;
    }
    assert!(Action::from_repr(Action::COUNT).is_none());
};
