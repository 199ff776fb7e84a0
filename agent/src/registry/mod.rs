//! The address registry: the lifecycle state machine of DESIGN §2 as pure logic.
//!
//! ```text
//!   Free --claim(h)--> Active(h) --drain(h)--> Draining(h)
//!    ^                    | holder gone             | holder gone
//!    |                    v                         v
//!    +--- cool-down over --- Quarantined(since, until)
//! ```
//!
//! The registry keeps one record per address, takes its time from an injectable [`Clock`]
//! (monotonic nanoseconds, the datapath's clock) and performs no I/O: every operation returns the
//! [`Effect`]s its owner must carry out — datapath map writes, events, conflicts, metrics — or a
//! [`RegistryError`] that leaves the registry unchanged.
//!
//! One type per concern:
//! - [`Registry`]: what the owner holds. Admission — claims ([`claim`](Registry::claim), the
//!   all-or-none [`claim_all`](Registry::claim_all)), the [`Refusals`] they met, and the
//!   [`Waitlist`] of claims refused for a full registry
//!   ([`claim_waiting`](Registry::claim_waiting)) — and accessors to the parts below.
//! - [`Lifecycle`]: the settings, the clock and the record book, and every transition after a
//!   claim (reached through [`Registry::lifecycle_mut`]); also [`Lifecycle::snapshot`] →
//!   [`Lifecycle::restore`], the durable form.
//! - [`RecordBook`]: the records by address (`records.rs` keeps each in a box of its own), their
//!   [`Indexes`] (by interface, container, quarantine deadline; per-state counts) and the
//!   [`Changes`] feed (generation; what the journal and the publisher have yet to take), all
//!   kept in step by `RecordBook::put`, the one place a record changes.
//! - [`AddrRecord`]: one address; its [`Contest`] holds the fenced, blocked and displaced
//!   holders of a contested address.
//!
//! Invariants (tested as properties in `proptests.rs`):
//! - the datapath mirror built from the emitted `Upsert`/`Remove` effects alone always equals
//!   [`RecordBook::datapath_entries`];
//! - under `fence-old` an address never has two live holders whose traffic flows;
//! - a full registry refuses new addresses and never evicts one;
//! - [`Lifecycle::snapshot`] → [`Lifecycle::restore`] round-trips.
//!
//! Operation summary (details on each method):
//! - [`claim`](Registry::claim): Free → Active; the same holder again is a no-op; a claim over a
//!   live holder is `early_reuse`, over a quarantine `reuse_in_cooldown`, each resolved by the
//!   `on_early_reuse` policy.
//! - [`drain`](Lifecycle::drain): Active → Draining.
//! - [`holder_gone`](Lifecycle::holder_gone): Active/Draining → Quarantined, or → Active of the
//!   blocked claimant (`refuse-new`).
//! - [`stale_seen`](Lifecycle::stale_seen) moves a quarantine's end (adaptive release);
//!   [`tick`](Lifecycle::tick) ends the quarantines that are over;
//!   [`release`](Lifecycle::release) frees an address early, with force.
//! - [`remote_claim`](Lifecycle::remote_claim),
//!   [`duplicate_source`](Lifecycle::duplicate_source): conflicts reported by the datapath.

mod batch;
mod book;
mod changes;
mod clock;
mod contest;
mod effects;
pub mod entry;
mod error;
mod indexes;
mod lifecycle;
mod records;
mod settings;
mod types;
mod waitlist;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::net::IpAddr;

pub use book::RecordBook;
pub use changes::Changes;
pub use clock::{Clock, FakeClock, SystemClock};
pub use contest::Contest;
pub use effects::{apply_to_mirror, Conflict, ConflictKind, Effect};
pub use entry::datapath_entry;
pub use error::{RecordProblem, RegistryError};
pub use indexes::Indexes;
pub use lifecycle::remote::PodStanding;
pub use lifecycle::snapshot::{Snapshot, SNAPSHOT_VERSION};
pub use lifecycle::Lifecycle;
pub use settings::RegistrySettings;
pub use types::{duration_ns, AddrRecord, AddrStatus, Holder, MonoNs, PodRef, Source, StateName};
pub use waitlist::{Waitlist, WaitlistRun};

/// The registry of every address this node knows. One owner; everything else sends it messages.
#[derive(Debug)]
pub struct Registry<C: Clock = SystemClock> {
    lifecycle: Lifecycle<C>,
    refusals: Refusals,
    /// Claims refused for a full registry, tried again as space frees.
    waitlist: Waitlist,
}

/// Claims the registry refused, counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Refusals {
    refused_claims: u64,
    full_rejections: u64,
}

impl Refusals {
    /// Explicit claims refused by `refuse-new` (`ipq_refused_claims_total`).
    pub fn refused_claims(&self) -> u64 {
        self.refused_claims
    }

    /// Claims of new addresses refused because the registry was full.
    pub fn full_rejections(&self) -> u64 {
        self.full_rejections
    }

    fn count(&mut self, error: &RegistryError) {
        match error {
            RegistryError::Refused { .. } => self.refused_claims += 1,
            RegistryError::Full { .. } => self.full_rejections += 1,
            _ => {}
        }
    }
}

impl<C: Clock> Registry<C> {
    pub fn new(settings: RegistrySettings, clock: C) -> Self {
        Self {
            lifecycle: Lifecycle::new(settings, clock),
            refusals: Refusals::default(),
            waitlist: Waitlist::default(),
        }
    }

    /// Which namespaces' pods are only observed; set before the registry holds anything.
    pub fn set_namespace_scope(&mut self, scope: crate::config::NamespaceScope) {
        self.lifecycle.records_mut().set_scope(scope);
    }

    pub fn settings(&self) -> &RegistrySettings {
        self.lifecycle.settings()
    }

    /// The records and every transition after a claim.
    pub fn lifecycle(&self) -> &Lifecycle<C> {
        &self.lifecycle
    }

    pub fn lifecycle_mut(&mut self) -> &mut Lifecycle<C> {
        &mut self.lifecycle
    }

    /// Every record, its indexes, and what changed.
    pub fn records(&self) -> &RecordBook {
        self.lifecycle.records()
    }

    pub fn changes(&self) -> &Changes {
        self.records().changes()
    }

    /// The change feeds, to take what changed.
    pub fn changes_mut(&mut self) -> &mut Changes {
        self.lifecycle.records_mut().changes_mut()
    }

    /// From now on, every address whose record changes is kept for
    /// [`Changes::take_published_changed`]; every address the registry holds now counts as
    /// changed (O(records), once).
    pub fn track_published_changes(&mut self) {
        let book = self.lifecycle.records_mut();
        let known = book.iter().map(|record| record.addr).collect();
        book.changes_mut().track_published_changes(known);
    }

    /// Claims refused for a full registry, waiting for room.
    pub fn waitlist(&self) -> &Waitlist {
        &self.waitlist
    }

    pub fn waitlist_mut(&mut self) -> &mut Waitlist {
        &mut self.waitlist
    }

    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// `holder` claims `addr`, as seen by `source`; a refusal is counted in [`Refusals`].
    ///
    /// - Free → Active(holder), unless the registry is full ([`RegistryError::Full`]; nothing is
    ///   evicted).
    /// - The current holder again: a no-op (identity it lacked is filled in, no effects). A
    ///   Draining holder that claims again explicitly (CNI, API) is Active again; the same claim
    ///   seen on netlink (a resync still listing its route) changes nothing.
    /// - The fenced holder or blocked claimant seen again on netlink: a no-op (it stays fenced).
    /// - Another live holder (Active or Draining) has it: an `early_reuse` conflict.
    ///   `fence-old`: the claimant becomes the holder, the old holder is fenced.
    ///   `refuse-new`: an explicit claim is refused ([`RegistryError::Refused`], nothing changes);
    ///   a netlink claim is kept as the blocked claimant (its traffic dropped) and promoted to
    ///   holder once the old holder is gone. `observe`: the claimant becomes the holder, nothing
    ///   is fenced.
    /// - Quarantined: a `reuse_in_cooldown` conflict. `fence-old`, `observe`: claimed.
    ///   `refuse-new`: an explicit claim is refused until the quarantine ends; a netlink claimant
    ///   is blocked until then and promoted by [`tick`](Lifecycle::tick).
    pub fn claim(
        &mut self,
        addr: IpAddr,
        holder: Holder,
        source: Source,
    ) -> Result<Vec<Effect>, RegistryError> {
        let result = self.lifecycle.claim(addr, holder, source);
        if let Err(error) = &result {
            self.refusals.count(error);
        }
        result
    }
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
