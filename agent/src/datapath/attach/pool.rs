//! The worker side of the attacher: the threads, the queue they take jobs from, the retries
//! waiting to be queued ([`Retries`]), and what a job leaves in the kernel when its interface is
//! no longer wanted (link pins, ipq's netlink filters).
//!
//! Each job carries a generation, given here, so that a report of an interface forgotten or
//! wanted again since its job was queued is told from the current one.

use std::{collections::BTreeSet, sync::Arc};

use log::{debug, warn};
use strum::VariantArray as _;

use super::{
    pins, queue::JobQueue, report, schedule::Retries, tc_filter, worker, Job, JobKind, JobReport,
    Role, Target, TcMode,
};
use crate::{
    datapath::DatapathError,
    paths::{AttachPoint, PinLayout},
};

/// Attach workers. Enough for the RCU waits of a burst of new pods to overlap; each holds three
/// program fds and sleeps while idle.
const WORKERS: usize = 4;

/// The attach workers and the jobs waiting for them. The workers end with the pool.
pub struct WorkerPool {
    layout: PinLayout,
    mode: TcMode,
    jobs: Arc<JobQueue>,
    /// Every retry that is waiting, by when it is due.
    retries: Retries,
    next_generation: u64,
    /// Whether workers attach on this node's kernel (false in unit tests, whose made-up
    /// reports name no real interface: nothing is undone there).
    workers: bool,
}

impl WorkerPool {
    /// Starts the workers; their reports arrive on the returned receiver, a worker waiting
    /// (counted in `overflows`) while it is full.
    pub fn start(
        layout: PinLayout,
        mode: TcMode,
        overflows: prometheus::IntCounter,
    ) -> Result<(Self, tokio::sync::mpsc::Receiver<JobReport>), DatapathError> {
        let queue = Arc::new(JobQueue::default());
        let (reports, receiver) = tokio::sync::mpsc::channel(super::REPORT_QUEUE);
        for n in 0..WORKERS {
            let (layout, queue) = (layout.clone(), queue.clone());
            let reports = worker::Reports {
                tx: reports.clone(),
                overflows: overflows.clone(),
            };
            std::thread::Builder::new()
                .name(format!("ipq-attach-{n}"))
                .spawn(move || worker::run(layout, mode, queue, reports))
                .map_err(DatapathError::Workers)?;
        }
        let pool = Self {
            layout,
            mode,
            jobs: queue,
            retries: Retries::default(),
            next_generation: 0,
            workers: true,
        };
        Ok((pool, receiver))
    }

    /// A pool without workers: the test takes the jobs, and makes up their reports.
    #[cfg(test)]
    pub(crate) fn without_workers(mode: TcMode) -> (Self, Arc<JobQueue>) {
        let queue = Arc::new(JobQueue::default());
        let pool = Self {
            layout: PinLayout::new("/nonexistent/ipq-test"),
            mode,
            jobs: queue.clone(),
            retries: Retries::default(),
            next_generation: 0,
            workers: false,
        };
        (pool, queue)
    }

    /// How the workers attach TC programs on this node.
    pub fn mode(&self) -> TcMode {
        self.mode
    }

    /// A generation no job was queued under before.
    pub(super) fn new_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Queues a `kind` job for `target`, under the target's generation.
    pub(super) fn queue(&self, ifindex: u32, target: &Target, kind: JobKind) {
        self.jobs.push(Job {
            ifindex,
            name: target.name.clone(),
            role: target.role,
            kind,
            generation: target.generation,
        });
    }

    /// An interface is no longer wanted: drops its queued jobs and removes its link pins.
    pub(super) fn cancel(&self, ifindex: u32) {
        self.jobs.cancel(ifindex);
        self.remove_pins(ifindex);
    }

    fn remove_pins(&self, ifindex: u32) {
        for &point in AttachPoint::VARIANTS {
            if let Err(e) = pins::remove_pin_of(&self.layout, ifindex, point) {
                warn!("if{ifindex}: removing its {} pin: {e}", point);
            }
        }
    }

    /// A late report for an interface that is no longer wanted (it went away, or was renamed
    /// out of the configuration, while its job ran): what the job attached is removed again.
    pub(super) fn undo_unwanted(&self, report: &JobReport) {
        if !self.workers {
            return;
        }
        let ifindex = report.job.ifindex;
        // Whatever the job pinned or took hold of goes, even if it failed in the end: a held
        // link of a forgotten interface would be pinned back by the next verification.
        self.remove_pins(ifindex);
        if !report.hooks.iter().any(|(_, r)| r.is_ok()) {
            return;
        }
        if report.job.role == Role::Workload {
            report::remove_filters(ifindex);
        }
        debug!(
            "{} (if{ifindex}): no longer wanted, undid its late attach",
            report.job.name
        );
    }

    /// Lets the queued TCX upgrades run (see [`super::queue`]): call once start-up is done.
    pub fn start_upgrades(&self) {
        self.jobs.start_upgrades();
    }

    /// When the next retry (of an attach or an upgrade) is due: O(log n).
    pub fn next_retry(&self) -> Option<std::time::Instant> {
        self.retries.next_retry()
    }

    /// The retry schedule (tests check it against the ledger).
    #[cfg(test)]
    pub(super) fn retries(&self) -> &Retries {
        &self.retries
    }

    pub(super) fn retries_mut(&mut self) -> &mut Retries {
        &mut self.retries
    }

    /// Detaches what earlier agents attached where `keep` does not want it: link pins, and
    /// ipq's netlink filters on the node's other interfaces.
    pub(super) fn prune(
        &self,
        keep: &BTreeSet<(u32, AttachPoint)>,
    ) -> Result<Vec<(u32, AttachPoint)>, DatapathError> {
        let mut removed = pins::prune(&self.layout, keep)?;
        let interfaces = crate::netdev::interfaces().map_err(|source| DatapathError::Io {
            path: "/sys/class/net".into(),
            source,
        })?;
        for (ifindex, _) in interfaces {
            for (point, dir) in [
                (AttachPoint::TcxIngress, tc_filter::Direction::Ingress),
                (AttachPoint::TcxEgress, tc_filter::Direction::Egress),
            ] {
                if keep.contains(&(ifindex, point)) {
                    continue;
                }
                match tc_filter::remove_ipq(ifindex, dir) {
                    Ok(true) => removed.push((ifindex, point)),
                    Ok(false) => {}
                    Err(e) => warn!("if{ifindex}: removing ipq's {} filter: {e}", dir),
                }
            }
        }
        // Programs of an older agent that are still attached anywhere keep the legacy filter
        // alive through their own reference; it is all ones, so they stay correct.
        crate::datapath::maps::unpin_legacy_filter(&self.layout)?;
        Ok(removed)
    }
}

impl Drop for WorkerPool {
    /// The workers end with the pool.
    fn drop(&mut self) {
        self.jobs.close();
    }
}
