//! The registry's vocabulary: holders, claim sources, states, records and settings.

use std::{net::IpAddr, time::Duration};

pub use ipq_api::{Holder, PodRef, StateName};

use ipq_common::addr::NO_IFINDEX;
use serde::{Deserialize, Serialize};

use super::{
    contest::{Contest, Contestants},
    effects::{Conflict, ConflictKind, Effect},
};
use crate::config::EarlyReusePolicy;

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
    /// traffic, see [`RegistrySettings::release_at`](super::RegistrySettings::release_at)).
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
/// only contested addresses have (fenced, blocked claimant, displaced) live in [`Contest`], one
/// box that exists only while one of them does. Its JSON (journal, API) is the flat object it
/// always was.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "RecordWire")]
pub struct AddrRecord {
    pub addr: IpAddr,
    pub status: AddrStatus,
    /// Who else lives on the address: fenced, blocked or displaced holders.
    pub contest: Contest,
    /// Conflicts recorded for this address since it left Free.
    pub conflicts: u32,
    /// An early reuse of this address was let through (`on_early_reuse = observe`): what the
    /// datapath sees between its holders is counted, never dropped, until the address is Free
    /// again. Journaled, and mirrored in the datapath entry's `FLAG_OBSERVE_ONLY`, so that a
    /// restart, an upgrade or a lost journal never turns observation into enforcement.
    /// (Journals written before this field read as `false`; the pinned flag fills it in.)
    pub observe_only: bool,
    /// Its holder (for a quarantine, the pod that left it) is in a namespace the agent only
    /// observes (`observe_namespaces`, `enforce_namespaces`): mirrored in the datapath entry's
    /// `FLAG_OBSERVE_NAMESPACE`. Derived, never journaled: the record book sets it from the
    /// configuration on every change of the record, a restore included
    /// ([`super::book::RecordBook`]), so a changed configuration applies at the next start.
    pub namespace_observed: bool,
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
        record.contest = Contest::of(Contestants {
            fenced: wire.fenced,
            blocked_claimant: wire.blocked_claimant,
            displaced: wire.displaced,
        });
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
            contest: Contest::default(),
            conflicts: 0,
            observe_only: false,
            namespace_observed: false,
        }
    }

    /// The namespace of the pod the address belongs to: its live holder's, or for a
    /// quarantine the one that left it; `None` when the CNI named no pod.
    pub fn owner_namespace(&self) -> Option<&str> {
        let owner = match &self.status {
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => holder,
            AddrStatus::Quarantined { previous, .. } => previous,
        };
        owner.pod().map(|pod| pod.namespace.as_str())
    }

    pub const fn state(&self) -> StateName {
        self.status.name()
    }

    /// The fenced holder ([`Contest::fenced`]).
    pub fn fenced(&self) -> Option<&Holder> {
        self.contest.fenced()
    }

    /// The blocked claimant ([`Contest::blocked_claimant`]).
    pub fn blocked_claimant(&self) -> Option<&Holder> {
        self.contest.blocked_claimant()
    }

    /// The displaced holders ([`Contest::displaced`]).
    pub fn displaced(&self) -> &[Holder] {
        self.contest.displaced()
    }

    /// Whether `holder` is the fenced holder, the blocked claimant or a displaced holder.
    pub fn is_fenced(&self, holder: &Holder) -> bool {
        self.contest.is_fenced(holder)
    }

    /// The interface whose traffic with this address the datapath drops both ways: the blocked
    /// claimant, else the fenced holder, else [`NO_IFINDEX`]. (The registry never sets both.)
    pub fn fenced_ifindex(&self) -> u32 {
        self.blocked_claimant()
            .or(self.fenced())
            .map_or(NO_IFINDEX, |h| h.ifindex)
    }

    /// Puts `holder` in the fence slot; whoever held it, if still someone else, is displaced.
    pub(crate) fn fence(&mut self, holder: Holder) {
        self.contest.fence(holder, self.status.holder());
    }

    /// Records a live holder that lost the address and the fence slot.
    pub(crate) fn displace(&mut self, holder: Holder) {
        self.contest.displace(holder, self.status.holder());
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

    /// Counts a conflict on this record and builds its effect.
    pub(crate) fn conflict(
        &mut self,
        kind: ConflictKind,
        old: Option<Holder>,
        new: Option<Holder>,
        policy: EarlyReusePolicy,
        at: MonoNs,
    ) -> Effect {
        self.conflicts = self.conflicts.saturating_add(1);
        Effect::Conflict(Box::new(Conflict {
            kind,
            addr: self.addr,
            old,
            new,
            policy,
            at,
        }))
    }

    /// What a Quarantined record becomes when its quarantine ends at `now`, with the
    /// [`Effect::Released`] that says so; `None` when it is not Quarantined. The address goes
    /// to whoever still lives on it: the blocked claimant (`refuse-new`) becomes its Active
    /// holder; a fenced holder that is still alive (a stuck, terminating workload) keeps it as
    /// Draining and stays fenced, so it is neither reconnected nor forgotten; with neither, the
    /// address is Free (the record `None`).
    pub(crate) fn quarantine_over(&self, now: MonoNs) -> Option<(Option<AddrRecord>, Effect)> {
        let AddrStatus::Quarantined { since, .. } = self.status else {
            return None;
        };
        let mut next = self.clone();
        let after = if let Some(claimant) = next.contest.take_blocked_claimant() {
            next.status = AddrStatus::Active {
                holder: claimant,
                since: now,
            };
            Some(next)
        } else if let Some(fenced) = next.fenced().cloned() {
            // (`put` keeps the fence slot filled while any displaced holder lives.)
            next.status = AddrStatus::Draining {
                holder: fenced,
                since: now,
            };
            Some(next)
        } else {
            None
        };
        let released = Effect::Released {
            addr: self.addr,
            quarantined_for_ns: now.saturating_sub(since),
        };
        Some((after, released))
    }
}
