//! Prometheus metrics of the agent (DESIGN §5), served by [`serve`] with `/healthz` and
//! `/readyz`.
//!
//! Every family with labels has all its label values from the first scrape (zeros included):
//! a series that appears only when it first moves breaks `rate()` and `increase()` over the
//! moment it appears, and alerts written as `x > 0` never see the step from nothing. Label
//! values are small closed sets (hooks, reasons, kinds, states, sources): never an address,
//! an interface or a pod.

use strum::VariantArray as _;
mod datapath;
mod families;
mod ipam;
mod server;
mod tamper;
#[cfg(test)]
mod tests;
mod writes;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use ipq_common::counters::Hook;
use log::warn;
use prometheus::{
    Encoder, Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};
use thiserror::Error;

pub use ipam::{IpamMetrics, MAX_NETWORK_LABELS, OTHER_NETWORK};
pub use server::serve;

use crate::datapath::{maps::Source, Counters, DatapathError};
use crate::hygiene::HygieneCounters;
use crate::paths::{AttachPoint, PinLayout};
use crate::queues::Overflows;
use crate::readiness::Readiness;
use crate::registry::{Clock, Registry as AddressRegistry, StateName};
use datapath::{LostCounts, ReadCounters};
pub use tamper::TamperMetrics;
pub use writes::WriteMetrics;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("registering metric: {0}")]
    Register(#[from] prometheus::Error),
    #[error("opening the datapath counters: {0}")]
    Datapath(#[from] DatapathError),
    #[error("listening on metrics_addr {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Where user space loses events (`source` label of `ipq_events_lost_total`; the kernel's
/// losses are `source="kernel"`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
    strum::EnumCount,
    strum::EnumIter,
)]
#[strum(serialize_all = "lowercase")]
pub enum LostAt {
    /// A conflict log line over the log rate limit.
    Log = 0,
    /// An `/v1/events` subscriber that fell too far behind.
    Api = 1,
    /// A conflict sample read from the kernel's ring while the queue to the owner loop was
    /// full: dropped as the kernel drops what its full ring cannot take.
    Queue = 2,
}

/// The states `ipq_addresses` reports (`Free` is the absence of a record).
const STATES: [StateName; 3] = [
    StateName::Active,
    StateName::Draining,
    StateName::Quarantined,
];

/// Buckets for durations from a few hundred milliseconds to an hour: cool-downs are seconds to
/// minutes, and the tail is what an operator sizing `cooldown` needs to see.
const DURATION_BUCKETS: [f64; 14] = [
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// `debug` or `release`: which cargo profile built the agent (`ipq_build_info{profile}`).
const PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The agent's metrics, shared with whoever updates them.
pub struct Metrics {
    pub registry: Registry,
    pub datapath_interfaces: IntGaugeVec,
    /// Wanted attach points whose program is not in place (attaching or failed), by hook.
    pub unprotected_interfaces: IntGaugeVec,
    /// Failed attach attempts, by hook; follows the attacher's count.
    pub attach_failures: IntCounterVec,
    /// Attachments another tool took away, by hook and what went (qdisc, filter, link, pin).
    pub attachments_lost: IntCounterVec,
    /// What other processes did to ipq's maps and hooks beyond taking attachments away.
    pub tamper: TamperMetrics,
    /// The datapath writer's refused writes, pending and retried.
    pub writes: WriteMetrics,
    /// `ipq_connections_refused_total{listener, reason}`, counted by the listeners' guards.
    pub connections_refused: IntCounterVec,
    /// How long the last verification of the datapath took.
    pub verify_seconds: Gauge,
    /// Protected workload interfaces whose netlink filters still wait for their TCX links.
    pub tc_upgrades_pending: IntGauge,
    pub registry_entries: IntGauge,
    pub registry_capacity: IntGauge,
    /// Claims of new addresses refused because the registry was full; follows the registry's
    /// own count through [`observe_registry`](Self::observe_registry).
    pub registry_full_rejections: IntCounter,
    pub addresses: IntGaugeVec,
    /// `ipq_addresses_by_mode{mode}`: by whether their pod's namespace is only observed.
    pub addresses_by_mode: IntGaugeVec,
    pub conflicts: IntCounterVec,
    pub refused_claims: IntCounter,
    pub netlink_resyncs: IntCounter,
    /// Journal saves that failed (`ipq_journal_write_failures_total`).
    pub journal_write_failures: IntCounter,
    /// Seconds the registry has had changes the journal lacks; 0 when saved.
    pub journal_unsaved_seconds: Gauge,
    /// Addresses a workload shows (a host route, a bridge neighbour) that the full registry
    /// could not take: seen but not protected.
    pub addresses_unprotected: IntGauge,
    pub stale_traffic_age_seconds: Histogram,
    pub quarantine_duration_seconds: Histogram,
    /// Reuse hygiene (written by its worker thread).
    pub hygiene: HygieneCounters,
    /// `ipq_queue_overflows_total{queue}`: items that found a bounded queue full.
    pub queues: Overflows,
    /// ipq-ipam: delegate DELs the agent ran for held allocations, by network and outcome
    /// (`released`, `failed`).
    pub ipam_releases: IntCounterVec,
    /// ipq-ipam: addresses of held allocations, by network.
    pub ipam_held_addresses: IntGaugeVec,
    /// ipq-ipam: held allocations whose release waits (quarantine running, or retrying).
    pub ipam_pending_releases: IntGauge,
    /// ipq-ipam: held allocations whose last delegate DEL failed (written by the releaser
    /// alone, from its table of retries).
    pub ipam_failing_releases: IntGauge,
    /// ipq-ipam: delegate ranges found exhausted while ipq held addresses of them, by network
    /// and outcome (`waited`, `released`, `release_failed`, `none_releasable`).
    pub ipam_exhausted: IntCounterVec,
    /// ipq-ipam: restored releases and the bound on `network` labels.
    pub ipam: IpamMetrics,
    lost: LostCounts,
    /// What `/readyz` answers; it keeps `ipq_ready`.
    pub readiness: Readiness,
}

use crate::series::registered;

impl Metrics {
    /// Registers every metric, `queues` among them; the datapath counters come from the maps
    /// pinned under `bpffs_dir`.
    pub fn new(bpffs_dir: &Path, queues: Overflows) -> Result<Arc<Self>, MetricsError> {
        let layout = PinLayout::new(bpffs_dir);
        let counters = Mutex::new(Counters::open(&mut Source::Pinned(&layout))?);
        let read: ReadCounters = Box::new(move || {
            counters
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .read()
        });
        Ok(Arc::new(Self::with_queues(read, queues)?))
    }

    /// Counts `n` events lost at `at` (`ipq_events_lost_total{source}`).
    pub fn events_lost(&self, at: LostAt, n: u64) {
        self.lost[at as usize].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the per-state address gauge from the registry, and carries the registry's count of
    /// claims it refused for being full into `ipq_registry_full_rejections_total`.
    pub fn observe_registry<C: Clock>(&self, registry: &AddressRegistry<C>) {
        for state in STATES {
            self.addresses
                .with_label_values(&[state.as_ref()])
                .set(registry.records().indexes().count(state) as i64);
        }
        let observed = registry.records().namespace_observed();
        self.addresses_by_mode
            .with_label_values(&["observe"])
            .set(observed as i64);
        self.addresses_by_mode
            .with_label_values(&["enforce"])
            .set(registry.records().len().saturating_sub(observed) as i64);
        let counted = self.registry_full_rejections.get();
        let seen = registry.refusals().full_rejections();
        if seen > counted {
            self.registry_full_rejections.inc_by(seen - counted);
        }
    }

    /// Sets the attached-interface gauge from the attach points in use.
    pub fn observe_attachments(&self, points: impl Iterator<Item = AttachPoint>) {
        let mut counts = [0i64; Hook::VARIANTS.len()];
        for point in points {
            counts[point.hook() as usize] += 1;
        }
        for &hook in Hook::VARIANTS {
            self.datapath_interfaces
                .with_label_values(&[hook.as_ref()])
                .set(counts[hook as usize]);
        }
    }

    /// Sets the unprotected gauge from the attach points not in place, and carries the
    /// attacher's failure counts into the failures counter.
    pub fn observe_unprotected(
        &self,
        points: impl Iterator<Item = AttachPoint>,
        failures: &BTreeMap<AttachPoint, u64>,
    ) {
        let mut counts = [0i64; Hook::VARIANTS.len()];
        for point in points {
            counts[point.hook() as usize] += 1;
        }
        let mut failed = [0u64; Hook::VARIANTS.len()];
        for (point, n) in failures {
            failed[point.hook() as usize] += n;
        }
        for &hook in Hook::VARIANTS {
            let label = [hook.as_ref()];
            self.unprotected_interfaces
                .with_label_values(&label)
                .set(counts[hook as usize]);
            let counter = self.attach_failures.with_label_values(&label);
            let seen = failed[hook as usize];
            if seen > counter.get() {
                counter.inc_by(seen - counter.get());
            }
        }
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            warn!("encoding metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The `hook` label of an attach point.
pub fn hook_label(point: AttachPoint) -> &'static str {
    point.hook().into()
}
