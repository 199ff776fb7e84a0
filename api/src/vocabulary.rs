//! The names the API speaks in: a lifecycle state, a conflict's kind, the early-reuse
//! policy, the pool-pressure policy. One type each, with its one spelling derived (strum) and
//! equal to its serde form.

use ipq_common::addr::AddrState;
use serde::{Deserialize, Serialize};

/// The name of a lifecycle state, `Free` included (an address without a record): the one
/// spelling of a state for the API, the CLI, the break-glass tools and the metrics. The
/// datapath's [`AddrState`] has no `Free` (a free address has no entry); [`StateName::entry`]
/// and `From<AddrState>` map between the two.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::EnumString,
    strum::Display,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum StateName {
    /// Never listed or written: a free address has no record and no datapath entry.
    #[value(skip)]
    Free,
    Active,
    Draining,
    Quarantined,
}

impl StateName {
    /// The state of a held address named `raw` (`active`, `draining`, `quarantined`): what a
    /// listing filters on and what a datapath entry is written with. `free` is not one.
    pub fn parse_held(raw: &str) -> Option<Self> {
        raw.parse().ok().filter(|s| *s != Self::Free)
    }

    /// The datapath entry's state for this name; `None` for `Free`, which has no entry.
    pub const fn entry(self) -> Option<AddrState> {
        match self {
            Self::Free => None,
            Self::Active => Some(AddrState::Active),
            Self::Draining => Some(AddrState::Draining),
            Self::Quarantined => Some(AddrState::Quarantined),
        }
    }
}

impl From<AddrState> for StateName {
    fn from(state: AddrState) -> Self {
        match state {
            AddrState::Active => Self::Active,
            AddrState::Draining => Self::Draining,
            AddrState::Quarantined => Self::Quarantined,
        }
    }
}

/// The kinds of conflict of DESIGN §2, as the `kind` label of `ipq_conflicts_total`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[derive(strum::VariantArray)]
pub enum ConflictKind {
    /// A claim while another live holder (Active or Draining) still has the address.
    EarlyReuse,
    /// A claim while the address is Quarantined.
    ReuseInCooldown,
    /// Packets with a holder's address as source arrived on another holder's interface.
    DuplicateSource,
    /// Another machine announced (ARP/NDP) an address that is Active/Draining here.
    RemoteClaim,
}

/// What happens when a new holder claims an address another live holder still has: the one
/// policy type from the configuration through the registry and the journal to the API, where
/// it is spelled as in the configuration (`fence-old`, `refuse-new`, `observe`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::EnumString,
    strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
#[derive(strum::VariantArray)]
pub enum EarlyReusePolicy {
    FenceOld,
    RefuseNew,
    Observe,
}

/// What the agent does when ipq-ipam's delegate finds a network's range exhausted while ipq
/// holds addresses of it (`ipam_on_exhausted`), spelled as in the configuration and in the
/// `policy` of the API's answer (`wait`, `release-quietest`). [`OnExhausted::Unknown`] is what
/// an answer of a newer agent's policy reads as; the configuration never accepts it
/// ([`OnExhausted::parse_setting`]).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
#[derive(strum::VariantArray)]
pub enum OnExhausted {
    /// The ADD fails with "try again later" until the first held address is released.
    #[default]
    Wait,
    /// The allocation quiet longest is released at once and the delegate asked again.
    ReleaseQuietest,
    /// A policy this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

impl OnExhausted {
    /// The policy a setting names (`wait`, `release-quietest`); `unknown` is not one.
    pub fn parse_setting(raw: &str) -> Option<Self> {
        raw.parse().ok().filter(|p| *p != Self::Unknown)
    }
}

/// Where a configured interface stands with ipq's programs (`protection` in `/v1/status` and in
/// an address's view): the one spelling the agent sets, the CLI shows and compares, and tools
/// match. A state a newer agent adds reads as [`Protection::Unknown`] in an older client, never
/// as a failure to read the whole answer.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum Protection {
    /// Not yet attached (a new interface, or one being retried).
    #[default]
    Attaching,
    /// ipq's programs are in place on every hook the interface needs.
    Protected,
    /// Another tool took ipq's program off a hook (the kernel announced it, or a verification
    /// found it): unprotected until the repair already queued puts it back.
    Repairing,
    /// Another tool's filter or program runs before ipq's on a hook and ends processing for a
    /// protected address's packet: packets it decides never reach ipq's program.
    Bypassed,
    /// Another tool's filter or program runs before ipq's on a hook, and what it does with the
    /// protected addresses' packets cannot be told (the agent may not run it, or it is not a
    /// program that can be run): unprotected, not ready, until it goes or can be told.
    Unverified,
    /// Attaching failed; retried with backoff.
    Failed,
    /// A state this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

impl Protection {
    /// Whether ipq's programs decide this interface's packets now.
    pub fn is_protected(self) -> bool {
        self == Self::Protected
    }
}

/// A write of an address's datapath entry (`IPQ_ADDRS` and its copies): the `op` label of
/// `ipq_datapath_write_failures_total` and the kind of a pending write in `/v1/status` and an
/// address's view. An operation a newer agent adds reads as [`MapWrite::Unknown`].
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum MapWrite {
    /// The entry written: a new address, or its state or holders changed.
    Update,
    /// The entry removed: the address is free.
    Delete,
    /// An operation this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}
