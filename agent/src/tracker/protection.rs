//! Where the tracker meets the attach machinery: the workers' reports, retries, and what the
//! metrics, `/readyz` and the API say about interfaces that are not (yet) protected.

use std::time::Instant;

use super::Tracker;
use crate::datapath::attach::{Attacher, JobReport, Target};

impl Tracker {
    /// One attach worker's report.
    pub fn on_attach_report(&mut self, report: JobReport) {
        if self.attacher.on_report(report) {
            self.observe_protection();
        }
    }

    /// Whether an interface's first attach is still under way.
    pub fn attaching(&self) -> bool {
        self.attacher.attaching()
    }

    pub fn attacher(&self) -> &Attacher {
        &self.attacher
    }

    /// The protection of a holder's interface, if ipq wants it protected.
    pub(super) fn protection_of(&self, ifindex: u32) -> Option<&Target> {
        self.attacher.target(ifindex)
    }

    /// The attach gauges, counters and readiness, from the attacher's state: O(interfaces),
    /// so called where the attacher changes (a link added, renamed or gone, a worker's report,
    /// a retry) and once per tick for the readiness grace period, never per route, neighbour or
    /// request.
    pub(super) fn observe_protection(&self) {
        #[cfg(test)]
        self.protection_observed
            .set(self.protection_observed.get() + 1);
        let attacher = &self.attacher;
        self.metrics.observe_attachments(attacher.attached_points());
        self.metrics.observe_unprotected(
            attacher.unprotected_points().map(|(_, _, point)| point),
            attacher.failures(),
        );
        self.metrics
            .tc_upgrades_pending
            .set(attacher.pending_upgrades() as i64);
        self.metrics
            .set_readiness_blocker(attacher.readiness_blocker(Instant::now()));
    }

    /// Lets the attach workers move netlink-protected interfaces to TCX: once start-up is done.
    pub fn start_tc_upgrades(&self) {
        self.attacher.start_upgrades();
    }
}
