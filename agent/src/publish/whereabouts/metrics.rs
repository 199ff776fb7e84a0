//! `ipq_publish_whereabouts_*`: how the projection of the quarantine into whereabouts'
//! OverlappingRangeIPReservations goes. Registered whether or not it is enabled (all zeros
//! then), so dashboards and alerts see the same series everywhere.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::{publish::FailureReason, series::registered};

pub struct ProjectionMetrics {
    /// Reservations made, labelled and deleted that the API server accepted.
    pub writes: IntCounter,
    pub failures: IntCounterVec,
    /// Reservations of ipq's that someone else (whereabouts' DEL, control loop or reconciler)
    /// deleted while the quarantine lasted, made again.
    pub recreated: IntCounter,
    /// Reservations ipq holds now.
    pub reservations: IntGauge,
    /// Listed addresses whose reservation names another pod (left alone, checked again).
    pub foreign: IntGauge,
    /// Complete lists the watch took (its start, and each restart after it expired).
    pub lists: IntCounter,
}

impl ProjectionMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let writes = registered(
            registry,
            IntCounter::new(
                "ipq_publish_whereabouts_writes_total",
                "Writes of whereabouts OverlappingRangeIPReservations for this node's \
                 addresses (ipq's own made or deleted, whereabouts' own of a live pod labelled) \
                 the API server accepted.",
            )?,
        )?;
        let failures = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_publish_whereabouts_failures_total",
                    "Writes of whereabouts reservations, and failures of their watch, that \
                     failed, by reason: config (no client could be made), unreachable (no \
                     answer from the API server), refused (an error answer: RBAC, CRD missing, \
                     no NodeQuarantine yet). Retried with backoff; enforcement on the node does \
                     not depend on them.",
                ),
                &["reason"],
            )?,
        )?;
        for reason in <FailureReason as strum::IntoEnumIterator>::iter() {
            failures
                .with_label_values(&[<&str>::from(reason)])
                .inc_by(0);
        }
        let recreated = registered(
            registry,
            IntCounter::new(
                "ipq_publish_whereabouts_recreated_total",
                "Reservations of ipq's deleted by someone else (whereabouts' CNI DEL, control \
                 loop or reconciler) while the address was still in quarantine, and made again.",
            )?,
        )?;
        let reservations = registered(
            registry,
            IntGauge::new(
                "ipq_publish_whereabouts_reservations",
                "whereabouts OverlappingRangeIPReservations of ipq's own for this node's \
                 addresses (quarantined, fenced, or freed by whereabouts under a live holder).",
            )?,
        )?;
        let foreign = registered(
            registry,
            IntGauge::new(
                "ipq_publish_whereabouts_foreign",
                "Quarantined or fenced addresses whose whereabouts reservation names another \
                 pod: left alone (whereabouts skips the address while it exists), checked again.",
            )?,
        )?;
        let lists = registered(
            registry,
            IntCounter::new(
                "ipq_publish_whereabouts_lists_total",
                "Complete lists of this node's whereabouts reservations the agent's watch took: \
                 one at start, one more each time the watch expired (410 Gone: the API \
                 server's history moved past it) or was started again (the API server back \
                 after an outage, rotated credentials).",
            )?,
        )?;
        Ok(Self {
            writes,
            failures,
            recreated,
            reservations,
            foreign,
            lists,
        })
    }

    pub fn failed(&self, reason: FailureReason) {
        self.failures
            .with_label_values(&[<&str>::from(reason)])
            .inc();
    }
}
