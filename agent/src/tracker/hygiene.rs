//! The tracker's side of reuse hygiene: which transitions hand the worker a job, claims that
//! are answered only once their flush is done, and the worker's reports turned into events
//! and `ipq get` fields.

use std::net::IpAddr;

use ipq_common::{
    counters::{Action, Reason},
    verdict,
};
use tokio::sync::{mpsc, oneshot};

use super::Tracker;
use crate::{
    api::{
        command::Reply,
        model::{AddressView, ClaimResponse, EventBody, HygieneView},
        views::{ApiError, TimeBase},
    },
    config::EarlyReusePolicy,
    hygiene::{HygieneError, Report, Trigger, CLAIM_WAIT},
    registry::{Holder, StateName},
};

use super::Answer;

/// A report as the API shows it; `at` empty while it is not known.
pub fn hygiene_view(report: &Report, time: Option<&TimeBase>) -> HygieneView {
    HygieneView {
        address: report.address,
        trigger: report.trigger.as_str().to_owned(),
        at: time.map_or_else(String::new, |t| t.rfc3339(report.finished_ns)),
        conntrack_entries: report.conntrack_entries,
        conntrack_flush: report.conntrack_flush.as_str().to_owned(),
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
    pub fn start_hygiene(&mut self) -> Result<mpsc::UnboundedReceiver<Report>, HygieneError> {
        self.hygiene.start(
            self.config.hygiene.clone(),
            self.config.interfaces.uplink.clone(),
            self.metrics.hygiene.clone(),
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
        let observed_reuse = self.registry.get(addr).is_some_and(|r| r.observe_only)
            || (self.config.on_early_reuse == EarlyReusePolicy::Observe
                && matches!(from, StateName::Active | StateName::Draining));
        // Cleaned exactly when the datapath drops a workload conflict on this address.
        let act = verdict::action_for_address(self.config.mode, Reason::Fenced, observed_reuse)
            == Action::Dropped;
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
        let in_registry = self.registry.get(report.address).is_some();
        self.hygiene.record(report, in_registry);
    }

    /// `view` with the address's last hygiene pass.
    pub(super) fn with_last_flush(&self, mut view: AddressView, time: &TimeBase) -> AddressView {
        view.last_flush = self
            .hygiene
            .last(view.address)
            .map(|r| hygiene_view(&r, Some(time)));
        view
    }
}

/// The answer to a claim: sent once the journal has it and every flush the claim started has
/// finished (bounded by [`CLAIM_WAIT`]), with what each did, from a task of its own so the
/// loop keeps serving.
pub(super) fn claim_answer(
    reply: Reply<ClaimResponse>,
    result: Result<ClaimResponse, ApiError>,
    waits: Vec<(IpAddr, oneshot::Receiver<Report>)>,
) -> Answer {
    Box::new(move |saved| {
        // Not durable, not done: the same rule as every other change (`durable_answer`).
        let result = match (result, saved) {
            (Ok(_), Err(reason)) => Err(ApiError::unavailable(reason)),
            (result, _) => result,
        };
        if waits.is_empty() {
            let _ = reply.send(result);
            return;
        }
        tokio::spawn(async move {
            let mut result = result;
            let deadline = tokio::time::Instant::now() + CLAIM_WAIT;
            for (addr, wait) in waits {
                let report = match tokio::time::timeout_at(deadline, wait).await {
                    Ok(Ok(report)) => Ok(report),
                    Ok(Err(_)) => Err("the hygiene worker stopped before it finished"),
                    Err(_) => Err("still running when the claim was answered"),
                };
                if let Ok(response) = result.as_mut() {
                    note_flush(response, addr, report);
                }
            }
            let _ = reply.send(result);
        });
    })
}

/// Puts a flush's report, or why there is none, into the claim's answer: a claim is never
/// answered as if its address were clean when that is not known.
fn note_flush(response: &mut ClaimResponse, addr: IpAddr, report: Result<Report, &str>) {
    let Some(view) = response.addresses.iter_mut().find(|v| v.address == addr) else {
        return;
    };
    view.last_flush = Some(match report {
        Ok(report) => hygiene_view(&report, Some(&TimeBase::now())),
        Err(why) => {
            log::error!("{addr}: claim answered before its reuse hygiene finished: {why}");
            HygieneView {
                address: addr,
                trigger: Trigger::NewHolder.as_str().to_owned(),
                at: String::new(),
                conntrack_entries: 0,
                conntrack_flush: String::new(),
                neighbours: 0,
                announcements: 0,
                announce_skipped: None,
                skipped: None,
                permanent_neighbours: Vec::new(),
                errors: vec![format!(
                    "{why} (after {})",
                    humantime::format_duration(CLAIM_WAIT)
                )],
            }
        }
    });
}
