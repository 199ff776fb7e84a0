//! The registry's vocabulary: holders, claim sources, states, records and settings.

use std::{fmt, net::IpAddr, time::Duration};

use ipq_common::addr::NO_IFINDEX;
use serde::{Deserialize, Serialize};

use crate::config::{Config, EarlyReusePolicy};

/// CLOCK_MONOTONIC(_COARSE) nanoseconds: the time type of the registry and of the datapath.
pub type MonoNs = u64;

/// A duration as monotonic nanoseconds, saturating (a `Duration` of centuries does not wrap).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The Kubernetes pod a holder belongs to, as CNI args name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`; runtimes older than CNI args v1 do not pass it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What uses an address on this node: the host side interface plus whatever identity is known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub ifindex: u32,
    pub ifname: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The container-side interface (`CNI_IFNAME`): with the container id, a CNI attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_ifname: Option<String>,
    /// The CNI network (conflist `name`) of that attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

impl Holder {
    /// A holder known only by its interface.
    pub fn new(ifindex: u32, ifname: impl Into<String>) -> Self {
        Self {
            ifindex,
            ifname: ifname.into(),
            container_id: None,
            cni_ifname: None,
            network: None,
            netns: None,
            pod: None,
        }
    }

    pub fn with_container_id(mut self, id: impl Into<String>) -> Self {
        self.container_id = Some(id.into());
        self
    }

    pub fn with_cni_ifname(mut self, ifname: impl Into<String>) -> Self {
        self.cni_ifname = Some(ifname.into());
        self
    }

    pub fn with_netns(mut self, netns: impl Into<String>) -> Self {
        self.netns = Some(netns.into());
        self
    }

    pub fn with_pod(mut self, pod: PodRef) -> Self {
        self.pod = Some(pod);
        self
    }

    /// Two holders are the same iff they have the same interface and, when both carry a
    /// container id, the same container id. (A netlink-only observation knows no container.)
    pub fn same_as(&self, other: &Holder) -> bool {
        self.ifindex == other.ifindex
            && match (&self.container_id, &other.container_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Fills identity fields this holder lacks from `other` (the same holder seen by a richer
    /// source). Never overwrites what is known. Returns whether anything changed.
    pub(crate) fn merge_identity(&mut self, other: &Holder) -> bool {
        let mut changed = false;
        if self.ifname.is_empty() && !other.ifname.is_empty() {
            self.ifname.clone_from(&other.ifname);
            changed = true;
        }
        changed |= fill(&mut self.container_id, &other.container_id);
        changed |= fill(&mut self.cni_ifname, &other.cni_ifname);
        changed |= fill(&mut self.network, &other.network);
        changed |= fill(&mut self.netns, &other.netns);
        changed |= fill(&mut self.pod, &other.pod);
        changed
    }
}

fn fill<T: Clone>(slot: &mut Option<T>, from: &Option<T>) -> bool {
    if slot.is_none() && from.is_some() {
        slot.clone_from(from);
        true
    } else {
        false
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ifindex {})", self.ifname, self.ifindex)?;
        if let Some(pod) = &self.pod {
            write!(f, " pod {}/{}", pod.namespace, pod.name)?;
        }
        if let Some(id) = &self.container_id {
            write!(f, " container {}", id.get(..12).unwrap_or(id))?;
        }
        Ok(())
    }
}

/// Who made a claim. `refuse-new` can refuse an explicit claim (CNI, API) but only fence one it
/// merely observed (netlink): the workload already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Cni,
    Api,
    Netlink,
}

impl Source {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cni => "cni",
            Self::Api => "api",
            Self::Netlink => "netlink",
        }
    }

    /// An explicit request (CNI ADD, API call), as opposed to an observation.
    pub const fn is_explicit(self) -> bool {
        !matches!(self, Self::Netlink)
    }
}

/// The name of a lifecycle state, `Free` included (an address without a record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateName {
    Free,
    Active,
    Draining,
    Quarantined,
}

impl StateName {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Active => "active",
            Self::Draining => "draining",
            Self::Quarantined => "quarantined",
        }
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an address is in its lifecycle (DESIGN §2). `Free` is the absence of a record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum AddrStatus {
    /// Held by a live holder since `since`.
    Active { holder: Holder, since: MonoNs },
    /// The holder is terminating but alive; its traffic flows unless it is fenced.
    Draining { holder: Holder, since: MonoNs },
    /// The holder is gone; the address cools down until `until` (adaptive: moved by stale
    /// traffic, see [`RegistrySettings::release_at`]).
    Quarantined {
        since: MonoNs,
        until: MonoNs,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_stale: Option<MonoNs>,
        previous: Holder,
    },
}

impl AddrStatus {
    pub const fn name(&self) -> StateName {
        match self {
            Self::Active { .. } => StateName::Active,
            Self::Draining { .. } => StateName::Draining,
            Self::Quarantined { .. } => StateName::Quarantined,
        }
    }

    /// The live holder (Active or Draining).
    pub const fn holder(&self) -> Option<&Holder> {
        match self {
            Self::Active { holder, .. } | Self::Draining { holder, .. } => Some(holder),
            Self::Quarantined { .. } => None,
        }
    }

    /// When the address entered this state.
    pub const fn since(&self) -> MonoNs {
        match self {
            Self::Active { since, .. }
            | Self::Draining { since, .. }
            | Self::Quarantined { since, .. } => *since,
        }
    }
}

/// Everything the registry knows about one address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrRecord {
    pub addr: IpAddr,
    #[serde(flatten)]
    pub status: AddrStatus,
    /// A live holder whose traffic with this address is dropped both ways: the old holder under
    /// `fence-old`, or a Draining holder another machine claims the address from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<Holder>,
    /// Under `refuse-new`: a claimant seen only on netlink, fenced until the live holder is gone
    /// (or the quarantine is over), then promoted to Active holder without any action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_claimant: Option<Holder>,
    /// Earlier holders displaced while `fenced` was already taken (three or more claimants on
    /// one address). The datapath has one fence slot, so these rely on the duplicate-source
    /// check for what they send; the registry keeps them so that the address does not fall
    /// Free while one of them still lives (see [`Registry::tick`](super::Registry::tick)), and
    /// moves the first of them into `fenced` whenever that slot empties.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<Holder>,
    /// Conflicts recorded for this address since it left Free.
    #[serde(default)]
    pub conflicts: u32,
    /// An early reuse of this address was let through (`on_early_reuse = observe`): what the
    /// datapath sees between its holders is counted, never dropped, until the address is Free
    /// again. Journaled, and mirrored in the datapath entry's `FLAG_OBSERVE_ONLY`, so that a
    /// restart, an upgrade or a lost journal never turns observation into enforcement.
    /// (Journals written before this field read as `false`; the pinned flag fills it in.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
}

impl AddrRecord {
    pub(crate) fn new(addr: IpAddr, status: AddrStatus) -> Self {
        Self {
            addr,
            status,
            fenced: None,
            blocked_claimant: None,
            displaced: Vec::new(),
            conflicts: 0,
            observe_only: false,
        }
    }

    pub const fn state(&self) -> StateName {
        self.status.name()
    }

    /// The interface whose traffic with this address the datapath drops both ways: the blocked
    /// claimant, else the fenced holder, else [`NO_IFINDEX`]. (The registry never sets both.)
    pub fn fenced_ifindex(&self) -> u32 {
        self.blocked_claimant
            .as_ref()
            .or(self.fenced.as_ref())
            .map_or(NO_IFINDEX, |h| h.ifindex)
    }

    /// Whether `holder` is the fenced holder, the blocked claimant or a displaced holder.
    pub fn is_fenced(&self, holder: &Holder) -> bool {
        self.fenced.as_ref().is_some_and(|f| f.same_as(holder))
            || self
                .blocked_claimant
                .as_ref()
                .is_some_and(|b| b.same_as(holder))
            || self.displaced.iter().any(|d| d.same_as(holder))
    }

    /// Puts `holder` in the fence slot; whoever held it, if still someone else, is displaced.
    pub(crate) fn fence(&mut self, holder: Holder) {
        if let Some(previous) = self.fenced.replace(holder) {
            self.displace(previous);
        }
    }

    /// Records a live holder that lost the address and the fence slot.
    pub(crate) fn displace(&mut self, holder: Holder) {
        let current = self.status.holder();
        let known = current.is_some_and(|h| h.same_as(&holder)) || self.is_fenced(&holder);
        if !known {
            self.displaced.push(holder);
        }
    }

    /// Forgets `holder` wherever it is fenced (it becomes the holder, or is refused).
    pub(crate) fn unfence(&mut self, holder: &Holder) {
        if self.fenced.as_ref().is_some_and(|f| f.same_as(holder)) {
            self.fenced = None;
        }
        if self
            .blocked_claimant
            .as_ref()
            .is_some_and(|b| b.same_as(holder))
        {
            self.blocked_claimant = None;
        }
        self.displaced.retain(|d| !d.same_as(holder));
    }

    /// Every holder this record names as alive: holder, fenced, blocked claimant, displaced.
    pub fn live_holders(&self) -> impl Iterator<Item = &Holder> + '_ {
        self.status
            .holder()
            .into_iter()
            .chain(self.fenced.as_ref())
            .chain(self.blocked_claimant.as_ref())
            .chain(self.displaced.iter())
    }

    pub(crate) fn live_ifindexes(&self) -> impl Iterator<Item = u32> + '_ {
        self.live_holders().map(|h| h.ifindex)
    }
}

/// The registry's knobs, taken from the agent configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistrySettings {
    pub policy: EarlyReusePolicy,
    pub cooldown: Duration,
    pub quiet_period: Duration,
    pub max_cooldown: Duration,
    pub capacity: u32,
}

impl From<&Config> for RegistrySettings {
    fn from(config: &Config) -> Self {
        Self {
            policy: config.on_early_reuse,
            cooldown: config.cooldown,
            quiet_period: config.quiet_period,
            max_cooldown: config.max_cooldown,
            capacity: config.capacity,
        }
    }
}

impl Default for RegistrySettings {
    fn default() -> Self {
        Self::from(&Config::default())
    }
}

impl RegistrySettings {
    /// When a quarantine that began at `since` ends: `max(since + cooldown, last_stale +
    /// quiet_period)`, capped at `since + max_cooldown`. The cap never undercuts the cooldown,
    /// even with settings that were not validated (`max_cooldown < cooldown`).
    pub fn release_at(&self, since: MonoNs, last_stale: Option<MonoNs>) -> MonoNs {
        let cooldown = duration_ns(self.cooldown);
        let cap = since.saturating_add(duration_ns(self.max_cooldown).max(cooldown));
        let base = since.saturating_add(cooldown);
        let quiet = last_stale.map_or(0, |at| at.saturating_add(duration_ns(self.quiet_period)));
        base.max(quiet).min(cap)
    }
}
