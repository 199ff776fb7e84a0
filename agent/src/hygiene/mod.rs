//! Reuse hygiene (DESIGN §4): when a holder is gone and when an address gets a new holder, the
//! node forgets the old holder. Its conntrack entries for the address are deleted (a UDP flow
//! DNATed to the old pod must not follow its entry to whoever holds the address next), its
//! neighbour entries are deleted (so that the node resolves the address again), and the new
//! holder is announced on its L2 segment (so that peers correct their caches now).
//!
//! The work runs on a thread of its own with its own netlink and packet sockets, off the
//! registry's owner loop: the loop hands it [`Job`]s and keeps serving. A claim waits for its
//! job's [`Report`] before it is answered (Calico's order: the address is clean before the
//! claimant is told it has it), and every report comes back to the loop for the event feed and
//! `ipq get`.

mod announce;
mod conntrack;
mod counters;
mod flush_probe;
mod kept;
mod kernel_flush;
mod link_query;
mod neighbour;
mod queue;
mod socket;
mod worker;

pub use counters::HygieneCounters;
pub use flush_probe::{child_main as conntrack_probe_main, PROBE_ARG as CONNTRACK_PROBE_ARG};

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use log::{debug, error};
use prometheus::IntCounter;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

pub use self::queue::{JOBS_PER_ADDRESS, REPORT_QUEUE};
use self::{
    kept::{AddressHygiene, KeptReport},
    queue::{JobSender, NotQueued},
    worker::Worker,
};
use crate::config::HygieneConfig;

#[derive(Debug, Error)]
pub enum HygieneError {
    #[error("starting the hygiene worker thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Why an address is cleaned.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Its holder is gone: the quarantine begins.
    HolderGone,
    /// It has a new holder.
    NewHolder,
}

/// The one place a trigger becomes the API's name for it (the journal keeps this type).
impl From<Trigger> for ipq_api::HygieneTrigger {
    fn from(trigger: Trigger) -> Self {
        match trigger {
            Trigger::HolderGone => Self::HolderGone,
            Trigger::NewHolder => Self::NewHolder,
        }
    }
}

/// One address to clean.
#[derive(Debug)]
pub struct Job {
    pub addr: IpAddr,
    pub trigger: Trigger,
    /// The new holder's host-side interface (for a new holder).
    pub holder_ifindex: Option<u32>,
    /// The new holder's MAC, when the claim said it (CNI prevResult's sandbox interface).
    pub holder_mac: Option<[u8; 6]>,
    done: Option<oneshot::Sender<Report>>,
}

/// How an address's conntrack entries were flushed, which says what their count means.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum FlushMethod {
    /// A dump of the whole table and a deletion per matching entry: the count is exact.
    #[default]
    Dump,
    /// The kernel's filtered flush (a new holder's claim, where the start-up probe proved it):
    /// the count is what the kernel reported, a lower bound.
    Kernel,
}

/// The one place a flush method becomes the API's name for it (the journal keeps this type).
impl From<FlushMethod> for ipq_api::ConntrackFlush {
    fn from(method: FlushMethod) -> Self {
        match method {
            FlushMethod::Dump => Self::Dump,
            FlushMethod::Kernel => Self::Kernel,
        }
    }
}

/// How a claim's conntrack entries are flushed, per family: `kernel` (the kernel's filtered
/// flush) or `dump (<why>)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFlush {
    pub ipv4: String,
    pub ipv6: String,
}

/// The hygiene steps, as the `step` label of `ipq_hygiene_failures_total`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[derive(strum::VariantArray)]
pub enum Step {
    Conntrack,
    Neighbours,
    Announce,
}

/// The counters of hygiene's two queues (`ipq_queue_overflows_total`).
#[derive(Clone, Debug)]
pub struct QueueCounters {
    /// Jobs dropped because their queue was full (`queue="hygiene_jobs"`).
    pub jobs: IntCounter,
    /// Times the worker waited for room for a report (`queue="hygiene_reports"`).
    pub reports: IntCounter,
}

/// What cleaning one address did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub address: IpAddr,
    pub trigger: Trigger,
    /// Monotonic ns when the work finished.
    #[serde(skip)]
    pub finished_ns: u64,
    pub conntrack_entries: u64,
    /// How they were flushed (what the count means).
    #[serde(default)]
    pub conntrack_flush: FlushMethod,
    pub neighbours: u64,
    pub announcements: u32,
    /// Why no announcement was sent on purpose (the rate limit), though one was due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce_skipped: Option<String>,
    /// Why nothing was flushed, when nothing was on purpose (the node's own address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// PERMANENT neighbour entries for the address that point elsewhere (a CNI's; kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permanent_neighbours: Vec<String>,
    /// What failed, one line per step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl Report {
    fn new(job: &Job) -> Self {
        Self {
            address: job.addr,
            trigger: job.trigger,
            finished_ns: 0,
            conntrack_entries: 0,
            conntrack_flush: FlushMethod::Dump,
            neighbours: 0,
            announcements: 0,
            announce_skipped: None,
            skipped: None,
            permanent_neighbours: Vec::new(),
            errors: Vec::new(),
        }
    }
}

/// The owner loop's side: hands jobs to the worker and keeps the last report per address.
pub struct Hygiene {
    /// The bounded queue to the worker (see [`queue`]).
    jobs: Option<JobSender>,
    /// Per address in the registry: its live holder at its last transition (to tell a new
    /// holder from the same one coming back, Draining → Active) and its last report (for `ipq
    /// get`). One map of compact entries: at 64k addresses each byte here is ~120 KB resident.
    addresses: BTreeMap<IpAddr, AddressHygiene>,
    /// While a claim is carried out: its interface and MAC, and the jobs it waits for.
    claim: Option<ClaimInProgress>,
    /// How the worker flushes a claim's conntrack entries, once its probe decided.
    claim_flush: Arc<Mutex<Option<ClaimFlush>>>,
}

struct ClaimInProgress {
    ifindex: u32,
    mac: Option<[u8; 6]>,
    waits: Vec<(IpAddr, oneshot::Receiver<Report>)>,
}

impl Default for Hygiene {
    fn default() -> Self {
        Self::disabled()
    }
}

impl Hygiene {
    /// Does nothing (until [`start`](Self::start)ed): recovery at start replays the registry,
    /// which is no change of holder on the node.
    pub fn disabled() -> Self {
        Self {
            jobs: None,
            addresses: BTreeMap::new(),
            claim: None,
            claim_flush: Arc::default(),
        }
    }

    /// How a claim's conntrack entries are flushed, per family, once the worker's start-up
    /// probe decided (for `/v1/status`).
    pub fn claim_flush(&self) -> Option<ClaimFlush> {
        self.claim_flush
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Starts the worker thread; its reports arrive on the returned channel. The job queue
    /// holds [`JOBS_PER_ADDRESS`] per address of a registry of `capacity` (one batch of the
    /// worker's at least); `queues` counts
    /// the jobs it drops and the times the worker waits for room for its reports.
    pub fn start(
        &mut self,
        config: HygieneConfig,
        uplinks: Vec<String>,
        metrics: HygieneCounters,
        capacity: usize,
        queues: QueueCounters,
    ) -> Result<mpsc::Receiver<Report>, HygieneError> {
        let (job_tx, job_rx) = JobSender::new(queue::job_queue(capacity), queues.jobs);
        let (report_tx, report_rx) = mpsc::channel(REPORT_QUEUE);
        let reports = worker::Reports {
            tx: report_tx,
            overflows: queues.reports,
        };
        let worker = Worker::new(config, uplinks, metrics, reports, self.claim_flush.clone());
        std::thread::Builder::new()
            .name("ipq-hygiene".into())
            .spawn(move || worker.run(job_rx))
            .map_err(HygieneError::Spawn)?;
        self.jobs = Some(job_tx);
        Ok(report_rx)
    }

    /// A claim by `ifindex` (with its MAC, if known) is being carried out: jobs for that holder
    /// are waited for until [`end_claim`](Self::end_claim).
    pub fn begin_claim(&mut self, ifindex: u32, mac: Option<[u8; 6]>) {
        self.claim = Some(ClaimInProgress {
            ifindex,
            mac,
            waits: Vec::new(),
        });
    }

    /// The jobs the claim started, to wait for before answering it.
    pub fn end_claim(&mut self) -> Vec<(IpAddr, oneshot::Receiver<Report>)> {
        self.claim.take().map(|c| c.waits).unwrap_or_default()
    }

    /// One registry transition of `addr` to `live_holder` (the live holder after it, if any);
    /// `quarantined` when its holder is gone. `act` is false where hygiene must change nothing
    /// (mode `observe`, an early reuse that is only observed).
    pub fn on_transition(
        &mut self,
        addr: IpAddr,
        quarantined: bool,
        live_holder: Option<u32>,
        act: bool,
    ) {
        let previous = match live_holder {
            Some(ifindex) => self
                .addresses
                .entry(addr)
                .or_default()
                .set_holder(Some(ifindex)),
            None => match self.addresses.get_mut(&addr) {
                Some(entry) => {
                    let previous = entry.set_holder(None);
                    if entry.is_empty() {
                        self.addresses.remove(&addr);
                    }
                    previous
                }
                None => None,
            },
        };
        let trigger = match live_holder {
            Some(ifindex) if previous != Some(ifindex) => Trigger::NewHolder,
            None if quarantined => Trigger::HolderGone,
            _ => return,
        };
        if !act {
            debug!(
                "{addr}: {} under observe: nothing flushed",
                trigger.as_ref()
            );
            return;
        }
        let Some(jobs) = self.jobs.as_mut() else {
            return;
        };
        let claim = self
            .claim
            .as_mut()
            .filter(|c| Some(c.ifindex) == live_holder);
        let (done, wait) = match claim.is_some() {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let job = Job {
            addr,
            trigger,
            holder_ifindex: live_holder,
            holder_mac: claim.as_ref().and_then(|c| c.mac),
            done,
        };
        let dropped = match jobs.send(job) {
            Ok(()) => None,
            Err(NotQueued::WorkerGone) => {
                error!("{addr}: the hygiene worker is gone; nothing flushed");
                return;
            }
            Err(NotQueued::Dropped(report, job)) => {
                // A claim waiting for it is answered with the report that says so.
                if let Some(done) = job.done {
                    let _ = done.send((*report).clone());
                }
                Some(*report)
            }
        };
        if let (Some(claim), Some(wait)) = (claim, wait) {
            claim.waits.push((addr, wait));
        }
        // `ipq get` shows it until the address is cleaned again.
        if let Some(report) = dropped {
            self.record(report, true);
        }
    }

    /// A report came back from the worker; kept while the address is in the registry.
    pub fn record(&mut self, report: Report, in_registry: bool) {
        let addr = report.address;
        if in_registry {
            self.addresses.entry(addr).or_default().last = Some(KeptReport::keep(report));
        } else if let Some(entry) = self.addresses.get_mut(&addr) {
            entry.last = None;
            if entry.is_empty() {
                self.addresses.remove(&addr);
            }
        }
    }

    /// The address left the registry.
    pub fn forget(&mut self, addr: IpAddr) {
        self.addresses.remove(&addr);
    }

    /// The last report for `addr`.
    pub fn last(&self, addr: IpAddr) -> Option<Report> {
        self.addresses
            .get(&addr)
            .and_then(|entry| entry.last.as_ref())
            .map(|kept| kept.report(addr))
    }
}

/// How long a claim waits for its flush before it is answered anyway, saying so.
pub const CLAIM_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;
