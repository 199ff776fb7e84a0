//! From the registry's records, conflicts and errors to the API's wire types: monotonic stamps
//! become wall-clock RFC 3339 times, registry errors become stable error codes.

use std::{
    net::IpAddr,
    sync::OnceLock,
    time::{Duration, SystemTime},
};

use super::model::{AddressView, ApiErrorBody, ConflictView, ErrorCode};
use crate::{
    netdev,
    registry::{AddrRecord, AddrStatus, Conflict, Holder, MonoNs, RegistryError},
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
        fenced: record.fenced.clone(),
        blocked_claimant: record.blocked_claimant.clone(),
        displaced: record.displaced.clone(),
        since: time.rfc3339(record.status.since()),
        until,
        last_stale,
        conflicts: record.conflicts,
        last_flush: None,
    }
}

/// What a policy did about a conflict, as `ConflictView::outcome` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FencedOld => "fenced_old",
            Self::Claimed => "claimed",
            Self::RefusedNew => "refused_new",
            Self::BlockedNew => "blocked_new",
            Self::Observed => "observed",
            Self::Dropped => "dropped",
            Self::Reported => "reported",
        }
    }
}

pub fn conflict_view(conflict: &Conflict, outcome: Outcome, time: &TimeBase) -> ConflictView {
    ConflictView {
        kind: conflict.kind,
        address: conflict.addr,
        old_holder: conflict.old.clone(),
        new_holder: conflict.new.clone(),
        policy: crate::registry::policy_str(conflict.policy).to_owned(),
        outcome: outcome.as_str().to_owned(),
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
