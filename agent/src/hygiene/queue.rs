//! The bounded queues between the owner loop and the hygiene worker, and what each does when
//! full (see `crate::queues`).
//!
//! Jobs: the owner loop must never wait for the worker, so a job that finds the queue full is
//! dropped and counted (`ipq_queue_overflows_total{queue="hygiene_jobs"}`, alerted on by
//! `IpqHygieneJobsDropped`): the address keeps its old holder's conntrack and neighbour state
//! until its next change of holder. Its report says so, for `ipq get` and for a claim waiting
//! for it. The queue holds [`JOBS_PER_ADDRESS`] jobs per address the registry can hold (and one
//! batch of the worker's at least): every address of a full registry losing its holder and
//! getting a new one before the worker takes any, so a drop means a worker stuck, not a busy
//! node.
//!
//! Reports: the worker waits for room (`queue="hygiene_reports"`); a report may answer a
//! claim's `ipq get` and feed, and the worker pausing holds up only later jobs.

use log::{debug, error, warn};
use prometheus::IntCounter;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::{Job, Report};
use crate::netdev;

/// Jobs queued per address the registry can hold (a holder gone and a new one).
pub const JOBS_PER_ADDRESS: usize = 2;

/// Reports waiting for the owner loop: one batch of the worker's (it reports a batch at once).
pub const REPORT_QUEUE: usize = super::worker::MAX_BATCH;

/// The job queue's bound for a registry of `capacity` addresses: [`JOBS_PER_ADDRESS`] each,
/// and never less than one batch of the worker's (a small registry's addresses can change
/// holder several times while a pass runs). Nothing is allocated until jobs queue.
pub(super) fn job_queue(capacity: usize) -> usize {
    (JOBS_PER_ADDRESS * capacity).max(super::worker::MAX_BATCH)
}

/// Why a job was not queued.
#[derive(Debug)]
pub(super) enum NotQueued {
    /// The queue was full: the job is dropped, and here is its report saying so.
    Dropped(Box<Report>, Job),
    /// The worker is gone (it panicked, or the agent is stopping).
    WorkerGone,
}

/// The owner loop's end of the job queue.
#[derive(Debug)]
pub(super) struct JobSender {
    tx: mpsc::Sender<Job>,
    capacity: usize,
    dropped: IntCounter,
    /// Jobs dropped since the queue last took one: one ERROR line per burst, not per address.
    dropping: u64,
}

impl JobSender {
    pub(super) fn new(capacity: usize, dropped: IntCounter) -> (Self, mpsc::Receiver<Job>) {
        let (tx, rx) = mpsc::channel(capacity);
        let sender = Self {
            tx,
            capacity,
            dropped,
            dropping: 0,
        };
        (sender, rx)
    }

    /// Queues `job`, or drops it (counted, with a report that says so) when the queue is full.
    pub(super) fn send(&mut self, job: Job) -> Result<(), NotQueued> {
        match self.tx.try_send(job) {
            Ok(()) => {
                if self.dropping > 0 {
                    warn!(
                        "reuse hygiene's queue has room again; {} jobs were dropped while it was \
                         full, their addresses not cleaned",
                        self.dropping
                    );
                    self.dropping = 0;
                }
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(NotQueued::WorkerGone),
            Err(TrySendError::Full(job)) => {
                self.dropped.inc();
                if self.dropping == 0 {
                    error!(
                        "reuse hygiene's queue is full ({} jobs): the worker is not keeping up, \
                         and the addresses whose holder goes or changes meanwhile are not \
                         cleaned (counted in ipq_queue_overflows_total{{queue=\"hygiene_jobs\"}})",
                        self.capacity
                    );
                }
                self.dropping += 1;
                debug!("{}: hygiene job dropped: the queue is full", job.addr);
                let mut report = Report::new(&job);
                report.finished_ns = netdev::monotonic_ns();
                report.errors.push(format!(
                    "not done: reuse hygiene's queue was full ({} jobs waiting)",
                    self.capacity
                ));
                Err(NotQueued::Dropped(Box::new(report), job))
            }
        }
    }
}
