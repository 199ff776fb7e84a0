//! The registry's vocabulary: holders, claim sources, states, records and settings.

use std::{net::IpAddr, time::Duration};

pub use ipq_api::{Holder, PodRef, StateName};

use ipq_common::addr::NO_IFINDEX;
use serde::{Deserialize, Serialize};

/// CLOCK_MONOTONIC(_COARSE) nanoseconds: the time type of the registry and of the datapath.
pub type MonoNs = u64;

/// A duration as monotonic nanoseconds, saturating (a `Duration` of centuries does not wrap).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Who made a claim. `refuse-new` can refuse an explicit claim (CNI, API) but only fence one it
/// merely observed (netlink): the workload already exists.
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
#[strum(serialize_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Cni,
    Api,
    Netlink,
}

impl Source {
    /// An explicit request (CNI ADD, API call), as opposed to an observation.
    pub const fn is_explicit(self) -> bool {
        !matches!(self, Self::Netlink)
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
///
/// Kept small, since a registry holds one per address (65536 by default): the holders that
/// only contested addresses have (fenced, blocked claimant, displaced) live in one box that
/// exists only while one of them does. Its JSON (journal, API) is the flat object it always was.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "RecordWire")]
pub struct AddrRecord {
    pub addr: IpAddr,
    pub status: AddrStatus,
    /// `None` when no holder is fenced, blocked or displaced; never `Some` of an empty contest,
    /// so that equality does not depend on the path a record took.
    contest: Option<Box<Contest>>,
    /// Conflicts recorded for this address since it left Free.
    pub conflicts: u32,
    /// An early reuse of this address was let through (`on_early_reuse = observe`): what the
    /// datapath sees between its holders is counted, never dropped, until the address is Free
    /// again. Journaled, and mirrored in the datapath entry's `FLAG_OBSERVE_ONLY`, so that a
    /// restart, an upgrade or a lost journal never turns observation into enforcement.
    /// (Journals written before this field read as `false`; the pinned flag fills it in.)
    pub observe_only: bool,
}

/// The live holders of a contested address other than its holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Contest {
    /// A live holder whose traffic with this address is dropped both ways: the old holder under
    /// `fence-old`, or a Draining holder another machine claims the address from.
    fenced: Option<Holder>,
    /// Under `refuse-new`: a claimant seen only on netlink, fenced until the live holder is gone
    /// (or the quarantine is over), then promoted to Active holder without any action.
    blocked_claimant: Option<Holder>,
    /// Earlier holders displaced while `fenced` was already taken (three or more claimants on
    /// one address). The datapath has one fence slot, so these rely on the duplicate-source
    /// check for what they send; the registry keeps them so that the address does not fall
    /// Free while one of them still lives (see [`Registry::tick`](super::Registry::tick)), and
    /// moves the first of them into `fenced` whenever that slot empties.
    displaced: Vec<Holder>,
}

impl Contest {
    fn is_empty(&self) -> bool {
        self.fenced.is_none() && self.blocked_claimant.is_none() && self.displaced.is_empty()
    }
}

/// A record as JSON has it: the status flattened into one object with the other fields.
#[derive(Deserialize)]
struct RecordWire {
    addr: IpAddr,
    #[serde(flatten)]
    status: AddrStatus,
    #[serde(default)]
    fenced: Option<Holder>,
    #[serde(default)]
    blocked_claimant: Option<Holder>,
    #[serde(default)]
    displaced: Vec<Holder>,
    #[serde(default)]
    conflicts: u32,
    #[serde(default)]
    observe_only: bool,
}

impl From<RecordWire> for AddrRecord {
    fn from(wire: RecordWire) -> Self {
        let mut record = AddrRecord::new(wire.addr, wire.status);
        record.conflicts = wire.conflicts;
        record.observe_only = wire.observe_only;
        let contest = Contest {
            fenced: wire.fenced,
            blocked_claimant: wire.blocked_claimant,
            displaced: wire.displaced,
        };
        // Nearly every record has none: no box to allocate (and free) for them on a load.
        if !contest.is_empty() {
            record.contest = Some(Box::new(contest));
        }
        record
    }
}

/// The same object, borrowed: serializing a record copies nothing.
#[derive(Serialize)]
struct RecordRef<'a> {
    addr: IpAddr,
    #[serde(flatten)]
    status: &'a AddrStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    fenced: Option<&'a Holder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked_claimant: Option<&'a Holder>,
    #[serde(skip_serializing_if = "<[Holder]>::is_empty")]
    displaced: &'a [Holder],
    conflicts: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    observe_only: bool,
}

impl Serialize for AddrRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RecordRef {
            addr: self.addr,
            status: &self.status,
            fenced: self.fenced(),
            blocked_claimant: self.blocked_claimant(),
            displaced: self.displaced(),
            conflicts: self.conflicts,
            observe_only: self.observe_only,
        }
        .serialize(serializer)
    }
}

impl AddrRecord {
    pub(crate) fn new(addr: IpAddr, status: AddrStatus) -> Self {
        Self {
            addr,
            status,
            contest: None,
            conflicts: 0,
            observe_only: false,
        }
    }

    pub const fn state(&self) -> StateName {
        self.status.name()
    }

    /// The fenced holder: a live holder whose traffic with this address is dropped both ways
    /// (the old holder under `fence-old`, or a Draining holder another machine claims the
    /// address from).
    pub fn fenced(&self) -> Option<&Holder> {
        self.contest.as_ref()?.fenced.as_ref()
    }

    /// Under `refuse-new`: a claimant seen only on netlink, fenced until the live holder is
    /// gone (or the quarantine is over), then promoted to Active holder without any action.
    pub fn blocked_claimant(&self) -> Option<&Holder> {
        self.contest.as_ref()?.blocked_claimant.as_ref()
    }

    /// Earlier holders displaced while the fence slot was already taken (three or more
    /// claimants on one address): kept so that the address does not fall Free while one of
    /// them still lives; the first moves into the fence slot whenever it empties.
    pub fn displaced(&self) -> &[Holder] {
        self.contest.as_ref().map_or(&[], |c| &c.displaced)
    }

    pub(crate) fn set_fenced(&mut self, holder: Option<Holder>) {
        if holder.is_some() || self.contest.is_some() {
            self.edit_contest(|c| c.fenced = holder);
        }
    }

    #[cfg(test)]
    pub(crate) fn set_blocked_claimant(&mut self, holder: Option<Holder>) {
        if holder.is_some() || self.contest.is_some() {
            self.edit_contest(|c| c.blocked_claimant = holder);
        }
    }

    /// The blocked claimant becomes `holder`; returns the earlier one.
    pub(crate) fn replace_blocked_claimant(&mut self, holder: Holder) -> Option<Holder> {
        self.edit_contest(|c| c.blocked_claimant.replace(holder))
    }

    pub(crate) fn take_blocked_claimant(&mut self) -> Option<Holder> {
        self.contest.as_ref()?;
        self.edit_contest(|c| c.blocked_claimant.take())
    }

    /// The fenced holder, to edit in place (its identity; not who it is).
    pub(crate) fn fenced_mut(&mut self) -> Option<&mut Holder> {
        self.contest.as_mut()?.fenced.as_mut()
    }

    /// Changes the contest through `edit`, keeping the box only while it holds someone. (Callers
    /// that may change nothing check first, so that no box is made and dropped for nothing.)
    fn edit_contest<T>(&mut self, edit: impl FnOnce(&mut Contest) -> T) -> T {
        let contest = self.contest.get_or_insert_with(Box::default);
        let result = edit(contest);
        if contest.is_empty() {
            self.contest = None;
        }
        result
    }

    /// The interface whose traffic with this address the datapath drops both ways: the blocked
    /// claimant, else the fenced holder, else [`NO_IFINDEX`]. (The registry never sets both.)
    pub fn fenced_ifindex(&self) -> u32 {
        self.blocked_claimant()
            .or(self.fenced())
            .map_or(NO_IFINDEX, |h| h.ifindex)
    }

    /// Whether `holder` is the fenced holder, the blocked claimant or a displaced holder.
    pub fn is_fenced(&self, holder: &Holder) -> bool {
        self.fenced().is_some_and(|f| f.same_as(holder))
            || self.blocked_claimant().is_some_and(|b| b.same_as(holder))
            || self.displaced().iter().any(|d| d.same_as(holder))
    }

    /// Puts `holder` in the fence slot; whoever held it, if still someone else, is displaced.
    pub(crate) fn fence(&mut self, holder: Holder) {
        if let Some(previous) = self.edit_contest(|c| c.fenced.replace(holder)) {
            self.displace(previous);
        }
    }

    /// Records a live holder that lost the address and the fence slot.
    pub(crate) fn displace(&mut self, holder: Holder) {
        let current = self.status.holder();
        let known = current.is_some_and(|h| h.same_as(&holder)) || self.is_fenced(&holder);
        if !known {
            self.edit_contest(|c| c.displaced.push(holder));
        }
    }

    /// Forgets `holder` wherever it is fenced (it becomes the holder, or is refused).
    pub(crate) fn unfence(&mut self, holder: &Holder) {
        if self.contest.is_none() {
            return;
        }
        self.edit_contest(|c| {
            if c.fenced.as_ref().is_some_and(|f| f.same_as(holder)) {
                c.fenced = None;
            }
            if c.blocked_claimant
                .as_ref()
                .is_some_and(|b| b.same_as(holder))
            {
                c.blocked_claimant = None;
            }
            c.displaced.retain(|d| !d.same_as(holder));
        });
    }

    /// Forgets interface `ifindex` wherever it is fenced, blocked or displaced (it is gone).
    pub(crate) fn forget_contestant(&mut self, ifindex: u32) {
        if self.contest.is_none() {
            return;
        }
        self.edit_contest(|c| {
            if c.fenced.as_ref().is_some_and(|f| f.ifindex == ifindex) {
                c.fenced = None;
            }
            if c.blocked_claimant
                .as_ref()
                .is_some_and(|b| b.ifindex == ifindex)
            {
                c.blocked_claimant = None;
            }
            c.displaced.retain(|d| d.ifindex != ifindex);
        });
    }

    /// The fence slot never stays empty while a displaced holder lives: the first moves in.
    pub(crate) fn refill_fence_slot(&mut self) {
        if let Some(c) = self.contest.as_mut() {
            if c.fenced.is_none() && !c.displaced.is_empty() {
                c.fenced = Some(c.displaced.remove(0));
            }
        }
    }

    /// Every holder this record names as alive: holder, fenced, blocked claimant, displaced.
    pub fn live_holders(&self) -> impl Iterator<Item = &Holder> + '_ {
        self.status
            .holder()
            .into_iter()
            .chain(self.fenced())
            .chain(self.blocked_claimant())
            .chain(self.displaced().iter())
    }

    pub(crate) fn live_ifindexes(&self) -> impl Iterator<Item = u32> + '_ {
        self.live_holders().map(|h| h.ifindex)
    }
}
