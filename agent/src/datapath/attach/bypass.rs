//! Nothing ahead of ipq in silence: another tool's filter at a priority before ipq's on a
//! clsact hook (netlink mode: `tc filter add dev <veth> ingress pref 1 u32 ... classid`, as a
//! CNI's own filter does), or its program before ipq's link on a TCX hook. The kernel announces
//! a filter ([`super::tc_watch`]); a worker's dump of the hook confirms it ([`find`]); the
//! verification finds a program ahead of ipq's link. What it does with the interface's
//! addresses' packets decides ([`super::cotenant::judge`]): one that hands them on leaves the
//! interface protected (and, under TCX, where it is); one that ends processing makes it
//! `bypassed` (unprotected in `ipq status`, the gauges and `/readyz`, counted, logged at WARN,
//! alerted on); one that cannot be told makes it `unverified` (unprotected and not ready the
//! same way, never counted as a bypass). ipq never touches another tool's filter; the interface
//! is protected again once the filter goes (announced the same way). Under TCX the hook's
//! programs run before any clsact filter, so only netlink-held hooks' filters are looked at.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use ipq_common::names::TC_FILTER_PRIORITY;
use log::{info, warn};

use super::{
    cotenant::{self, Ahead, Verdict},
    lost,
    tc_filter::{self, Direction},
    Attacher, JobKind, JobReport, Lost, Mechanism, Protection, Target,
};
use crate::paths::AttachPoint;

/// The hooks of `report` held by ipq's netlink filter where other filters run first, with
/// what those filters do with the interface's addresses' packets, as one dump per such hook
/// and [`cotenant::judge`] find them (worker side, off the owner loop).
pub(super) fn find(report: &JobReport) -> Vec<(AttachPoint, Verdict)> {
    report
        .hooks
        .iter()
        .filter(|(_, result)| result.as_ref().is_ok_and(|h| h.by == Mechanism::Netlink))
        .filter_map(|(point, _)| {
            let direction = Direction::of(*point)?;
            let filters = tc_filter::list(report.job.ifindex, direction).ok()?;
            let ahead: Vec<Ahead> = tc_filter::all_ahead_of_ipq(&filters)
                .into_iter()
                .map(Ahead::Filter)
                .collect();
            (!ahead.is_empty())
                .then(|| (*point, cotenant::judge(report.job.ifindex, *point, &ahead)))
        })
        .collect()
}

/// What the hooks' verdicts say, as `ipq status` and the log show it.
fn describe<'a>(verdicts: impl Iterator<Item = &'a Verdict>) -> String {
    verdicts.map(Verdict::why).collect::<Vec<_>>().join("; ")
}

/// Applies what a report's dump found (`ahead`: the netlink hooks with filters ahead of
/// ipq's, and their verdicts) to `target`, whose hooks are otherwise all in place: `bypassed`
/// where one ends processing, `unverified` where one cannot be told, protected where every
/// one hands packets on. Returns the hooks newly bypassed (to count). Called only for a report
/// without errors.
pub(super) fn apply(
    target: &mut Target,
    ifindex: u32,
    ahead: &[(AttachPoint, Verdict)],
) -> Vec<AttachPoint> {
    // Only the netlink hooks were looked at: a TCX hook's verdict is the verification's.
    let netlink: BTreeSet<AttachPoint> = target
        .attached
        .iter()
        .filter(|(_, m)| **m == Mechanism::Netlink)
        .map(|(p, _)| *p)
        .collect();
    target.ahead.retain(|p, _| !netlink.contains(p));
    target.ahead.extend(ahead.iter().cloned());
    let ends: BTreeSet<AttachPoint> = ahead
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::EndsProcessing(_)))
        .map(|(p, _)| *p)
        .collect();
    let newly: Vec<AttachPoint> = ends.difference(&target.bypassed).copied().collect();
    // The netlink hooks' bypasses are what this dump found; a TCX hook's stay the
    // verification's.
    target.bypassed.retain(|p| !netlink.contains(p));
    target.bypassed.extend(ends.iter().copied());
    if !target.held_back() {
        if matches!(
            target.protection,
            Protection::Bypassed | Protection::Unverified
        ) {
            info!(
                "{} (if{ifindex}): {}: protected",
                target.name,
                if ahead.is_empty() {
                    "no filter runs before ipq's any more".to_owned()
                } else {
                    describe(ahead.iter().map(|(_, v)| v))
                }
            );
        }
        return Vec::new();
    }
    if target.bypassed.is_empty() {
        let why = format!(
            "unverified: {}",
            describe(
                target
                    .ahead
                    .values()
                    .filter(|v| matches!(v, Verdict::CannotTell(_)))
            )
        );
        if target.protection != Protection::Unverified || target.last_error.as_deref() != Some(&why)
        {
            warn!(
                "{} (if{ifindex}): NOT PROTECTED: {why}; ipq does not touch another tool's \
                 filter",
                target.name
            );
            target.since = Instant::now();
        }
        target.protection = Protection::Unverified;
        target.last_error = Some(why);
        return Vec::new();
    }
    let why = format!(
        "bypassed: {}",
        describe(
            target
                .ahead
                .values()
                .filter(|v| matches!(v, Verdict::EndsProcessing(_)))
        )
    );
    if target.protection != Protection::Bypassed || target.last_error.as_deref() != Some(&why) {
        warn!(
            "{} (if{ifindex}): NOT PROTECTED: {why}; what it passes never reaches ipq's \
             program (ipq does not touch another tool's filter: move it after pref \
             {TC_FILTER_PRIORITY}, make it hand packets on, or delete it)",
            target.name
        );
        target.since = Instant::now();
    }
    target.protection = Protection::Bypassed;
    target.last_error = Some(why);
    newly
}

impl Attacher {
    /// A verification's dumps: `found` are the netlink hooks with filters ahead of ipq's, and
    /// their verdicts. Where they disagree with what the ledger holds (a notification lost,
    /// or the interface's addresses changed the verdict), the hook is looked at again.
    pub fn on_filters_ahead(&mut self, found: &[((u32, AttachPoint), Verdict)]) {
        let known: BTreeMap<(u32, AttachPoint), &'static str> = self
            .ledger
            .cotenants_ahead()
            .filter(|(ifindex, point, _)| {
                self.ledger
                    .target(*ifindex)
                    .and_then(|t| t.attached.get(point))
                    == Some(&Mechanism::Netlink)
            })
            .map(|(ifindex, point, verdict)| ((ifindex, point), verdict.label()))
            .collect();
        let found: BTreeMap<(u32, AttachPoint), &'static str> = found
            .iter()
            .map(|(hook, verdict)| (*hook, verdict.label()))
            .collect();
        let differ: BTreeSet<(u32, AttachPoint)> = known
            .keys()
            .chain(found.keys())
            .filter(|hook| known.get(hook) != found.get(hook))
            .copied()
            .collect();
        let mode = self.workers.mode();
        for (ifindex, point) in differ {
            if let Some(target) = self.ledger.target(ifindex) {
                if lost::concerned(mode, target, &[point]) {
                    self.workers
                        .queue(ifindex, target, JobKind::Repair(Lost::Filter));
                }
            }
        }
    }
}

/// Moves of ipq's TCX link back to the front allowed per [`DISPLACED_WINDOW`] and hook; a
/// tool that displaces it more often is not fought in a loop: the hook is `bypassed` until the
/// window lets the next move.
const DISPLACED_LIMIT: usize = 3;
const DISPLACED_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// When another program was last put before ipq's TCX link, per hook: the fight's rate, which
/// decides whether ipq's link is moved first again.
#[derive(Default)]
pub(super) struct Displacements {
    history: BTreeMap<(u32, AttachPoint), Vec<Instant>>,
}

/// A displacement past [`DISPLACED_LIMIT`] in the window: not moved back now.
struct RateLimited {
    /// Displacements in the window, this one included.
    count: usize,
    /// When the window allows the next move.
    next: Instant,
}

impl Displacements {
    /// Counts a displacement of `point` on `ifindex` seen `now`: fine to move ipq's link
    /// first again, or rate-limited.
    fn displaced(
        &mut self,
        ifindex: u32,
        point: AttachPoint,
        now: Instant,
    ) -> Result<(), RateLimited> {
        let history = self.history.entry((ifindex, point)).or_default();
        history.retain(|at| now.duration_since(*at) < DISPLACED_WINDOW);
        if history.len() < DISPLACED_LIMIT {
            history.push(now);
            return Ok(());
        }
        Err(RateLimited {
            count: history.len() + 1,
            next: history[0] + DISPLACED_WINDOW,
        })
    }
}

impl Attacher {
    /// A verification's queries: `behind` are the TCX hooks where other programs run before
    /// ipq's link, and what they do with the interface's addresses' packets. Programs that
    /// hand every packet on are left where they are (reordering another tool's programs
    /// changes what they see, and ipq sees every packet anyway): the hook stays protected.
    /// Any other is counted and ipq's link moved first again, at most [`DISPLACED_LIMIT`]
    /// times a [`DISPLACED_WINDOW`]; past that the hook is `bypassed` (unprotected, `/readyz`
    /// 503) and reported until the window allows the next move. A TCX hook bypassed before
    /// and not behind any more is protected again. True when a protection changed.
    pub fn on_links_behind(
        &mut self,
        behind: &[((u32, AttachPoint), Verdict)],
        seen: Instant,
    ) -> bool {
        let now = Instant::now();
        let mut changed = false;
        let is_tcx = |target: &Target, point: &AttachPoint| {
            target.attached.get(point) == Some(&Mechanism::Tcx)
        };
        // What was ahead of a TCX hook and is not any more, or hands packets on now.
        let stale: Vec<(u32, AttachPoint)> = self
            .ledger
            .cotenants_ahead()
            .filter(|(ifindex, point, _)| {
                self.ledger
                    .target(*ifindex)
                    .is_some_and(|t| is_tcx(t, point))
                    && !behind.iter().any(|(hook, _)| *hook == (*ifindex, *point))
            })
            .map(|(ifindex, point, _)| (ifindex, point))
            .collect();
        for (ifindex, point) in stale {
            if let Some(target) = self.ledger.get_mut(ifindex) {
                target.ahead.remove(&point);
            }
        }
        let cleared: Vec<(u32, AttachPoint)> = self
            .ledger
            .bypassed_points()
            .filter(|(ifindex, point)| {
                self.ledger
                    .target(*ifindex)
                    .is_some_and(|t| is_tcx(t, point))
                    && !behind
                        .iter()
                        .any(|(hook, v)| *hook == (*ifindex, *point) && !v.hands_on())
            })
            .collect();
        for (ifindex, point) in cleared {
            if let Some(target) = self.ledger.get_mut(ifindex) {
                target.bypassed.remove(&point);
                if target.bypassed.is_empty() && target.protection == Protection::Bypassed {
                    info!(
                        "{} (if{ifindex}): ipq's {} link is first, or what runs before it hands \
                         packets on: protected",
                        target.name,
                        point.as_ref()
                    );
                    target.protection = Protection::Protected;
                    target.last_error = None;
                    target.since = now;
                    changed = true;
                }
            }
        }
        for ((ifindex, point), verdict) in behind {
            let (ifindex, point) = (*ifindex, *point);
            let Some(target) = self.ledger.get_mut(ifindex) else {
                continue;
            };
            if !is_tcx(target, &point) || target.looked_at.is_some_and(|at| at >= seen) {
                continue;
            }
            target.ahead.insert(point, verdict.clone());
            if verdict.hands_on() {
                log::debug!("{} (if{ifindex}): {}", target.name, verdict.why());
            }
        }
        // A program that cannot be told is moved past too, but is not called a bypass.
        let behind: Vec<((u32, AttachPoint), bool)> = behind
            .iter()
            .filter(|(_, verdict)| !verdict.hands_on())
            .map(|(hook, verdict)| (*hook, matches!(verdict, Verdict::EndsProcessing(_))))
            .collect();
        for &((ifindex, point), ends) in &behind {
            // A hook whose move is already queued (a pass found it, the repair has not
            // reported yet) is not a second displacement.
            let by_tcx = self.ledger.target(ifindex).is_some_and(|t| {
                t.attached.get(&point) == Some(&Mechanism::Tcx)
                    && !t.lost.contains(&point)
                    && t.looked_at.is_none_or(|at| at < seen)
            });
            if !by_tcx {
                continue;
            }
            let limited = match self.displaced.displaced(ifindex, point, now) {
                Ok(()) => {
                    if ends {
                        self.findings.count_bypass(point);
                    }
                    changed |= self.on_link_lost(ifindex, point, seen);
                    continue;
                }
                Err(limited) => limited,
            };
            let Some(target) = self.ledger.get_mut(ifindex) else {
                continue;
            };
            let (state, word) = if ends {
                (Protection::Bypassed, "bypassed")
            } else {
                (Protection::Unverified, "unverified")
            };
            let why = format!(
                "{word}: {}: another program was put before ipq's link {} times in {}s; \
                 moving ipq's first again is rate-limited (next in {}s)",
                point.as_ref(),
                limited.count,
                DISPLACED_WINDOW.as_secs(),
                limited.next.saturating_duration_since(now).as_secs()
            );
            if target.protection != state {
                if ends {
                    self.findings.count_bypass(point);
                }
                warn!(
                    "{} (if{ifindex}): NOT PROTECTED: {why}: find the tool that keeps \
                     attaching at the head of the hook",
                    target.name
                );
                target.since = now;
                changed = true;
            }
            target.protection = state;
            if ends {
                target.bypassed.insert(point);
            }
            target.last_error = Some(why);
        }
        // An interface left `unverified` by a program ahead that is gone, or hands on now.
        for target in self.ledger.targets_mut() {
            if target.protection == Protection::Unverified && !target.held_back() {
                info!(
                    "{}: nothing ahead of ipq's links that cannot be told: protected",
                    target.name
                );
                target.protection = Protection::Protected;
                target.last_error = None;
                target.since = now;
                changed = true;
            }
        }
        changed
    }
}
