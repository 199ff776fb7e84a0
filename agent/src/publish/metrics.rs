//! `ipq_publish_*`: how writing the node's NodeQuarantine goes. Registered whether or not the
//! agent publishes (all zeros then), so dashboards and alerts see the same series everywhere.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use crate::series::registered;

/// Why a write failed (`reason` of `ipq_publish_failures_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "lowercase")]
pub enum FailureReason {
    /// No client could be made (no in-cluster service account, a bad kubeconfig), or the API
    /// server does not accept its credentials (401).
    Config,
    /// The API server was not reached, or did not answer in time.
    Unreachable,
    /// The API server answered with an error (forbidden, no such resource, invalid).
    Refused,
}

pub struct PublishMetrics {
    pub writes: IntCounter,
    pub failures: IntCounterVec,
    /// Seconds since the oldest change the object lacks; 0 when it holds everything.
    pub pending_seconds: Gauge,
    pub entries: IntGauge,
    pub omitted_entries: IntGauge,
    /// Orphaned entries the last write left out: the API server refused their state.
    pub orphans_withheld: IntGauge,
    /// From the first change a write carries to the API server's answer.
    pub latency: Histogram,
    /// Passes of the owner loop that found the writer's feed full and kept their changes.
    pub feed_full: IntCounter,
}

impl PublishMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let writes = registered(
            registry,
            IntCounter::new(
                "ipq_publish_writes_total",
                "Writes of this node's NodeQuarantine status the API server accepted \
                 (coalesced: at most a few a second whatever the churn).",
            )?,
        )?;
        let failures = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_publish_failures_total",
                    "Writes of this node's NodeQuarantine that failed, by reason: config (no \
                     client could be made), unreachable (no answer from the API server), \
                     refused (an error answer: RBAC, CRD missing, invalid). Retried with \
                     backoff; enforcement on the node does not depend on them.",
                ),
                &["reason"],
            )?,
        )?;
        for reason in <FailureReason as strum::IntoEnumIterator>::iter() {
            failures
                .with_label_values(&[<&str>::from(reason)])
                .inc_by(0);
        }
        let pending_seconds = registered(
            registry,
            Gauge::new(
                "ipq_publish_pending_seconds",
                "How long the oldest change to this node's quarantine has waited to reach its \
                 NodeQuarantine object; 0 when the object holds everything.",
            )?,
        )?;
        let entries = registered(
            registry,
            IntGauge::new(
                "ipq_publish_entries",
                "Addresses (quarantined, fenced or orphaned) the last written NodeQuarantine \
                 listed.",
            )?,
        )?;
        let omitted_entries = registered(
            registry,
            IntGauge::new(
                "ipq_publish_omitted_entries",
                "Quarantined or fenced addresses left out of the last written NodeQuarantine \
                 (over its cap of entries, kept under the API server's object size limit).",
            )?,
        )?;
        let orphans_withheld = registered(
            registry,
            IntGauge::new(
                "ipq_publish_orphans_withheld",
                "Orphaned holders (force-deleted pods still running) left out of the last \
                 written NodeQuarantine because the API server refused the state: the \
                 cluster's NodeQuarantine CRD is older than the agent (kubectl apply -f \
                 deploy/helm/ipq/crds/). 0 when none were.",
            )?,
        )?;
        let latency = registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "ipq_publish_latency_seconds",
                    "From a change to this node's quarantine to the API server's acceptance of \
                     the write that carries it.",
                )
                .buckets(vec![
                    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
                ]),
            )?,
        )?;
        let feed_full = registered(
            registry,
            IntCounter::new(
                "ipq_publish_feed_full_total",
                "Times the agent's loop found the NodeQuarantine writer (or the whereabouts \
                 projection, where enabled) too far behind to take more changes (a write \
                 hanging on a slow API server); the changes were kept, coalesced per address, \
                 and handed over on a later pass.",
            )?,
        )?;
        Ok(Self {
            feed_full,
            writes,
            failures,
            pending_seconds,
            entries,
            omitted_entries,
            orphans_withheld,
            latency,
        })
    }

    pub fn failed(&self, reason: FailureReason) {
        self.failures
            .with_label_values(&[<&str>::from(reason)])
            .inc();
    }
}
