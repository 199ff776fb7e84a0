//! Where the tracker meets the attach machinery ([`Protection`]): the attacher and what it
//! reports, the verification's findings about links, filters and pins, and what the metrics,
//! `/readyz` and the API say about interfaces that are not (yet) protected.

use std::{path::Path, sync::Arc, time::Instant};

use ipq_api::EventHook;

use log::{info, warn};

use super::{decide::Core, effects::Sinks, observer::Observer, Role};
use crate::{
    api::{
        model::{EventBody, StartedView},
        views::TimeBase,
    },
    datapath::{
        attach::{tc_watch::TcNotice, Attacher, JobReport, Lost, LostAttachment},
        bpf_watch::Pokes,
        verify::{Summary, Verification},
    },
    metrics::{self, Metrics},
    netdev,
    netlink::{NetEvent, NetState},
    paths::PinLayout,
    registry::Holder,
};

/// The attacher and what the agent knows of its interfaces' protection.
pub(super) struct Protection {
    /// Attaches programs off the owner loop; the tracker only says what it wants.
    pub(super) attacher: Attacher,
    /// Why the pins under `bpffs_dir` cannot be kept, as the last verification found.
    pins_problem: Option<String>,
    /// Whether the watcher of other processes' bpf() calls is attached, or why not.
    pub(super) bpf_watcher: Result<Arc<Pokes>, String>,
    /// What was in place when the agent became ready ([`Protection::mark_started`]).
    pub(super) started: Option<StartedView>,
    metrics: Arc<Metrics>,
    /// How often the O(interfaces) protection gauges were recomputed; for tests.
    #[cfg(test)]
    pub(super) observed: std::cell::Cell<u64>,
}

impl Protection {
    pub(super) fn new(
        attacher: Attacher,
        bpf_watcher: Result<Arc<Pokes>, String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            attacher,
            pins_problem: None,
            bpf_watcher,
            started: None,
            metrics,
            #[cfg(test)]
            observed: std::cell::Cell::new(0),
        }
    }

    /// Asks for `ifindex` to be protected in `role` (or forgotten: `None`, its name no longer
    /// matches the configuration); the attach itself runs off the owner loop. Returns whether
    /// that changed what the attacher wants (most link events, an operstate or carrier change,
    /// do not).
    pub(super) fn want(&mut self, ifindex: u32, name: &str, role: Option<Role>) -> bool {
        let wanted = |attacher: &Attacher| {
            attacher
                .ledger()
                .target(ifindex)
                .map(|target| (target.name.clone(), target.role))
        };
        let before = wanted(&self.attacher);
        match role {
            Some(role) => self.attacher.want(ifindex, name, role),
            None => self.attacher.release(ifindex),
        }
        wanted(&self.attacher) != before
    }

    /// One attach worker's report; the attachments it found lost are counted and published.
    pub(super) fn on_report(&mut self, report: JobReport, observer: &mut Observer) {
        if self.attacher.on_report(report) {
            self.observe();
        }
        for lost in self.attacher.findings_mut().take_lost() {
            publish_lost(&self.metrics, observer, lost);
        }
    }

    /// A TC notification: a repair of the interface it names is queued if it concerns ipq.
    /// A notice that proves a loss makes the interface unprotected at once (O(interfaces) then,
    /// which only another tool's deletion costs).
    pub(super) fn on_tc_notice(&mut self, notice: TcNotice) {
        if self.attacher.on_tc_notice(notice) {
            self.observe();
        }
    }

    /// A verification pass's findings about links, filters and pins: pins put back are counted
    /// and published here (their WARN lines are the verification's); detached links are
    /// repaired by a worker, which counts them like any lost attachment. Returns whether the
    /// pass looked at everything (and so at the maps too), not only at the links' state.
    fn on_verified(
        &mut self,
        verification: &Verification,
        bpffs_dir: &Path,
        observer: &mut Observer,
    ) -> bool {
        if verification.links_state_only {
            // The links' state alone: a lost one is repaired; nothing else was looked at, so
            // nothing else (places on hooks, filters, pins, maps, the status' last pass) is
            // taken from it.
            if self.links_lost(verification) {
                self.observe();
            }
            return false;
        }
        self.publish_restored(verification, bpffs_dir, observer);
        let mut marked = self.links_lost(verification);
        marked |= self
            .attacher
            .on_links_behind(&verification.behind, verification.started);
        for &(ifindex, point) in &verification.filters_missing {
            marked |= self.attacher.on_filter_missing(ifindex, point);
        }
        self.attacher.on_filters_ahead(&verification.filters_ahead);
        if marked {
            self.observe();
        }
        let problem = verification.pins_problem();
        if problem.is_some() && problem != self.pins_problem {
            log::error!("NOT READY: {}", problem.as_deref().unwrap_or_default());
        }
        self.metrics.readiness.set_pins_problem(problem.clone());
        self.pins_problem = problem;
        true
    }

    /// A verification pass's findings: links, filters and pins (see [`Self::on_verified`]),
    /// then the maps' entries another process wrote, looked at again against what `core`'s
    /// registry wants and written back by `sinks`.
    pub(super) fn on_verification(
        &mut self,
        verification: &Verification,
        core: &Core,
        sinks: &mut Sinks,
    ) {
        if !self.on_verified(verification, &core.config.bpffs_dir, &mut sinks.observer) {
            return;
        }
        let drift = sinks.verify_maps(verification, &core.registry, &self.metrics);
        self.metrics
            .verify_seconds
            .set(verification.took.as_secs_f64());
        self.attacher
            .findings_mut()
            .set_verified(verification.summary(&drift));
    }

    /// What a look at the entries another process wrote found (see
    /// `Sinks::recheck_reported`): `ipq status` shows what was found last, whichever look
    /// found it.
    pub(super) fn found_drift(&mut self, found: Option<Summary>) {
        if let Some(found) = found {
            let pins = self.attacher.findings().verified().map_or(0, |v| v.pins);
            self.attacher
                .findings_mut()
                .set_found(Summary { pins, ..found });
        }
    }

    /// The links the pass found detached or replaced, each marked lost for a worker to
    /// repair; whether any changed what the attacher holds.
    fn links_lost(&mut self, verification: &Verification) -> bool {
        let mut marked = false;
        for &(ifindex, point) in verification.detached.iter().chain(&verification.replaced) {
            marked |= self
                .attacher
                .on_link_lost(ifindex, point, verification.started);
        }
        marked
    }

    /// Counts and publishes each pin the pass put back.
    fn publish_restored(
        &self,
        verification: &Verification,
        bpffs_dir: &Path,
        observer: &mut Observer,
    ) {
        let layout = PinLayout::new(bpffs_dir);
        for restored in &verification.restored {
            let link = restored
                .path
                .parent()
                .filter(|dir| *dir == layout.links_dir())
                .and(restored.path.file_name())
                .and_then(|name| PinLayout::parse_link_name(name.to_str()?));
            let (interface, ifindex, hook) = match link {
                Some((ifindex, point)) => (
                    self.attacher
                        .ledger()
                        .target(ifindex)
                        .map_or_else(|| format!("if{ifindex}"), |t| t.name.clone()),
                    ifindex,
                    EventHook::from(point.hook()),
                ),
                // A map or program pin: no interface's, every hook's.
                None => (restored.path.display().to_string(), 0, EventHook::NoHook),
            };
            self.metrics
                .attachments_lost
                .with_label_values(&[hook.as_ref(), Lost::Pin.as_ref()])
                .inc();
            observer.publish(
                humantime::format_rfc3339_millis(verification.finished_at).to_string(),
                EventBody::AttachmentLost {
                    interface,
                    ifindex,
                    hook,
                    what: Lost::Pin.into(),
                    repaired: restored.outcome.is_ok(),
                    error: restored.outcome.as_ref().err().map(ToString::to_string),
                },
            );
        }
    }

    /// The attach gauges, counters and readiness, from the attacher's state: O(interfaces),
    /// so called where the attacher changes (a link added, renamed or gone, a worker's report,
    /// a retry) and once per tick for the readiness grace period, never per route, neighbour or
    /// request.
    pub(super) fn observe(&self) {
        #[cfg(test)]
        self.observed.set(self.observed.get() + 1);
        let (attacher, metrics) = (&self.attacher, &self.metrics);
        metrics.observe_attachments(attacher.ledger().attached_points());
        metrics.observe_unprotected(
            attacher
                .ledger()
                .unprotected_points()
                .map(|(_, _, point)| point),
            attacher.findings().failures(),
        );
        metrics.tamper.observe_bypassed(
            attacher.ledger().bypassed_points().map(|(_, point)| point),
            attacher.findings().bypasses(),
        );
        metrics.tamper.observe_cotenants(
            attacher
                .ledger()
                .cotenants_ahead()
                .map(|(_, point, verdict)| (point, verdict.label())),
        );
        metrics
            .tc_upgrades_pending
            .set(attacher.ledger().pending_upgrades() as i64);
        metrics
            .readiness
            .set_blocker(attacher.ledger().readiness_blocker(Instant::now()));
    }

    /// CNI can be faster than the netlink event of the veth it just created: the attacher is
    /// asked now (the API service checked the role), so the claim is enforced the moment it is
    /// answered. The node's mirror (`net`) learns the link too (the kernel just named it), so
    /// that a resync that no longer finds it forgets it; its own netlink event changes nothing.
    pub(super) fn watch_claimant(&mut self, holder: &Holder, net: &mut NetState) {
        if self.attacher.ledger().target(holder.ifindex).is_none() {
            net.apply(&NetEvent::Link {
                ifindex: holder.ifindex,
                name: holder.ifname.clone(),
            });
            self.attacher
                .want(holder.ifindex, &holder.ifname, Role::Workload);
            self.observe();
        }
    }

    /// Detaches what earlier agents attached and no configured interface needs now.
    pub(super) fn prune_links(&self) {
        match self.attacher.prune() {
            Ok(removed) => {
                for (ifindex, point) in removed {
                    info!(
                        "detached if{ifindex} {}: no longer configured or gone",
                        point.as_ref()
                    );
                }
            }
            Err(e) => warn!("pruning stale link pins: {e}"),
        }
    }

    /// Start-up is done: records what is in place (for `/v1/status` and the `started:` line),
    /// then lets the attach workers move netlink-protected interfaces to TCX.
    pub(super) fn mark_started(&mut self) -> StartedView {
        let started = StartedView {
            attachments: self.attacher.ledger().attached_points().count() as u64,
            unprotected: self.attacher.ledger().unprotected_points().count() as u64,
            tc_upgrades_pending: self.attacher.ledger().pending_upgrades() as u64,
        };
        self.started = Some(started.clone());
        self.attacher.workers().start_upgrades();
        started
    }
}

/// Counts and publishes an attachment another tool took away (its WARN line is the
/// attacher's).
fn publish_lost(metrics: &Metrics, observer: &mut Observer, lost: LostAttachment) {
    let hook = metrics::hook_label(lost.point);
    metrics
        .attachments_lost
        .with_label_values(&[hook, lost.what.as_ref()])
        .inc();
    let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
    observer.publish(
        at,
        EventBody::AttachmentLost {
            interface: lost.name,
            ifindex: lost.ifindex,
            hook: lost.point.hook().into(),
            what: lost.what.into(),
            repaired: lost.error.is_none(),
            error: lost.error,
        },
    );
}
