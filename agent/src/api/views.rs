//! From the registry's records, conflicts and kernel samples to the API's wire types, needing
//! nothing but what they are given: monotonic stamps become wall-clock RFC 3339 times, a
//! conflict gets the outcome its policy had, a sample becomes an event. The answers built from
//! the registry owner's state, registry refusals as API errors included, are
//! `tracker::api_service`'s.

use std::{
    net::IpAddr,
    sync::OnceLock,
    time::{Duration, SystemTime},
};

use ipq_common::{
    addr::AddrState,
    counters::{Action, Reason},
    sample::ConflictSample,
    verdict,
};

use super::model::{
    AddressView, ApiErrorBody, ClaimFlushView, ConflictView, ErrorCode, EventBody, InterfaceStatus,
    PendingWriteView, RecoveryView, RegistryCounts, Role, StartedView, Status, VerificationView,
};
/// What a policy did about a conflict, as `ConflictView::outcome` says it: the API's type.
pub use ipq_api::ConflictOutcome as Outcome;
use ipq_api::{EntryState, EventHook, SampleAction, SampleReason, TcAttachMode};

use crate::{
    config::{EarlyReusePolicy, Mode},
    netdev,
    registry::{
        AddrRecord, AddrStatus, Clock, Conflict, ConflictKind, Holder, MonoNs, Registry, StateName,
    },
};

/// Converts monotonic nanoseconds to wall-clock time, from one reading of both clocks.
#[derive(Clone, Copy, Debug)]
pub struct TimeBase {
    mono_ns: MonoNs,
    wall: SystemTime,
}

impl TimeBase {
    /// The agent's one reading, taken at first use: every time it reports then converts the
    /// same stamp to the same string, call after call.
    pub fn now() -> Self {
        static BASE: OnceLock<TimeBase> = OnceLock::new();
        *BASE.get_or_init(|| Self {
            mono_ns: netdev::monotonic_ns(),
            wall: SystemTime::now(),
        })
    }

    /// For tests: `mono_ns` on the monotonic clock is `wall`.
    pub fn at(mono_ns: MonoNs, wall: SystemTime) -> Self {
        Self { mono_ns, wall }
    }

    pub fn wall(&self, at: MonoNs) -> SystemTime {
        if at >= self.mono_ns {
            self.wall + Duration::from_nanos(at - self.mono_ns)
        } else {
            self.wall - Duration::from_nanos(self.mono_ns - at)
        }
    }

    /// `at` as an RFC 3339 UTC time with milliseconds.
    pub fn rfc3339(&self, at: MonoNs) -> String {
        humantime::format_rfc3339_millis(self.wall(at)).to_string()
    }
}

pub fn address_view(record: &AddrRecord, time: &TimeBase) -> AddressView {
    let (until, last_stale, previous_holder) = match &record.status {
        AddrStatus::Quarantined {
            until,
            last_stale,
            previous,
            ..
        } => (
            Some(time.rfc3339(*until)),
            last_stale.map(|at| time.rfc3339(at)),
            Some(previous.clone()),
        ),
        _ => (None, None, None),
    };
    AddressView {
        address: record.addr,
        state: record.state(),
        holder: record.status.holder().cloned(),
        previous_holder,
        fenced: record.fenced().cloned(),
        blocked_claimant: record.blocked_claimant().cloned(),
        displaced: record.displaced().to_vec(),
        since: time.rfc3339(record.status.since()),
        until,
        last_stale,
        conflicts: record.conflicts,
        protection: None,
        attachment: None,
        observe_only: record.observe_only,
        namespace_observed: record.namespace_observed,
        last_flush: None,
        ipam_hold: None,
        pending_write: None,
    }
}

/// What a policy did about a conflict, as `ConflictView::outcome` says it: the API's type.
/// What the policy did about `conflict`, judged from its address's record after it (none once
/// the address is free) under the agent's `mode`.
pub fn outcome_of(conflict: &Conflict, record: Option<&AddrRecord>, mode: Mode) -> Outcome {
    let old_fenced = match (record, &conflict.old) {
        (Some(record), Some(old)) => record.is_fenced(old),
        _ => false,
    };
    let flags = record.map_or(0, |r| crate::registry::datapath_entry(r).flags);
    let duplicate = verdict::action_for_flags(mode, Reason::DuplicateSource, flags);
    let outcome = match conflict.kind {
        ConflictKind::EarlyReuse | ConflictKind::ReuseInCooldown => match conflict.policy {
            EarlyReusePolicy::Observe => Outcome::Observed,
            EarlyReusePolicy::RefuseNew => Outcome::BlockedNew,
            EarlyReusePolicy::FenceOld if old_fenced => Outcome::FencedOld,
            EarlyReusePolicy::FenceOld => Outcome::Claimed,
        },
        ConflictKind::DuplicateSource => match duplicate {
            Action::Dropped => Outcome::Dropped,
            Action::Observed => Outcome::Observed,
            Action::Reported => Outcome::Reported,
        },
        ConflictKind::RemoteClaim if old_fenced => Outcome::FencedOld,
        ConflictKind::RemoteClaim => Outcome::Reported,
    };
    // An address of a namespace only observed drops nothing: whatever the policy chose is
    // counted and let through.
    let observed = record.is_some_and(|r| r.namespace_observed);
    if observed && matches!(outcome, Outcome::FencedOld | Outcome::BlockedNew) {
        Outcome::Observed
    } else {
        outcome
    }
}

pub fn conflict_view(conflict: &Conflict, outcome: Outcome, time: &TimeBase) -> ConflictView {
    ConflictView {
        kind: conflict.kind,
        address: conflict.addr,
        old_holder: conflict.old.clone(),
        new_holder: conflict.new.clone(),
        policy: conflict.policy,
        outcome,
        at: time.rfc3339(conflict.at),
    }
}

/// An API error: the body of an error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError(pub Box<ApiErrorBody>);

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(Box::new(ApiErrorBody {
            code,
            message: message.into(),
            address: None,
            holder: None,
            until: None,
            needs: None,
        }))
    }

    /// A change was made but could not be made durable (the journal could not be saved):
    /// nothing is reported as done until it is. The caller may retry; the agent retries the
    /// save on its own.
    pub fn unavailable(reason: &str) -> Self {
        Self::new(
            ErrorCode::Unavailable,
            format!(
                "the change could not be saved to the journal ({reason}); it is not reported \
                 as done until it is durable: retry later"
            ),
        )
    }

    pub fn with_address(mut self, addr: IpAddr) -> Self {
        self.0.address = Some(addr);
        self
    }

    /// A refusal of a request that needs `role`: the caller can tell what it lacks.
    pub fn forbidden(role: Role, message: impl Into<String>) -> Self {
        let mut error = Self::new(ErrorCode::Forbidden, message);
        error.0.needs = Some(role);
        error
    }

    pub fn with_holder(mut self, holder: &Holder) -> Self {
        self.0.holder = Some(holder.clone());
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.0.code
    }
}

/// A kernel sample as an event: `seen_on` names the interface it came through, `holder` is the
/// address's holder as the registry knows it.
pub fn sample_body(sample: &ConflictSample, seen_on: String, holder: Option<Holder>) -> EventBody {
    let m = sample.src_mac;
    EventBody::Sample {
        address: sample.addr.to_ip(),
        hook: EventHook::of_raw(sample.hook),
        reason: SampleReason::of_raw(sample.reason),
        action: SampleAction::of_raw(sample.action),
        state: EntryState::of_raw(AddrState::from_repr(sample.state)),
        ifindex: sample.ifindex,
        seen_on,
        holder_ifindex: sample.holder_ifindex,
        holder,
        src_mac: format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ),
        pkt_len: sample.pkt_len,
    }
}

/// What `GET /v1/status` reports besides the registry and the interfaces.
pub struct StatusFacts {
    pub ready: bool,
    /// Why not ready: starting, or the unprotected interfaces with their errors.
    pub not_ready: Option<String>,
    /// How TC programs attach: `tcx` or `netlink`.
    pub tc_attach: TcAttachMode,
    /// How a claim's conntrack entries are flushed, once the probe decided.
    pub conntrack_claim_flush: Option<ClaimFlushView>,
    pub mode: Mode,
    pub on_early_reuse: EarlyReusePolicy,
    pub conflicts_total: u64,
    pub refused_claims_total: u64,
    pub started_at: SystemTime,
    pub verification: Option<VerificationView>,
    /// What finds the changes nothing announces (see `Status::unannounced`).
    pub unannounced: String,
    pub recovery: Option<RecoveryView>,
    pub started: Option<StartedView>,
    /// Addresses whose datapath write the kernel refused (retried every tick).
    pub writes_pending: u64,
    /// The first of them, in address order.
    pub pending_writes: Vec<PendingWriteView>,
    pub publish: Option<super::model::PublishView>,
    pub whereabouts: Option<super::model::WhereaboutsView>,
    pub cluster: Option<super::model::ClusterView>,
    /// Observe by namespace: (observed, enforced) as configured.
    pub namespaces: (Vec<String>, Vec<String>),
}

/// The agent's status: readiness, policy, registry counts (O(1): the registry keeps them) and
/// the attached interfaces as (ifindex, name, hooks).
pub fn status_view<C: Clock>(
    facts: StatusFacts,
    registry: &Registry<C>,
    interfaces: Vec<InterfaceStatus>,
) -> Status {
    let count = |state| registry.records().indexes().count(state) as u64;
    let unprotected = interfaces
        .iter()
        .filter(|i| !i.protection.is_protected())
        .count() as u64;
    Status {
        ready: facts.ready,
        not_ready: facts.not_ready,
        tc_attach: facts.tc_attach,
        unprotected,
        conntrack_claim_flush: facts.conntrack_claim_flush,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        mode: facts.mode,
        on_early_reuse: facts.on_early_reuse,
        registry: RegistryCounts {
            entries: registry.records().len() as u64,
            capacity: u64::from(registry.records().capacity()),
            active: count(StateName::Active),
            draining: count(StateName::Draining),
            quarantined: count(StateName::Quarantined),
        },
        interfaces,
        conflicts_total: facts.conflicts_total,
        refused_claims_total: facts.refused_claims_total,
        started_at: humantime::format_rfc3339_millis(facts.started_at).to_string(),
        verification: facts.verification,
        unannounced: facts.unannounced,
        recovery: facts.recovery,
        started: facts.started,
        datapath_writes_pending: facts.writes_pending,
        pending_writes: facts.pending_writes,
        publish: facts.publish,
        whereabouts: facts.whereabouts,
        cluster: facts.cluster,
        observe_namespaces: facts.namespaces.0,
        enforce_namespaces: facts.namespaces.1,
        namespace_observed: registry.records().namespace_observed() as u64,
    }
}

#[cfg(test)]
mod tests;
