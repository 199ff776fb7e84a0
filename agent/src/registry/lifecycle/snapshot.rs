//! The registry's durable form, for the journal: [`Lifecycle::snapshot`] and a validating
//! [`Lifecycle::restore`]. Nothing in a snapshot is trusted blindly.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::NO_IFINDEX;
use serde::{Deserialize, Serialize};

use crate::registry::{
    AddrRecord, AddrStatus, Clock, Effect, Lifecycle, MonoNs, RecordProblem, RegistryError,
};

/// The snapshot format this build writes and reads.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Every record of a registry at one instant. Quarantine deadlines are absolute monotonic ns,
/// so a quarantine restored by a restarted agent keeps its original end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// Monotonic ns when it was taken.
    #[serde(default)]
    pub taken_at: MonoNs,
    pub records: Vec<AddrRecord>,
}

impl Snapshot {
    /// Moves every monotonic stamp by `to - from`: for a snapshot taken when the monotonic
    /// clock read `from` (e.g. the journal's write time) to be restored on a clock where that
    /// instant reads `to` (e.g. after a reboot, computed from wall-clock time). Stamps are
    /// clamped to `[0, u64::MAX]`; durations between them are kept where no clamp hits.
    pub fn rebase(&mut self, from: MonoNs, to: MonoNs) {
        let shift = |t: MonoNs| -> MonoNs {
            if to >= from {
                t.saturating_add(to - from)
            } else {
                t.saturating_sub(from - to)
            }
        };
        self.taken_at = shift(self.taken_at);
        for record in &mut self.records {
            match &mut record.status {
                AddrStatus::Active { since, .. } | AddrStatus::Draining { since, .. } => {
                    *since = shift(*since);
                }
                AddrStatus::Quarantined {
                    since,
                    until,
                    last_stale,
                    ..
                } => {
                    *since = shift(*since);
                    *until = shift(*until);
                    *last_stale = last_stale.map(shift);
                }
            }
        }
    }
}

impl<C: Clock> Lifecycle<C> {
    /// A copy of every record, in address order.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: self.clock.now(),
            records: self.records.iter().cloned().collect(),
        }
    }

    /// Replaces every record by those of `snapshot`, after validating all of them: a snapshot
    /// of another version, listing an address twice, holding more addresses than the capacity
    /// or with an impossible record is refused as a whole and the registry is left unchanged.
    ///
    /// Returns only the datapath writes (`Remove` for addresses that are no longer registered,
    /// `Upsert` for every restored one): a restore is a reconciliation, not a series of events.
    /// The refused-claim counters are kept.
    pub fn restore(&mut self, snapshot: Snapshot) -> Result<Vec<Effect>, RegistryError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(RegistryError::UnsupportedSnapshotVersion {
                found: snapshot.version,
                supported: SNAPSHOT_VERSION,
            });
        }
        let capacity = self.records.capacity();
        if snapshot.records.len() > capacity as usize {
            return Err(RegistryError::OverCapacity {
                records: snapshot.records.len(),
                capacity,
            });
        }
        let now = self.clock.now();
        let mut records = BTreeMap::new();
        for mut record in snapshot.records {
            record.addr = record.addr.to_canonical();
            let addr = record.addr;
            validate(&record, now)
                .map_err(|problem| RegistryError::InvalidRecord { addr, problem })?;
            if records.insert(addr, record).is_some() {
                return Err(RegistryError::DuplicateAddress { addr });
            }
        }

        let mut out = Vec::new();
        let gone: Vec<IpAddr> = self
            .records
            .iter()
            .map(|record| record.addr)
            .filter(|addr| !records.contains_key(addr))
            .collect();
        for addr in gone {
            self.records.put(addr, None, &mut out);
        }
        for (addr, record) in records {
            self.records.put(addr, Some(record), &mut out);
        }
        out.retain(|e| matches!(e, Effect::Upsert { .. } | Effect::Remove { .. }));
        Ok(out)
    }
}

fn validate(record: &AddrRecord, now: MonoNs) -> Result<(), RecordProblem> {
    if record.addr.is_unspecified() {
        return Err(RecordProblem::UnspecifiedAddress);
    }
    let previous = match &record.status {
        AddrStatus::Quarantined { previous, .. } => Some(previous),
        _ => None,
    };
    let named = record
        .status
        .holder()
        .into_iter()
        .chain(previous)
        .chain(record.fenced())
        .chain(record.blocked_claimant())
        .chain(record.displaced().iter());
    for holder in named {
        if holder.ifindex == NO_IFINDEX {
            return Err(RecordProblem::ZeroIfindex);
        }
    }
    if let (Some(holder), Some(blocked)) = (record.status.holder(), record.blocked_claimant()) {
        if holder.same_as(blocked) {
            return Err(RecordProblem::BlockedIsHolder);
        }
    }
    if let AddrStatus::Quarantined { since, until, .. } = record.status {
        if until < since {
            return Err(RecordProblem::UntilBeforeSince);
        }
    }
    if record.status.since() > now {
        return Err(RecordProblem::SinceInFuture);
    }
    Ok(())
}
