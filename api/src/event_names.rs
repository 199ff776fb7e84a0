//! The names events and the datapath's answers speak in: where a packet was seen, why it was
//! dropped or reported and what was done with it, a datapath entry's state, what of an
//! attachment another tool took away, which of ipq's maps another process wrote. One type each,
//! its spelling derived (strum) and equal to its serde form; each has an `Unknown` that a newer
//! agent's new value (or, for a kernel's raw value, one this build does not know) reads as,
//! never a failure to read the whole event. The kernel's own types (`ipq_common`) become these
//! in one place each: the `From` impls and `of_raw` below.

use ipq_common::{
    addr::AddrState,
    counters::{Action, Hook, Reason},
};
use serde::{Deserialize, Serialize};

/// The hook an event is about: where a sampled packet was seen (`hook` of a `sample`), or whose
/// program another tool took away (`hook` of an `attachment_lost`), spelled as the metrics'
/// `hook` label.
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
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum EventHook {
    /// TC ingress of a workload interface: what the workload sends.
    TcIngress,
    /// TC egress of a workload interface: what the workload receives.
    TcEgress,
    /// XDP on an uplink: what arrives from other machines.
    Xdp,
    /// No one hook's: a map's or a program's pin, which every hook needs (`attachment_lost`).
    #[serde(rename = "none")]
    #[strum(serialize = "none")]
    NoHook,
    /// A hook this build does not know (an event of a newer agent, or a sample's raw value).
    #[serde(other)]
    Unknown,
}

impl EventHook {
    /// The hook of a sample's raw value.
    pub fn of_raw(raw: u32) -> Self {
        Hook::from_repr(raw).map_or(Self::Unknown, Self::from)
    }
}

impl From<Hook> for EventHook {
    fn from(hook: Hook) -> Self {
        match hook {
            Hook::TcIngress => Self::TcIngress,
            Hook::TcEgress => Self::TcEgress,
            Hook::Xdp => Self::Xdp,
        }
    }
}

/// Why the kernel dropped, observed or reported a sampled packet (`reason` of a `sample`),
/// spelled as the metrics' `reason` label.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum SampleReason {
    /// The address is fenced on this interface.
    Fenced,
    /// The address belongs to a holder on another interface.
    DuplicateSource,
    /// Inbound traffic on an uplink for a quarantined address.
    StaleTraffic,
    /// A workload interface used a quarantined address it does not hold.
    Quarantined,
    /// An ARP/NDP announcement from another machine for an address held here.
    RemoteClaim,
    /// A reason this build does not know (an event of a newer agent, or a raw value).
    #[serde(other)]
    Unknown,
}

impl SampleReason {
    /// The reason of a sample's raw value.
    pub fn of_raw(raw: u32) -> Self {
        Reason::from_repr(raw).map_or(Self::Unknown, Self::from)
    }
}

impl From<Reason> for SampleReason {
    fn from(reason: Reason) -> Self {
        match reason {
            Reason::Fenced => Self::Fenced,
            Reason::DuplicateSource => Self::DuplicateSource,
            Reason::StaleTraffic => Self::StaleTraffic,
            Reason::Quarantined => Self::Quarantined,
            Reason::RemoteClaim => Self::RemoteClaim,
        }
    }
}

/// What the kernel did with a sampled packet (`action` of a `sample`), spelled as the metrics'
/// `action` label.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum SampleAction {
    /// Dropped (`enforce` mode).
    Dropped,
    /// Would have been dropped; passed because the mode is `observe`.
    Observed,
    /// Passed and reported (a remote claim is evidence, not a reason to drop).
    Reported,
    /// An action this build does not know (an event of a newer agent, or a raw value).
    #[serde(other)]
    Unknown,
}

impl SampleAction {
    /// The action of a sample's raw value.
    pub fn of_raw(raw: u32) -> Self {
        Action::from_repr(raw).map_or(Self::Unknown, Self::from)
    }
}

impl From<Action> for SampleAction {
    fn from(action: Action) -> Self {
        match action {
            Action::Dropped => Self::Dropped,
            Action::Observed => Self::Observed,
            Action::Reported => Self::Reported,
        }
    }
}

/// A datapath entry's state as the kernel holds it (`state` of a `sample` and of a break-glass
/// answer): a held state's name as [`StateName`](crate::StateName) spells it (an entry is never
/// free), or `unknown` for a raw value this build does not know.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum EntryState {
    Active,
    Draining,
    Quarantined,
    /// A raw state this build does not know (an entry or event of a newer agent).
    #[serde(other)]
    Unknown,
}

impl EntryState {
    /// The state of an entry's raw value, as `AddrState::from_repr` read it.
    pub fn of_raw(raw: Option<AddrState>) -> Self {
        raw.map_or(Self::Unknown, Self::from)
    }
}

impl From<AddrState> for EntryState {
    fn from(state: AddrState) -> Self {
        match state {
            AddrState::Active => Self::Active,
            AddrState::Draining => Self::Draining,
            AddrState::Quarantined => Self::Quarantined,
        }
    }
}

/// What of an attachment another tool took away (`what` of an `attachment_lost`), spelled as
/// the `what` label of `ipq_datapath_attachments_lost_total`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum LostPart {
    /// The clsact qdisc under ipq's netlink filters.
    Qdisc,
    /// ipq's netlink filter (deleted, or another filter put in its place).
    Filter,
    /// A TCX or XDP link (detached).
    Link,
    /// A pin under `bpffs_dir` (removed or replaced).
    Pin,
    /// A part this build does not know (an event of a newer agent).
    #[serde(other)]
    Unknown,
}

/// One of ipq's maps whose entries the verification compares with what ipq wrote (`map` of a
/// `map_rewritten` event and the `map` label of `ipq_datapath_map_entries_rewritten_total`), spelled as
/// the map is named and pinned (`ipq_common::names`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum CheckedMap {
    /// The address table (`IPQ_ADDRS`).
    IpqAddrs,
    /// Its inlined copy the programs read first (`IPQ_SLOTS`).
    IpqSlots,
    /// The interfaces' slots (`IPQ_IFACES`).
    IpqIfaces,
    /// The quarantine's Bloom filter (`IPQ_QBLOOM`).
    IpqQbloom,
    /// A map this build does not know (an event of a newer agent).
    #[serde(other, rename = "unknown")]
    #[strum(serialize = "unknown")]
    Unknown,
}
