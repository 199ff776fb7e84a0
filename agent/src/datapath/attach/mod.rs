//! Attaching ipq's programs to the interfaces the configuration names, off the owner loop.
//!
//! The tracker says which interfaces it wants protected ([`Attacher::want`]) and which went
//! away ([`Attacher::forget`]); it never waits for the kernel. A small pool of worker threads
//! does the attaching: each worker owns its own handles on the loaded programs (aya's program
//! objects are not `Sync`), opened from their pins under `bpffs_dir/progs`, and attaches while
//! the registry, the API and the CNI are answered. Each outcome comes back as a [`JobReport`]
//! on a channel the agent's loop hands to [`Attacher::on_report`].
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

use strum::VariantArray as _;
mod bypass;
pub mod error;
mod lost;
mod model;
pub mod pins;
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
mod worker;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use log::{debug, warn};

pub use error::AttachError;
pub use model::{
    Hooked, Job, JobKind, JobReport, Lost, LostAttachment, Mechanism, Protection, Role, Target,
    TcMode,
};
pub use pins::Attached;

use self::{queue::JobQueue, retry::Backoff};
use super::DatapathError;
use crate::paths::{AttachPoint, PinLayout};

/// Attach workers. Enough for the RCU waits of a burst of new pods to overlap; each holds three
/// program fds and sleeps while idle.
const WORKERS: usize = 4;

/// Reports waiting for the owner loop. A worker whose report finds the queue full waits for
/// room (counted in `ipq_queue_overflows_total{queue="attach_reports"}`): a report may be the
/// only news of a lost attachment, so none is dropped, and a waiting worker holds up only its
/// own next job, never the loop. 256 is a burst of new pods' attaches several times over (each
/// worker reports one job at a time).
pub const REPORT_QUEUE: usize = 256;

/// How long an interface may stay `attaching` before `/readyz` counts it as unprotected (a
/// normal attach takes milliseconds; this only keeps pod churn from flapping readiness).
pub const ATTACHING_GRACE: Duration = Duration::from_secs(5);

/// The attach machinery the tracker drives.
/// What a waiting retry will do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RetryKind {
    /// Attach again (the interface is `failed`).
    Attach,
    /// Move the netlink filters to TCX again.
    Upgrade,
}

pub struct Attacher {
    layout: PinLayout,
    mode: TcMode,
    jobs: Arc<JobQueue>,
    targets: BTreeMap<u32, Target>,
    /// Every retry that is waiting, by when it is due: (due, ifindex, [`RetryKind`]). The loop
    /// asks for the next one after every event, so it must not walk every interface.
    retries: BTreeSet<(Instant, u32, RetryKind)>,
    next_generation: u64,
    /// Failed attach attempts, per attach point, since start (`ipq_datapath_attach_failures_total`).
    failures: BTreeMap<AttachPoint, u64>,
    /// Hooks found bypassed by a filter ahead of ipq's, per attach point, since start.
    bypasses: BTreeMap<AttachPoint, u64>,
    /// When another program was last put before ipq's TCX link, per hook (the fight's rate).
    displaced: BTreeMap<(u32, AttachPoint), Vec<Instant>>,
    /// Whether workers attach on this node's kernel (false in unit tests, whose made-up
    /// reports name no real interface: nothing is undone there).
    workers: bool,
    /// Attachments repairs found taken away, for the tracker to count and publish.
    lost: Vec<LostAttachment>,
    /// What the last verification of the datapath found.
    verified: Option<crate::datapath::verify::Summary>,
    /// The last verification that found something wrong.
    last_found: Option<crate::datapath::verify::Summary>,
    /// The hooks held by ipq's netlink filter, for the verification to look at off the loop.
    netlink_hooks: crate::datapath::verify::NetlinkHooks,
}

impl Attacher {
    /// Starts the workers; their reports arrive on the returned receiver, a worker waiting
    /// (counted in `overflows`) while it is full.
    pub fn start(
        layout: PinLayout,
        mode: TcMode,
        overflows: prometheus::IntCounter,
    ) -> Result<(Self, tokio::sync::mpsc::Receiver<JobReport>), DatapathError> {
        let queue = Arc::new(JobQueue::default());
        let (reports, receiver) = tokio::sync::mpsc::channel(REPORT_QUEUE);
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
        Ok((
            Self {
                layout,
                mode,
                jobs: queue,
                targets: BTreeMap::new(),
                retries: BTreeSet::new(),
                next_generation: 0,
                failures: BTreeMap::new(),
                bypasses: BTreeMap::new(),
                displaced: BTreeMap::new(),
                workers: true,
                lost: Vec::new(),
                verified: None,
                last_found: None,
                netlink_hooks: Default::default(),
            },
            receiver,
        ))
    }

    /// An attacher without workers: the test takes the jobs, and makes up their reports.
    #[cfg(test)]
    pub(crate) fn without_workers(mode: TcMode) -> (Self, Arc<JobQueue>) {
        let queue = Arc::new(JobQueue::default());
        let attacher = Self {
            layout: PinLayout::new("/nonexistent/ipq-test"),
            mode,
            jobs: queue.clone(),
            targets: BTreeMap::new(),
            retries: BTreeSet::new(),
            next_generation: 0,
            failures: BTreeMap::new(),
            bypasses: BTreeMap::new(),
            displaced: BTreeMap::new(),
            workers: false,
            lost: Vec::new(),
            verified: None,
            last_found: None,
            netlink_hooks: Default::default(),
        };
        (attacher, queue)
    }

    pub fn mode(&self) -> TcMode {
        self.mode
    }

    /// Wants `ifindex` protected in `role`, under `name`. Nothing new is queued for an
    /// interface already wanted the same way: its attach is under way, done, or waiting for its
    /// retry.
    pub fn want(&mut self, ifindex: u32, name: &str, role: Role) {
        if let Some(target) = self.targets.get(&ifindex) {
            if target.name == name && target.role == role {
                return;
            }
        }
        let before = self.retry_times(ifindex);
        self.next_generation += 1;
        let target = Target {
            name: name.to_owned(),
            role,
            protection: Protection::Attaching,
            attached: BTreeMap::new(),
            last_error: None,
            failures: 0,
            since: Instant::now(),
            generation: self.next_generation,
            backoff: Backoff::default(),
            retry_at: None,
            upgrade: upgrade::Upgrade::default(),
            lost: BTreeSet::new(),
            looked_at: None,
            bypassed: BTreeSet::new(),
        };
        self.queue(ifindex, &target, JobKind::Protect);
        self.targets.insert(ifindex, target);
        self.reindex(ifindex, before);
    }

    fn queue(&self, ifindex: u32, target: &Target, kind: JobKind) {
        self.jobs.push(Job {
            ifindex,
            name: target.name.clone(),
            role: target.role,
            kind,
            generation: target.generation,
        });
    }

    /// Forgets an interface that went away (or is no longer configured): drops its queued
    /// jobs and removes its link pins.
    pub fn forget(&mut self, ifindex: u32) {
        let before = self.retry_times(ifindex);
        if self.targets.remove(&ifindex).is_none() {
            return;
        }
        self.reindex(ifindex, before);
        self.jobs.cancel(ifindex);
        self.remove_pins(ifindex);
        self.share_netlink_hooks(ifindex);
    }

    fn remove_pins(&self, ifindex: u32) {
        for &point in AttachPoint::VARIANTS {
            if let Err(e) = pins::remove_pin_of(&self.layout, ifindex, point) {
                warn!("if{ifindex}: removing its {} pin: {e}", point);
            }
        }
    }

    /// Releases an interface whose new name no longer matches the configuration: forgets it
    /// and removes ipq's netlink filters from it too (the device lives on, unlike after
    /// [`forget`](Self::forget)'s usual case).
    pub fn release(&mut self, ifindex: u32) {
        if !self.targets.contains_key(&ifindex) {
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
        let before = self.retry_times(ifindex);
        let changed = self.apply_report(report);
        self.reindex(ifindex, before);
        self.share_netlink_hooks(ifindex);
        changed
    }

    /// Lets the queued TCX upgrades run (see [`queue`]): call once start-up is done.
    pub fn start_upgrades(&self) {
        self.jobs.start_upgrades();
    }

    /// Protected interfaces whose netlink filters still wait for their TCX links (always 0
    /// outside [`TcMode::NetlinkThenTcx`]).
    pub fn pending_upgrades(&self) -> usize {
        if self.mode != TcMode::NetlinkThenTcx {
            return 0;
        }
        self.targets.values().filter(|t| upgrade::wanted(t)).count()
    }

    /// Whether any interface's attach is still under way (not yet reported once).
    pub fn attaching(&self) -> bool {
        self.targets
            .values()
            .any(|t| t.protection == Protection::Attaching)
    }

    pub fn targets(&self) -> &BTreeMap<u32, Target> {
        &self.targets
    }

    pub fn target(&self, ifindex: u32) -> Option<&Target> {
        self.targets.get(&ifindex)
    }

    /// Every attach point in place, for the attached-interface gauge.
    pub fn attached_points(&self) -> impl Iterator<Item = AttachPoint> + '_ {
        self.targets
            .values()
            .flat_map(|t| t.attached.keys().copied())
    }

    /// Every wanted attach point not in place: (ifindex, target, point).
    pub fn unprotected_points(&self) -> impl Iterator<Item = (u32, &Target, AttachPoint)> + '_ {
        self.targets.iter().flat_map(|(ifindex, t)| {
            t.role
                .points()
                .iter()
                .filter(|p| {
                    !t.attached.contains_key(p) || t.lost.contains(p) || t.bypassed.contains(p)
                })
                .map(move |p| (*ifindex, t, *p))
        })
    }

    /// Failed attempts per attach point since start.
    pub fn failures(&self) -> &BTreeMap<AttachPoint, u64> {
        &self.failures
    }

    /// Why `/readyz` must say not ready, if it must: an interface failed, or attaching for
    /// longer than [`ATTACHING_GRACE`].
    pub fn readiness_blocker(&self, now: Instant) -> Option<String> {
        let blocking: Vec<String> = self
            .targets
            .iter()
            .filter(|(_, t)| match t.protection {
                Protection::Protected => false,
                // The agent never sets `Unknown` (it is how an older client reads a newer
                // agent's state); were it set, it would not be protected.
                Protection::Failed
                | Protection::Repairing
                | Protection::Bypassed
                | Protection::Unknown => true,
                Protection::Attaching => now.duration_since(t.since) > ATTACHING_GRACE,
            })
            .map(|(ifindex, t)| {
                format!(
                    "{} (if{ifindex}) {}{}",
                    t.name,
                    t.protection.as_ref(),
                    t.last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        (!blocking.is_empty()).then(|| {
            format!(
                "{} interface(s) unprotected: {}",
                blocking.len(),
                blocking.join("; ")
            )
        })
    }

    /// Detaches what earlier agents attached to interfaces no longer wanted (gone, or no longer
    /// configured): link pins, and ipq's netlink filters on the node's other interfaces. Call
    /// once every configured interface has been attached once.
    pub fn prune(&self) -> Result<Vec<(u32, AttachPoint)>, DatapathError> {
        let keep: BTreeSet<(u32, AttachPoint)> = self
            .targets
            .iter()
            .flat_map(|(i, t)| t.role.points().iter().map(move |p| (*i, *p)))
            .collect();
        let mut removed = pins::prune(&self.layout, &keep)?;
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
        super::maps::unpin_legacy_filter(&self.layout)?;
        Ok(removed)
    }
}

impl Drop for Attacher {
    /// The workers end with the attacher.
    fn drop(&mut self) {
        self.jobs.close();
    }
}
