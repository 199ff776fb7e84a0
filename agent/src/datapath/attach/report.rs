//! A worker's report applied to the interface it was for: protected, bypassed, or failed and
//! retried with backoff. (A report for an interface no longer wanted is undone by the worker
//! pool, [`super::pool`].)

use std::time::Instant;

use log::{debug, error, info, warn};

use super::{
    bypass, findings::Findings, retry::Backoff, tc_filter, upgrade, JobKind, JobReport, Protection,
    Target, TcMode,
};

/// Applies `report`, a protect or repair job's report of the current generation, to `target`:
/// protected, bypassed, or failed and retried with backoff. Failures, bypasses and lost
/// attachments go to `findings`. Returns the job to queue next for the target, if any (its
/// move to TCX).
pub(super) fn apply(
    target: &mut Target,
    mode: TcMode,
    report: JobReport,
    findings: &mut Findings,
) -> Option<JobKind> {
    let ifindex = report.job.ifindex;
    if let JobKind::Repair(what) = report.job.kind {
        findings.record_lost(ifindex, target, what, &report);
    }
    // Every hook of the interface was looked at (or attached): what it found decides.
    target.lost.clear();
    target.looked_at = Some(std::time::Instant::now());
    let name = target.name.clone();
    let mut errors = Vec::new();
    // The kernel said the interface is gone on every failed hook: churn, decided on the
    // errno without asking the kernel again.
    let mut all_gone = true;
    for (point, result) in report.hooks {
        match result {
            Ok(hooked) => {
                debug!(
                    "{name} (if{ifindex}): {} attached ({:?}, {})",
                    hooked.by.hook_name(point),
                    hooked.how,
                    hooked.by.as_ref()
                );
                target.attached.insert(point, hooked.by);
            }
            Err(e) => {
                findings.count_failure(point);
                target.attached.remove(&point);
                all_gone &= e.interface_gone();
                errors.push(format!("{}: {e}", mode.hook_name(point)));
            }
        }
    }
    let now = Instant::now();
    if errors.is_empty() {
        for point in bypass::apply(target, ifindex, &report.ahead) {
            findings.count_bypass(point);
        }
    }
    if errors.is_empty() && target.held_back() {
        target.failures = 0;
        target.retry_at = None;
        if mode == TcMode::NetlinkThenTcx && upgrade::wanted(target) {
            // A TCX link runs before every clsact filter: the move ends the bypass.
            return Some(JobKind::Upgrade);
        }
    } else if errors.is_empty() {
        if target.protection != Protection::Protected {
            if target.failures > 0 {
                info!(
                    "{name} (if{ifindex}): protected after {} failed attempts",
                    target.failures
                );
            } else {
                // Per pod interface: `ipq status` and the metrics say it; the log only when
                // asked (a failure, and the recovery from one, stay at INFO and above).
                debug!("{name} (if{ifindex}): protected ({mode})");
            }
            target.since = now;
        }
        target.protection = Protection::Protected;
        target.last_error = None;
        target.failures = 0;
        target.backoff = Backoff::default();
        target.retry_at = None;
        target.upgrade = upgrade::Upgrade::default();
        if mode == TcMode::NetlinkThenTcx && upgrade::wanted(target) {
            return Some(JobKind::Upgrade);
        }
    } else {
        let error = errors.join("; ");
        let delay = target.backoff.next_delay();
        target.failures += 1;
        // The first failure and every change of error are errors; repeats of the same one
        // are not logged again at that level.
        if all_gone || crate::netdev::vanished(&name, ifindex) {
            // Churn: the interface went away before its attach ran; its LinkGone event
            // forgets it.
            debug!("{name} (if{ifindex}): gone before it was attached: {error}");
        } else if target.last_error.as_deref() != Some(error.as_str()) {
            error!(
                "{name} (if{ifindex}): NOT PROTECTED: {error}; retrying in {}",
                humantime::format_duration(delay)
            );
        } else {
            debug!("{name} (if{ifindex}): still failing: {error}");
        }
        if target.protection != Protection::Failed {
            target.since = now;
        }
        target.protection = Protection::Failed;
        target.last_error = Some(error);
        target.retry_at = Some(now + delay);
    }
    None
}

/// Removes ipq's netlink filters (only ipq's) from both TC hooks of `ifindex`.
pub(super) fn remove_filters(ifindex: u32) {
    for dir in [tc_filter::Direction::Ingress, tc_filter::Direction::Egress] {
        if let Err(e) = tc_filter::remove_ipq(ifindex, dir) {
            warn!("if{ifindex}: removing ipq's {} filter: {e}", dir);
        }
    }
}
