//! Nothing ahead of ipq in silence (netlink mode): a filter another tool adds at a priority
//! before ipq's on a clsact hook (`tc filter add dev <veth> ingress pref 1 u32 ... classid`,
//! as a CNI's own filter does) ends classification for what it matches, so ipq's program never
//! sees those packets. The kernel announces the filter ([`super::tc_watch`]); a worker's dump
//! of the hook confirms it ([`find`]); the interface is then `bypassed` by that filter:
//! unprotected in `ipq status`, the gauges and `/readyz`, counted, logged at WARN, alerted
//! on. ipq never touches another tool's filter; the interface is protected again once the
//! filter goes (announced the same way). Under TCX the hook's programs run before any
//! clsact filter, so only netlink-held hooks are looked at.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use ipq_common::names::TC_FILTER_PRIORITY;
use log::{info, warn};

use super::{
    lost,
    tc_filter::{self, Direction},
    Attacher, JobKind, JobReport, Lost, Mechanism, Protection, Target,
};
use crate::paths::AttachPoint;

/// The hooks of `report` held by ipq's netlink filter where another filter runs first, as
/// one dump per such hook finds them (worker side, off the owner loop).
pub(super) fn find(report: &JobReport) -> Vec<(AttachPoint, String)> {
    report
        .hooks
        .iter()
        .filter(|(_, result)| result.as_ref().is_ok_and(|h| h.by == Mechanism::Netlink))
        .filter_map(|(point, _)| {
            let direction = Direction::of(*point)?;
            let filters = tc_filter::list(report.job.ifindex, direction).ok()?;
            tc_filter::ahead_of_ipq(&filters).map(|f| (*point, f.describe()))
        })
        .collect()
}

/// What a hook's bypass says, as `ipq status` and the log show it.
fn describe(bypassed: &[(AttachPoint, String)]) -> String {
    bypassed
        .iter()
        .map(|(point, filter)| {
            format!(
                "{}: {filter} runs before ipq's filter (pref {TC_FILTER_PRIORITY})",
                point.name_under_filter()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Applies what a report's dump found to `target`, whose hooks are otherwise all in place.
/// Returns the hooks newly bypassed (to count). Called only for a report without errors.
pub(super) fn apply(
    target: &mut Target,
    ifindex: u32,
    bypassed: &[(AttachPoint, String)],
) -> Vec<AttachPoint> {
    let points: BTreeSet<AttachPoint> = bypassed.iter().map(|(p, _)| *p).collect();
    if points.is_empty() {
        if !target.bypassed.is_empty() {
            info!(
                "{} (if{ifindex}): no filter runs before ipq's any more: protected",
                target.name
            );
            target.bypassed.clear();
        }
        return Vec::new();
    }
    let why = format!("bypassed: {}", describe(bypassed));
    let newly: Vec<AttachPoint> = points.difference(&target.bypassed).copied().collect();
    if target.protection != Protection::Bypassed || target.last_error.as_deref() != Some(&why) {
        warn!(
            "{} (if{ifindex}): NOT PROTECTED: {why}; what it classifies never reaches ipq's \
             program (ipq does not touch another tool's filter: move it after pref \
             {TC_FILTER_PRIORITY} or delete it)",
            target.name
        );
        target.since = Instant::now();
    }
    target.protection = Protection::Bypassed;
    target.last_error = Some(why);
    target.bypassed = points;
    newly
}

impl Attacher {
    /// A verification's dumps: `found` are the netlink hooks with a filter ahead of ipq's.
    /// Where they disagree with what the reports said (a notification lost), the hook is
    /// looked at again.
    pub fn on_filters_ahead(&mut self, found: &[(u32, AttachPoint)]) {
        let known: BTreeSet<(u32, AttachPoint)> = self.ledger.bypassed_points().collect();
        let found: BTreeSet<(u32, AttachPoint)> = found.iter().copied().collect();
        let mode = self.workers.mode();
        for (ifindex, point) in known.symmetric_difference(&found) {
            if let Some(target) = self.ledger.target(*ifindex) {
                if lost::concerned(mode, target, &[*point]) {
                    self.workers
                        .queue(*ifindex, target, JobKind::Repair(Lost::Filter));
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
    /// A verification's queries: `behind` are the TCX hooks where another program runs before
    /// ipq's link. Each is counted and moved first again, at most [`DISPLACED_LIMIT`] times a
    /// [`DISPLACED_WINDOW`]; past that the hook is `bypassed` (unprotected, `/readyz` 503) and
    /// reported until the window allows the next move. A TCX hook bypassed before and not
    /// behind any more is protected again. True when a protection changed.
    pub fn on_links_behind(&mut self, behind: &[(u32, AttachPoint)], seen: Instant) -> bool {
        let now = Instant::now();
        let mut changed = false;
        let cleared: Vec<(u32, AttachPoint)> = self
            .ledger
            .bypassed_points()
            .filter(|(ifindex, point)| {
                self.ledger
                    .target(*ifindex)
                    .and_then(|t| t.attached.get(point))
                    == Some(&Mechanism::Tcx)
                    && !behind.contains(&(*ifindex, *point))
            })
            .collect();
        for (ifindex, point) in cleared {
            if let Some(target) = self.ledger.get_mut(ifindex) {
                target.bypassed.remove(&point);
                if target.bypassed.is_empty() && target.protection == Protection::Bypassed {
                    info!(
                        "{} (if{ifindex}): ipq's {} link is first: protected",
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
        for &(ifindex, point) in behind {
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
                    self.findings.count_bypass(point);
                    changed |= self.on_link_lost(ifindex, point, seen);
                    continue;
                }
                Err(limited) => limited,
            };
            let Some(target) = self.ledger.get_mut(ifindex) else {
                continue;
            };
            let why = format!(
                "bypassed: {}: another program was put before ipq's link {} times in {}s; \
                 moving ipq's first again is rate-limited (next in {}s)",
                point.as_ref(),
                limited.count,
                DISPLACED_WINDOW.as_secs(),
                limited.next.saturating_duration_since(now).as_secs()
            );
            if target.protection != Protection::Bypassed {
                self.findings.count_bypass(point);
                warn!(
                    "{} (if{ifindex}): NOT PROTECTED: {why}: find the tool that keeps \
                     attaching at the head of the hook",
                    target.name
                );
                target.since = now;
                changed = true;
            }
            target.protection = Protection::Bypassed;
            target.bypassed.insert(point);
            target.last_error = Some(why);
        }
        changed
    }
}
