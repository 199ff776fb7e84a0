//! The hygiene worker: a thread of its own, with its own netlink and packet sockets, that takes
//! jobs in batches (one conntrack dump for a whole batch) and reports what each did. Claims
//! waiting for their flush go first, and their conntrack entries go by the kernel's filtered
//! flush where the start-up probe proved it (see `kernel_flush`, `flush_probe`).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use log::{error, warn};
use thiserror::Error;
use tokio::sync::mpsc;

mod announcing;
mod claim_flush;
mod flushes;

use announcing::BatchLinks;

use super::counters::HygieneCounters;
use super::{
    announce::Announcer,
    conntrack::{Conntrack, ConntrackError},
    neighbour::{NeighbourError, Neighbours},
    ClaimFlush, Job, Report, Step, Trigger,
};
use crate::{config::HygieneConfig, netdev};

/// The worker's nice value: below the owner loop's.
const WORKER_NICE: libc::c_int = 10;

/// Jobs taken together in one pass (one conntrack dump for all of them).
pub(super) const MAX_BATCH: usize = 1024;

/// Where the worker reports: the bounded queue to the owner loop, and the count of the times a
/// report found it full and the worker waited.
pub(super) struct Reports {
    pub(super) tx: mpsc::Sender<Report>,
    pub(super) overflows: prometheus::IntCounter,
}

/// Why the worker could not do a step: its socket's own error, kept whole so that a caller can
/// still tell a socket that would not open from a request the kernel refused.
#[derive(Debug, Error)]
pub(super) enum WorkerError {
    #[error(transparent)]
    Conntrack(#[from] ConntrackError),
    #[error(transparent)]
    Neighbours(#[from] NeighbourError),
}

/// The worker thread: owns the sockets, takes jobs in batches.
pub(super) struct Worker {
    config: HygieneConfig,
    uplinks: Vec<String>,
    metrics: HygieneCounters,
    reports: Reports,
    sockets: Option<(Conntrack, Neighbours)>,
    announcer: Option<Announcer>,
    /// A new holder's entries go by the kernel's filtered flush, per family, where the probe
    /// proved it; by the dump until it has (see [`claim_flush`]).
    kernel_flush: Arc<claim_flush::Choice>,
    /// Where that choice is shown (`/v1/status`).
    shown: Arc<Mutex<Option<ClaimFlush>>>,
}

impl Worker {
    pub(super) fn new(
        config: HygieneConfig,
        uplinks: Vec<String>,
        metrics: HygieneCounters,
        reports: Reports,
        shown: Arc<Mutex<Option<ClaimFlush>>>,
    ) -> Self {
        Self {
            config,
            uplinks,
            metrics,
            reports,
            sockets: None,
            announcer: None,
            kernel_flush: Arc::default(),
            shown,
        }
    }

    pub(super) fn run(mut self, mut jobs: mpsc::Receiver<Job>) {
        // Background work: on a busy node the owner loop, which answers the API and follows
        // netlink, gets the CPU first. (Linux: the nice value of a thread is its own.)
        // SAFETY: plain syscalls on this thread's own id.
        if unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                libc::gettid() as libc::id_t,
                WORKER_NICE,
            )
        } != 0
        {
            warn!(
                "hygiene worker: lowering its priority: {}",
                std::io::Error::last_os_error()
            );
        }
        // On a thread of its own: the probe takes a netns of its own, which a node busy
        // creating and deleting namespaces can make wait for seconds; claims meanwhile flush
        // by the dump.
        claim_flush::start(&self.config, self.shown.clone(), self.kernel_flush.clone());
        while let Some(first) = jobs.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            for group in claims_first(batch) {
                let reports = self.clean(&group);
                for (job, report) in group.into_iter().zip(reports) {
                    if let Some(done) = job.done {
                        let _ = done.send(report.clone());
                    }
                    let reports = &self.reports;
                    if crate::queues::send_or_wait(&reports.tx, report, &reports.overflows).is_err()
                    {
                        return;
                    }
                }
            }
        }
    }

    /// Opens the sockets on first use, and again after a failure.
    fn sockets(&mut self) -> Result<&mut (Conntrack, Neighbours), WorkerError> {
        if self.sockets.is_none() {
            let conntrack = Conntrack::open()?;
            let neighbours = Neighbours::open()?;
            self.sockets = Some((conntrack, neighbours));
        }
        Ok(self.sockets.as_mut().expect("just opened"))
    }

    fn fail(&self, report: &mut Report, step: Step, error: impl std::fmt::Display) {
        self.metrics
            .failures
            .with_label_values(&[step.as_ref()])
            .inc();
        error!(
            "{}: reuse hygiene, {}: {error}",
            report.address,
            step.as_ref()
        );
        report.errors.push(format!("{}: {error}", step));
    }

    fn clean(&mut self, batch: &[Job]) -> Vec<Report> {
        let mut reports: Vec<Report> = batch.iter().map(Report::new).collect();
        let flush = self.config.flush;
        let node_addrs = match self.sockets() {
            Ok((_, neighbours)) => match neighbours.node_addresses() {
                Ok(addrs) => addrs,
                Err(e) => {
                    self.sockets = None;
                    for report in &mut reports {
                        self.fail(report, Step::Neighbours, &e);
                    }
                    return self.finish(reports);
                }
            },
            Err(e) => {
                for report in &mut reports {
                    self.fail(report, Step::Conntrack, &e);
                }
                return self.finish(reports);
            }
        };
        for report in &mut reports {
            if node_addrs.contains(&report.address) {
                report.skipped = Some("the node's own address: never flushed".into());
            }
        }
        if flush {
            self.flush_conntrack(&mut reports);
        }
        // The neighbour table read once for the whole batch (`None`: not flushing, or the read
        // failed and each report says so).
        let mut neighbours = if flush {
            self.neighbour_entries(&mut reports)
        } else {
            None
        };
        // The links the batch's jobs name, each asked of the kernel once (not a dump of every
        // link of the node per batch: a node of 1000 pods has 1000 veths).
        let mut links = BatchLinks::default();
        for (job, report) in batch.iter().zip(reports.iter_mut()) {
            if report.skipped.is_some() {
                continue;
            }
            let mac = match job.trigger {
                Trigger::NewHolder => self.holder_mac(job, &mut links),
                Trigger::HolderGone => None,
            };
            if let Some(found) = neighbours.as_mut() {
                let entries = found.remove(&report.address).unwrap_or_default();
                self.flush_neighbours(report, &entries, mac);
            }
            if job.trigger == Trigger::NewHolder && self.config.announce {
                self.announce(job, report, mac, &mut links);
            }
        }
        self.finish(reports)
    }

    fn finish(&self, mut reports: Vec<Report>) -> Vec<Report> {
        let now = netdev::monotonic_ns();
        for report in &mut reports {
            report.finished_ns = now;
            // Per address at DEBUG (the feed has each pass); a pass that failed at WARN.
            let level = if report.errors.is_empty() {
                log::Level::Debug
            } else {
                log::Level::Warn
            };
            log::log!(
                target: "ipq::hygiene",
                level,
                "{}: {} hygiene: {} conntrack entries, {} neighbour entries flushed, {} \
                 announcements{}{}{}",
                report.address,
                report.trigger.as_ref(),
                report.conntrack_entries,
                report.neighbours,
                report.announcements,
                report
                    .announce_skipped
                    .as_deref()
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default(),
                report.skipped.as_deref().map(|s| format!(" ({s})")).unwrap_or_default(),
                if report.errors.is_empty() {
                    String::new()
                } else {
                    format!("; failed: {}", report.errors.join("; "))
                }
            );
        }
        reports
    }
}

/// Splits a batch so that the jobs a claim waits for are done (and answered) first, before
/// the holder-gone flushes that nobody waits for; unless an address has jobs on both sides, in
/// which case the batch stays whole and in order (an address is never cleaned for a holder
/// gone after it was cleaned for its new one).
pub(super) fn claims_first(batch: Vec<Job>) -> Vec<Vec<Job>> {
    let claimed: BTreeSet<IpAddr> = batch
        .iter()
        .filter(|j| j.done.is_some())
        .map(|j| j.addr)
        .collect();
    if batch
        .iter()
        .any(|j| j.done.is_none() && claimed.contains(&j.addr))
    {
        return vec![batch];
    }
    let (claims, rest): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|j| j.done.is_some());
    [claims, rest]
        .into_iter()
        .filter(|g| !g.is_empty())
        .collect()
}
