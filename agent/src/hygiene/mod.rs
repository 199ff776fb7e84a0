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
mod neighbour;
mod socket;

pub use announce::{format_mac, parse_mac};

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{mpsc as std_mpsc, Arc},
    time::Duration,
};

use log::{debug, error, info, warn};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use self::{
    announce::Announcer,
    conntrack::Conntrack,
    neighbour::{Link, Neighbours},
};
use crate::{config::HygieneConfig, metrics::Metrics, netdev};

/// The worker's nice value: below the owner loop's.
const WORKER_NICE: libc::c_int = 10;

/// Jobs taken together in one pass (one conntrack dump for all of them).
const MAX_BATCH: usize = 1024;

#[derive(Debug, Error)]
pub enum HygieneError {
    #[error("starting the hygiene worker thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Why an address is cleaned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Its holder is gone: the quarantine begins.
    HolderGone,
    /// It has a new holder.
    NewHolder,
}

impl Trigger {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::HolderGone => "holder_gone",
            Self::NewHolder => "new_holder",
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

/// The hygiene steps, as the `step` label of `ipq_hygiene_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Conntrack,
    Neighbours,
    Announce,
}

impl Step {
    pub const ALL: [Step; 3] = [Self::Conntrack, Self::Neighbours, Self::Announce];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conntrack => "conntrack",
            Self::Neighbours => "neighbours",
            Self::Announce => "announce",
        }
    }
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
    pub neighbours: u64,
    pub announcements: u32,
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
            neighbours: 0,
            announcements: 0,
            skipped: None,
            permanent_neighbours: Vec::new(),
            errors: Vec::new(),
        }
    }
}

/// The owner loop's side: hands jobs to the worker and keeps the last report per address.
pub struct Hygiene {
    jobs: Option<std_mpsc::Sender<Job>>,
    /// The live holder each address had at its last transition, to tell a new holder from the
    /// same one coming back (Draining → Active).
    holders: BTreeMap<IpAddr, u32>,
    /// The last report per address in the registry, for `ipq get`.
    last: BTreeMap<IpAddr, Report>,
    /// While a claim is carried out: its interface and MAC, and the jobs it waits for.
    claim: Option<ClaimInProgress>,
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
            holders: BTreeMap::new(),
            last: BTreeMap::new(),
            claim: None,
        }
    }

    /// Starts the worker thread; its reports arrive on the returned channel.
    pub fn start(
        &mut self,
        config: HygieneConfig,
        uplinks: Vec<String>,
        metrics: Arc<Metrics>,
    ) -> Result<mpsc::UnboundedReceiver<Report>, HygieneError> {
        let (job_tx, job_rx) = std_mpsc::channel();
        let (report_tx, report_rx) = mpsc::unbounded_channel();
        let worker = Worker {
            config,
            uplinks,
            metrics,
            reports: report_tx,
            sockets: None,
            announcer: None,
        };
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
            Some(ifindex) => self.holders.insert(addr, ifindex),
            None => self.holders.remove(&addr),
        };
        let trigger = match live_holder {
            Some(ifindex) if previous != Some(ifindex) => Trigger::NewHolder,
            None if quarantined => Trigger::HolderGone,
            _ => return,
        };
        if !act {
            debug!(
                "{addr}: {} under observe: nothing flushed",
                trigger.as_str()
            );
            return;
        }
        let Some(jobs) = &self.jobs else {
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
        if jobs.send(job).is_err() {
            error!("{addr}: the hygiene worker is gone; nothing flushed");
            return;
        }
        if let (Some(claim), Some(wait)) = (claim, wait) {
            claim.waits.push((addr, wait));
        }
    }

    /// A report came back from the worker; kept while the address is in the registry.
    pub fn record(&mut self, report: Report, in_registry: bool) {
        if in_registry {
            self.last.insert(report.address, report);
        } else {
            self.last.remove(&report.address);
        }
    }

    /// The address left the registry.
    pub fn forget(&mut self, addr: IpAddr) {
        self.last.remove(&addr);
        self.holders.remove(&addr);
    }

    /// The last report for `addr`.
    pub fn last(&self, addr: IpAddr) -> Option<&Report> {
        self.last.get(&addr)
    }
}

/// The worker thread: owns the sockets, takes jobs in batches.
struct Worker {
    config: HygieneConfig,
    uplinks: Vec<String>,
    metrics: Arc<Metrics>,
    reports: mpsc::UnboundedSender<Report>,
    sockets: Option<(Conntrack, Neighbours)>,
    announcer: Option<Announcer>,
}

impl Worker {
    fn run(mut self, jobs: std_mpsc::Receiver<Job>) {
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
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let reports = self.clean(&batch);
            for (job, report) in batch.into_iter().zip(reports) {
                if let Some(done) = job.done {
                    let _ = done.send(report.clone());
                }
                if self.reports.send(report).is_err() {
                    return;
                }
            }
        }
    }

    /// Opens the sockets on first use, and again after a failure.
    fn sockets(&mut self) -> Result<&mut (Conntrack, Neighbours), String> {
        if self.sockets.is_none() {
            let conntrack = Conntrack::open().map_err(|e| e.to_string())?;
            let neighbours = Neighbours::open().map_err(|e| e.to_string())?;
            self.sockets = Some((conntrack, neighbours));
        }
        Ok(self.sockets.as_mut().expect("just opened"))
    }

    fn fail(&self, report: &mut Report, step: Step, error: String) {
        self.metrics
            .hygiene_failures
            .with_label_values(&[step.as_str()])
            .inc();
        error!(
            "{}: reuse hygiene, {}: {error}",
            report.address,
            step.as_str()
        );
        report.errors.push(format!("{}: {error}", step.as_str()));
    }

    fn clean(&mut self, batch: &[Job]) -> Vec<Report> {
        let mut reports: Vec<Report> = batch.iter().map(Report::new).collect();
        let flush = self.config.flush;
        let (node_addrs, links) = match self.sockets() {
            Ok((_, neighbours)) => match (neighbours.node_addresses(), neighbours.links()) {
                (Ok(addrs), Ok(links)) => (addrs, links),
                (Err(e), _) | (_, Err(e)) => {
                    let e = e.to_string();
                    self.sockets = None;
                    for report in &mut reports {
                        self.fail(report, Step::Neighbours, e.clone());
                    }
                    return self.finish(reports);
                }
            },
            Err(e) => {
                for report in &mut reports {
                    self.fail(report, Step::Conntrack, e.clone());
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
        for (job, report) in batch.iter().zip(reports.iter_mut()) {
            if report.skipped.is_some() {
                continue;
            }
            let mac = match job.trigger {
                Trigger::NewHolder => self.holder_mac(job, &links),
                Trigger::HolderGone => None,
            };
            if flush {
                self.flush_neighbours(report, mac);
            }
            if job.trigger == Trigger::NewHolder && self.config.announce {
                self.announce(job, report, mac, &links);
            }
        }
        self.finish(reports)
    }

    fn finish(&self, mut reports: Vec<Report>) -> Vec<Report> {
        let now = netdev::monotonic_ns();
        for report in &mut reports {
            report.finished_ns = now;
            info!(
                target: "ipq::hygiene",
                "{}: {} hygiene: {} conntrack entries, {} neighbour entries flushed, {} \
                 announcements{}{}",
                report.address,
                report.trigger.as_str(),
                report.conntrack_entries,
                report.neighbours,
                report.announcements,
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

    fn flush_conntrack(&mut self, reports: &mut [Report]) {
        let targets: BTreeSet<IpAddr> = reports
            .iter()
            .filter(|r| r.skipped.is_none())
            .map(|r| r.address)
            .collect();
        if targets.is_empty() {
            return;
        }
        let result = match self.sockets() {
            Ok((conntrack, _)) => conntrack.flush(&targets).map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(flushed) => {
                let total: u64 = flushed.values().sum();
                self.metrics.conntrack_entries_flushed.inc_by(total);
                for report in reports.iter_mut() {
                    report.conntrack_entries = flushed.get(&report.address).copied().unwrap_or(0);
                }
            }
            Err(e) => {
                self.sockets = None;
                for report in reports.iter_mut().filter(|r| r.skipped.is_none()) {
                    self.fail(report, Step::Conntrack, e.clone());
                }
            }
        }
    }

    fn flush_neighbours(&mut self, report: &mut Report, mac: Option<[u8; 6]>) {
        let result = match self.sockets() {
            Ok((_, neighbours)) => neighbours
                .flush(report.address, mac)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(flushed) => {
                self.metrics.neighbours_flushed.inc_by(flushed.deleted);
                report.neighbours = flushed.deleted;
                for entry in flushed.permanent {
                    let mac = entry.mac.map_or_else(|| "none".to_owned(), format_mac);
                    let line = format!("if{} lladdr {mac}", entry.ifindex);
                    warn!(
                        "{}: a PERMANENT neighbour entry ({line}) does not point at the new \
                         holder; left alone (a CNI's)",
                        report.address
                    );
                    report.permanent_neighbours.push(line);
                }
            }
            Err(e) => {
                self.sockets = None;
                self.fail(report, Step::Neighbours, e);
            }
        }
    }

    /// The new holder's MAC: from the claim, else the one MAC the bridge learned behind its
    /// port.
    fn holder_mac(&mut self, job: &Job, links: &[Link]) -> Option<[u8; 6]> {
        if job.holder_mac.is_some() {
            return job.holder_mac;
        }
        let port = job.holder_ifindex?;
        links.iter().find(|l| l.ifindex == port)?.master?;
        let learned = self.sockets().ok()?.1.learned_macs(port).ok()?;
        match learned[..] {
            [mac] => Some(mac),
            _ => None,
        }
    }

    /// Sends the announcement on every other port of the holder's bridge (never back to the
    /// holder: an IPv6 holder still doing DAD would take it for a duplicate), and on the
    /// uplinks when configured.
    fn announce(&mut self, job: &Job, report: &mut Report, mac: Option<[u8; 6]>, links: &[Link]) {
        let Some(port) = job.holder_ifindex else {
            return;
        };
        let master = links
            .iter()
            .find(|l| l.ifindex == port)
            .and_then(|l| l.master);
        let mut out: Vec<u32> = match master {
            Some(bridge) => links
                .iter()
                .filter(|l| l.master == Some(bridge) && l.ifindex != port)
                .map(|l| l.ifindex)
                .collect(),
            None => Vec::new(),
        };
        if self.config.announce_on_uplinks {
            out.extend(
                links
                    .iter()
                    .filter(|l| self.uplinks.contains(&l.name))
                    .map(|l| l.ifindex),
            );
        }
        if out.is_empty() {
            return;
        }
        let Some(mac) = mac else {
            self.fail(
                report,
                Step::Announce,
                "the new holder's MAC is unknown (the claim named none and the bridge learned \
                 none behind its port)"
                    .into(),
            );
            return;
        };
        if self.announcer.is_none() {
            match Announcer::open(self.config.announce_per_second) {
                Ok(a) => self.announcer = Some(a),
                Err(e) => {
                    self.fail(report, Step::Announce, format!("AF_PACKET socket: {e}"));
                    return;
                }
            }
        }
        let announcer = self.announcer.as_mut().expect("just opened");
        if !announcer.may_send() {
            warn!(
                "{}: announcement suppressed by the rate limit (announce_per_second = {})",
                report.address, self.config.announce_per_second
            );
            return;
        }
        let frame = announce::frame(report.address, mac);
        let mut failures = Vec::new();
        for ifindex in out {
            match announcer.send(ifindex, &frame) {
                Ok(()) => report.announcements += 1,
                Err(e) => failures.push(format!("if{ifindex}: {e}")),
            }
        }
        self.metrics
            .announcements
            .inc_by(u64::from(report.announcements));
        if !failures.is_empty() {
            self.fail(report, Step::Announce, failures.join(", "));
        }
    }
}

/// How long a claim waits for its flush before it is answered anyway, saying so.
pub const CLAIM_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;
