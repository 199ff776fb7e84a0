//! The address registry: the lifecycle state machine of DESIGN §2 as pure logic.
//!
//! ```text
//!   Free --claim(h)--> Active(h) --drain(h)--> Draining(h)
//!    ^                    | holder gone             | holder gone
//!    |                    v                         v
//!    +--- cool-down over --- Quarantined(since, until)
//! ```
//!
//! The registry owns one record per address, takes its time from an injectable [`Clock`]
//! (monotonic nanoseconds, the datapath's clock) and performs no I/O: every operation returns the
//! [`Effect`]s its owner must carry out — datapath map writes, events, conflicts, metrics — or a
//! [`RegistryError`] that leaves the registry unchanged.
//!
//! Invariants (tested as properties in `proptests.rs`):
//! - the datapath mirror built from the emitted `Upsert`/`Remove` effects alone always equals
//!   [`Registry::datapath_entries`];
//! - under `fence-old` an address never has two live holders whose traffic flows;
//! - a full registry refuses new addresses and never evicts one;
//! - [`Registry::snapshot`] → [`Registry::restore`] round-trips.
//!
//! Operation summary (details on each method):
//! - [`claim`](Registry::claim): Free → Active; the same holder again is a no-op; a claim over a
//!   live holder is `early_reuse`, over a quarantine `reuse_in_cooldown`, each resolved by the
//!   `on_early_reuse` policy.
//! - [`drain`](Registry::drain): Active → Draining.
//! - [`holder_gone`](Registry::holder_gone): Active/Draining → Quarantined, or → Active of the
//!   blocked claimant (`refuse-new`).
//! - [`stale_seen`](Registry::stale_seen) moves a quarantine's end (adaptive release);
//!   [`tick`](Registry::tick) ends the quarantines that are over;
//!   [`release`](Registry::release) frees an address early, with force.
//! - [`remote_claim`](Registry::remote_claim), [`duplicate_source`](Registry::duplicate_source):
//!   conflicts reported by the datapath.

mod batch;
mod claim;
mod clock;
mod effects;
pub mod entry;
mod error;
mod records;
mod settings;
mod snapshot;
mod transitions;
mod types;
mod waitlist;

#[cfg(test)]
mod invariants;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use ipq_common::addr::AddrEntry;

pub use clock::{Clock, FakeClock, SystemClock};
pub use effects::{apply_to_mirror, Conflict, ConflictKind, Effect};
pub use entry::datapath_entry;
pub use error::{RecordProblem, RegistryError};
pub use settings::RegistrySettings;
pub use snapshot::{Snapshot, SNAPSHOT_VERSION};
pub use types::{duration_ns, AddrRecord, AddrStatus, Holder, MonoNs, PodRef, Source, StateName};
pub use waitlist::WaitlistRun;

/// The registry of every address this node knows. One owner; everything else sends it messages.
#[derive(Debug)]
pub struct Registry<C: Clock = SystemClock> {
    settings: RegistrySettings,
    clock: C,
    records: records::Records,
    /// Interface → addresses whose record names it alive (holder, fenced or blocked claimant):
    /// `holder_gone` touches only these.
    by_ifindex: HashMap<u32, BTreeSet<IpAddr>>,
    /// (release time, address) of every quarantine: `tick` and `next_deadline` read the front.
    deadlines: BTreeSet<(MonoNs, IpAddr)>,
    /// Records per state (Active, Draining, Quarantined), kept by `put`: the gauges read them
    /// in O(1).
    counts: StateCounts,
    /// Bumped by every change to a record, whatever it is (a state, an identity merged in, a
    /// quarantine's end moved, a conflict counted): the journal is up to date iff it saved this
    /// generation.
    generation: u64,
    /// Container id → addresses whose live holder names it: a CNI DEL touches only these.
    by_container: HashMap<String, BTreeSet<IpAddr>>,
    /// Addresses whose record changed since the journal last took them: what the next commit
    /// appends, O(changes) instead of the whole registry.
    changed: HashSet<IpAddr>,
    /// The same for the NodeQuarantine publisher, kept only while one runs
    /// ([`Registry::track_published_changes`]).
    published_changed: Option<HashSet<IpAddr>>,
    refused_claims: u64,
    full_rejections: u64,
    /// Claims refused for a full registry, tried again as space frees.
    waitlist: waitlist::Waitlist,
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

impl<C: Clock> Registry<C> {
    pub fn new(settings: RegistrySettings, clock: C) -> Self {
        Self {
            settings,
            clock,
            records: records::Records::default(),
            by_ifindex: HashMap::new(),
            deadlines: BTreeSet::new(),
            counts: StateCounts::default(),
            generation: 0,
            by_container: HashMap::new(),
            changed: HashSet::new(),
            published_changed: None,
            refused_claims: 0,
            full_rejections: 0,
            waitlist: waitlist::Waitlist::default(),
        }
    }

    pub fn settings(&self) -> &RegistrySettings {
        &self.settings
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The record of `addr` (IPv4-mapped IPv6 addresses are looked up as IPv4), if not Free.
    pub fn get(&self, addr: IpAddr) -> Option<&AddrRecord> {
        self.records.get(&addr.to_canonical())
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
        self.settings.capacity
    }

    /// How many addresses are in `state` (`Free` counts as 0: the registry does not list it).
    /// O(1): kept up to date by every change.
    pub fn count(&self, state: StateName) -> usize {
        self.counts.get(state)
    }

    /// The same count, recounted from every record: what [`count`](Self::count) must equal.
    pub fn recount(&self, state: StateName) -> usize {
        if state == StateName::Free {
            return 0;
        }
        self.records.values().filter(|r| r.state() == state).count()
    }

    /// Changes so far: bumped by every change to any record. Whoever saves the registry
    /// remembers the generation it saved; anything answered at a later generation is not
    /// durable until a save reaches it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Explicit claims refused by `refuse-new` (`ipq_refused_claims_total`).
    pub fn refused_claims(&self) -> u64 {
        self.refused_claims
    }

    /// Claims of new addresses refused because the registry was full.
    pub fn full_rejections(&self) -> u64 {
        self.full_rejections
    }

    /// When the earliest quarantine ends: the owner should call [`tick`](Self::tick) then.
    pub fn next_deadline(&self) -> Option<MonoNs> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// The addresses whose record changed (or went) since the last call, forgetting them.
    pub fn take_changed(&mut self) -> Vec<IpAddr> {
        // Taken, not drained: draining would keep (and scan) the capacity a restore grew.
        std::mem::take(&mut self.changed).into_iter().collect()
    }

    /// From now on, every address whose record changes is kept for
    /// [`take_published_changed`](Self::take_published_changed); every address the registry
    /// holds now counts as changed (O(records), once).
    pub fn track_published_changes(&mut self) {
        self.published_changed = Some(self.records.keys().copied().collect());
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

    /// The records whose live holder (Active or Draining) names container `id`, in address
    /// order: O(its addresses), not O(registry).
    pub fn held_by_container<'a>(&'a self, id: &str) -> impl Iterator<Item = &'a AddrRecord> + 'a {
        self.by_container
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|addr| self.records.get(addr))
    }

    /// The addresses whose quarantine is due at `now`, earliest first.
    pub fn due(&self, now: MonoNs) -> impl Iterator<Item = IpAddr> + '_ {
        self.deadlines
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, addr)| *addr)
    }

    /// What the datapath map must hold: one entry per record.
    pub fn datapath_entries(&self) -> BTreeMap<IpAddr, AddrEntry> {
        self.records
            .iter()
            .map(|(addr, record)| (*addr, datapath_entry(record)))
            .collect()
    }

    /// Replaces the record of `addr` by `after` (None = Free), keeping the indexes in step and
    /// appending the map write and transition this causes. Every mutation goes through here.
    fn put(&mut self, addr: IpAddr, mut after: Option<AddrRecord>, out: &mut Vec<Effect>) {
        if let Some(record) = &mut after {
            record.refill_fence_slot();
        }
        self.changed.insert(addr);
        if let Some(published) = &mut self.published_changed {
            published.insert(addr);
        }
        let before = self.records.remove(&addr);
        if before != after {
            self.generation += 1;
        }
        if let Some(before) = &before {
            self.unindex(before);
            self.counts.sub(before.state());
        }
        effects::diff(addr, before.as_ref(), after.as_ref(), out);
        if let Some(after) = after {
            self.index(&after);
            self.counts.add(after.state());
            self.records.insert(addr, after);
        }
    }

    fn index(&mut self, record: &AddrRecord) {
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
    }

    fn unindex(&mut self, record: &AddrRecord) {
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
    }
}

/// The container id of a record's live holder, if it names one.
fn container_of(record: &AddrRecord) -> Option<&str> {
    record.status.holder()?.container_id()
}

/// The registry's key for `addr`: IPv4-mapped IPv6 as IPv4 (the datapath key of both is the
/// same), the unspecified address refused (its key marks unused slots).
fn canonical(addr: IpAddr) -> Result<IpAddr, RegistryError> {
    let addr = addr.to_canonical();
    if addr.is_unspecified() {
        Err(RegistryError::InvalidAddress { addr })
    } else {
        Ok(addr)
    }
}
