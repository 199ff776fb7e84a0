//! The hygiene worker: a thread of its own, with its own netlink and packet sockets, that takes
//! jobs in batches (one conntrack dump for a whole batch) and reports what each did. Claims
//! waiting for their flush go first, and their conntrack entries go by the kernel's filtered
//! flush where the start-up probe proved it (see `kernel_flush`, `flush_probe`).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::mpsc as std_mpsc,
    sync::{Arc, Mutex},
    time::Instant,
};

use log::{error, info, warn};
use tokio::sync::mpsc;

use super::counters::HygieneCounters;
use super::{
    announce::{self, format_mac, Announcer},
    conntrack::Conntrack,
    flush_probe::{self, Verdict},
    neighbour::{Link, NeighbourEntry, Neighbours},
    ClaimFlush, FlushMethod, Job, Report, Step, Trigger,
};
use crate::{config::HygieneConfig, netdev};

/// The worker's nice value: below the owner loop's.
const WORKER_NICE: libc::c_int = 10;

/// Jobs taken together in one pass (one conntrack dump for all of them).
const MAX_BATCH: usize = 1024;

/// The worker thread: owns the sockets, takes jobs in batches.
pub(super) struct Worker {
    config: HygieneConfig,
    uplinks: Vec<String>,
    metrics: HygieneCounters,
    reports: mpsc::UnboundedSender<Report>,
    sockets: Option<(Conntrack, Neighbours)>,
    announcer: Option<Announcer>,
    /// A new holder's entries go by the kernel's filtered flush, per family (where the probe
    /// proved it).
    kernel_flush_v4: bool,
    kernel_flush_v6: bool,
    /// Where that choice is shown (`/v1/status`).
    shown: Arc<Mutex<Option<ClaimFlush>>>,
}

impl Worker {
    pub(super) fn new(
        config: HygieneConfig,
        uplinks: Vec<String>,
        metrics: HygieneCounters,
        reports: mpsc::UnboundedSender<Report>,
        shown: Arc<Mutex<Option<ClaimFlush>>>,
    ) -> Self {
        Self {
            config,
            uplinks,
            metrics,
            reports,
            sockets: None,
            announcer: None,
            kernel_flush_v4: false,
            kernel_flush_v6: false,
            shown,
        }
    }

    /// Decides how a new holder's conntrack entries are flushed, per family: by the kernel's
    /// filtered flush only where the probe saw the kernel honour the filter, else by the dump.
    fn choose_claim_flush(&mut self) {
        if !self.config.flush {
            return;
        }
        if !self.config.filtered_flush {
            info!(
                "conntrack flush on claims: a dump of the whole table (hygiene.filtered_flush = \
                 false)"
            );
            let off = "dump (hygiene.filtered_flush = false)".to_owned();
            self.show(ClaimFlush {
                ipv4: off.clone(),
                ipv6: off,
            });
            return;
        }
        let started = Instant::now();
        let verdicts = flush_probe::run();
        let took = started.elapsed();
        let shown = |v: &Verdict| match v {
            Verdict::Honoured => "kernel".to_owned(),
            other => format!("dump ({})", other.describe()),
        };
        self.show(ClaimFlush {
            ipv4: shown(&verdicts.v4),
            ipv6: shown(&verdicts.v6),
        });
        for (family, verdict, chosen) in [
            ("IPv4", &verdicts.v4, &mut self.kernel_flush_v4),
            ("IPv6", &verdicts.v6, &mut self.kernel_flush_v6),
        ] {
            *chosen = *verdict == Verdict::Honoured;
            let why = verdict.describe();
            match verdict {
                Verdict::Honoured => info!(
                    "conntrack flush on claims, {family}: the kernel's filtered flush; probe \
                     ({took:.0?}): {why}"
                ),
                Verdict::Refused(_) => info!(
                    "conntrack flush on claims, {family}: a dump of the whole table; probe \
                     ({took:.0?}): {why} (supported from Linux 6.12)"
                ),
                Verdict::Unavailable(_) | Verdict::Ignored(_) => warn!(
                    "conntrack flush on claims, {family}: a dump of the whole table; probe \
                     ({took:.0?}): {why}"
                ),
            }
        }
    }

    fn show(&self, view: ClaimFlush) {
        *self
            .shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(view);
    }

    pub(super) fn run(mut self, jobs: std_mpsc::Receiver<Job>) {
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
        self.choose_claim_flush();
        while let Ok(first) = jobs.recv() {
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
                    if self.reports.send(report).is_err() {
                        return;
                    }
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
            .failures
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
        // The neighbour table read once for the whole batch (`None`: not flushing, or the read
        // failed and each report says so).
        let mut neighbours = if flush {
            self.neighbour_entries(&mut reports)
        } else {
            None
        };
        for (job, report) in batch.iter().zip(reports.iter_mut()) {
            if report.skipped.is_some() {
                continue;
            }
            let mac = match job.trigger {
                Trigger::NewHolder => self.holder_mac(job, &links),
                Trigger::HolderGone => None,
            };
            if let Some(found) = neighbours.as_mut() {
                let entries = found.remove(&report.address).unwrap_or_default();
                self.flush_neighbours(report, &entries, mac);
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
                report.trigger.as_str(),
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

    fn flush_conntrack(&mut self, reports: &mut [Report]) {
        // The reports whose addresses the dump flushes (by index: an address can have two
        // jobs in a batch, one of them flushed by the kernel).
        let mut dumped = vec![false; reports.len()];
        for (report, dump) in reports.iter_mut().zip(dumped.iter_mut()) {
            if report.skipped.is_some() {
                continue;
            }
            let honoured = match report.address {
                IpAddr::V4(_) => self.kernel_flush_v4,
                IpAddr::V6(_) => self.kernel_flush_v6,
            };
            if !(honoured && report.trigger == Trigger::NewHolder) {
                *dump = true;
                continue;
            }
            let result = match self.sockets() {
                Ok((conntrack, _)) => conntrack
                    .flush_in_kernel(report.address)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            match result {
                Ok(reported) => {
                    self.metrics.conntrack_entries_flushed.inc_by(reported);
                    report.conntrack_entries = reported;
                    report.conntrack_flush = FlushMethod::Kernel;
                }
                Err(e) => {
                    // The kernel passed the probe, so this is a fault of the moment (or of the
                    // socket): the dump still flushes the address before its claim is answered.
                    warn!(
                        "{}: the kernel's filtered conntrack flush failed ({e}); dumping instead",
                        report.address
                    );
                    self.sockets = None;
                    *dump = true;
                }
            }
        }
        let targets: BTreeSet<IpAddr> = reports
            .iter()
            .zip(&dumped)
            .filter(|(_, dump)| **dump)
            .map(|(r, _)| r.address)
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
                for (report, _) in reports.iter_mut().zip(&dumped).filter(|(_, d)| **d) {
                    report.conntrack_entries = flushed.get(&report.address).copied().unwrap_or(0);
                    report.conntrack_flush = FlushMethod::Dump;
                }
            }
            Err(e) => {
                self.sockets = None;
                for (report, _) in reports.iter_mut().zip(&dumped).filter(|(_, d)| **d) {
                    self.fail(report, Step::Conntrack, e.clone());
                }
            }
        }
    }

    /// The node's neighbour entries of every address of the batch still to clean, in one
    /// read of the table; when the read fails, each of those reports says so.
    fn neighbour_entries(
        &mut self,
        reports: &mut [Report],
    ) -> Option<std::collections::HashMap<IpAddr, Vec<NeighbourEntry>>> {
        let addrs: BTreeSet<IpAddr> = reports
            .iter()
            .filter(|r| r.skipped.is_none())
            .map(|r| r.address)
            .collect();
        if addrs.is_empty() {
            return Some(Default::default());
        }
        let result = match self.sockets() {
            Ok((_, neighbours)) => neighbours.entries_of(&addrs).map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(found) => Some(found),
            Err(e) => {
                self.sockets = None;
                for report in reports.iter_mut().filter(|r| r.skipped.is_none()) {
                    self.fail(report, Step::Neighbours, e.clone());
                }
                None
            }
        }
    }

    fn flush_neighbours(
        &mut self,
        report: &mut Report,
        entries: &[NeighbourEntry],
        mac: Option<[u8; 6]>,
    ) {
        let result = match self.sockets() {
            Ok((_, neighbours)) => neighbours
                .flush(report.address, entries, mac)
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
            let why = format!(
                "rate-limited (announce_per_second = {})",
                self.config.announce_per_second
            );
            warn!("{}: announcement not sent: {why}", report.address);
            report.announce_skipped = Some(why);
            self.metrics.announcements_rate_limited.inc();
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
