//! Attachments another tool takes away: the kernel's TC notices and the verification's
//! findings turned into hooks marked lost on their target (unprotected at once) and repair
//! jobs. What the repairs then find is recorded as [`super::LostAttachment`]s in the
//! [`super::findings::Findings`].

use log::warn;

use super::{
    tc_watch::{TcChange, TcNotice},
    Attacher, JobKind, Lost, Mechanism, Protection, Role, Target, TcMode,
};
use crate::paths::AttachPoint;

impl Attacher {
    /// A TC notification: queues a repair of the interface it names, if ipq's netlink filter
    /// may have been on a hook it concerns. O(1) per notice but an overrun (every workload
    /// interface is looked at again, off the loop).
    /// True when it made an interface unprotected (the caller refreshes the gauges).
    pub fn on_tc_notice(&mut self, notice: TcNotice) -> bool {
        let mode = self.workers.mode();
        let mut marked = false;
        match notice {
            TcNotice::Change { ifindex, change } => {
                let what = match change {
                    TcChange::ClsactDeleted => Lost::Qdisc,
                    TcChange::FilterDeleted(_)
                    | TcChange::ForeignFilter(_)
                    | TcChange::Ahead(_) => Lost::Filter,
                };
                let Some(target) = self.ledger.get_mut(ifindex) else {
                    return false;
                };
                if concerned(mode, target, change.points()) {
                    // A deleted clsact or a foreign filter at ipq's place is never ipq's own
                    // doing; a deleted filter is, when an upgrade swaps it for a TCX link. A
                    // filter ahead takes nothing away: the repair's dump says what it does.
                    let certain =
                        !matches!(change, TcChange::FilterDeleted(_) | TcChange::Ahead(_))
                            || (mode == TcMode::Netlink
                                && matches!(change, TcChange::FilterDeleted(_)));
                    if certain {
                        marked = mark_lost(target, change.points());
                    }
                    self.workers.queue(ifindex, target, JobKind::Repair(what));
                }
            }
            TcNotice::Overrun => {
                warn!(
                    "TC notifications were lost (the socket overran, or the queue to the loop \
                     was full): looking at every hook again"
                );
                for (ifindex, target) in self.ledger.targets() {
                    if target.role == Role::Workload {
                        self.workers
                            .queue(*ifindex, target, JobKind::Repair(Lost::Filter));
                    }
                }
            }
        }
        marked
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
        let Some(target) = self.ledger.get_mut(ifindex) else {
            return false;
        };
        // A hook whose repair is already queued, or was looked at after the pass began, is not
        // lost again: a pass (the watcher's come right after a call) can find ipq's own move
        // first half done.
        let by_link = matches!(
            target.attached.get(&point),
            Some(Mechanism::Tcx | Mechanism::Xdp)
        ) && !target.lost.contains(&point)
            && target.looked_at.is_none_or(|at| at < seen);
        if !by_link {
            return false;
        }
        let marked = mark_lost(target, &[point]);
        self.workers
            .queue(ifindex, target, JobKind::Repair(Lost::Link));
        marked
    }

    /// A verification found ipq's netlink filter missing from `point` of `ifindex`, with no
    /// notification seen: a repair is queued if ipq's filter is still meant to be there.
    /// True when it made the interface unprotected.
    ///
    /// Under `tc_attach = auto` the filter may be gone by ipq's own upgrade, half done as the
    /// pass saw it (the TCX link made, the filter deleted, the report not yet taken, so the
    /// hooks the pass looked at still listed it): as for a deleted filter's notice, the
    /// repair's look says whether anything was lost. Marking it lost at once made a fresh
    /// agent unready for a moment while it moved its interfaces to TCX.
    pub fn on_filter_missing(&mut self, ifindex: u32, point: AttachPoint) -> bool {
        let mode = self.workers.mode();
        let Some(target) = self.ledger.get_mut(ifindex) else {
            return false;
        };
        if !concerned(mode, target, &[point]) {
            return false;
        }
        let own_upgrade_may_be_under_way =
            mode == TcMode::NetlinkThenTcx && super::upgrade::wanted(target);
        let marked = !own_upgrade_may_be_under_way && mark_lost(target, &[point]);
        self.workers
            .queue(ifindex, target, JobKind::Repair(Lost::Filter));
        marked
    }
}

/// Whether a change to `points` of `target` can have taken ipq's program away: ipq's netlink
/// filter is (or is being put) there. TCX links hang on neither clsact nor filters.
pub(super) fn concerned(mode: TcMode, target: &Target, points: &[AttachPoint]) -> bool {
    mode != TcMode::Tcx
        && target.role == Role::Workload
        && (target.protection == Protection::Attaching
            || points
                .iter()
                .any(|p| target.attached.get(p) == Some(&Mechanism::Netlink)))
}

/// Hooks of `target` whose program is known gone: the interface is unprotected (in
/// `ipq status`, the gauge and `/readyz`) until its repair reports, however fast that is.
/// True when a hook was newly marked.
fn mark_lost(target: &mut Target, points: &[AttachPoint]) -> bool {
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
