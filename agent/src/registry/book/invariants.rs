//! The record book's self-check, run by the tests and property tests after every operation: its
//! indexes list exactly what its records say, and each record keeps the rules of its state.

use std::net::IpAddr;

use thiserror::Error;

use super::{
    super::{AddrStatus, MonoNs, StateName},
    RecordBook,
};
use crate::invariant::InvariantViolation;

/// What [`RecordBook::check_invariants`] found broken.
#[derive(Debug, Error)]
pub(crate) enum RegistryViolation {
    #[error(transparent)]
    Index(#[from] InvariantViolation),
    /// Records are keyed by their own address, canonical and specified.
    #[error("record key {key} vs {addr}")]
    RecordKey { key: IpAddr, addr: IpAddr },
    #[error("{addr}: ifindex 0")]
    NoIfindex { addr: IpAddr },
    #[error("{addr}: until {until} < since {since}")]
    EndsBeforeItStarts {
        addr: IpAddr,
        since: MonoNs,
        until: MonoNs,
    },
    #[error("{addr}: displaced holders but an empty fence slot")]
    DisplacedWithoutFence { addr: IpAddr },
    #[error("{addr}: blocked claimant is the holder")]
    HolderBlocked { addr: IpAddr },
    #[error("{state}: counted {counted} but {records} records")]
    Count {
        state: StateName,
        counted: usize,
        records: usize,
    },
    #[error("{records} records over capacity")]
    OverCapacity { records: usize },
}

impl RecordBook {
    /// Checks the indexes and record invariants.
    pub(crate) fn check_invariants(&self) -> Result<(), RegistryViolation> {
        for (addr, record) in self.records.iter() {
            let addr = *addr;
            if addr != record.addr || addr.to_canonical() != addr || addr.is_unspecified() {
                return Err(RegistryViolation::RecordKey {
                    key: addr,
                    addr: record.addr,
                });
            }
            for ifindex in record.live_ifindexes() {
                if ifindex == ipq_common::addr::NO_IFINDEX {
                    return Err(RegistryViolation::NoIfindex { addr });
                }
            }
            if let AddrStatus::Quarantined { since, until, .. } = record.status {
                if until < since {
                    return Err(RegistryViolation::EndsBeforeItStarts { addr, since, until });
                }
            }
            if record.fenced().is_none() && !record.displaced().is_empty() {
                return Err(RegistryViolation::DisplacedWithoutFence { addr });
            }
            if let (Some(h), Some(b)) = (record.status.holder(), record.blocked_claimant()) {
                if h.same_as(b) {
                    return Err(RegistryViolation::HolderBlocked { addr });
                }
            }
        }
        self.indexes.check(self.records.values())?;
        for state in [
            StateName::Active,
            StateName::Draining,
            StateName::Quarantined,
        ] {
            let counted = self.indexes.count(state);
            let records = self.iter().filter(|r| r.state() == state).count();
            if counted != records {
                return Err(RegistryViolation::Count {
                    state,
                    counted,
                    records,
                });
            }
        }
        if self.len() > self.capacity as usize {
            return Err(RegistryViolation::OverCapacity {
                records: self.len(),
            });
        }
        Ok(())
    }
}
