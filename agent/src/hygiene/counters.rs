//! What reuse hygiene counts, registered in the agent's Prometheus registry and written by the
//! hygiene worker thread alone. Owned here, beside the worker, so that hygiene needs nothing of
//! the rest of the agent's metrics.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use strum::VariantArray as _;

use super::Step;
use crate::series::registered;

/// The reuse-hygiene series.
#[derive(Clone, Debug)]
pub struct HygieneCounters {
    pub conntrack_entries_flushed: IntCounter,
    pub neighbours_flushed: IntCounter,
    pub announcements: IntCounter,
    pub announcements_rate_limited: IntCounter,
    pub failures: IntCounterVec,
}

impl HygieneCounters {
    /// Creates the series in `registry`, every `step` label at 0.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let failures = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_hygiene_failures_total",
                    "Reuse-hygiene steps that failed, by step (conntrack, neighbours, announce): \
                     a reused address may still carry its old holder's state.",
                ),
                &["step"],
            )?,
        )?;
        for &step in Step::VARIANTS {
            failures.with_label_values(&[step.as_ref()]).inc_by(0);
        }
        Ok(Self {
            conntrack_entries_flushed: registered(
                registry,
                IntCounter::new(
                    "ipq_conntrack_entries_flushed_total",
                    "Conntrack entries deleted because their original or reply tuple carried an \
                     address whose holder went away or changed (reuse hygiene).",
                )?,
            )?,
            neighbours_flushed: registered(
                registry,
                IntCounter::new(
                    "ipq_neighbours_flushed_total",
                    "The node's non-permanent neighbour entries deleted for addresses whose \
                     holder went away or changed, so that the node resolves them again.",
                )?,
            )?,
            announcements: registered(
                registry,
                IntCounter::new(
                    "ipq_announcements_total",
                    "Gratuitous ARPs and unsolicited neighbour advertisements sent for new \
                     holders (one per interface sent on).",
                )?,
            )?,
            announcements_rate_limited: registered(
                registry,
                IntCounter::new(
                    "ipq_announcements_rate_limited_total",
                    "New holders not announced because `announce_per_second` was used up (one \
                     per address; its hygiene report says so in `announce_skipped`).",
                )?,
            )?,
            failures,
        })
    }
}
