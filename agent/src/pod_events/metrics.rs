//! `ipq_events_*`: the Kubernetes Events written on the pods involved. Registered whether or
//! not the agent writes any (all zeros then), from a registry handed in: this module owns its
//! series. (Not to be confused with `ipq_events_lost_total`, the API's event feed.)

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use strum::IntoEnumIterator;

use super::notice::EventReason;
use crate::{publish::FailureReason, series::registered};

/// Why a notice became no Event (`cause` of `ipq_events_dropped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum DropCause {
    /// The queue from the agent's loop to the writer was full.
    QueueFull,
    /// A new pod-and-reason series while the cap of series was kept.
    SeriesFull,
    /// A new series while the writer waited out a failing API server (backoff).
    Backoff,
}

pub struct EventMetrics {
    /// Events created and series patches written, by reason.
    pub emitted: IntCounterVec,
    /// Notices counted into an existing series instead of an Event of their own, by reason.
    pub aggregated: IntCounterVec,
    pub dropped: IntCounterVec,
    /// Writes the API server did not take, by failure reason.
    pub failed: IntCounterVec,
    /// Pod-and-reason series kept.
    pub series: IntGauge,
}

impl EventMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let emitted = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_events_emitted_total",
                    "Kubernetes Events written on the pods involved in a conflict, a fence or a \
                     held quarantine, by reason: a create for a series' first occurrence, a \
                     patch of its series count at most once per events interval.",
                ),
                &["reason"],
            )?,
        )?;
        let aggregated = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_events_aggregated_total",
                    "Occurrences counted into an existing Event's series (same pod, same \
                     reason) instead of an Event of their own, by reason.",
                ),
                &["reason"],
            )?,
        )?;
        let dropped = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_events_dropped_total",
                    "Occurrences that became no Kubernetes Event, by cause: queue_full (the \
                     writer behind, a bounded queue), series_full (too many pods and reasons \
                     at once), backoff (a new series while the API server was failing).",
                ),
                &["cause"],
            )?,
        )?;
        let failed = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_events_failed_total",
                    "Kubernetes Event writes that failed, by reason: config (no client), \
                     unreachable, refused (RBAC, invalid).",
                ),
                &["reason"],
            )?,
        )?;
        let series = registered(
            registry,
            IntGauge::new(
                "ipq_events_series",
                "Pod-and-reason series of Kubernetes Events the agent keeps (bounded).",
            )?,
        )?;
        for reason in EventReason::iter() {
            let reason: &str = reason.into();
            emitted.with_label_values(&[reason]).inc_by(0);
            aggregated.with_label_values(&[reason]).inc_by(0);
        }
        for cause in DropCause::iter() {
            dropped.with_label_values(&[<&str>::from(cause)]).inc_by(0);
        }
        for reason in FailureReason::iter() {
            failed.with_label_values(&[<&str>::from(reason)]).inc_by(0);
        }
        Ok(Self {
            emitted,
            aggregated,
            dropped,
            failed,
            series,
        })
    }

    pub fn emitted(&self, reason: EventReason) {
        self.emitted
            .with_label_values(&[<&str>::from(reason)])
            .inc();
    }

    pub fn aggregated(&self, reason: EventReason) {
        self.aggregated
            .with_label_values(&[<&str>::from(reason)])
            .inc();
    }

    pub fn dropped(&self, cause: DropCause) {
        self.dropped.with_label_values(&[<&str>::from(cause)]).inc();
    }

    pub fn failed(&self, reason: FailureReason) {
        self.failed.with_label_values(&[<&str>::from(reason)]).inc();
    }
}
