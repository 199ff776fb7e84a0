//! From the registry's records, conflicts and errors to the API's wire types: monotonic stamps
//! become wall-clock RFC 3339 times, registry errors become stable error codes, kernel samples
//! become events. The presentation of everything the API shows lives here.

use std::{
    net::IpAddr,
    sync::OnceLock,
    time::{Duration, SystemTime},
};

use ipq_common::{
    addr::AddrState,
    counters::{Action, Hook, Reason},
    sample::ConflictSample,
};

use super::model::{
    AddressView, ApiErrorBody, ClaimFlushView, ConflictView, ErrorCode, EventBody, InterfaceStatus,
    RecoveryView, RegistryCounts, StartedView, Status, VerificationView,
};
use crate::{
    config::{EarlyReusePolicy, Mode},
    netdev,
    registry::{
        AddrRecord, AddrStatus, Clock, Conflict, Holder, MonoNs, Registry, RegistryError, StateName,
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
        last_flush: None,
        ipam_hold: None,
    }
}

/// What a policy did about a conflict, as `ConflictView::outcome` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
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
}

pub fn conflict_view(conflict: &Conflict, outcome: Outcome, time: &TimeBase) -> ConflictView {
    ConflictView {
        kind: conflict.kind,
        address: conflict.addr,
        old_holder: conflict.old.clone(),
        new_holder: conflict.new.clone(),
        policy: conflict.policy,
        outcome: outcome.to_string(),
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

    fn with_holder(mut self, holder: &Holder) -> Self {
        self.0.holder = Some(holder.clone());
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.0.code
    }

    /// The API's answer to a registry refusal.
    pub fn from_registry(error: &RegistryError, time: &TimeBase) -> Self {
        let message = error.to_string();
        match error {
            RegistryError::NotFound { addr } => {
                Self::new(ErrorCode::NotFound, message).with_address(*addr)
            }
            RegistryError::InvalidAddress { addr } | RegistryError::InvalidHolder { addr, .. } => {
                Self::new(ErrorCode::InvalidArgument, message).with_address(*addr)
            }
            RegistryError::NotHolder { addr, current, .. } => {
                Self::new(ErrorCode::NotHolder, message)
                    .with_address(*addr)
                    .with_holder(current)
            }
            RegistryError::Refused {
                addr,
                holder,
                until,
            } => {
                let mut e = Self::new(
                    ErrorCode::Refused,
                    refused_message(*addr, holder, *until, time),
                )
                .with_address(*addr)
                .with_holder(holder);
                e.0.until = until.map(|at| time.rfc3339(at));
                e
            }
            RegistryError::Full { addr, .. } => {
                Self::new(ErrorCode::RegistryFull, message).with_address(*addr)
            }
            RegistryError::NotReleasable { addr, .. } => {
                Self::new(ErrorCode::NotReleasable, message).with_address(*addr)
            }
            RegistryError::UnsupportedSnapshotVersion { .. }
            | RegistryError::DuplicateAddress { .. }
            | RegistryError::InvalidRecord { .. }
            | RegistryError::OverCapacity { .. } => Self::new(ErrorCode::Internal, message),
        }
    }
}

/// The registry's own message speaks monotonic nanoseconds; people and CNI logs need a time.
fn refused_message(
    addr: IpAddr,
    holder: &Holder,
    until: Option<MonoNs>,
    time: &TimeBase,
) -> String {
    match until {
        None => format!(
            "{addr} is still held by {holder}; claim refused (on_early_reuse = refuse-new), try \
             again once it is released"
        ),
        Some(until) => format!(
            "{addr} is quarantined after {holder} until {}; claim refused (on_early_reuse = \
             refuse-new), try again then",
            time.rfc3339(until)
        ),
    }
}

/// A kernel sample as an event: `seen_on` names the interface it came through, `holder` is the
/// address's holder as the registry knows it.
pub fn sample_body(sample: &ConflictSample, seen_on: String, holder: Option<Holder>) -> EventBody {
    let hook = Hook::ALL
        .into_iter()
        .find(|h| *h as u32 == sample.hook)
        .map_or("unknown", Hook::as_str);
    let m = sample.src_mac;
    EventBody::Sample {
        address: sample.addr.to_ip(),
        hook: hook.to_owned(),
        reason: Reason::from_raw(sample.reason)
            .map_or("unknown", Reason::as_str)
            .to_owned(),
        action: Action::from_raw(sample.action)
            .map_or("unknown", Action::as_str)
            .to_owned(),
        state: StateName::of_raw_entry(AddrState::from_raw(sample.state)).to_owned(),
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
    pub tc_attach: &'static str,
    /// How a claim's conntrack entries are flushed, once the probe decided.
    pub conntrack_claim_flush: Option<ClaimFlushView>,
    pub mode: Mode,
    pub on_early_reuse: EarlyReusePolicy,
    pub conflicts_total: u64,
    pub refused_claims_total: u64,
    pub started_at: SystemTime,
    pub verification: Option<VerificationView>,
    pub recovery: Option<RecoveryView>,
    pub started: Option<StartedView>,
}

/// The agent's status: readiness, policy, registry counts (O(1): the registry keeps them) and
/// the attached interfaces as (ifindex, name, hooks).
pub fn status_view<C: Clock>(
    facts: StatusFacts,
    registry: &Registry<C>,
    interfaces: Vec<InterfaceStatus>,
) -> Status {
    let count = |state| registry.count(state) as u64;
    let unprotected = interfaces
        .iter()
        .filter(|i| i.protection != "protected")
        .count() as u64;
    Status {
        ready: facts.ready,
        not_ready: facts.not_ready,
        tc_attach: facts.tc_attach.to_owned(),
        unprotected,
        conntrack_claim_flush: facts.conntrack_claim_flush,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        mode: facts.mode,
        on_early_reuse: facts.on_early_reuse,
        registry: RegistryCounts {
            entries: registry.len() as u64,
            capacity: u64::from(registry.capacity()),
            active: count(StateName::Active),
            draining: count(StateName::Draining),
            quarantined: count(StateName::Quarantined),
        },
        interfaces,
        conflicts_total: facts.conflicts_total,
        refused_claims_total: facts.refused_claims_total,
        started_at: humantime::format_rfc3339_millis(facts.started_at).to_string(),
        verification: facts.verification,
        recovery: facts.recovery,
        started: facts.started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_stamps_become_wall_clock_times() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let time = TimeBase::at(5_000_000_000, wall);
        assert_eq!(time.rfc3339(5_000_000_000), "2027-01-15T08:00:00.000Z");
        assert_eq!(time.rfc3339(6_500_000_000), "2027-01-15T08:00:01.500Z");
        assert_eq!(time.rfc3339(4_000_000_000), "2027-01-15T07:59:59.000Z");
    }

    #[test]
    fn an_outcome_keeps_the_spelling_the_api_has_always_used() {
        for (outcome, spelling) in [
            (Outcome::FencedOld, "fenced_old"),
            (Outcome::Claimed, "claimed"),
            (Outcome::RefusedNew, "refused_new"),
            (Outcome::BlockedNew, "blocked_new"),
            (Outcome::Observed, "observed"),
            (Outcome::Dropped, "dropped"),
            (Outcome::Reported, "reported"),
        ] {
            assert_eq!(outcome.to_string(), spelling);
        }
    }

    #[test]
    fn a_refusal_names_the_address_the_holder_and_until_when() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let time = TimeBase::at(0, wall);
        let holder = Holder::new(7, "veth7").with_container_id("abc");
        let error = RegistryError::Refused {
            addr: "10.1.0.5".parse().unwrap(),
            holder: Box::new(holder.clone()),
            until: Some(30_000_000_000),
        };
        let api = ApiError::from_registry(&error, &time).0;
        assert_eq!(api.code, ErrorCode::Refused);
        assert_eq!(api.holder, Some(holder));
        assert_eq!(api.until.as_deref(), Some("2027-01-15T08:00:30.000Z"));
        assert!(api.message.contains("10.1.0.5"), "{}", api.message);
        assert!(api.message.contains("veth7"), "{}", api.message);
        assert!(
            api.message.contains("2027-01-15T08:00:30.000Z"),
            "{}",
            api.message
        );
    }
}
