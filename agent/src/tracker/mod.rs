//! The registry's owner: the dispatcher where what netlink observes, what the kernel samples,
//! what the API asks and what time does become registry operations, whose effects it hands to
//! the part that owns each.
//!
//! - `decide`: the registry, the netlink mirror and the configuration behind handlers that take
//!   an input and return the registry's effects, with no I/O;
//! - `recovery`: bringing the registry back at start and reconciling it with a netlink dump;
//! - `events`: netlink events, kernel samples and ticks as registry operations;
//! - `commands` (with `claims`, `break_glass`, `ipam`): the API's requests dispatched, and the
//!   changes they ask for made;
//! - `api_service`: the API's answers: every view, read from the owner's state, and the
//!   registry's refusals as API errors;
//! - `effects`: each effect handed to its owner;
//! - `enforcer` (with `pending_writes`): the datapath's one writer, and the writes the kernel
//!   refused, retried every tick;
//! - `observer` (with `feed`): counters, event-feed entries and log lines;
//! - `durable`: the journal and how saving it goes;
//! - `protection`: the attach workers' reports, retries and readiness;
//! - `hygiene`: conntrack/neighbour flushes and announcements handed to the hygiene worker;
//! - `ipam_pressure`: exhausted ranges of ipq-ipam;
//! - `publish`: what changed, handed to the NodeQuarantine publisher.
//!
//! Durability: the registry counts its changes (its generation); [`Tracker::persist`] saves
//! when the journal is behind, and nothing that changed the registry is answered before a save
//! reached its generation.

mod api_service;
mod break_glass;
mod claims;
mod commands;
mod decide;
mod durable;
mod effects;
mod enforcer;
mod events;
mod feed;
mod hygiene;
mod ipam;
mod ipam_pressure;
mod map_drift;
mod observer;
mod pending_writes;
mod protection;
mod publish;
#[cfg(test)]
mod publish_tests;
mod recovery;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_retry_tests;

pub use api_service::answer::Answer;
pub use recovery::Recovery;

use std::{sync::Arc, time::SystemTime};

use log::error;

use crate::{
    config::Config,
    datapath::{attach::Attacher, DatapathPort},
    journal::{Commit, Journal, JournalError, Synced},
    metrics::Metrics,
    registry::{Registry, RegistrySettings, SystemClock},
};

// The role of an interface under the configuration is the attacher's own type: one concept,
// one type.
use crate::datapath::attach::Role;

pub struct Tracker {
    /// The registry, the node's netlink mirror and the configuration: the decisions.
    core: decide::Core,
    /// The datapath's one writer.
    enforcer: enforcer::Enforcer,
    /// Attaches programs off this loop; the tracker only says what it wants.
    attacher: Attacher,
    /// The registry's durable copy, and how saving it goes.
    durable: durable::Durable,
    metrics: Arc<Metrics>,
    /// Effects and samples made counters, feed entries and log lines.
    observer: observer::Observer,
    started_at: SystemTime,
    /// How the registry came back at start (`/v1/status`).
    recovered: Option<crate::api::model::RecoveryView>,
    /// Why the pins under `bpffs_dir` cannot be kept, as the last verification found.
    pins_problem: Option<String>,
    /// Datapath entries written (`Some`) or removed (`None`) by hand, behind the registry's
    /// back, until the registry next changes the address: what the verification keeps there.
    hand_written: break_glass::HandWritten,
    /// Whether the watcher of other processes' bpf() calls is attached, or why not.
    bpf_watcher: Result<Arc<crate::datapath::bpf_watch::Pokes>, String>,
    /// What was in place when the agent became ready ([`Tracker::mark_started`]).
    started: Option<crate::api::model::StartedView>,
    /// Reuse hygiene's jobs and last reports (inert until started).
    hygiene: crate::hygiene::Hygiene,
    /// ipq-ipam's records, held releases, holds and releaser.
    ipam: ipam::IpamSide,
    /// The NodeQuarantine publisher's end, when the agent publishes (`publish`).
    publish: Option<crate::publish::Feed>,
    /// The whereabouts projection's end, when enabled (`publish`).
    whereabouts: Option<crate::publish::whereabouts::Feed>,
    /// How often the O(interfaces) protection gauges were recomputed; for tests.
    #[cfg(test)]
    protection_observed: std::cell::Cell<u64>,
}

impl Tracker {
    /// Whether the bpf() watcher runs (`ipq status` says what finds unannounced changes).
    pub fn set_bpf_watcher(
        &mut self,
        watcher: Result<Arc<crate::datapath::bpf_watch::Pokes>, String>,
    ) {
        self.bpf_watcher = watcher;
    }

    pub fn new(
        config: Config,
        datapath: impl DatapathPort + 'static,
        attacher: Attacher,
        journal: Journal,
        metrics: Arc<Metrics>,
    ) -> Self {
        let settings = RegistrySettings::from(&config);
        let ipam = ipam::IpamSide::new(&config.state_dir, config.capacity as usize);
        Self {
            observer: observer::Observer::new(metrics.clone()),
            core: decide::Core::new(config, Registry::new(settings, SystemClock)),
            enforcer: enforcer::Enforcer::new(datapath, metrics.clone()),
            attacher,
            durable: durable::Durable::new(journal),
            metrics,
            started_at: SystemTime::now(),
            recovered: None,
            pins_problem: None,
            hand_written: Default::default(),
            bpf_watcher: Err("not started".to_owned()),
            started: None,
            hygiene: crate::hygiene::Hygiene::disabled(),
            ipam,
            publish: None,
            whereabouts: None,
            #[cfg(test)]
            protection_observed: std::cell::Cell::new(0),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.core.registry
    }

    pub fn datapath(&self) -> &dyn DatapathPort {
        self.enforcer.port()
    }

    /// When `tick` has work next (monotonic ns).
    pub fn next_deadline(&self) -> Option<u64> {
        self.core.registry.next_deadline()
    }

    /// Whether everything the registry changed so far is in the journal.
    pub fn is_saved(&self) -> bool {
        self.durable.is_saved(self.core.registry.generation())
    }

    /// Saves the registry if the journal is behind it. `Err` names why the save failed: what
    /// changed since the last save is then not durable, must not be reported as done, and is
    /// saved by a later call (the agent's loop calls this at least once a second).
    pub fn persist(&mut self) -> Result<(), JournalError> {
        self.durable.persist(&mut self.core.registry, &self.metrics)
    }

    /// [`Tracker::persist`] with the flush left to the journal's threads (see
    /// [`Tracker::defer_journal_syncs`]): `Syncing` until [`Tracker::on_synced`] reports it.
    pub fn persist_deferred(&mut self) -> Result<Commit, JournalError> {
        self.durable
            .persist_deferred(&mut self.core.registry, &self.metrics)
    }

    /// Moves the journal's flushes off the owner loop; their reports come out of the returned
    /// receiver, for [`Tracker::on_synced`].
    pub fn defer_journal_syncs(&mut self) -> tokio::sync::mpsc::Receiver<Synced> {
        let (reports, receiver) = tokio::sync::mpsc::channel(crate::journal::REPORT_QUEUE);
        self.durable.journal_mut().defer_syncs(reports);
        receiver
    }

    /// A flush's report: `Some(Ok(ticket))`, every commit up to it is durable; `Some(Err)`,
    /// none waiting is; `None`, nothing changes.
    pub fn on_synced(&mut self, synced: Synced) -> Option<Result<u64, JournalError>> {
        self.durable.on_synced(synced, &self.metrics)
    }

    /// The gauges that follow the registry and the datapath, after every event and request.
    /// O(1) in what is stored: the registry keeps its per-state counts, the table its length.
    /// (The protection gauges walk the attacher's interfaces: they are updated only where the
    /// attacher changes and on every tick, see [`Tracker::observe_protection`].)
    fn update_gauges(&self) {
        self.metrics.observe_registry(&self.core.registry);
        self.metrics
            .registry_entries
            .set(self.enforcer.len() as i64);
        self.metrics
            .addresses_unprotected
            .set(self.core.registry.waiting() as i64);
    }

    /// The releaser's queue for pool pressure.
    pub fn set_ipam_releaser(
        &mut self,
        urgent: tokio::sync::mpsc::Sender<crate::ipam::releaser::Urgent>,
    ) {
        self.ipam.set_releaser(urgent);
    }

    /// The shared table of ipq-ipam's holds and the records of its allocations, for the
    /// releaser and the API.
    pub fn ipam_tables(&self) -> (crate::ipam::holds::Holds, crate::ipam::records::Records) {
        (self.ipam.holds(), self.ipam.records())
    }

    /// Writes what is still unsaved; the datapath keeps enforcing through its pins.
    pub fn shutdown(mut self) {
        if let Err(reason) = self.persist() {
            error!("journal: the last changes were not saved at shutdown ({reason})");
        }
    }
}
