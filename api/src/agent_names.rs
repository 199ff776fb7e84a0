//! The names the agent reports its own doings in: how its programs are attached, where its
//! registry came back from, what a hygiene pass was and how it flushed, what a conflict's
//! policy did, when the IPAM gets an address back. One type each, its spelling derived (strum)
//! and equal to its serde form. Each has an `Unknown` a newer agent's new value reads as in an
//! older client, never a failure to read the whole answer.

use serde::{Deserialize, Serialize};

/// How TC programs attach on this node (`tc_attach` in `/v1/status`), as the agent decided at
/// start from its `tc_attach` setting and the kernel.
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
    strum::Display,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum TcAttachMode {
    /// TCX links (`tc_attach = "tcx"`).
    Tcx,
    /// ipq's cls_bpf filter under clsact (`"netlink"`, or `"auto"` on a kernel without TCX).
    Netlink,
    /// `"auto"` on a kernel with TCX: the netlink filter at once, a TCX link in the background.
    NetlinkThenTcx,
    /// A mode this build does not know (an answer of a newer agent), or none given (an agent
    /// before the field).
    #[default]
    #[serde(other)]
    Unknown,
}

/// What holds ipq's programs on an interface's hooks (`attachment` in `/v1/status` and an
/// address's view).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum Attachment {
    /// TCX links.
    Tcx,
    /// ipq's netlink (cls_bpf) filters.
    Netlink,
    /// An XDP link (an uplink).
    Xdp,
    /// Halfway through the move from netlink filters to TCX links: some hooks have each.
    #[serde(rename = "tcx+netlink")]
    #[strum(serialize = "tcx+netlink")]
    TcxAndNetlink,
    /// An attachment this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// A hook with ipq's program in place, named by the attachment it has (`hooks` of an interface
/// in `/v1/status`): `tc-` under ipq's netlink (cls_bpf) filter, `tcx-` under a TCX link.
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
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum AttachedHook {
    /// TC ingress under ipq's netlink filter.
    TcIngress,
    /// TC egress under ipq's netlink filter.
    TcEgress,
    /// TC ingress under a TCX link.
    TcxIngress,
    /// TC egress under a TCX link.
    TcxEgress,
    /// XDP (an uplink's link).
    Xdp,
    /// A hook this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// Where the registry came back from when the agent started (`recovery.from`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum RecoveredFrom {
    /// The journal.
    Journal,
    /// The pinned maps: no journal yet, or one that could not be used.
    PinnedMaps,
    /// A source this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// Why an address was cleaned (`trigger` of a hygiene pass).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum HygieneTrigger {
    /// Its holder is gone: the quarantine began.
    HolderGone,
    /// It has a new holder.
    NewHolder,
    /// A trigger this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// How a hygiene pass flushed an address's conntrack entries, which says what their count
/// means (`conntrack_flush`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum ConntrackFlush {
    /// A dump of the whole table and a deletion per matching entry: the count is exact.
    Dump,
    /// The kernel's filtered flush: the count is what the kernel reported, a lower bound.
    Kernel,
    /// A method this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// What the `on_early_reuse` policy (or the datapath) did about a conflict (`outcome`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum ConflictOutcome {
    /// The old holder's traffic with the address is dropped; the claimant has it.
    FencedOld,
    /// The address had no live holder: the claimant simply has it.
    Claimed,
    /// An explicit claim was refused (`refuse-new`).
    RefusedNew,
    /// A claimant seen on netlink is kept out until the address is free (`refuse-new`).
    BlockedNew,
    /// Let through and counted only (`observe`).
    Observed,
    /// The offending packets are dropped (duplicate source).
    Dropped,
    /// Reported only (a remote claim over an Active holder).
    Reported,
    /// An outcome this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// When ipq gives an address the IPAM holds for it back (`release` of an IPAM hold).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum HoldRelease {
    /// When its quarantine ends (the address's `until`).
    #[serde(rename = "after the quarantine")]
    #[strum(serialize = "after the quarantine")]
    AfterQuarantine,
    /// It is free: the delegate's DEL runs within a second.
    #[serde(rename = "now")]
    #[strum(serialize = "now")]
    Now,
    /// The delegate's DEL failed; retried with backoff.
    #[serde(rename = "failing")]
    #[strum(serialize = "failing")]
    Failing,
    /// A release this build does not know (an answer of a newer agent).
    #[serde(other, rename = "unknown")]
    #[strum(serialize = "unknown")]
    Unknown,
}

/// How writing the node's NodeQuarantine object stands (`publish.state` in `/v1/status`).
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
    strum::Display,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum PublishState {
    /// Nothing written yet since the agent started.
    #[default]
    Starting,
    /// The object holds what the agent has.
    Published,
    /// A change waits for the next write.
    Pending,
    /// Writes fail; retried with backoff.
    Failing,
    /// A state this build does not know (an answer of a newer agent).
    #[serde(other)]
    Unknown,
}

/// What found an entry of ipq's maps written by another process (`found_by` of a
/// `map_rewritten` event).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum DriftFoundBy {
    /// The bpf() watcher reported the write with its key, and that entry was looked at at once.
    ReportedWrite,
    /// The comparison of the whole maps with what ipq wrote (a pass the watcher asked for, or
    /// the periodic one).
    Comparison,
    /// A finder this build does not know (an event of a newer agent).
    #[serde(other)]
    Unknown,
}
