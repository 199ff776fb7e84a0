//! The record book: one record per address the registry knows, its indexes, and the feed of
//! what changed. [`RecordBook::put`] is the one place a record changes: it keeps the indexes
//! and the feed in step and appends the datapath write and transition the change causes.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::AddrEntry;

use crate::config::NamespaceScope;

use super::{
    changes::Changes, effects, entry::datapath_entry, indexes::Indexes, records::RecordMap,
    AddrRecord, Effect, StateName,
};

/// Every record, by address, with what follows them. Read through
/// [`Registry::records`](super::Registry::records); changed only by the lifecycle.
#[derive(Debug)]
pub struct RecordBook {
    records: RecordMap,
    indexes: Indexes,
    changes: Changes,
    /// Records kept at most: a full book refuses new addresses and never evicts one.
    capacity: u32,
    /// Which namespaces are only observed: decides each record's `namespace_observed`.
    scope: NamespaceScope,
    /// Records with `namespace_observed` set.
    namespace_observed: usize,
}

impl RecordBook {
    pub(super) fn new(capacity: u32) -> Self {
        Self {
            records: RecordMap::default(),
            indexes: Indexes::default(),
            changes: Changes::default(),
            capacity,
            scope: NamespaceScope::Everywhere,
            namespace_observed: 0,
        }
    }

    /// From now on records are observed or enforced by the namespace of their pod as `scope`
    /// says (set once, before the registry holds anything).
    pub(super) fn set_scope(&mut self, scope: NamespaceScope) {
        self.scope = scope;
    }

    /// Records whose pod's namespace is only observed.
    pub fn namespace_observed(&self) -> usize {
        self.namespace_observed
    }

    /// The record of `addr` (IPv4-mapped IPv6 addresses are looked up as IPv4), if not Free.
    pub fn get(&self, addr: IpAddr) -> Option<&AddrRecord> {
        self.records.get(&addr.to_canonical())
    }

    /// The record of `addr`, already in the registry's canonical form.
    pub(super) fn record(&self, addr: &IpAddr) -> Option<&AddrRecord> {
        self.records.get(addr)
    }

    /// The state of `addr`, `Free` when it has no record.
    pub fn state(&self, addr: IpAddr) -> StateName {
        self.get(addr).map_or(StateName::Free, AddrRecord::state)
    }

    /// Every record, in address order.
    pub fn iter(&self) -> impl Iterator<Item = &AddrRecord> + '_ {
        self.records.values()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Records by interface, container, deadline and state.
    pub fn indexes(&self) -> &Indexes {
        &self.indexes
    }

    /// The records whose live holder (Active or Draining) names container `id`, in address
    /// order: O(its addresses), not O(registry).
    pub fn held_by_container<'a>(&'a self, id: &str) -> impl Iterator<Item = &'a AddrRecord> + 'a {
        self.indexes
            .in_container(id)
            .into_iter()
            .flatten()
            .filter_map(|addr| self.records.get(addr))
    }

    /// What the datapath map must hold: one entry per record.
    pub fn datapath_entries(&self) -> BTreeMap<IpAddr, AddrEntry> {
        self.records
            .iter()
            .map(|(addr, record)| (*addr, datapath_entry(record)))
            .collect()
    }

    /// What changed, for the journal and the publisher.
    pub fn changes(&self) -> &Changes {
        &self.changes
    }

    pub(super) fn changes_mut(&mut self) -> &mut Changes {
        &mut self.changes
    }

    /// Replaces the record of `addr` by `after` (None = Free), keeping the indexes and the
    /// change feed in step and appending the map write and transition this causes.
    pub(super) fn put(
        &mut self,
        addr: IpAddr,
        mut after: Option<AddrRecord>,
        out: &mut Vec<Effect>,
    ) {
        if let Some(record) = &mut after {
            record.contest.refill_fence_slot();
            // The one place the verdict's namespace part is decided, O(log n) in the lists.
            record.namespace_observed = self.scope.observes(record.owner_namespace());
        }
        let before = self.records.remove(&addr);
        let observed = |r: &Option<AddrRecord>| r.as_ref().is_some_and(|r| r.namespace_observed);
        self.namespace_observed = self.namespace_observed + usize::from(observed(&after))
            - usize::from(observed(&before));
        self.changes.note(addr, before != after);
        if let Some(before) = &before {
            self.indexes.unindex(before);
        }
        effects::diff(addr, before.as_ref(), after.as_ref(), out);
        if let Some(after) = after {
            self.indexes.index(&after);
            self.records.insert(addr, after);
        }
    }
}

#[cfg(test)]
mod invariants;
