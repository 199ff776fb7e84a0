//! Every series the agent exports, created and registered once at start: its name, help,
//! labels and buckets, and every labelled series set to 0 so that `rate()` and the alerts
//! work from the first scrape.

use std::sync::{atomic::AtomicU64, Arc};
use strum::VariantArray as _;

use ipq_common::counters::Hook;
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::{
    datapath::{DatapathCollector, LostCounts, ReadCounters},
    registered, Metrics, DURATION_BUCKETS, PROFILE, STATES,
};
use super::{tamper::TamperMetrics, writes::WriteMetrics};
use crate::{
    hygiene::HygieneCounters, queues::Overflows, readiness::Readiness, registry::ConflictKind,
};

impl Metrics {
    /// Every metric, with the packet counters read by `read` and queue overflows of their own.
    #[cfg(test)]
    pub(super) fn with_counters(read: ReadCounters) -> Result<Self, prometheus::Error> {
        Self::with_queues(read, Overflows::new()?)
    }

    /// Every metric, with the packet counters read by `read` and the queue overflows `queues`
    /// (made before the registry: the netlink subscription precedes the datapath's load).
    pub(super) fn with_queues(
        read: ReadCounters,
        queues: Overflows,
    ) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        queues.register(&registry)?;
        let lost: LostCounts = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        registry.register(Box::new(DatapathCollector::new(read, lost.clone())?))?;
        // The standard process_* series (CPU, memory, fds, threads, start time) of the agent.
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;

        let build_info = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_build_info",
                    "Always 1; the labels say which ipq build runs (version: the crate \
                     version, profile: the cargo profile, debug or release).",
                ),
                &["version", "profile"],
            )?,
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), PROFILE])
            .set(1);
        let ready = registered(
            &registry,
            IntGauge::new(
                "ipq_ready",
                "1 when the agent is ready (datapath loaded, registry recovered and reconciled \
                 with the node; /readyz answers 200), else 0.",
            )?,
        )?;

        let datapath_interfaces = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_datapath_interfaces",
                    "Interfaces with an ipq program attached, by hook (tc_ingress and \
                     tc_egress on workload interfaces, xdp on uplinks).",
                ),
                &["hook"],
            )?,
        )?;
        for &hook in Hook::VARIANTS {
            datapath_interfaces
                .with_label_values(&[hook.as_ref()])
                .set(0);
        }
        let unprotected_interfaces = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_datapath_unprotected_interfaces",
                    "Interfaces the configuration names (workload globs, uplinks) whose program \
                     is not attached, by hook: attaching, or failed and retried with backoff. \
                     Traffic there is not enforced; ipq status names them with the last error.",
                ),
                &["hook"],
            )?,
        )?;
        let attach_failures = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_attach_failures_total",
                    "Attach attempts that failed, by hook (each is retried with backoff).",
                ),
                &["hook"],
            )?,
        )?;
        let attachments_lost = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_attachments_lost_total",
                    "ipq attachments another tool took away, by hook and what went: qdisc \
                     (the clsact under ipq's netlink filter), filter (ipq's netlink filter \
                     deleted or replaced), link (a TCX or XDP link detached), pin (a pin under \
                     bpffs_dir removed or replaced). Each is repaired at once.",
                ),
                &["hook", "what"],
            )?,
        )?;
        let connections_refused = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_connections_refused_total",
                    "Connections a listener closed as soon as it accepted them, by listener \
                     (metrics, api) and reason: full (every slot taken), peer_limit (the \
                     metrics port's allowance of one peer address used up).",
                ),
                &["listener", "reason"],
            )?,
        )?;
        let tamper = TamperMetrics::register(&registry)?;
        let writes = WriteMetrics::register(&registry)?;
        let verify_seconds = registered(
            &registry,
            Gauge::new(
                "ipq_datapath_verify_seconds",
                "How long the last verification of ipq's pins, links and maps against the \
                 kernel took (every verify_interval; the reads off the owner loop, O(pins + \
                 addresses)).",
            )?,
        )?;
        for &hook in Hook::VARIANTS {
            for what in crate::datapath::attach::Lost::VARIANTS {
                attachments_lost
                    .with_label_values(&[hook.as_ref(), what.as_ref()])
                    .inc_by(0);
            }
            unprotected_interfaces
                .with_label_values(&[hook.as_ref()])
                .set(0);
            attach_failures
                .with_label_values(&[hook.as_ref()])
                .inc_by(0);
        }
        let ipam_releases = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_ipam_releases_total",
                    "Delegate DELs the agent ran for allocations ipq-ipam held, by network and \
                     outcome (released; failed, retried with backoff).",
                ),
                &["network", "outcome"],
            )?,
        )?;
        // Releases whose config names no network count under network "": those series exist
        // from the start, so the alert on failures has a series to read before any release.
        for outcome in ["released", "failed", "unrecorded"] {
            ipam_releases.with_label_values(&["", outcome]).inc_by(0);
        }
        let ipam_exhausted = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_ipam_exhausted_total",
                    "ipq-ipam ADDs that found the delegate's range exhausted while ipq held \
                     addresses of it, by network and outcome (waited; released, the quietest \
                     quarantined allocation given back; release_failed; none_releasable, every \
                     held address draining).",
                ),
                &["network", "outcome"],
            )?,
        )?;
        for outcome in ["waited", "released", "release_failed", "none_releasable"] {
            ipam_exhausted.with_label_values(&["", outcome]).inc_by(0);
        }
        let ipam_held_addresses = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_ipam_held_addresses",
                    "Addresses whose allocation ipq-ipam holds in the node's IPAM until their \
                     quarantine is over, by network.",
                ),
                &["network"],
            )?,
        )?;
        // Like the releases above: a series from the first scrape, so panels have one to show.
        ipam_held_addresses.with_label_values(&[""]).set(0);
        let ipam_pending_releases = registered(
            &registry,
            IntGauge::new(
                "ipq_ipam_pending_releases",
                "Allocations ipq-ipam holds whose delegate DEL has not run yet (quarantine \
                 running, or a failed DEL being retried).",
            )?,
        )?;
        let ipam_failing_releases = registered(
            &registry,
            IntGauge::new(
                "ipq_ipam_failing_releases",
                "Held allocations whose last delegate DEL failed (being retried with backoff): \
                 their addresses stay allocated in the node's IPAM until a DEL succeeds.",
            )?,
        )?;
        let tc_upgrades_pending = registered(
            &registry,
            IntGauge::new(
                "ipq_datapath_tc_upgrades_pending",
                "Workload interfaces protected by ipq's netlink filter that wait for the TCX \
                 link replacing it (tc_attach = auto on a kernel with TCX; created in the \
                 background, one at a time). Always 0 in the other modes.",
            )?,
        )?;
        let registry_entries = registered(
            &registry,
            IntGauge::new(
                "ipq_registry_entries",
                "Addresses in the datapath's address map (the registry's copy in the kernel). \
                 At ipq_registry_capacity, claims of new addresses are refused.",
            )?,
        )?;
        let registry_capacity = registered(
            &registry,
            IntGauge::new(
                "ipq_registry_capacity",
                "Addresses the datapath's address map can hold (capacity).",
            )?,
        )?;
        let registry_full_rejections = registered(
            &registry,
            IntCounter::new(
                "ipq_registry_full_rejections_total",
                "Claims of new addresses refused because the address map was full (existing \
                 entries are never evicted).",
            )?,
        )?;

        let addresses = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_addresses",
                    "Addresses in the registry, by lifecycle state (active, draining, \
                     quarantined).",
                ),
                &["state"],
            )?,
        )?;
        for state in STATES {
            addresses.with_label_values(&[state.as_ref()]).set(0);
        }
        let addresses_by_mode = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_addresses_by_mode",
                    "Addresses in the registry by how the namespace of their pod is treated \
                     (observe_namespaces / enforce_namespaces): observe (what would be \
                     dropped is counted as observed and let through), enforce. Bounded: never \
                     the namespace's name.",
                ),
                &["mode"],
            )?,
        )?;
        for mode in ["observe", "enforce"] {
            addresses_by_mode.with_label_values(&[mode]).set(0);
        }
        let conflicts = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_conflicts_total",
                    "Address conflicts recorded, by kind (early_reuse: a claim while another \
                     live holder has the address; reuse_in_cooldown: a claim during \
                     quarantine; duplicate_source: a holder's address as source on another \
                     holder's interface; remote_claim: another machine announcing an address \
                     held here).",
                ),
                &["kind"],
            )?,
        )?;
        for &kind in ConflictKind::VARIANTS {
            conflicts.with_label_values(&[kind.as_ref()]).inc_by(0);
        }
        let refused_claims = registered(
            &registry,
            IntCounter::new(
                "ipq_refused_claims_total",
                "Explicit claims (CNI ADD, API) refused with try-again-later under \
                 on_early_reuse = refuse-new.",
            )?,
        )?;
        let netlink_resyncs = registered(
            &registry,
            IntCounter::new(
                "ipq_netlink_resyncs_total",
                "Full netlink dumps taken because netlink events were lost (socket overrun).",
            )?,
        )?;
        let journal_write_failures = registered(
            &registry,
            IntCounter::new(
                "ipq_journal_write_failures_total",
                "Saves of the registry's journal in state_dir that failed (full disk, read-only \
                 file system, I/O error). While saving fails, requests that change the registry \
                 are answered unavailable (503) and the agent retries every second.",
            )?,
        )?;
        let journal_unsaved_seconds = registered(
            &registry,
            Gauge::new(
                "ipq_journal_unsaved_seconds",
                "Seconds since the registry first had a change the journal does not hold yet; 0 \
                 when everything is saved. A restart now would lose those changes' identities \
                 (pods, containers) and deadlines beyond what the pinned maps keep.",
            )?,
        )?;
        let addresses_unprotected = registered(
            &registry,
            IntGauge::new(
                "ipq_addresses_unprotected",
                "Addresses a workload on this node shows (a host route, a neighbour behind a \
                 bridge port) that the registry refused because it was full: seen but not \
                 protected. Each is claimed as soon as a registry entry frees.",
            )?,
        )?;
        let stale_traffic_age_seconds = registered(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "ipq_stale_traffic_age_seconds",
                    "Seconds since its holder left at which stale inbound traffic for a \
                     quarantined address arrived, one observation per conflict sample (at most \
                     one per address per sample interval): the evidence for choosing cooldown.",
                )
                .buckets(DURATION_BUCKETS.to_vec()),
            )?,
        )?;
        let quarantine_duration_seconds = registered(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "ipq_quarantine_duration_seconds",
                    "Seconds addresses stayed quarantined before release (cooldown, extended by \
                     stale traffic up to max_cooldown).",
                )
                .buckets(DURATION_BUCKETS.to_vec()),
            )?,
        )?;

        let hygiene = HygieneCounters::register(&registry)?;
        let ipam = super::IpamMetrics::register(&registry)?;

        Ok(Self {
            registry,
            queues,
            hygiene,
            ipam_releases,
            ipam_held_addresses,
            ipam_pending_releases,
            ipam_failing_releases,
            ipam_exhausted,
            ipam,
            datapath_interfaces,
            unprotected_interfaces,
            attach_failures,
            attachments_lost,
            tamper,
            writes,
            connections_refused,
            verify_seconds,
            tc_upgrades_pending,
            registry_entries,
            registry_capacity,
            registry_full_rejections,
            addresses,
            addresses_by_mode,
            conflicts,
            refused_claims,
            netlink_resyncs,
            journal_write_failures,
            journal_unsaved_seconds,
            addresses_unprotected,
            stale_traffic_age_seconds,
            quarantine_duration_seconds,
            lost,
            readiness: Readiness::new(ready),
        })
    }

    /// Every metric, with no kernel counters behind them: for tests that need no datapath.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Arc<Self> {
        let read: ReadCounters = Box::new(|| Ok(Vec::new()));
        Arc::new(Self::with_counters(read).expect("metrics register"))
    }
}
