//! The swap of a protected interface's netlink filters for TCX links
//! ([`super::TcMode::NetlinkThenTcx`]): the bookkeeping of one interface's upgrade.
//!
//! An upgrade that fails leaves the interface as protected as it was (the TCX link is created
//! before the filter goes), so it is logged and retried with backoff, and never counted as an
//! unprotected hook or an attach failure.

use std::time::Instant;

use log::{debug, info, warn};

use super::{retry::Backoff, AttachError, Hooked, Mechanism, Protection, Role, Target};
use crate::paths::AttachPoint;

/// Where one interface's upgrade stands.
#[derive(Clone, Debug, Default)]
pub(super) struct Upgrade {
    backoff: Backoff,
    retry_at: Option<Instant>,
    failures: u32,
    last_error: Option<String>,
}

impl Upgrade {
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Its retry is queued.
    pub(super) fn queued(&mut self) {
        self.retry_at = None;
    }
}

/// Whether `target` is protected with a netlink filter still on a hook: an upgrade is queued,
/// under way, or waiting for its retry.
pub(super) fn wanted(target: &Target) -> bool {
    target.role == Role::Workload
        && matches!(
            target.protection,
            Protection::Protected | Protection::Bypassed | Protection::Unverified
        )
        && target.attached.values().any(|m| *m == Mechanism::Netlink)
}

/// An upgrade job's report: the hooks it moved to TCX, or its retry.
pub(super) fn on_report(
    target: &mut Target,
    ifindex: u32,
    hooks: Vec<(AttachPoint, Result<Hooked, AttachError>)>,
) {
    let name = target.name.clone();
    let mut errors = Vec::new();
    let mut all_gone = true;
    for (point, result) in hooks {
        match result {
            Ok(hooked) => {
                target.attached.insert(point, hooked.by);
                // A TCX link runs before every clsact filter: nothing bypasses it.
                let was_held_back = target.held_back();
                target.bypassed.remove(&point);
                target.ahead.remove(&point);
                if was_held_back && !target.held_back() {
                    info!("{name} (if{ifindex}): on TCX now, no filter runs before ipq's");
                    target.protection = Protection::Protected;
                    target.last_error = None;
                }
            }
            Err(e) => {
                all_gone &= e.interface_gone();
                errors.push(format!("{}: {e}", point));
            }
        }
    }
    let upgrade = &mut target.upgrade;
    if errors.is_empty() {
        if upgrade.failures > 0 {
            info!(
                "{name} (if{ifindex}): moved to TCX after {} failed attempts",
                upgrade.failures
            );
        } else {
            debug!("{name} (if{ifindex}): moved from its netlink filters to TCX");
        }
        *upgrade = Upgrade::default();
        return;
    }
    let error = errors.join("; ");
    let delay = upgrade.backoff.next_delay();
    upgrade.failures += 1;
    if all_gone || crate::netdev::vanished(&name, ifindex) {
        // Churn: the interface went away while its move ran; its LinkGone event forgets it.
        debug!("{name} (if{ifindex}): gone before it moved to TCX: {error}");
    } else if upgrade.last_error.as_deref() != Some(error.as_str()) {
        warn!(
            "{name} (if{ifindex}): still protected by its netlink filter, moving it to TCX \
             failed: {error}; retrying in {}",
            humantime::format_duration(delay)
        );
    } else {
        debug!("{name} (if{ifindex}): moving to TCX still fails: {error}");
    }
    upgrade.last_error = Some(error);
    upgrade.retry_at = Some(Instant::now() + delay);
}
