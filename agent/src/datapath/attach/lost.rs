//! Attachments another tool takes away: the kernel's TC notices turned into repair jobs, and
//! what the repairs found turned into [`LostAttachment`]s for the tracker to count, publish
//! and log.

use log::warn;

use super::{
    tc_watch::{TcChange, TcNotice},
    Attacher, JobKind, JobReport, Lost, LostAttachment, Mechanism, Protection, Role, Target,
    TcMode,
};
use crate::{
    datapath::verify::{NetlinkHooks, Summary},
    paths::AttachPoint,
};

impl Attacher {
    /// A TC notification: queues a repair of the interface it names, if ipq's netlink filter
    /// may have been on a hook it concerns. O(1) per notice but an overrun (every workload
    /// interface is looked at again, off the loop).
    /// True when it made an interface unprotected (the caller refreshes the gauges).
    pub fn on_tc_notice(&mut self, notice: TcNotice) -> bool {
        let mut marked = false;
        match notice {
            TcNotice::Change { ifindex, change } => {
                let what = match change {
                    TcChange::ClsactDeleted => Lost::Qdisc,
                    TcChange::FilterDeleted(_)
                    | TcChange::ForeignFilter(_)
                    | TcChange::Ahead(_) => Lost::Filter,
                };
                if self.concerned(ifindex, change.points()) {
                    // A deleted clsact or a foreign filter at ipq's place is never ipq's own
                    // doing; a deleted filter is, when an upgrade swaps it for a TCX link. A
                    // filter ahead takes nothing away: the repair's dump says what it does.
                    let certain =
                        !matches!(change, TcChange::FilterDeleted(_) | TcChange::Ahead(_))
                            || (self.mode == TcMode::Netlink
                                && matches!(change, TcChange::FilterDeleted(_)));
                    if certain {
                        marked = self.mark_lost(ifindex, change.points());
                    }
                    self.repair(ifindex, what);
                }
            }
            TcNotice::Overrun => {
                warn!(
                    "TC notifications were lost (the socket overran, or the queue to the loop \
                     was full): looking at every hook again"
                );
                let workloads: Vec<u32> = self
                    .targets
                    .iter()
                    .filter(|(_, t)| t.role == Role::Workload)
                    .map(|(ifindex, _)| *ifindex)
                    .collect();
                for ifindex in workloads {
                    self.repair(ifindex, Lost::Filter);
                }
            }
        }
        marked
    }

    /// Whether a change to `points` of `ifindex` can have taken ipq's program away: ipq's
    /// netlink filter is (or is being put) there. TCX links hang on neither clsact nor filters.
    fn concerned(&self, ifindex: u32, points: &[AttachPoint]) -> bool {
        let Some(target) = self.targets.get(&ifindex) else {
            return false;
        };
        self.mode != TcMode::Tcx
            && target.role == Role::Workload
            && (target.protection == Protection::Attaching
                || points
                    .iter()
                    .any(|p| target.attached.get(p) == Some(&Mechanism::Netlink)))
    }

    /// Queues a look at `ifindex`'s hooks if ipq's netlink filter is on one of `points`.
    pub(super) fn look_again(&mut self, ifindex: u32, points: &[AttachPoint]) {
        if self.concerned(ifindex, points) {
            self.repair(ifindex, Lost::Filter);
        }
    }

    /// Queues a look at `ifindex`'s hooks (deduplicated while one waits, see the queue).
    fn repair(&mut self, ifindex: u32, what: Lost) {
        if let Some(target) = self.targets.get(&ifindex) {
            let target = target.clone();
            self.queue(ifindex, &target, JobKind::Repair(what));
        }
    }

    /// A verification found the link of `point` on `ifindex` detached, or behind another
    /// program: a repair is queued if ipq's program was there by that link.
    /// True when it made the interface unprotected.
    pub fn on_link_lost(
        &mut self,
        ifindex: u32,
        point: AttachPoint,
        seen: std::time::Instant,
    ) -> bool {
        // A hook whose repair is already queued, or was looked at after the pass began, is not
        // lost again: a pass (the watcher's come right after a call) can find ipq's own move
        // first half done.
        let by_link = self.targets.get(&ifindex).is_some_and(|t| {
            matches!(
                t.attached.get(&point),
                Some(Mechanism::Tcx | Mechanism::Xdp)
            ) && !t.lost.contains(&point)
                && t.looked_at.is_none_or(|at| at < seen)
        });
        if !by_link {
            return false;
        }
        let marked = self.mark_lost(ifindex, &[point]);
        self.repair(ifindex, Lost::Link);
        marked
    }

    /// The hooks held by ipq's netlink filter, shared with the verification: kept in step
    /// with every report and every interface forgotten, O(1) each.
    pub fn netlink_hooks(&self) -> NetlinkHooks {
        self.netlink_hooks.clone()
    }

    pub(super) fn share_netlink_hooks(&self, ifindex: u32) {
        let points: Vec<AttachPoint> = self.targets.get(&ifindex).map_or_else(Vec::new, |t| {
            t.attached
                .iter()
                .filter(|(_, m)| **m == Mechanism::Netlink)
                .map(|(p, _)| *p)
                .collect()
        });
        let mut hooks = self
            .netlink_hooks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if points.is_empty() {
            hooks.remove(&ifindex);
        } else {
            hooks.insert(ifindex, points);
        }
    }

    /// A verification found ipq's netlink filter missing from `point` of `ifindex`, with no
    /// notification seen: a repair is queued if ipq's filter is still meant to be there.
    /// True when it made the interface unprotected.
    pub fn on_filter_missing(&mut self, ifindex: u32, point: AttachPoint) -> bool {
        if !self.concerned(ifindex, &[point]) {
            return false;
        }
        let marked = self.mark_lost(ifindex, &[point]);
        self.repair(ifindex, Lost::Filter);
        marked
    }

    /// Hooks of `ifindex` whose program is known gone: the interface is unprotected (in
    /// `ipq status`, the gauge and `/readyz`) until its repair reports, however fast that is.
    /// True when a hook was newly marked.
    fn mark_lost(&mut self, ifindex: u32, points: &[AttachPoint]) -> bool {
        let Some(target) = self.targets.get_mut(&ifindex) else {
            return false;
        };
        let before = target.lost.len();
        target.lost.extend(
            points
                .iter()
                .filter(|p| target.attached.contains_key(p))
                .copied(),
        );
        if target.lost.len() == before {
            return false;
        }
        if target.protection == Protection::Protected {
            target.protection = Protection::Repairing;
            target.since = std::time::Instant::now();
        }
        true
    }

    /// Keeps what the last verification found, and the last one that found anything, for
    /// `ipq status`.
    pub fn set_verified(&mut self, summary: Summary) {
        if !summary.found.is_empty() {
            self.last_found = Some(summary.clone());
        }
        self.verified = Some(summary);
    }

    /// Keeps what a look outside the passes found (the entries the bpf() watcher reported
    /// written), as the last thing found, for `ipq status`.
    pub fn set_found(&mut self, summary: Summary) {
        if !summary.found.is_empty() {
            self.last_found = Some(summary);
        }
    }

    pub fn verified(&self) -> Option<&Summary> {
        self.verified.as_ref()
    }

    /// The last verification that found something wrong.
    pub fn last_found(&self) -> Option<&Summary> {
        self.last_found.as_ref()
    }

    /// The lost attachments found since the last call.
    pub fn take_lost(&mut self) -> Vec<LostAttachment> {
        std::mem::take(&mut self.lost)
    }
}

/// Records what a repair of `target` found missing: only hooks ipq had attached count (one
/// that never got ipq's program is a failed attach, not a lost one).
pub(super) fn found(
    lost: &mut Vec<LostAttachment>,
    ifindex: u32,
    target: &Target,
    what: Lost,
    report: &JobReport,
) {
    for point in &report.found_missing {
        if !target.attached.contains_key(point) {
            continue;
        }
        let error = report
            .hooks
            .iter()
            .find(|(p, _)| p == point)
            .and_then(|(_, result)| result.as_ref().err().cloned());
        match &error {
            None => warn!(
                "{} (if{ifindex}): ipq's {} program was taken off by another tool ({} \
                 deleted or replaced); attached again",
                target.name,
                what.hook_name(*point),
                what
            ),
            Some(e) => warn!(
                "{} (if{ifindex}): ipq's {} program was taken off by another tool ({} \
                 deleted or replaced) and cannot be attached again yet: {e}",
                target.name,
                what.hook_name(*point),
                what
            ),
        }
        lost.push(LostAttachment {
            ifindex,
            name: target.name.clone(),
            point: *point,
            what,
            error: error.map(|e| e.to_string()),
        });
    }
}
