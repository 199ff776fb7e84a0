//! The tracker's side of reuse hygiene: which transitions hand the worker a job, and the
//! worker's reports turned into events and kept for `ipq get` (a claim's answer waits for its
//! flushes: `api_service::answer`).

use tokio::sync::mpsc;

use super::effects::Sinks;
use crate::{
    api::{
        model::{EventBody, HygieneView},
        views::TimeBase,
    },
    config::Config,
    hygiene::{HygieneError, QueueCounters, Report},
    metrics::Metrics,
    queues::Queue,
    registry::Registry,
};

/// A report as the API shows it; `at` empty while it is not known.
pub fn hygiene_view(report: &Report, time: Option<&TimeBase>) -> HygieneView {
    HygieneView {
        address: report.address,
        trigger: report.trigger.into(),
        at: time.map_or_else(String::new, |t| t.rfc3339(report.finished_ns)),
        conntrack_entries: report.conntrack_entries,
        conntrack_flush: Some(report.conntrack_flush.into()),
        neighbours: report.neighbours,
        announcements: report.announcements,
        announce_skipped: report.announce_skipped.clone(),
        skipped: report.skipped.clone(),
        permanent_neighbours: report.permanent_neighbours.clone(),
        errors: report.errors.clone(),
    }
}

impl Sinks {
    /// Starts reuse hygiene: from now on a holder gone or new hands the worker a job. Started
    /// after recovery, which replays the registry rather than changing any holder.
    pub(super) fn start_hygiene(
        &mut self,
        config: &Config,
        metrics: &Metrics,
    ) -> Result<mpsc::Receiver<Report>, HygieneError> {
        let queues = QueueCounters {
            jobs: metrics.queues.of(Queue::HygieneJobs),
            reports: metrics.queues.of(Queue::HygieneReports),
        };
        self.hygiene.start(
            config.hygiene.clone(),
            config.interfaces.uplink.clone(),
            metrics.hygiene.clone(),
            config.capacity as usize,
            queues,
        )
    }

    /// A report from the hygiene worker: published, and kept for `ipq get`.
    pub(super) fn on_hygiene_report(&mut self, report: Report, registry: &Registry) {
        let time = TimeBase::now();
        let view = hygiene_view(&report, None);
        self.observer.publish(
            time.rfc3339(report.finished_ns),
            EventBody::Hygiene(Box::new(view)),
        );
        let in_registry = registry.records().get(report.address).is_some();
        self.hygiene.record(report, in_registry);
    }
}
