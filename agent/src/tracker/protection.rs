//! Where the tracker meets the attach machinery: the workers' reports, retries, and what the
//! metrics, `/readyz` and the API say about interfaces that are not (yet) protected.

use std::time::Instant;

use ipq_api::EventHook;

use super::Tracker;
use crate::{
    api::{model::EventBody, views::TimeBase},
    datapath::{
        attach::{tc_watch::TcNotice, Attacher, JobReport, Lost, LostAttachment},
        verify::Verification,
    },
    metrics, netdev,
    paths::PinLayout,
};

impl Tracker {
    /// One attach worker's report.
    pub fn on_attach_report(&mut self, report: JobReport) {
        if self.attacher.on_report(report) {
            self.observe_protection();
        }
        for lost in self.attacher.take_lost() {
            self.publish_lost(lost);
        }
    }

    /// A TC notification: a repair of the interface it names is queued if it concerns ipq.
    /// A notice that proves a loss makes the interface unprotected at once (O(interfaces) then,
    /// which only another tool's deletion costs).
    pub fn on_tc_notice(&mut self, notice: TcNotice) {
        if self.attacher.on_tc_notice(notice) {
            self.observe_protection();
        }
    }

    /// A verification pass's findings: pins put back are counted and published here (their
    /// WARN lines are the verification's); detached links are repaired by a worker, which
    /// counts them like any lost attachment.
    pub fn on_verification(&mut self, verification: Verification) {
        if verification.links_state_only {
            // The links' state alone: a lost one is repaired; nothing else was looked at, so
            // nothing else (places on hooks, filters, pins, maps, the status' last pass) is
            // taken from it.
            let mut marked = false;
            for &(ifindex, point) in verification.detached.iter().chain(&verification.replaced) {
                marked |= self
                    .attacher
                    .on_link_lost(ifindex, point, verification.started);
            }
            if marked {
                self.observe_protection();
            }
            return;
        }
        let layout = PinLayout::new(&self.core.config.bpffs_dir);
        for restored in &verification.restored {
            let link = restored
                .path
                .parent()
                .filter(|dir| *dir == layout.links_dir())
                .and(restored.path.file_name())
                .and_then(|name| PinLayout::parse_link_name(name.to_str()?));
            let (interface, ifindex, hook) = match link {
                Some((ifindex, point)) => (
                    self.attacher
                        .target(ifindex)
                        .map_or_else(|| format!("if{ifindex}"), |t| t.name.clone()),
                    ifindex,
                    EventHook::from(point.hook()),
                ),
                // A map or program pin: no interface's, every hook's.
                None => (restored.path.display().to_string(), 0, EventHook::NoHook),
            };
            self.metrics
                .attachments_lost
                .with_label_values(&[hook.as_ref(), Lost::Pin.as_ref()])
                .inc();
            self.sinks.observer.publish(
                humantime::format_rfc3339_millis(verification.finished_at).to_string(),
                EventBody::AttachmentLost {
                    interface,
                    ifindex,
                    hook,
                    what: Lost::Pin.into(),
                    repaired: restored.outcome.is_ok(),
                    error: restored.outcome.as_ref().err().map(ToString::to_string),
                },
            );
        }
        let mut marked = false;
        for &(ifindex, point) in verification.detached.iter().chain(&verification.replaced) {
            marked |= self
                .attacher
                .on_link_lost(ifindex, point, verification.started);
        }
        marked |= self
            .attacher
            .on_links_behind(&verification.behind, verification.started);
        for &(ifindex, point) in &verification.filters_missing {
            marked |= self.attacher.on_filter_missing(ifindex, point);
        }
        self.attacher.on_filters_ahead(&verification.filters_ahead);
        if marked {
            self.observe_protection();
        }
        let problem = verification.pins_problem();
        if problem.is_some() && problem != self.pins_problem {
            log::error!("NOT READY: {}", problem.as_deref().unwrap_or_default());
        }
        self.metrics.readiness.set_pins_problem(problem.clone());
        self.pins_problem = problem;
        let drift = self.verify_maps(&verification);
        self.metrics
            .verify_seconds
            .set(verification.took.as_secs_f64());
        self.attacher.set_verified(verification.summary(&drift));
    }

    /// Counts and publishes an attachment another tool took away (its WARN line is the
    /// attacher's).
    fn publish_lost(&mut self, lost: LostAttachment) {
        let hook = metrics::hook_label(lost.point);
        self.metrics
            .attachments_lost
            .with_label_values(&[hook, lost.what.as_ref()])
            .inc();
        let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
        self.sinks.observer.publish(
            at,
            EventBody::AttachmentLost {
                interface: lost.name,
                ifindex: lost.ifindex,
                hook: lost.point.hook().into(),
                what: lost.what.into(),
                repaired: lost.error.is_none(),
                error: lost.error,
            },
        );
    }

    /// Whether an interface's first attach is still under way.
    pub fn attaching(&self) -> bool {
        self.attacher.attaching()
    }

    pub fn attacher(&self) -> &Attacher {
        &self.attacher
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
        self.metrics.tamper.observe_bypassed(
            attacher.bypassed_points().map(|(_, point)| point),
            attacher.bypasses(),
        );
        self.metrics
            .tc_upgrades_pending
            .set(attacher.pending_upgrades() as i64);
        self.metrics
            .readiness
            .set_blocker(attacher.readiness_blocker(Instant::now()));
    }

    /// Start-up is done: records what is in place (for `/v1/status` and the `started:` line),
    /// then lets the attach workers move netlink-protected interfaces to TCX.
    pub fn mark_started(&mut self) -> crate::api::model::StartedView {
        let started = crate::api::model::StartedView {
            attachments: self.attacher.attached_points().count() as u64,
            unprotected: self.attacher.unprotected_points().count() as u64,
            tc_upgrades_pending: self.attacher.pending_upgrades() as u64,
        };
        self.started = Some(started.clone());
        self.attacher.start_upgrades();
        started
    }
}
