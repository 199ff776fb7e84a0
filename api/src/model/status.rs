//! `GET /v1/status`: readiness, policy, counts and every configured interface.

use serde::{Deserialize, Serialize};

use ipq_common::config::Mode;

use super::PendingWriteView;
use crate::{AttachedHook, Attachment, EarlyReusePolicy, Protection, RecoveredFrom, TcAttachMode};

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    /// Why not ready: starting, the unprotected interfaces with their errors, the pins, the
    /// datapath writes pending, or what cannot save changes and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<String>,
    /// How TC programs attach on this node: `tcx`, `netlink`, or `netlink-then-tcx` (`auto` on
    /// a kernel with TCX: the netlink filter at once, a TCX link in the background).
    /// `unknown` from an agent before the field.
    #[serde(default)]
    pub tc_attach: TcAttachMode,
    /// Interfaces the configuration names that are not protected (attaching or failed).
    #[serde(default)]
    pub unprotected: u64,
    /// How a claim's conntrack entries are flushed, per family, as the start-up probe decided;
    /// absent while it runs, or with `[hygiene] flush = false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack_claim_flush: Option<ClaimFlushView>,
    pub version: String,
    /// `enforce` or `observe`.
    pub mode: Mode,
    pub on_early_reuse: EarlyReusePolicy,
    pub registry: RegistryCounts,
    pub interfaces: Vec<InterfaceStatus>,
    pub conflicts_total: u64,
    pub refused_claims_total: u64,
    pub started_at: String,
    /// What finds the changes no notification announces (a link detached, a program put
    /// ahead of ipq's, a map written by another process): the periodic verification and its
    /// interval. Absent from agents before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unannounced: String,
    /// The last verification of ipq's pins and links against the kernel; absent before the
    /// first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationView>,
    /// How the registry came back when this agent started; absent from agents before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryView>,
    /// What the agent had in place when it became ready; absent until then, and from agents
    /// before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<StartedView>,
    /// Addresses whose datapath entry the kernel refused to write, each retried every tick;
    /// the agent is not ready while any is.
    #[serde(default)]
    pub datapath_writes_pending: u64,
    /// The first 16 of them, in address order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_writes: Vec<PendingWriteView>,
    /// The node's NodeQuarantine object and how writing it goes; absent when the agent
    /// publishes nothing (no Kubernetes node name) and from agents before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishView>,
    /// The projection of the quarantine into whereabouts' reservations and how writing them
    /// goes; absent unless `kubernetes.whereabouts` is on, and from agents before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whereabouts: Option<WhereaboutsView>,
    /// The other nodes' quarantines, from their NodeQuarantine objects; absent when the agent
    /// publishes nothing, and from agents before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
    /// Observe by namespace: the namespaces only observed (`observe_namespaces`), or those
    /// enforced while every other known one is observed (`enforce_namespaces`); both empty:
    /// every namespace as `mode` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observe_namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enforce_namespaces: Vec<String>,
    /// Addresses whose pod's namespace is only observed.
    #[serde(default)]
    pub namespace_observed: u64,
}

/// The other nodes' NodeQuarantine objects as the agent last read them (a bounded summary:
/// per node its counts and its newest entries).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// When the objects were last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
    /// Why the last read failed (RBAC without `list`, an unreachable API server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Other nodes with anything in quarantine or fenced, most first; at most a few dozen.
    #[serde(default)]
    pub nodes: Vec<NodeQuarantineSummary>,
    /// Nodes with something listed that the summary leaves out (over its cap).
    #[serde(default)]
    pub nodes_omitted: u64,
}

/// One other node's NodeQuarantine, summarized.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeQuarantineSummary {
    pub node: String,
    pub quarantined: u64,
    pub fenced: u64,
    /// Live holders whose pod was deleted under them (absent from an older agent's object).
    #[serde(default)]
    pub orphaned: u64,
    /// Its newest entries (by `since`), at most a few.
    #[serde(default)]
    pub newest: Vec<ClusterEntry>,
}

/// One entry of another node's NodeQuarantine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEntry {
    pub address: String,
    pub state: String,
    pub since: String,
    /// `namespace/name` of the pod that held it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// How the projection into whereabouts' OverlappingRangeIPReservations (docs/kubernetes.md)
/// stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhereaboutsView {
    /// whereabouts' namespace, and the network name its reservations' names carry.
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network_name: String,
    /// Reservations of ipq's own; listed addresses another pod's reservation holds.
    pub reservations: u64,
    pub foreign: u64,
    pub writes_total: u64,
    /// Reservations whereabouts deleted while still needed, made again.
    pub recreated_total: u64,
    /// Live holders whose pod was deleted under them (their reservation freed by whereabouts):
    /// the NodeQuarantine lists them as orphaned.
    #[serde(default)]
    pub orphaned: u64,
    pub failures_total: u64,
    /// While failing: why the last attempt failed, and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<String>,
}

/// How the agent's NodeQuarantine object (docs/kubernetes.md) stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishView {
    /// The node, which the object is named after.
    pub node: String,
    /// `starting`, `published` (the object holds what the agent has), `pending` (a change
    /// waits for the next write) or `failing` (writes fail; retried with backoff); `unknown`
    /// for a state of a newer agent.
    pub state: crate::PublishState,
    /// When a write last succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_published_at: Option<String>,
    /// Entries the last written object listed, and those left out of it (it has a cap).
    pub entries: u64,
    pub omitted: u64,
    /// Of `entries`, the orphaned ones: live holders whose pod was deleted under them (a force
    /// delete) and whose address the cluster's IPAM freed (learned by the whereabouts
    /// projection).
    #[serde(default)]
    pub orphaned: u64,
    /// Orphaned entries the last write left out because the API server refused their state (a
    /// NodeQuarantine CRD older than the agent); absent when none were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphans_withheld: Option<u64>,
    pub writes_total: u64,
    pub failures_total: u64,
    /// While failing: why the last attempt failed, since when, and when the next one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<String>,
}

/// The datapath as the agent found it at the moment it became ready (what its `started:` log
/// line says).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedView {
    /// Hooks with ipq's program in place.
    pub attachments: u64,
    /// Configured hooks without it.
    pub unprotected: u64,
    /// Workload interfaces on ipq's netlink filter still to move to their TCX link
    /// (`tc_attach = "auto"` on a TCX kernel): readiness does not wait for that move.
    pub tc_upgrades_pending: u64,
}

/// How the registry came back at start: from the journal, or rebuilt from the pinned maps (no
/// journal yet, or one that could not be used), and what was wrong with what it found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryView {
    /// `journal` or `pinned_maps`.
    pub from: RecoveredFrom,
    /// Addresses in the registry once recovered.
    pub addresses: u64,
    /// What recovery found wrong or set aside: a torn tail dropped, a corrupt journal kept
    /// aside (and where), a newer journal left for its agent; empty when nothing was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// What the last verification of the datapath found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerificationView {
    pub at: String,
    pub took_us: u64,
    /// Pins held and checked (links, maps, programs).
    pub pins: u64,
    /// What was wrong (and what was done); empty when everything was in place.
    pub found: Vec<String>,
    /// When a pass last found something wrong, and what (a repair is usually done before
    /// anyone reads `found`): kept until a later pass finds something again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_found_at: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_found: Vec<String>,
}

/// How a claim's conntrack entries are flushed: `kernel` (the kernel's filtered flush) or
/// `dump (<why>)`, per family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimFlushView {
    pub ipv4: String,
    pub ipv6: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryCounts {
    pub entries: u64,
    pub capacity: u64,
    pub active: u64,
    pub draining: u64,
    pub quarantined: u64,
}

/// An interface the configuration names (a workload interface or an uplink).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    pub ifindex: u32,
    pub name: String,
    /// The hooks with ipq's program in place, named by the attachment each has: `tc-ingress`,
    /// `tc-egress` (ipq's netlink filter under clsact), `tcx-ingress`, `tcx-egress` (a TCX
    /// link), `xdp`.
    pub hooks: Vec<AttachedHook>,
    /// `attaching`, `protected`, `repairing` (another tool took ipq's program off a hook; put
    /// back at once), `bypassed` (another tool's filter or program runs first and ends
    /// processing for a protected address's packet), `unverified` (one runs first and what it
    /// does cannot be told) or `failed` (retried with backoff).
    #[serde(default)]
    pub protection: Protection,
    /// What runs before ipq's program on a hook (another tool's filter or TCX program) and
    /// what it does with the interface's addresses' packets, one line per hook: `protected`
    /// with lines here means every such co-tenant hands packets on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ahead: Vec<String>,
    /// What holds ipq's programs on the hooks: `tcx`, `netlink` (ipq's cls_bpf filter; under
    /// `tc_attach = "auto"` on a TCX kernel, until its TCX link is in), `xdp`, or
    /// `tcx+netlink` halfway through that move. Absent while nothing is attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Attachment>,
    /// The last attach error while not protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Failed attempts since it was last protected.
    #[serde(default)]
    pub failed_attempts: u32,
}
