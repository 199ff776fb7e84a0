//! The lifecycle of DESIGN §2: the transitions that move each address's record from one state
//! to the next, at the time the injectable [`Clock`] says, committed through the record book.
//! The transitions themselves are in `lifecycle/claim.rs` and `lifecycle/transitions.rs`, the
//! durable form in `lifecycle/snapshot.rs`.

use super::{book::RecordBook, Clock, RegistrySettings, SystemClock};

/// The records and the rules that move them. Claims reach it through
/// [`Registry::claim`](super::Registry::claim), which counts refusals; every other transition
/// through [`Registry::lifecycle_mut`](super::Registry::lifecycle_mut).
#[derive(Debug)]
pub struct Lifecycle<C: Clock = SystemClock> {
    settings: RegistrySettings,
    clock: C,
    records: RecordBook,
}

impl<C: Clock> Lifecycle<C> {
    pub(super) fn new(settings: RegistrySettings, clock: C) -> Self {
        Self {
            records: RecordBook::new(settings.capacity),
            settings,
            clock,
        }
    }

    pub fn settings(&self) -> &RegistrySettings {
        &self.settings
    }

    pub fn records(&self) -> &RecordBook {
        &self.records
    }

    /// The book itself: for an all-or-none claim's rollback and for the change feeds.
    pub(super) fn records_mut(&mut self) -> &mut RecordBook {
        &mut self.records
    }
}

mod claim;
pub(super) mod remote;
pub(super) mod snapshot;
mod transitions;
