//! The registry's owner: the one place where what netlink observes, what the kernel samples
//! and what time does become registry transitions, and where those transitions' effects reach
//! the datapath, the journal, the log and the metrics.
//!
//! - `recovery`: bringing the registry back at start (journal merged with the pinned maps) and
//!   reconciling it with a netlink dump;
//! - `events`: netlink events, kernel samples and ticks as registry operations;
//! - `effects`: carrying out what the registry asks (map writes, conflicts, transitions);
//! - `commands`: the API's requests;
//! - `feed`: the event feed, recent conflicts and the conflict log's rate limit;
//! - `protection`: the attach workers' reports, retries and readiness;
//! - `hygiene`: conntrack/neighbour flushes and announcements handed to the hygiene worker.
//!
//! Durability: the registry counts its changes (its generation); [`Tracker::persist`] saves
//! when the journal is behind, and nothing that changed the registry is answered before a save
//! reached its generation.

mod break_glass;
mod claims;
mod commands;
mod effects;
mod enforcer;
mod events;
mod feed;
mod hygiene;
mod ipam;
mod ipam_pressure;
mod observer;
mod protection;
mod recovery;
#[cfg(test)]
mod tests;

pub use commands::Answer;
pub use recovery::Recovery;

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use log::{error, info};

use crate::{
    config::Config,
    datapath::{attach::Attacher, DatapathPort},
    journal::{Journal, JournalError},
    metrics::Metrics,
    netlink::NetState,
    registry::{Holder, Registry, RegistrySettings, SystemClock},
};

// The role of an interface under the configuration is the attacher's own type: one concept,
// one type.
use crate::datapath::attach::Role;

/// How often a journal save that keeps failing is logged (every failure is counted).
const SAVE_FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The journal's standing: what was last saved, and since when saving fails.
#[derive(Debug, Default)]
struct JournalState {
    /// The registry generation the journal holds; `None` before the first save.
    saved: Option<u64>,
    /// Since when the registry has changes the journal lacks.
    unsaved_since: Option<Instant>,
    /// The last save's failure, while saving fails.
    failing: Option<String>,
    last_logged: Option<Instant>,
}

pub struct Tracker {
    config: Config,
    registry: Registry,
    /// The datapath's one writer.
    enforcer: enforcer::Enforcer,
    /// Attaches programs off this loop; the tracker only says what it wants.
    attacher: Attacher,
    net: NetState,
    journal: Journal,
    journal_state: JournalState,
    metrics: Arc<Metrics>,
    /// Effects and samples made counters, feed entries and log lines.
    observer: observer::Observer,
    started_at: SystemTime,
    /// Reuse hygiene's jobs and last reports (inert until started).
    hygiene: crate::hygiene::Hygiene,
    /// The allocations ipq-ipam holds, as its releaser last saw them.
    ipam_holds: crate::cni::ipam::holds::Holds,
    /// The releaser's queue of releases wanted now (pool pressure); none in tests.
    ipam_urgent: Option<tokio::sync::mpsc::Sender<crate::cni::ipam::releaser::Urgent>>,
    /// How often the O(interfaces) protection gauges were recomputed; for tests.
    #[cfg(test)]
    protection_observed: std::cell::Cell<u64>,
}

impl Tracker {
    pub fn new(
        config: Config,
        datapath: impl DatapathPort + 'static,
        attacher: Attacher,
        journal: Journal,
        metrics: Arc<Metrics>,
    ) -> Self {
        let settings = RegistrySettings::from(&config);
        Self {
            observer: observer::Observer::new(metrics.clone()),
            registry: Registry::new(settings, SystemClock),
            config,
            enforcer: enforcer::Enforcer::new(datapath),
            attacher,
            net: NetState::default(),
            journal,
            journal_state: JournalState::default(),
            metrics,
            started_at: SystemTime::now(),
            hygiene: crate::hygiene::Hygiene::disabled(),
            ipam_holds: Default::default(),
            ipam_urgent: None,
            #[cfg(test)]
            protection_observed: std::cell::Cell::new(0),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn datapath(&self) -> &dyn DatapathPort {
        self.enforcer.port()
    }

    fn role(&self, ifname: &str) -> Option<Role> {
        if self.config.is_uplink(ifname) {
            Some(Role::Uplink)
        } else if self.config.workload_glob_matching(ifname).is_some() {
            Some(Role::Workload)
        } else {
            None
        }
    }

    fn workload_holder(&self, ifindex: u32) -> Option<Holder> {
        let name = self.net.link_name(ifindex)?;
        (self.role(name) == Some(Role::Workload)).then(|| Holder::new(ifindex, name.to_owned()))
    }

    /// When `tick` has work next (monotonic ns).
    pub fn next_deadline(&self) -> Option<u64> {
        self.registry.next_deadline()
    }

    /// Whether everything the registry changed so far is in the journal.
    pub fn is_saved(&self) -> bool {
        self.journal_state.saved == Some(self.registry.generation())
    }

    /// Saves the registry if the journal is behind it. `Err` names why the save failed: what
    /// changed since the last save is then not durable, must not be reported as done, and is
    /// saved by a later call (the agent's loop calls this at least once a second).
    pub fn persist(&mut self) -> Result<(), JournalError> {
        let generation = self.registry.generation();
        let state = &mut self.journal_state;
        if state.saved == Some(generation) {
            self.metrics.journal_unsaved_seconds.set(0.0);
            return Ok(());
        }
        let now = Instant::now();
        let since = *state.unsaved_since.get_or_insert(now);
        match self.journal.commit(&mut self.registry) {
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
                self.metrics.journal_unsaved_seconds.set(0.0);
                Ok(())
            }
            Err(e) => {
                self.metrics.journal_write_failures.inc();
                self.metrics
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

    /// The gauges that follow the registry and the datapath, after every event and request.
    /// O(1) in what is stored: the registry keeps its per-state counts, the table its length.
    /// (The protection gauges walk the attacher's interfaces: they are updated only where the
    /// attacher changes and on every tick, see [`Tracker::observe_protection`].)
    fn update_gauges(&self) {
        self.metrics.observe_registry(&self.registry);
        self.metrics
            .registry_entries
            .set(self.enforcer.len() as i64);
        self.metrics
            .addresses_unprotected
            .set(self.registry.waiting() as i64);
    }

    /// Writes what is still unsaved; the datapath keeps enforcing through its pins.
    pub fn shutdown(mut self) {
        if let Err(reason) = self.persist() {
            error!("journal: the last changes were not saved at shutdown ({reason})");
        }
    }
}
