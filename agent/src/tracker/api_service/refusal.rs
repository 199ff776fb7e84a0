//! A registry's refusal as the API answers it: a stable error code, the address and holder it
//! concerns, and times people can read instead of the registry's monotonic nanoseconds.

use std::net::IpAddr;

use crate::{
    api::{
        model::ErrorCode,
        views::{ApiError, TimeBase},
    },
    registry::{Holder, MonoNs, RegistryError},
};

/// The API's answer to a registry refusal.
pub fn refusal(error: &RegistryError) -> ApiError {
    refusal_at(error, &TimeBase::now())
}

/// [`refusal`], its times converted by `time`.
pub fn refusal_at(error: &RegistryError, time: &TimeBase) -> ApiError {
    let message = error.to_string();
    match error {
        RegistryError::NotFound { addr } => {
            ApiError::new(ErrorCode::NotFound, message).with_address(*addr)
        }
        RegistryError::InvalidAddress { addr } | RegistryError::InvalidHolder { addr, .. } => {
            ApiError::new(ErrorCode::InvalidArgument, message).with_address(*addr)
        }
        RegistryError::NotHolder { addr, current, .. } => {
            ApiError::new(ErrorCode::NotHolder, message)
                .with_address(*addr)
                .with_holder(current)
        }
        RegistryError::Refused {
            addr,
            holder,
            until,
        } => {
            let mut e = ApiError::new(
                ErrorCode::Refused,
                refused_message(*addr, holder, *until, time),
            )
            .with_address(*addr)
            .with_holder(holder);
            e.0.until = until.map(|at| time.rfc3339(at));
            e
        }
        RegistryError::Full { addr, .. } => {
            ApiError::new(ErrorCode::RegistryFull, message).with_address(*addr)
        }
        RegistryError::NotReleasable { addr, .. } => {
            ApiError::new(ErrorCode::NotReleasable, message).with_address(*addr)
        }
        RegistryError::UnsupportedSnapshotVersion { .. }
        | RegistryError::DuplicateAddress { .. }
        | RegistryError::InvalidRecord { .. }
        | RegistryError::OverCapacity { .. } => ApiError::new(ErrorCode::Internal, message),
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
