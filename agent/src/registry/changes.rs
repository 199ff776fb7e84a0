//! What changed in the record book, for those that follow it: the generation (bumped by every
//! change), the addresses the journal has yet to take, and those the NodeQuarantine publisher
//! has yet to take while one runs. Fed by [`RecordBook::put`](super::RecordBook), the one
//! place records change.

use std::{collections::HashSet, net::IpAddr};

#[derive(Debug, Default)]
pub struct Changes {
    /// Bumped by every change to a record, whatever it is (a state, an identity merged in, a
    /// quarantine's end moved, a conflict counted): the journal is up to date iff it saved this
    /// generation.
    generation: u64,
    /// Addresses whose record changed since the journal last took them: what the next commit
    /// appends, O(changes) instead of the whole registry.
    changed: HashSet<IpAddr>,
    /// The same for the NodeQuarantine publisher, kept only while one runs
    /// ([`track_published_changes`](Self::track_published_changes)).
    published_changed: Option<HashSet<IpAddr>>,
}

impl Changes {
    /// The record of `addr` was put again; `changed` when it differs from what it was.
    pub(super) fn note(&mut self, addr: IpAddr, changed: bool) {
        self.changed.insert(addr);
        if let Some(published) = &mut self.published_changed {
            published.insert(addr);
        }
        if changed {
            self.generation += 1;
        }
    }

    /// Changes so far: bumped by every change to any record. Whoever saves the registry
    /// remembers the generation it saved; anything answered at a later generation is not
    /// durable until a save reaches it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The addresses whose record changed (or went) since the last call, forgetting them.
    pub fn take_changed(&mut self) -> Vec<IpAddr> {
        // Taken, not drained: draining would keep (and scan) the capacity a restore grew.
        std::mem::take(&mut self.changed).into_iter().collect()
    }

    /// From now on, every address whose record changes is kept for
    /// [`take_published_changed`](Self::take_published_changed); `known` (every address the
    /// registry holds now) counts as changed.
    pub(super) fn track_published_changes(&mut self, known: HashSet<IpAddr>) {
        self.published_changed = Some(known);
    }

    /// Whether [`take_published_changed`](Self::take_published_changed) would return any.
    pub fn has_published_changes(&self) -> bool {
        self.published_changed
            .as_ref()
            .is_some_and(|set| !set.is_empty())
    }

    /// The addresses whose record changed (or went) since the last call, forgetting them;
    /// none unless tracked.
    pub fn take_published_changed(&mut self) -> Vec<IpAddr> {
        match &mut self.published_changed {
            Some(set) if !set.is_empty() => std::mem::take(set).into_iter().collect(),
            _ => Vec::new(),
        }
    }
}
