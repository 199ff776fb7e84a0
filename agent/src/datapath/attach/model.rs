//! What the attacher, its workers and its callers say to each other: modes, roles, jobs,
//! reports, and where each wanted interface stands.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use ipq_api::Attachment;

use super::{
    cotenant::Verdict, error::AttachError, pins::Attached, retry::Backoff, upgrade::Upgrade,
};
use crate::paths::AttachPoint;

/// How TC programs are attached on this node.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
pub enum TcMode {
    /// TCX links, pinned under `bpffs_dir/links` (`tc_attach = "tcx"`).
    Tcx,
    /// A clsact qdisc and ipq's cls_bpf filter at `TC_FILTER_PRIORITY`/`TC_FILTER_HANDLE`
    /// (`tc_attach = "netlink"`, or `"auto"` on a kernel without TCX).
    Netlink,
    /// `tc_attach = "auto"` on a kernel with TCX: an interface with a usable TCX link pin keeps
    /// it; any other gets the netlink filter at once and a TCX link later, in the background.
    NetlinkThenTcx,
}

/// The one place a mode becomes the API's name for it (`tc_attach` in `/v1/status`).
impl From<TcMode> for ipq_api::TcAttachMode {
    fn from(mode: TcMode) -> Self {
        match mode {
            TcMode::Tcx => Self::Tcx,
            TcMode::Netlink => Self::Netlink,
            TcMode::NetlinkThenTcx => Self::NetlinkThenTcx,
        }
    }
}

impl TcMode {
    /// The name of `point` as attached first in this mode (the netlink filter, except under
    /// `tc_attach = "tcx"`), for what is said before an attach has told its mechanism.
    pub fn hook_name(self, point: AttachPoint) -> &'static str {
        match self {
            Self::Tcx => point.into(),
            Self::Netlink | Self::NetlinkThenTcx => point.name_under_filter(),
        }
    }
}

/// What holds ipq's program on a hook.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "lowercase")]
pub enum Mechanism {
    /// A pinned TCX link, and no ipq filter left on the hook.
    Tcx,
    /// ipq's cls_bpf filter (in [`TcMode::NetlinkThenTcx`], waiting for its TCX link).
    Netlink,
    /// A pinned XDP link.
    Xdp,
}

impl Mechanism {
    /// The name of `point` held this way, as `ipq status`, the API and the log say it:
    /// `tc-ingress`/`tc-egress` under a netlink filter, `tcx-ingress`/`tcx-egress` under a TCX
    /// link, `xdp`.
    pub fn hook_name(self, point: AttachPoint) -> &'static str {
        match self {
            Self::Netlink => point.name_under_filter(),
            Self::Tcx | Self::Xdp => point.into(),
        }
    }

    /// The one place a hook held this way becomes the API's name for it (`hooks` of an
    /// interface in `/v1/status`), spelled as [`Self::hook_name`] (`vocabulary_tests`).
    pub fn attached_hook(self, point: AttachPoint) -> ipq_api::AttachedHook {
        use ipq_api::AttachedHook as Api;
        match (self, point) {
            (Self::Netlink, AttachPoint::TcxIngress) => Api::TcIngress,
            (Self::Netlink, AttachPoint::TcxEgress) => Api::TcEgress,
            (Self::Tcx | Self::Xdp, AttachPoint::TcxIngress) => Api::TcxIngress,
            (Self::Tcx | Self::Xdp, AttachPoint::TcxEgress) => Api::TcxEgress,
            (_, AttachPoint::Xdp) => Api::Xdp,
        }
    }
}

/// What an interface is to ipq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// TC ingress and egress.
    Workload,
    /// XDP.
    Uplink,
}

impl Role {
    pub fn points(self) -> &'static [AttachPoint] {
        match self {
            Self::Workload => &[AttachPoint::TcxIngress, AttachPoint::TcxEgress],
            Self::Uplink => &[AttachPoint::Xdp],
        }
    }
}

/// What a job is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// Get ipq's programs onto the interface's hooks (its first attach, or a retry).
    Protect,
    /// Swap ipq's netlink filters on a protected interface for TCX links.
    Upgrade,
    /// The kernel announced that something ipq's program on this interface depends on went
    /// (`what`): look at each hook, and attach again where ipq's program is no longer there.
    Repair(Lost),
}

/// What of an attachment went ([`JobKind::Repair`]), as `ipq_datapath_attachments_lost_total`
/// labels it.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "lowercase")]
#[derive(strum::VariantArray)]
pub enum Lost {
    /// The clsact qdisc under ipq's netlink filters.
    Qdisc,
    /// ipq's netlink filter (deleted, or another filter put in its place).
    Filter,
    /// A TCX or XDP link (detached).
    Link,
    /// A pin under `bpffs_dir` (removed or replaced).
    Pin,
}

/// The one place a part lost becomes the API's name for it (`what` of an `attachment_lost`).
impl From<Lost> for ipq_api::LostPart {
    fn from(lost: Lost) -> Self {
        match lost {
            Lost::Qdisc => Self::Qdisc,
            Lost::Filter => Self::Filter,
            Lost::Link => Self::Link,
            Lost::Pin => Self::Pin,
        }
    }
}

impl Lost {
    /// The name of `point` as the attachment that went had it: a qdisc or filter held a
    /// `tc-` hook, a link or its pin a `tcx-` hook (or `xdp`).
    pub fn hook_name(self, point: AttachPoint) -> &'static str {
        match self {
            Self::Qdisc | Self::Filter => point.name_under_filter(),
            Self::Link | Self::Pin => point.into(),
        }
    }
}

/// One attach to do.
#[derive(Clone, Debug)]
pub struct Job {
    pub ifindex: u32,
    pub name: String,
    pub role: Role,
    pub kind: JobKind,
    /// Tells an outdated report (the interface was forgotten or wanted again since) from the
    /// current one.
    pub generation: u64,
}

/// A hook with ipq's program in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hooked {
    pub how: Attached,
    pub by: Mechanism,
}

/// What a worker did with a job, per attach point.
#[derive(Debug)]
pub struct JobReport {
    pub job: Job,
    pub hooks: Vec<(AttachPoint, Result<Hooked, AttachError>)>,
    /// A repair's hooks that had no ipq program when the worker looked (attached again, or
    /// not, as `hooks` says).
    pub found_missing: Vec<AttachPoint>,
    /// Hooks held by ipq's netlink filter where other filters run first (a lower priority),
    /// as the worker's dump found them, with what those filters do with the interface's
    /// addresses' packets ([`super::cotenant::judge`]).
    pub ahead: Vec<(AttachPoint, Verdict)>,
}

/// An attachment another tool took away, as a repair found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostAttachment {
    pub ifindex: u32,
    pub name: String,
    pub point: AttachPoint,
    pub what: Lost,
    /// `None` once ipq's program is back; else why it could not be put back (retried).
    pub error: Option<String>,
}

/// Where an interface stands: the API's one vocabulary (`bypassed`: ipq's netlink filter or
/// TCX link is in place, but another tool's runs before it on a hook and ends processing for a
/// protected address's packet; `unverified`: what it does cannot be told; either way ipq does
/// not touch it, and the interface is unprotected until it goes or hands packets on).
pub use ipq_api::Protection;

/// One wanted interface.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub role: Role,
    pub protection: Protection,
    /// Attach points whose program is in place, and what holds it.
    pub attached: BTreeMap<AttachPoint, Mechanism>,
    /// The last error, per attach point, of the last failed attempt.
    pub last_error: Option<String>,
    /// Attempts since the last success (0 once protected).
    pub failures: u32,
    /// Since when the current protection state holds.
    pub since: Instant,
    pub(super) generation: u64,
    pub(super) backoff: Backoff,
    pub(super) retry_at: Option<Instant>,
    pub(super) upgrade: Upgrade,
    /// Hooks known to have lost ipq's program, until a repair's report says how they are.
    pub(super) lost: BTreeSet<AttachPoint>,
    /// When a report last said how every hook is: a verification that began before it saw
    /// the hooks as they were then (perhaps ipq's own move first half done), and its findings
    /// of them are stale.
    pub(super) looked_at: Option<Instant>,
    /// Hooks where another filter or program runs before ipq's and ends processing
    /// ([`Protection::Bypassed`]).
    pub(super) bypassed: BTreeSet<AttachPoint>,
    /// What runs before ipq's program on a hook, as last judged: a co-tenant that hands
    /// packets on leaves the hook protected; one that cannot be told leaves it `unverified`.
    pub ahead: BTreeMap<AttachPoint, Verdict>,
}

impl Target {
    /// Hooks whose co-tenant ahead could not be told ([`Protection::Unverified`]).
    pub fn unverified(&self) -> impl Iterator<Item = AttachPoint> + '_ {
        self.ahead
            .iter()
            .filter(|(_, v)| matches!(v, Verdict::CannotTell(_)))
            .map(|(p, _)| *p)
    }

    /// Whether a co-tenant ahead keeps a hook unprotected: it ends processing, or cannot be
    /// told.
    pub(super) fn held_back(&self) -> bool {
        !self.bypassed.is_empty() || self.unverified().next().is_some()
    }
}

impl Target {
    /// How ipq's programs are held on this interface's hooks: `tcx`, `netlink`, `xdp`, or
    /// `tcx+netlink` while an upgrade is half done; None when nothing is attached. The one
    /// place the hooks' mechanisms become the API's name for them.
    pub fn attachment(&self) -> Option<Attachment> {
        let kinds: BTreeSet<Mechanism> = self.attached.values().copied().collect();
        let has = |m| kinds.contains(&m);
        match (
            has(Mechanism::Tcx),
            has(Mechanism::Netlink),
            has(Mechanism::Xdp),
        ) {
            (false, false, false) => None,
            (true, false, false) => Some(Attachment::Tcx),
            (false, true, false) => Some(Attachment::Netlink),
            (false, false, true) => Some(Attachment::Xdp),
            (true, true, false) => Some(Attachment::TcxAndNetlink),
            // XDP is an uplink's only hook, TC a workload's: no interface has both.
            _ => Some(Attachment::Unknown),
        }
    }
}
