//! Why a registry operation was refused. Every refusal leaves the registry unchanged.

use std::net::IpAddr;

use thiserror::Error;

use super::{
    effects::ConflictKind,
    types::{Holder, MonoNs, StateName},
};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistryError {
    #[error("{addr}: not in the registry")]
    NotFound { addr: IpAddr },

    #[error("{addr}: cannot be registered (unspecified address)")]
    InvalidAddress { addr: IpAddr },

    #[error("{addr}: holder {holder} has no interface (ifindex 0)")]
    InvalidHolder { addr: IpAddr, holder: Box<Holder> },

    #[error("{addr}: {given} is not its holder (held by {current})")]
    NotHolder {
        addr: IpAddr,
        given: Box<Holder>,
        current: Box<Holder>,
    },

    /// `refuse-new`: an explicit claim while the address is still held (`until: None`) or
    /// cooling down until `until` (monotonic ns). Try again later.
    #[error("{addr}: claim refused, {} (try again later)", refused_reason(.holder, .until))]
    Refused {
        addr: IpAddr,
        holder: Box<Holder>,
        until: Option<MonoNs>,
    },

    #[error("{addr}: registry full ({capacity} addresses); existing entries are kept")]
    Full { addr: IpAddr, capacity: u32 },

    #[error("{addr}: {state}, releasing it needs force")]
    NotReleasable { addr: IpAddr, state: StateName },

    #[error("snapshot version {found} not supported (this agent reads {supported})")]
    UnsupportedSnapshotVersion { found: u32, supported: u32 },

    #[error("snapshot lists {addr} more than once")]
    DuplicateAddress { addr: IpAddr },

    #[error("snapshot record {addr}: {problem}")]
    InvalidRecord {
        addr: IpAddr,
        problem: RecordProblem,
    },

    #[error("snapshot holds {records} addresses, more than the capacity {capacity}")]
    OverCapacity { records: usize, capacity: u32 },
}

impl RegistryError {
    /// The conflict a refused claim stands for.
    pub fn conflict_kind(&self) -> Option<ConflictKind> {
        match self {
            Self::Refused { until: None, .. } => Some(ConflictKind::EarlyReuse),
            Self::Refused { until: Some(_), .. } => Some(ConflictKind::ReuseInCooldown),
            _ => None,
        }
    }
}

/// What is wrong with a snapshot record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RecordProblem {
    #[error("the unspecified address cannot be registered")]
    UnspecifiedAddress,
    #[error("a holder has no interface (ifindex 0)")]
    ZeroIfindex,
    #[error("the blocked claimant is the holder")]
    BlockedIsHolder,
    #[error("quarantine ends before it began")]
    UntilBeforeSince,
    #[error("entered its state in the future of this clock (a reboot?)")]
    SinceInFuture,
}

fn refused_reason(holder: &Holder, until: &Option<MonoNs>) -> String {
    match until {
        None => format!("still held by {holder}"),
        Some(until) => format!("cooling down after {holder} until {until} ns"),
    }
}
