//! The tracker's side of reuse hygiene: which transitions hand the worker a job, and the
//! worker's reports turned into events and kept for `ipq get` (a claim's answer waits for its
//! flushes: `api_service::answer`).

use tokio::sync::mpsc;

use super::Tracker;
use crate::{
    api::{
        model::{EventBody, HygieneView},
        views::TimeBase,
    },
    hygiene::{HygieneError, QueueCounters, Report},
    queues::Queue,
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

impl Tracker {
    /// Starts reuse hygiene: from now on a holder gone or new hands the worker a job. Started
    /// after recovery, which replays the registry rather than changing any holder.
    pub fn start_hygiene(&mut self) -> Result<mpsc::Receiver<Report>, HygieneError> {
        let queues = QueueCounters {
            jobs: self.metrics.queues.of(Queue::HygieneJobs),
            reports: self.metrics.queues.of(Queue::HygieneReports),
        };
        self.sinks.hygiene.start(
            self.core.config.hygiene.clone(),
            self.core.config.interfaces.uplink.clone(),
            self.metrics.hygiene.clone(),
            self.core.config.capacity as usize,
            queues,
        )
    }

    /// A report from the hygiene worker: published, and kept for `ipq get`.
    pub fn on_hygiene_report(&mut self, report: Report) {
        let time = TimeBase::now();
        let view = hygiene_view(&report, None);
        self.sinks.observer.publish(
            time.rfc3339(report.finished_ns),
            EventBody::Hygiene(Box::new(view)),
        );
        let in_registry = self.core.registry.records().get(report.address).is_some();
        self.sinks.hygiene.record(report, in_registry);
    }
}
