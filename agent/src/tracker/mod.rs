//! The registry's owner: the dispatcher where what netlink observes, what the kernel samples,
//! what the API asks and what time does become registry operations, whose effects it hands to
//! the part that owns each.
//!
//! - `decide` (the [`decide::Core`]): the registry, the netlink mirror and the configuration
//!   behind handlers that take an input and return the registry's effects, with no I/O;
//! - `effects` (the `Sinks`): where the effects go, each part owning its state: `enforcer`
//!   (with `pending_writes`: the datapath's one writer, the writes the kernel refused retried
//!   every tick), `break_glass` (entries written by hand), `observer` (with `feed`: counters,
//!   event-feed entries and log lines), reuse hygiene, and `map_drift` (what another process
//!   wrote into the maps, written back);
//! - `protection`: the attacher, the workers' reports, TC notices, the verification's findings
//!   about links and pins, and readiness;
//! - `ipam` (with `ipam_pressure`): ipq-ipam's records, held releases, holds and exhausted
//!   ranges;
//! - `publish`: what changed, handed to the NodeQuarantine publisher and whereabouts;
//! - `recovery`: bringing the registry back at start and reconciling it with a netlink dump;
//! - `events`, `commands` (with `claims`), `hygiene`: the inputs dispatched;
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
pub use durable::{Durable, Journaled};
pub use recovery::Recovery;

use std::{sync::Arc, time::SystemTime};

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
        Self {
            core: decide::Core::new(config, Registry::new(settings, SystemClock)),
            sinks: effects::Sinks {
                enforcer: enforcer::Enforcer::new(datapath, metrics.clone()),
                hand_written: Default::default(),
                observer: observer::Observer::new(metrics.clone()),
                hygiene: crate::hygiene::Hygiene::disabled(),
            },
            protection: protection::Protection::new(attacher, bpf_watcher, metrics.clone()),
            metrics,
            started_at: SystemTime::now(),
            recovered: None,
            ipam,
            publishing: Default::default(),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.core.registry
    }

    pub fn datapath(&self) -> &dyn DatapathPort {
        self.sinks.enforcer.port()
    }

    /// When `tick` has work next (monotonic ns).
    pub fn next_deadline(&self) -> Option<u64> {
        self.core.registry.records().indexes().next_deadline()
    }

    /// The registry as the journal reads it, for a save ([`Durable`]).
    pub fn journaled(&mut self) -> Journaled<'_> {
        Journaled(&mut self.core.registry)
    }

    /// The gauges that follow the registry and the datapath, after every event and request.
    /// O(1) in what is stored: the registry keeps its per-state counts, the table its length.
    /// (The protection gauges walk the attacher's interfaces: they are updated only where the
    /// attacher changes and on every tick, see [`Tracker::observe_protection`].)
    fn update_gauges(&self) {
        self.metrics.observe_registry(&self.core.registry);
        self.metrics
            .registry_entries
            .set(self.sinks.enforcer.len() as i64);
        self.metrics
            .addresses_unprotected
            .set(self.core.registry.waitlist().len() as i64);
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
}
