//! The tracker's side of reuse hygiene: which transitions hand the worker a job, and the
//! worker's reports turned into events and kept for `ipq get` (a claim's answer waits for its
//! flushes: `api_service::answer`).

use std::net::IpAddr;

use tokio::sync::mpsc;

use super::Tracker;
use crate::{
    api::{
        model::{EventBody, HygieneView},
        views::TimeBase,
    },
    hygiene::{HygieneError, QueueCounters, Report},
    queues::Queue,
    registry::{Holder, StateName},
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
        self.hygiene.start(
            self.core.config.hygiene.clone(),
            self.core.config.interfaces.uplink.clone(),
            self.metrics.hygiene.clone(),
            self.core.config.capacity as usize,
            queues,
        )
    }

    /// A transition of `addr` from `from` into `to` with `holder` live after it: when the holder
    /// is gone or new, the hygiene worker gets a job. Under `observe` (the mode, or an early
    /// reuse that is only observed) nothing is flushed: every holder keeps flowing, so must
    /// their state. (The transition comes before its conflict, so an observed early reuse is
    /// recognised here by the policy and the live old holder.)
    pub(super) fn hygiene_on_transition(
        &mut self,
        addr: IpAddr,
        from: StateName,
        to: StateName,
        holder: Option<&Holder>,
    ) {
        let act = self.core.cleans(addr, from);
        let live = holder
            .filter(|_| matches!(to, StateName::Active | StateName::Draining))
            .map(|h| h.ifindex);
        self.hygiene
            .on_transition(addr, to == StateName::Quarantined, live, act);
        if to == StateName::Free {
            self.hygiene.forget(addr);
        }
    }

    /// A report from the hygiene worker: published, and kept for `ipq get`.
    pub fn on_hygiene_report(&mut self, report: Report) {
        let time = TimeBase::now();
        let view = hygiene_view(&report, None);
        self.observer.publish(
            time.rfc3339(report.finished_ns),
            EventBody::Hygiene(Box::new(view)),
        );
        let in_registry = self.core.registry.get(report.address).is_some();
        self.hygiene.record(report, in_registry);
    }
}
