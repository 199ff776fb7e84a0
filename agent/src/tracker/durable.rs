//! The registry's durable copy: saved once per burst of changes, and what a failing save
//! means (counted, logged every so often, and no change reported as done until a save
//! reaches it).

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use log::{error, info};

use crate::{
    journal::{Commit, Contents, Journal, JournalError, SyncOutcome, Synced},
    metrics::Metrics,
    queues::Queue,
    registry::{AddrRecord, Registry},
};

/// The registry as the journal reads it: its changes, its records and its generation, which is
/// all a save needs; nothing that changes a record goes through it.
pub struct Journaled<'a>(pub(super) &'a mut Registry);

impl Journaled<'_> {
    fn generation(&self) -> u64 {
        self.0.changes().generation()
    }
}

impl Contents<AddrRecord> for Journaled<'_> {
    fn take_changed(&mut self) -> Vec<IpAddr> {
        self.0.changes_mut().take_changed()
    }
    fn get(&self, key: &IpAddr) -> Option<&AddrRecord> {
        self.0.records().get(*key)
    }
    fn all(&self) -> Vec<AddrRecord> {
        Contents::all(&*self.0)
    }
}

/// Commits kept waiting for their flush, each with the registry generation it holds. A disk
/// whose flushes hang would otherwise add one per commit for as long as it hangs; beyond the
/// bound, a new commit takes the place of the newest one waiting (a flush through it covers
/// every commit before it), so the generation known saved can only lag, never run ahead.
const SYNCING_MAX: usize = 1024;

/// What readiness names while the journal cannot be saved.
const UNSAVED: &str = "journal";

/// How often a journal save that keeps failing is logged (every failure is counted).
const SAVE_FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The journal's standing: what was last saved, and since when saving fails.
#[derive(Debug, Default)]
pub(super) struct JournalState {
    /// The registry generation the journal holds; `None` before the first save.
    saved: Option<u64>,
    /// Since when the registry has changes the journal lacks.
    unsaved_since: Option<Instant>,
    /// The last save's failure, while saving fails.
    failing: Option<String>,
    last_logged: Option<Instant>,
    /// Commits written and waiting for their flush: (ticket, the registry generation it holds).
    syncing: VecDeque<(u64, u64)>,
}

impl JournalState {
    /// Keeps commit `ticket` (holding `generation`) until its flush reports; true when the
    /// queue was at `bound` and it took the newest waiting commit's place.
    fn wait_for_flush(&mut self, ticket: u64, generation: u64, bound: usize) -> bool {
        let full = self.syncing.len() >= bound;
        match self.syncing.back_mut() {
            Some(&mut (t, _)) if t == ticket => false,
            Some(newest) if full => {
                *newest = (ticket, generation);
                true
            }
            _ => {
                self.syncing.push_back((ticket, generation));
                false
            }
        }
    }
}

/// The journal and its standing: the registry's durable copy, a sink the owner loop saves to
/// once per burst of changes (and that recovery reads at start).
pub struct Durable {
    journal: Journal,
    state: JournalState,
    metrics: Arc<Metrics>,
}

impl Durable {
    pub fn new(journal: Journal, metrics: Arc<Metrics>) -> Self {
        Self {
            journal,
            state: JournalState::default(),
            metrics,
        }
    }

    /// Moves the journal's flushes off the owner loop; their reports come out of the returned
    /// receiver, for [`Durable::on_synced`].
    pub fn defer_syncs(&mut self) -> tokio::sync::mpsc::Receiver<Synced> {
        let (reports, receiver) = tokio::sync::mpsc::channel(crate::journal::REPORT_QUEUE);
        self.journal.defer_syncs(reports);
        receiver
    }

    /// The journal itself, which recovery reads, stages and sets aside.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// Whether the journal holds `generation` of the registry.
    pub fn is_saved(&self, generation: u64) -> bool {
        self.state.saved == Some(generation)
    }

    /// Saves the registry if the journal is behind it. `Err` names why the save failed: what
    /// changed since the last save is then not durable, must not be reported as done, and is
    /// saved by a later call (the agent's loop calls this at least once a second).
    pub fn persist(&mut self, registry: Journaled<'_>) -> Result<(), JournalError> {
        self.save(registry, false).map(|_| ())
    }

    /// Like [`Durable::persist`], with the flush left to the journal's threads: `Syncing`
    /// until [`Durable::on_synced`] reports it.
    pub fn persist_deferred(&mut self, registry: Journaled<'_>) -> Result<Commit, JournalError> {
        self.save(registry, true)
    }

    /// A flush's report: `Some(Ok(ticket))`, every commit up to it is durable; `Some(Err)`,
    /// none waiting is; `None`, it changes nothing.
    pub fn on_synced(&mut self, synced: Synced) -> Option<Result<u64, JournalError>> {
        let metrics = &self.metrics.clone();
        match self.journal.on_synced(synced) {
            SyncOutcome::Stale => None,
            SyncOutcome::DurableThrough(ticket) => {
                while let Some(&(waiting, generation)) = self.state.syncing.front() {
                    if waiting > ticket {
                        break;
                    }
                    self.state.syncing.pop_front();
                    self.state.saved = Some(generation);
                }
                if self.state.syncing.is_empty() {
                    self.saved_now(metrics);
                }
                Some(Ok(ticket))
            }
            SyncOutcome::Failed(e) => {
                self.state.syncing.clear();
                self.failed(&e, metrics);
                Some(Err(e))
            }
        }
    }

    fn save(&mut self, mut registry: Journaled<'_>, defer: bool) -> Result<Commit, JournalError> {
        let metrics = &self.metrics.clone();
        let generation = registry.generation();
        if self.state.saved == Some(generation) {
            metrics.journal_unsaved_seconds.set(0.0);
            return Ok(Commit::Durable);
        }
        self.state.unsaved_since.get_or_insert_with(Instant::now);
        let committed = if defer {
            self.journal.commit_deferred(&mut registry)
        } else {
            self.journal.commit(&mut registry).map(|()| Commit::Durable)
        };
        match committed {
            Ok(Commit::Durable) => {
                self.state.syncing.clear();
                self.state.saved = Some(generation);
                self.saved_now(metrics);
                Ok(Commit::Durable)
            }
            Ok(Commit::Syncing(ticket)) => {
                if self.state.wait_for_flush(ticket, generation, SYNCING_MAX) {
                    metrics.queues.of(Queue::JournalCommits).inc();
                }
                Ok(Commit::Syncing(ticket))
            }
            Err(e) => {
                self.failed(&e, metrics);
                Err(e)
            }
        }
    }

    /// The journal holds everything: the end of a run of failures, if there was one.
    fn saved_now(&mut self, metrics: &Metrics) {
        let state = &mut self.state;
        let since = state.unsaved_since.take();
        if let (Some(reason), Some(since)) = (state.failing.take(), since) {
            info!(
                "journal: saved again after {:.1}s of failures ({reason})",
                since.elapsed().as_secs_f64()
            );
        }
        state.last_logged = None;
        metrics.journal_unsaved_seconds.set(0.0);
        metrics.readiness.set_unsaved(UNSAVED, None);
    }

    /// A save or a flush failed: counted, and logged when the reason changes or every so often.
    fn failed(&mut self, e: &JournalError, metrics: &Metrics) {
        let state = &mut self.state;
        let now = Instant::now();
        let since = *state.unsaved_since.get_or_insert(now);
        metrics.journal_write_failures.inc();
        metrics
            .journal_unsaved_seconds
            .set(now.duration_since(since).as_secs_f64());
        let reason = e.to_string();
        let changed = state.failing.as_deref() != Some(reason.as_str());
        if changed {
            metrics.readiness.set_unsaved(UNSAVED, Some(reason.clone()));
        }
        let due = state
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= SAVE_FAILURE_LOG_EVERY);
        if changed || due {
            error!(
                "journal: {reason}; changes are not durable and requests that made them are \
                 answered `unavailable` until a save succeeds (retrying)"
            );
            state.last_logged = Some(now);
        }
        state.failing = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::JournalState;

    /// A full queue of commits waiting for their flush takes a new one in its newest's place:
    /// a flush through the newest then says everything before it is saved, and one through an
    /// older commit never claims a generation it did not flush.
    #[test]
    fn commits_waiting_for_a_hung_flush_are_bounded_and_never_run_ahead() {
        let mut state = JournalState::default();
        assert!(!state.wait_for_flush(1, 10, 2));
        assert!(
            !state.wait_for_flush(1, 10, 2),
            "the same commit is kept once"
        );
        assert!(!state.wait_for_flush(2, 20, 2));
        assert!(
            state.wait_for_flush(3, 30, 2),
            "full: the newest is replaced"
        );
        assert!(state.wait_for_flush(4, 40, 2));
        assert_eq!(Vec::from(state.syncing.clone()), [(1, 10), (4, 40)]);
    }
}
