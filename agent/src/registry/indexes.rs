//! The record book's secondary indexes, kept in step with every record by
//! [`RecordBook::put`](super::RecordBook): what `holder_gone`, a CNI DEL, `tick` and the
//! gauges read instead of scanning every record.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use super::types::{AddrRecord, AddrStatus, MonoNs, StateName};

/// Records by interface, by container, by quarantine deadline, and how many are in each state.
#[derive(Debug, Default)]
pub struct Indexes {
    /// Interface → addresses whose record names it alive (holder, fenced or blocked claimant):
    /// `holder_gone` touches only these.
    by_ifindex: HashMap<u32, BTreeSet<IpAddr>>,
    /// Container id → addresses whose live holder names it: a CNI DEL touches only these.
    by_container: HashMap<String, BTreeSet<IpAddr>>,
    /// (release time, address) of every quarantine: `tick` and `next_deadline` read the front.
    deadlines: BTreeSet<(MonoNs, IpAddr)>,
    /// Records per state (Active, Draining, Quarantined): the gauges read them in O(1).
    counts: StateCounts,
}

impl Indexes {
    /// How many addresses are in `state` (`Free` counts as 0: the registry does not list it).
    /// O(1): kept up to date by every change.
    pub fn count(&self, state: StateName) -> usize {
        self.counts.get(state)
    }

    /// When the earliest quarantine ends: the owner should call
    /// [`Lifecycle::tick`](super::Lifecycle::tick) then.
    pub fn next_deadline(&self) -> Option<MonoNs> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// The addresses whose quarantine is due at `now`, earliest first.
    pub fn due(&self, now: MonoNs) -> impl Iterator<Item = IpAddr> + '_ {
        self.deadlines
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, addr)| *addr)
    }

    /// The addresses whose record names interface `ifindex` alive, in address order.
    pub(super) fn on_interface(&self, ifindex: u32) -> Option<&BTreeSet<IpAddr>> {
        self.by_ifindex.get(&ifindex)
    }

    /// The addresses whose live holder names container `id`, in address order.
    pub(super) fn in_container(&self, id: &str) -> Option<&BTreeSet<IpAddr>> {
        self.by_container.get(id)
    }

    /// Lists `record` (just stored).
    pub(super) fn index(&mut self, record: &AddrRecord) {
        for ifindex in record.live_ifindexes() {
            self.by_ifindex
                .entry(ifindex)
                .or_default()
                .insert(record.addr);
        }
        if let AddrStatus::Quarantined { until, .. } = record.status {
            self.deadlines.insert((until, record.addr));
        }
        if let Some(id) = container_of(record) {
            self.by_container
                .entry(id.to_owned())
                .or_default()
                .insert(record.addr);
        }
        self.counts.add(record.state());
    }

    /// Unlists `record` (just removed).
    pub(super) fn unindex(&mut self, record: &AddrRecord) {
        for ifindex in record.live_ifindexes() {
            if let Some(addrs) = self.by_ifindex.get_mut(&ifindex) {
                addrs.remove(&record.addr);
                if addrs.is_empty() {
                    self.by_ifindex.remove(&ifindex);
                }
            }
        }
        if let AddrStatus::Quarantined { until, .. } = record.status {
            self.deadlines.remove(&(until, record.addr));
        }
        if let Some(id) = container_of(record) {
            if let Some(addrs) = self.by_container.get_mut(id) {
                addrs.remove(&record.addr);
                if addrs.is_empty() {
                    self.by_container.remove(id);
                }
            }
        }
        self.counts.sub(record.state());
    }

    /// Whether these indexes list exactly what `records` say; for tests.
    #[cfg(test)]
    pub(super) fn check<'a>(
        &self,
        records: impl Iterator<Item = &'a AddrRecord>,
    ) -> Result<(), crate::invariant::InvariantViolation> {
        let mut rebuilt = Self::default();
        for record in records {
            rebuilt.index(record);
        }
        crate::invariant::same_index("by_ifindex", &self.by_ifindex, &rebuilt.by_ifindex)?;
        crate::invariant::same_index("by_container", &self.by_container, &rebuilt.by_container)?;
        crate::invariant::same_index("deadlines", &self.deadlines, &rebuilt.deadlines)
    }
}

/// The container id of a record's live holder, if it names one.
fn container_of(record: &AddrRecord) -> Option<&str> {
    record.status.holder()?.container_id()
}

/// How many records are in each state, indexed by [`StateName`] (`Free` stays 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StateCounts([usize; 4]);

impl StateCounts {
    fn slot(state: StateName) -> usize {
        match state {
            StateName::Free => 0,
            StateName::Active => 1,
            StateName::Draining => 2,
            StateName::Quarantined => 3,
        }
    }

    fn get(&self, state: StateName) -> usize {
        match state {
            StateName::Free => 0,
            _ => self.0[Self::slot(state)],
        }
    }

    fn add(&mut self, state: StateName) {
        self.0[Self::slot(state)] += 1;
    }

    fn sub(&mut self, state: StateName) {
        let slot = &mut self.0[Self::slot(state)];
        *slot = slot.saturating_sub(1);
    }
}
