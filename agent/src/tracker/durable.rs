//! The registry's durable copy: saved once per burst of changes, and what a failing save
//! means (counted, logged every so often, and no change reported as done until a save
//! reaches it).

use std::time::{Duration, Instant};

use log::{error, info};

use crate::{
    journal::{Journal, JournalError},
    metrics::Metrics,
    registry::Registry,
};

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
}

/// The journal and its standing.
pub struct Durable {
    journal: Journal,
    state: JournalState,
}

impl Durable {
    pub fn new(journal: Journal) -> Self {
        Self {
            journal,
            state: JournalState::default(),
        }
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
    pub fn persist(
        &mut self,
        registry: &mut Registry,
        metrics: &Metrics,
    ) -> Result<(), JournalError> {
        let generation = registry.generation();
        let state = &mut self.state;
        if state.saved == Some(generation) {
            metrics.journal_unsaved_seconds.set(0.0);
            return Ok(());
        }
        let now = Instant::now();
        let since = *state.unsaved_since.get_or_insert(now);
        match self.journal.commit(registry) {
            Ok(()) => {
                state.saved = Some(generation);
                state.unsaved_since = None;
                if let Some(reason) = state.failing.take() {
                    info!(
                        "journal: saved again after {:.1}s of failures ({reason})",
                        now.duration_since(since).as_secs_f64()
                    );
                }
                state.last_logged = None;
                metrics.journal_unsaved_seconds.set(0.0);
                Ok(())
            }
            Err(e) => {
                metrics.journal_write_failures.inc();
                metrics
                    .journal_unsaved_seconds
                    .set(now.duration_since(since).as_secs_f64());
                let reason = e.to_string();
                let changed = state.failing.as_deref() != Some(reason.as_str());
                let due = state
                    .last_logged
                    .is_none_or(|at| now.duration_since(at) >= SAVE_FAILURE_LOG_EVERY);
                if changed || due {
                    error!(
                        "journal: {reason}; changes are not durable and requests that made \
                         them are answered `unavailable` until a save succeeds (retrying)"
                    );
                    state.last_logged = Some(now);
                }
                state.failing = Some(reason);
                Err(e)
            }
        }
    }
}
