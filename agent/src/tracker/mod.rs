//! The registry's owner: the dispatcher where what netlink observes, what the kernel samples,
//! what the API asks and what time does become registry operations, whose effects it hands to
//! the part that owns each.
//!
//! - `decide` (the [`decide::Core`]): the registry, the netlink mirror and the configuration
//!   behind handlers that take an input and return the registry's effects, with no I/O;
//! - `effects` (the `Sinks`): where the effects go, each part owning its state: `enforcer`
//!   (with `pending_writes`: the datapath's one writer, the writes the kernel refused retried
//!   every tick), `break_glass` (entries written by hand), `observer` (with `feed`: counters,
//!   event-feed entries and log lines), reuse hygiene (`hygiene`: its start and reports), and
//!   `map_drift` (what another process wrote into the maps, written back);
//! - `protection`: the attacher, the workers' reports, TC notices, the verification's findings
//!   about links and pins, and readiness;
//! - `ipam` (with `ipam_pressure`): ipq-ipam's records, held releases, holds and exhausted
//!   ranges;
//! - `publish`: what changed, handed to the NodeQuarantine publisher and whereabouts;
//! - `recovery`: bringing the registry back at start and reconciling it with a netlink dump;
//! - `events` ([`Observed`]: what the node, the kernel, the workers and time said),
//!   `commands` (with `claims`: the API's requests): the inputs, dispatched to the parts;
//! - `startup`: the owner's part in the agent's start-up after recovery;
//! - `api_service`: the API's answers: every view, read from the parts' state, and the
//!   registry's refusals as API errors;
//! - `durable`: the journal, a sink the agent's loop owns beside the tracker.
//!
//! Durability: the registry counts its changes (its generation); [`Durable::persist`] saves
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
#[cfg(test)]
mod pod_events_tests;
mod protection;
mod protection_view;
mod publish;
#[cfg(test)]
mod publish_tests;
mod recovery;
mod sinks_view;
mod startup;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_retry_tests;

pub use api_service::answer::Answer;
pub use durable::{Durable, Journaled};
pub use events::Observed;
pub use feed::StreamsClosing;
pub use recovery::Recovery;
pub use startup::{ServeWith, Served};

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    config::Config,
    datapath::{attach::Attacher, DatapathPort},
    metrics::Metrics,
    registry::{Registry, RegistrySettings, SystemClock},
};

// The role of an interface under the configuration is the attacher's own type: one concept,
// one type.
use crate::datapath::attach::Role;

pub struct Tracker {
    /// The registry, the node's netlink mirror and the configuration: the decisions.
    core: decide::Core,
    /// Where the core's effects go: the datapath writer, the observer, reuse hygiene.
    sinks: effects::Sinks,
    /// The attacher and what is known of the interfaces' protection.
    protection: protection::Protection,
    metrics: Arc<Metrics>,
    started_at: SystemTime,
    /// How the registry came back at start (`/v1/status`).
    recovered: Option<crate::api::model::RecoveryView>,
    /// ipq-ipam's records, held releases, holds and releaser.
    ipam: ipam::IpamSide,
    /// The NodeQuarantine publisher's and the whereabouts projection's ends, when the agent
    /// publishes.
    publishing: publish::Publishing,
}

impl Tracker {
    /// `bpf_watcher`: whether the watcher of other processes' bpf() calls runs, or why not
    /// (`ipq status` says what finds unannounced changes).
    pub fn new(
        config: Config,
        datapath: impl DatapathPort + 'static,
        attacher: Attacher,
        bpf_watcher: Result<Arc<crate::datapath::bpf_watch::Pokes>, String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let settings = RegistrySettings::from(&config);
        let ipam = ipam::IpamSide::new(&config.state_dir, config.capacity as usize);
        let mut registry = Registry::new(settings, SystemClock);
        registry.set_namespace_scope(config.namespaces.clone());
        Self {
            core: decide::Core::new(config, registry),
            sinks: effects::Sinks {
                enforcer: enforcer::Enforcer::new(datapath, metrics.clone()),
                hand_written: Default::default(),
                observer: observer::Observer::new(metrics.clone()),
                hygiene: crate::hygiene::Hygiene::disabled(),
                remote_claims: None,
            },
            protection: protection::Protection::new(attacher, bpf_watcher, metrics.clone()),
            metrics,
            started_at: SystemTime::now(),
            recovered: None,
            ipam,
            publishing: Default::default(),
        }
    }

    /// How long until the registry's next deadline or the attacher's next retry, when either
    /// has one: the owner loop ticks then at the latest.
    pub fn until_next_work(&self) -> Option<Duration> {
        let deadline = self
            .core
            .registry
            .records()
            .indexes()
            .next_deadline()
            .map(|at| Duration::from_nanos(at.saturating_sub(crate::netdev::monotonic_ns())));
        let retry = self
            .protection
            .attacher
            .workers()
            .next_retry()
            .map(|at| at.saturating_duration_since(Instant::now()));
        match (deadline, retry) {
            (Some(d), Some(r)) => Some(d.min(r)),
            (d, r) => d.or(r),
        }
    }

    /// The agent stops: the event feed's followers get every event published so far, then
    /// their streams end (the answer says when).
    pub fn close_event_streams(&mut self) -> StreamsClosing {
        self.sinks.observer.close_feed()
    }

    /// The registry as the journal reads it, for a save ([`Durable`]).
    pub fn journaled(&mut self) -> Journaled<'_> {
        Journaled(&mut self.core.registry)
    }
}
