//! What `/v1` answers about addresses, claims, conflicts and datapath entries.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{
    Attachment, ConflictKind, ConflictOutcome, ConntrackFlush, EarlyReusePolicy, EntryState,
    HoldRelease, Holder, HygieneTrigger, MapWrite, OnExhausted, Protection, StateName,
};

/// The answer to a claim: the addresses as they are now, and the conflicts the claim caused
/// (under `fence-old` or `observe` a claim over a live holder succeeds *and* conflicts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimResponse {
    pub addresses: Vec<AddressView>,
    pub conflicts: Vec<ConflictView>,
}

/// The answer to a drain, a GC or a release: the addresses changed, as they are now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedResponse {
    pub addresses: Vec<AddressView>,
}

/// `GET /v1/addresses[?state=S]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressList {
    pub addresses: Vec<AddressView>,
}

/// One address as the registry has it. `GET /v1/addresses/{ip}` returns one of these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressView {
    pub address: IpAddr,
    /// `active`, `draining` or `quarantined`; `free` only for an address ipq-ipam still holds
    /// (any other free address has no view: 404).
    pub state: StateName,
    /// The live holder (Active, Draining).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// The holder that had it before it was quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_holder: Option<Holder>,
    /// A holder whose traffic with this address is dropped (the old one under `fence-old`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<Holder>,
    /// A claimant kept out until the address is free (`refuse-new`, seen on netlink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_claimant: Option<Holder>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<Holder>,
    /// When it entered `state`.
    pub since: String,
    /// When the quarantine ends, as things stand (stale traffic can push it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The last stale packet seen for it while quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stale: Option<String>,
    /// Conflicts recorded on it since it left Free.
    pub conflicts: u32,
    /// Whether ipq's programs are in place on the holder's interface, as `/v1/status` says of
    /// it (left out when there is no live holder on a workload interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protection: Option<Protection>,
    /// What holds ipq's programs on that interface: `tcx`, `netlink`, `tcx+netlink` (as in
    /// `/v1/status`); left out when nothing is attached there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Attachment>,
    /// An early reuse of it was let through (`on_early_reuse = observe`): conflicts between its
    /// holders are counted, never dropped, until it is Free again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
    /// Its pod's namespace is only observed (`observe_namespaces` / `enforce_namespaces`):
    /// what would be dropped on it is counted and let through.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub namespace_observed: bool,
    /// The last reuse-hygiene pass on it (conntrack and neighbour entries flushed, the new
    /// holder announced), if one ran since it entered the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_flush: Option<HygieneView>,
    /// The node's IPAM keeps this address allocated for ipq (`ipq-ipam`): not handed out again
    /// until ipq runs the delegate's DEL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam_hold: Option<IpamHoldView>,
    /// The kernel refused the last write of its datapath entry: the kernel enforces what it
    /// had before (or nothing) until the retry on every tick goes through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_write: Option<PendingWriteView>,
}

/// A write of an address's datapath entry the kernel refused, kept and retried every tick
/// until it goes through (or the registry no longer wants it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingWriteView {
    pub address: IpAddr,
    /// What the registry wants done: `update` the entry or `delete` it.
    pub op: MapWrite,
    /// The kernel's answer to the last attempt.
    pub error: String,
    /// Attempts that failed since the first.
    pub failures: u32,
    /// When the first attempt failed.
    pub since: String,
}

impl AddressView {
    /// The view of an address the registry does not hold: `free`, with no holder, no time in
    /// a state and nothing recorded against it. The agent shows one for an address the IPAM
    /// still holds for ipq (its `ipam_hold` filled in); every other field stays empty.
    pub fn free(address: IpAddr) -> Self {
        Self {
            address,
            state: StateName::Free,
            holder: None,
            previous_holder: None,
            fenced: None,
            blocked_claimant: None,
            displaced: Vec::new(),
            since: String::new(),
            until: None,
            last_stale: None,
            conflicts: 0,
            protection: None,
            attachment: None,
            observe_only: false,
            namespace_observed: false,
            last_flush: None,
            ipam_hold: None,
            pending_write: None,
        }
    }
}

/// An allocation `ipq-ipam` holds in the node's IPAM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamHoldView {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// When it is given back: `after the quarantine` (until the address's `until`), `now`
    /// (free: the delegate's DEL runs within a second), or `failing` (retried with backoff).
    pub release: HoldRelease,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the agent did about an exhausted range (`ipam_on_exhausted`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExhaustedAnswer {
    /// `wait` or `release-quietest`.
    pub policy: OnExhausted,
    /// Held addresses of the network still quarantined.
    pub quarantined: usize,
    /// Held addresses of the network whose holder is still draining (never released early).
    pub draining: usize,
    /// When the first held address's quarantine ends, if one is quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_release: Option<String>,
    /// Under `release-quietest`: the addresses of the allocation just released. They are
    /// still quarantined (the fence stands); ipq-ipam lets the delegate hand them out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<IpAddr>,
}

/// One reuse-hygiene pass on an address: what the node forgot of its old holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HygieneView {
    pub address: IpAddr,
    /// `holder_gone` (its quarantine began) or `new_holder`.
    pub trigger: HygieneTrigger,
    /// When it finished. Empty (and left out) inside an [`Event`], whose own `at` it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub at: String,
    /// Conntrack entries deleted (original or reply tuple carrying the address).
    pub conntrack_entries: u64,
    /// How: `dump` (the count is exact) or `kernel` (the kernel's filtered flush on a claim;
    /// the count is what the kernel reported, a lower bound). Absent when the flush did not
    /// finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack_flush: Option<ConntrackFlush>,
    /// The node's neighbour entries deleted.
    pub neighbours: u64,
    /// Announcements sent (one per interface).
    pub announcements: u32,
    /// Why no announcement was sent though one was due: the rate limit
    /// (`rate-limited (announce_per_second = N)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce_skipped: Option<String>,
    /// Why nothing was flushed on purpose (the node's own address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// PERMANENT neighbour entries that point elsewhere, left alone (a CNI's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permanent_neighbours: Vec<String>,
    /// What failed; empty when everything worked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// One conflict, with both holders.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictView {
    pub kind: ConflictKind,
    pub address: IpAddr,
    /// The holder that had the address (for `reuse_in_cooldown`, the one that is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_holder: Option<Holder>,
    /// The claimant, or where the duplicate source came from; none for a remote claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_holder: Option<Holder>,
    /// The `on_early_reuse` policy applied: `fence-old`, `refuse-new` or `observe`.
    pub policy: EarlyReusePolicy,
    /// What the policy did: `fenced_old`, `refused_new`, `blocked_new`, `observed`,
    /// `dropped` (duplicate source), `reported`.
    pub outcome: ConflictOutcome,
    /// Empty (and left out) inside an [`Event`], whose own `at` is the same instant: the
    /// event's fields and the conflict's share one JSON object, where a key may appear once.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub at: String,
}

/// `GET /v1/conflicts[?limit=N]`: the most recent conflicts, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictList {
    pub conflicts: Vec<ConflictView>,
}

/// A datapath entry as the agent wrote or removed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatapathEntryView {
    pub address: IpAddr,
    /// `active`, `draining`, `quarantined`, or `unknown` for a raw state this build does not
    /// know.
    pub state: EntryState,
    pub holder_ifindex: u32,
    pub fenced_ifindex: u32,
}

#[cfg(test)]
mod tests;
