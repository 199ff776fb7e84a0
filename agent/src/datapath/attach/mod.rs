//! Attaching ipq's programs to the interfaces the configuration names, off the owner loop.
//!
//! The tracker says which interfaces it wants protected ([`Attacher::want`]) and which went
//! away ([`Attacher::forget`]); it never waits for the kernel. A small pool of worker threads
//! ([`WorkerPool`]) does the attaching: each worker owns its own handles on the loaded programs
//! (aya's program objects are not `Sync`), opened from their pins under `bpffs_dir/progs`, and
//! attaches while the registry, the API and the CNI are answered. Each outcome comes back as a
//! [`JobReport`] on a channel the agent's loop hands to [`Attacher::on_report`].
//!
//! The [`Attacher`] is the composition root of its parts, each owning its own state: the
//! [`WorkerPool`] (threads, job queue, job generations and the retry schedule,
//! `schedule::Retries`), the [`Ledger`] (every wanted interface, what holds its hooks, and
//! what the gauges, `ipq status` and `/readyz` derive from that), the [`Findings`] (failures and
//! bypasses counted, attachments found lost, the verifications' summaries), and the
//! displacement history of bypass detection (`bypass`). Loss tracking (`lost`) and bypass
//! detection turn the kernel's notices and the verification's findings into changes of the
//! ledger and repair jobs.
//!
//! Why a pool rather than one thread: what the kernel lets run in parallel does (netlink
//! requests, pin and program opens, a slow or failing interface does not hold up the others).
//! A TCX link create is the exception: `tcx_link_attach` holds `rtnl_lock` across the RCU
//! grace period it waits for (~16 ms here), so the kernel runs them one at a time whatever the
//! number of threads (measured: 100 new veths take ~3.3 s to protect with 1 worker or 4). A
//! cls_bpf filter over netlink waits for no grace period (the same 100 in ~0.15 s).
//!
//! Every wanted interface has a protection state: `attaching`, `protected`, or `failed` with
//! the last error, retried with exponential backoff ([`retry::Backoff`]) for as long as the
//! interface exists, whatever the error (EMFILE, a foreign filter in ipq's place, a missing
//! clsact). The unprotected ones are what the gauge, `ipq status` and `/readyz` report.
//!
//! How TC programs attach is chosen once, at start ([`TcMode`]): under `tc_attach = "auto"`
//! on a kernel with TCX (probed, [`probe`]), protect first, upgrade later
//! ([`TcMode::NetlinkThenTcx`]): an interface without an ipq attachment gets ipq's cls_bpf
//! filter over netlink ([`tc_filter`]) at once, and is queued for a background swap to a pinned
//! TCX link, which runs only when no interface waits for protection ([`queue`]). The TCX link
//! goes in first and ipq's filter goes after it, so enforcement never lapses; for a moment both
//! run the same program on the same maps. Without TCX it is the filter only; `tc_attach =
//! "tcx"` and `"netlink"` force one mechanism. Each attach also removes what the other
//! mechanism left on that hook, after its own program is in place.

mod bypass;
pub mod cotenant;
pub mod error;
mod findings;
mod ledger;
mod lost;
mod model;
pub mod pins;
mod pool;
pub mod probe;
pub mod queue;
mod repair;
mod report;
pub mod retry;
mod schedule;
pub mod tc_filter;
mod tc_hook;
pub mod tc_watch;
#[cfg(test)]
mod tests;
mod upgrade;
pub mod witness;
mod worker;

use std::time::Instant;

use log::debug;

pub use error::AttachError;
pub use findings::Findings;
pub use ledger::{Ledger, ATTACHING_GRACE};
pub use model::{
    Hooked, Job, JobKind, JobReport, Lost, LostAttachment, Mechanism, Protection, Role, Target,
    TcMode,
};
pub use pins::Attached;
pub use pool::WorkerPool;

use self::{
    bypass::Displacements,
    schedule::{Retries, RetryKind},
};
use super::DatapathError;
use crate::paths::AttachPoint;

/// Reports waiting for the owner loop. A worker whose report finds the queue full waits for
/// room (counted in `ipq_queue_overflows_total{queue="attach_reports"}`): a report may be the
/// only news of a lost attachment, so none is dropped, and a waiting worker holds up only its
/// own next job, never the loop. 256 is a burst of new pods' attaches several times over (each
/// worker reports one job at a time).
pub const REPORT_QUEUE: usize = 256;

/// The attach machinery the tracker drives: what it wants, what the workers report, what the
/// kernel's notices and the verification find, each applied to the parts it concerns.
pub struct Attacher {
    workers: WorkerPool,
    ledger: Ledger,
    findings: Findings,
    /// The displacement history of ipq's TCX links, for [`Attacher::on_links_behind`].
    displaced: Displacements,
}

impl Attacher {
    /// An attacher driving `workers` (started with [`WorkerPool::start`]).
    pub fn new(workers: WorkerPool) -> Self {
        Self {
            ledger: Ledger::new(workers.mode()),
            workers,
            findings: Findings::default(),
            displaced: Displacements::default(),
        }
    }

    /// The workers: the mode they attach in, the upgrades' start, the next retry.
    pub fn workers(&self) -> &WorkerPool {
        &self.workers
    }

    /// Every wanted interface and where its protection stands.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Failures, bypasses and lost attachments found, and the verifications' summaries.
    pub fn findings(&self) -> &Findings {
        &self.findings
    }

    pub fn findings_mut(&mut self) -> &mut Findings {
        &mut self.findings
    }

    /// Wants `ifindex` protected in `role`, under `name`. Nothing new is queued for an
    /// interface already wanted the same way: its attach is under way, done, or waiting for its
    /// retry.
    pub fn want(&mut self, ifindex: u32, name: &str, role: Role) {
        if let Some(target) = self.ledger.target(ifindex) {
            if target.name == name && target.role == role {
                return;
            }
        }
        let before = Retries::times(self.ledger.target(ifindex));
        let generation = self.workers.new_generation();
        let target = self.ledger.want(ifindex, name, role, generation);
        self.workers.queue(ifindex, target, JobKind::Protect);
        self.workers
            .retries_mut()
            .reindex(ifindex, before, self.ledger.target(ifindex));
    }

    /// Forgets an interface that went away (or is no longer configured): drops its queued
    /// jobs and removes its link pins.
    pub fn forget(&mut self, ifindex: u32) {
        let before = Retries::times(self.ledger.target(ifindex));
        if !self.ledger.remove(ifindex) {
            return;
        }
        self.workers.retries_mut().reindex(ifindex, before, None);
        self.workers.cancel(ifindex);
        self.ledger.share_netlink_hooks(ifindex);
        cotenant::forget(ifindex);
    }

    /// Releases an interface whose new name no longer matches the configuration: forgets it
    /// and removes ipq's netlink filters from it too (the device lives on, unlike after
    /// [`forget`](Self::forget)'s usual case).
    pub fn release(&mut self, ifindex: u32) {
        if self.ledger.target(ifindex).is_none() {
            return;
        }
        self.forget(ifindex);
        report::remove_filters(ifindex);
        debug!("if{ifindex}: no longer configured, detached");
    }

    /// Takes a worker's report. Returns whether it changed anything (an outdated report for an
    /// interface forgotten or wanted again since does not).
    pub fn on_report(&mut self, report: JobReport) -> bool {
        let ifindex = report.job.ifindex;
        let before = Retries::times(self.ledger.target(ifindex));
        let mode = self.workers.mode();
        let changed = match self.ledger.get_mut(ifindex) {
            None => {
                self.workers.undo_unwanted(&report);
                false
            }
            Some(target) if target.generation != report.job.generation => false,
            Some(target) if report.job.kind == JobKind::Upgrade => {
                upgrade::on_report(target, ifindex, report.hooks);
                true
            }
            Some(target) => {
                if let Some(next) = report::apply(target, mode, report, &mut self.findings) {
                    self.workers.queue(ifindex, target, next);
                }
                true
            }
        };
        self.workers
            .retries_mut()
            .reindex(ifindex, before, self.ledger.target(ifindex));
        self.ledger.share_netlink_hooks(ifindex);
        changed
    }

    /// Queues the retries that are due, of attaches and of upgrades. Returns how many.
    pub fn retry_due(&mut self, now: Instant) -> usize {
        let mut queued = 0;
        while let Some((ifindex, kind)) = self.workers.retries_mut().take_due(now) {
            let Some(target) = self.ledger.get_mut(ifindex) else {
                continue;
            };
            let job = match kind {
                RetryKind::Attach => {
                    target.retry_at = None;
                    target.generation = self.workers.new_generation();
                    JobKind::Protect
                }
                RetryKind::Upgrade => {
                    target.upgrade.queued();
                    JobKind::Upgrade
                }
            };
            self.workers.queue(ifindex, target, job);
            queued += 1;
        }
        queued
    }

    /// Detaches what earlier agents attached to interfaces no longer wanted (gone, or no longer
    /// configured): link pins, and ipq's netlink filters on the node's other interfaces. Call
    /// once every configured interface has been attached once.
    pub fn prune(&self) -> Result<Vec<(u32, AttachPoint)>, DatapathError> {
        self.workers.prune(&self.ledger.wanted_points())
    }
}
