//! What the node, the kernel, the workers and time said ([`Observed`]), dispatched to the part
//! that owns each: the core decides what it means for the registry and the sinks carry out its
//! decisions; the attacher's and hygiene's reports and the verification's findings go to the
//! parts that own them.

use ipq_common::sample::ConflictSample;

use super::{decide::InterfaceChange, Tracker};
use crate::{
    datapath::{
        attach::{tc_watch::TcNotice, JobReport},
        bpf_watch::ReportedKey,
        verify::Verification,
    },
    hygiene,
    netlink::NetEvent,
};

/// One input of the registry's owner other than an API request: each a burst, taken whole
/// (one gauge update per burst, not per item).
pub enum Observed {
    /// Netlink events, in arrival order.
    Net(Vec<NetEvent>),
    TcNotices(Vec<TcNotice>),
    Verification(Box<Verification>),
    /// Map writes another process made, reported by the bpf() watcher.
    ReportedKeys(Vec<ReportedKey>),
    AttachReports(Vec<JobReport>),
    HygieneReports(Vec<hygiene::Report>),
    Samples(Vec<ConflictSample>),
    /// The API server's answers about remote claims' local holders.
    RemoteClaimAnswers(Vec<crate::remote_claim::Answer>),
    /// Time passed: cool-downs, retries, readiness.
    Tick,
}

impl Tracker {
    /// One input, handed to the part that owns what it says.
    pub fn on_input(&mut self, input: Observed) {
        match input {
            Observed::Net(events) => {
                let mut attacher_changed = false;
                for event in events {
                    attacher_changed |= self.apply_event(event);
                }
                self.sinks
                    .observe_gauges(&self.core.registry, &self.metrics);
                if attacher_changed {
                    self.protection.observe();
                }
            }
            Observed::TcNotices(notices) => {
                for notice in notices {
                    self.protection.on_tc_notice(notice);
                }
            }
            Observed::Verification(verification) => {
                self.protection
                    .on_verification(&verification, &self.core, &mut self.sinks);
            }
            Observed::ReportedKeys(keys) => {
                let found = self
                    .sinks
                    .recheck_reported(&keys, &self.core.registry, &self.metrics);
                self.protection.found_drift(found);
            }
            Observed::AttachReports(reports) => {
                for report in reports {
                    self.protection.on_report(report, &mut self.sinks.observer);
                }
            }
            Observed::HygieneReports(reports) => {
                for report in reports {
                    self.sinks.on_hygiene_report(report, &self.core.registry);
                }
            }
            Observed::Samples(samples) => {
                for sample in &samples {
                    let attacher = &self.protection.attacher;
                    self.sinks
                        .on_sample(&mut self.core, attacher, &self.metrics, sample);
                }
            }
            Observed::RemoteClaimAnswers(answers) => {
                for answer in &answers {
                    let effects = self.core.on_remote_claim_answer(answer);
                    self.sinks.apply(&mut self.core, effects);
                }
            }
            Observed::Tick => {
                self.protection
                    .attacher
                    .retry_due(std::time::Instant::now());
                self.sinks.tick(&mut self.core, &self.metrics);
                self.protection.observe();
            }
        }
    }

    /// One netlink event, without the gauges (a burst or a resync updates them once after all
    /// its events); returns whether it changed what the attacher wants.
    pub(super) fn apply_event(&mut self, event: NetEvent) -> bool {
        let decision = self.core.on_net_event(event);
        let attacher_changed = match decision.interface {
            InterfaceChange::Unchanged => false,
            InterfaceChange::Seen {
                ifindex,
                name,
                role,
            } => self.protection.want(ifindex, &name, role),
            InterfaceChange::Gone(ifindex) => {
                self.protection.attacher.forget(ifindex);
                true
            }
        };
        self.sinks.apply(&mut self.core, decision.effects);
        attacher_changed
    }
}
