//! The API's wire types: what `/v1` accepts and returns. The agent, the `ipq` CLI and `ipq-cni`
//! share them, so a field cannot mean one thing on one side and another on the other.
//!
//! Times are RFC 3339 UTC strings (`"2026-11-22T10:00:00.123Z"`), converted from the
//! registry's monotonic clock when a response is built. Addresses are IP strings; holders are
//! [`Holder`]s as the registry keeps them.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{
    config::{EarlyReusePolicy, Mode},
    registry::{ConflictKind, Holder, PodRef, StateName},
};

/// The API version prefix of every path.
pub const API_PREFIX: &str = "/v1";

/// `POST /v1/claims`: `holder` claims every address in `addresses`, all or none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub addresses: Vec<IpAddr>,
    pub holder: HolderSpec,
    /// Who asks: `cni` (ipq-cni) or `api` (an IPAM, an operator; the default). Both are
    /// explicit claims, which `refuse-new` can refuse.
    #[serde(default = "api_source")]
    pub source: ClaimSource,
}

/// The callers of `POST /v1/claims`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimSource {
    Cni,
    Api,
}

fn api_source() -> ClaimSource {
    ClaimSource::Api
}

/// Who claims: the host-side interface by name plus whatever identity the caller knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderSpec {
    /// The host-side interface (the pod's veth peer, a bridge port).
    pub interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The container-side interface name (`CNI_IFNAME`), which with the container id names a
    /// CNI attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_ifname: Option<String>,
    /// The CNI network (the conflist's `name`) the attachment belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The MAC of the holder's interface inside its sandbox (`aa:bb:cc:dd:ee:ff`, from the
    /// CNI prevResult): what reuse hygiene announces the address at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// The answer to a claim: the addresses as they are now, and the conflicts the claim caused
/// (under `fence-old` or `observe` a claim over a live holder succeeds *and* conflicts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimResponse {
    pub addresses: Vec<AddressView>,
    pub conflicts: Vec<ConflictView>,
}

/// `POST /v1/drains`: the holder of a CNI attachment is terminating (CNI DEL). Idempotent:
/// nothing to drain is success. Drains every address whose live holder has `container_id`
/// (and `cni_ifname`, when given), plus `addresses` whose holder is that container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainAttachmentRequest {
    pub container_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_ifname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
}

/// `POST /v1/addresses/{ip}/release`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Needed to end a quarantine early or to free a live holder's address.
    #[serde(default)]
    pub force: bool,
}

/// One CNI attachment, as `cni.dev/valid-attachments` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// `POST /v1/gc`: drain every CNI-made holder whose attachment is not in `valid_attachments`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    pub valid_attachments: Vec<Attachment>,
    /// The CNI network being collected: holders of another network are left alone. Without
    /// it, every CNI-made holder is judged by `valid_attachments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
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
    /// `active`, `draining` or `quarantined` (a `free` address has no view: 404).
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
    /// Whether ipq's programs are in place on the holder's interface: `attaching`, `protected`
    /// or `failed` (left out when there is no live holder on a workload interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protection: Option<String>,
    /// What holds ipq's programs on that interface: `tcx`, `netlink`, `tcx+netlink` (as in
    /// `/v1/status`); left out when nothing is attached there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
    /// An early reuse of it was let through (`on_early_reuse = observe`): conflicts between its
    /// holders are counted, never dropped, until it is Free again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
    /// The last reuse-hygiene pass on it (conntrack and neighbour entries flushed, the new
    /// holder announced), if one ran since it entered the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_flush: Option<HygieneView>,
    /// The node's IPAM keeps this address allocated for ipq (`ipq-ipam`): not handed out again
    /// until ipq runs the delegate's DEL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam_hold: Option<IpamHoldView>,
}

/// An allocation `ipq-ipam` holds in the node's IPAM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamHoldView {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// When it is given back: `after the quarantine` (until the address's `until`), `now`
    /// (free: the delegate's DEL runs within a second), or `failing` (retried with backoff).
    pub release: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/ipam/exhausted`: ipq-ipam's delegate said the range of `network` is used up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExhaustedRequest {
    /// The network's `name`, as the held releases have it ("" for a config without one).
    pub network: String,
    /// The container whose ADD found the range exhausted (for the log and the event).
    pub container_id: String,
}

/// What the agent did about an exhausted range (`ipam_on_exhausted`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExhaustedAnswer {
    /// `wait` or `release-quietest`.
    pub policy: String,
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
    pub trigger: String,
    /// When it finished. Empty (and left out) inside an [`Event`], whose own `at` it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub at: String,
    /// Conntrack entries deleted (original or reply tuple carrying the address).
    pub conntrack_entries: u64,
    /// How: `dump` (the count is exact) or `kernel` (the kernel's filtered flush on a claim;
    /// the count is what the kernel reported, a lower bound). Empty (and left out) when the
    /// flush did not finish.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conntrack_flush: String,
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
    pub outcome: String,
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

/// One line of `GET /v1/events` (newline-delimited JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event the agent published; a gap means events were lost (a
    /// `lost` marker, which carries seq 0 and is outside the sequence, says how many).
    pub seq: u64,
    pub at: String,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// A registry conflict.
    Conflict(Box<ConflictView>),
    /// An address changed state (or holder).
    Transition {
        address: IpAddr,
        from: StateName,
        to: StateName,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
    },
    /// A packet the kernel dropped, observed or reported, sampled (rate-limited per address).
    Sample {
        address: IpAddr,
        hook: String,
        reason: String,
        action: String,
        /// The address's state in the datapath when the packet was seen.
        state: String,
        /// The interface the packet was seen on, by index and name.
        ifindex: u32,
        #[serde(default)]
        seen_on: String,
        holder_ifindex: u32,
        /// Who the registry says holds the address (for a quarantined one, who held it last).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
        src_mac: String,
        pkt_len: u32,
    },
    /// A reuse-hygiene pass finished.
    Hygiene(Box<HygieneView>),
    /// Another tool took ipq's program off a hook (a qdisc or filter deleted, a filter put in
    /// its place, a link detached, a pin removed).
    AttachmentLost {
        interface: String,
        ifindex: u32,
        /// `tc_ingress`, `tc_egress` or `xdp`.
        hook: String,
        /// `qdisc`, `filter`, `link` or `pin`.
        what: String,
        /// Whether ipq's program is back on the hook.
        repaired: bool,
        /// Why it is not (yet): retried with backoff, the interface unprotected meanwhile.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// ipq-ipam's delegate found its range exhausted while ipq held addresses of it.
    IpamExhausted {
        network: String,
        container_id: String,
        #[serde(flatten)]
        answer: ExhaustedAnswer,
    },
    /// `n` events were dropped before this subscriber could read them.
    Lost { n: u64 },
}

/// `PUT /v1/datapath/{ip}`: break-glass, one datapath entry written by the agent itself (the
/// maps' one writer) without the registry knowing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatapathEntryRequest {
    /// `active`, `draining` or `quarantined`.
    pub state: String,
    /// The interface of the holder whose traffic flows (required but for `quarantined`).
    #[serde(default)]
    pub holder: Option<String>,
    /// An interface whose packets with this address are dropped both ways.
    #[serde(default)]
    pub fenced: Option<String>,
}

/// A datapath entry as the agent wrote or removed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatapathEntryView {
    pub address: IpAddr,
    pub state: String,
    pub holder_ifindex: u32,
    pub fenced_ifindex: u32,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    /// Why not ready: starting, or the unprotected interfaces with their errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<String>,
    /// How TC programs attach on this node: `tcx`, `netlink`, or `netlink-then-tcx` (`auto` on
    /// a kernel with TCX: the netlink filter at once, a TCX link in the background).
    #[serde(default)]
    pub tc_attach: String,
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
    /// The last verification of ipq's pins and links against the kernel; absent before the
    /// first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationView>,
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
    /// The hooks with ipq's program in place: `tcx-ingress`, `tcx-egress` (the TC hooks, TCX
    /// link or netlink filter), `xdp`.
    pub hooks: Vec<String>,
    /// `attaching`, `protected` or `failed` (retried with backoff).
    #[serde(default)]
    pub protection: String,
    /// What holds ipq's programs on the hooks: `tcx`, `netlink` (ipq's cls_bpf filter; under
    /// `tc_attach = "auto"` on a TCX kernel, until its TCX link is in), `xdp`, or
    /// `tcx+netlink` halfway through that move. Absent while nothing is attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
    /// The last attach error while not protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Failed attempts since it was last protected.
    #[serde(default)]
    pub failed_attempts: u32,
}

/// Every error response: `{"error": {...}}` with an HTTP status that matches `code`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ApiErrorBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    pub code: ErrorCode,
    /// Names the input that was wrong and why.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// The holder in the way (refused, not_holder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Until when the address is not free (refused during a quarantine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// Stable error codes. Scripts and the CNI plugin branch on these, never on messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not JSON of the expected shape (400).
    BadRequest,
    /// A field's value is not acceptable: an address, a state name, an empty list (400).
    InvalidArgument,
    /// The address is Free or the path does not exist (404).
    NotFound,
    /// The interface named by the holder does not exist on this node (404).
    UnknownInterface,
    /// `refuse-new`: the address is not free; try again later (409).
    Refused,
    /// The caller is not the address's holder (409).
    NotHolder,
    /// Releasing this address needs `force` (409).
    NotReleasable,
    /// The registry is full; nothing was evicted (507).
    RegistryFull,
    /// The peer's credentials are not allowed on the socket (403).
    Forbidden,
    /// The path exists but not with this method (405).
    MethodNotAllowed,
    /// The agent is starting or stopping (503).
    NotReady,
    /// The change could not be made durable (the journal save failed); retry later (503).
    Unavailable,
    /// Something failed inside the agent (500).
    Internal,
}

impl ErrorCode {
    pub const fn http_status(self) -> u16 {
        match self {
            Self::BadRequest | Self::InvalidArgument => 400,
            Self::Forbidden => 403,
            Self::NotFound | Self::UnknownInterface => 404,
            Self::MethodNotAllowed => 405,
            Self::Refused | Self::NotHolder | Self::NotReleasable => 409,
            Self::Internal => 500,
            Self::NotReady | Self::Unavailable => 503,
            Self::RegistryFull => 507,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}
