//! What the API shows of the interfaces' protection, from [`Protection`]'s own state: each
//! interface's hooks and errors, how TC attaches, the last verification and what finds the
//! changes nothing announces, what was in place at start, and the protection of an address's
//! holder in its view.

use std::{sync::Arc, time::Duration};

use super::protection::Protection;
use ipq_api::TcAttachMode;
use ipq_common::watch::WatchMode;

use crate::{
    api::model::{AddressView, InterfaceStatus, StartedView, VerificationView},
    datapath::bpf_watch::Pokes,
    registry::AddrRecord,
};

/// What `/v1/status` says of protection.
pub(super) struct ProtectionStatus {
    pub(super) interfaces: Vec<InterfaceStatus>,
    pub(super) tc_attach: TcAttachMode,
    pub(super) verification: Option<VerificationView>,
    /// What finds the changes nothing announces, and how late (`Status::unannounced`).
    pub(super) unannounced: String,
    pub(super) started: Option<StartedView>,
}

impl Protection {
    /// `/v1/status`'s part: O(interfaces). `verify_interval`: the periodic verification's.
    pub(super) fn status(&self, verify_interval: Duration) -> ProtectionStatus {
        let attacher = &self.attacher;
        let interfaces = attacher
            .ledger()
            .targets()
            .iter()
            .map(|(ifindex, target)| InterfaceStatus {
                ifindex: *ifindex,
                name: target.name.clone(),
                hooks: target
                    .attached
                    .iter()
                    .map(|(p, by)| by.attached_hook(*p))
                    .collect(),
                protection: target.protection,
                attachment: target.attachment(),
                error: target.last_error.clone(),
                failed_attempts: target.failures,
                ahead: target.ahead.values().map(|v| v.why().to_owned()).collect(),
            })
            .collect();
        let rfc3339 = |at| humantime::format_rfc3339_millis(at).to_string();
        let verification = attacher.findings().verified().map(|v| VerificationView {
            at: rfc3339(v.finished_at),
            took_us: u64::try_from(v.took.as_micros()).unwrap_or(u64::MAX),
            pins: v.pins as u64,
            found: v.found.clone(),
            last_found_at: attacher
                .findings()
                .last_found()
                .map(|l| rfc3339(l.finished_at)),
            last_found: attacher
                .findings()
                .last_found()
                .map_or_else(Vec::new, |l| l.found.clone()),
        });
        ProtectionStatus {
            interfaces,
            tc_attach: attacher.workers().mode().into(),
            verification,
            unannounced: unannounced(&self.bpf_watcher, verify_interval),
            started: self.started.clone(),
        }
    }

    /// The protection of `record`'s live holder's interface, in its address's view.
    pub(super) fn annotate(&self, view: &mut AddressView, record: &AddrRecord) {
        if let Some(target) = record
            .status
            .holder()
            .and_then(|h| self.attacher.ledger().target(h.ifindex))
        {
            view.protection = Some(target.protection);
            view.attachment = target.attachment();
        }
    }
}

/// No netlink group announces a detached link, a program put ahead of ipq's or a map written
/// by another process: what finds them (the bpf() watcher, `Err` why not), and how late.
fn unannounced(bpf_watcher: &Result<Arc<Pokes>, String>, verify_interval: Duration) -> String {
    let every = humantime::format_duration(verify_interval);
    match bpf_watcher.as_ref().map(|pokes| pokes.stopped()) {
        Ok(Some(why)) => format!(
            "periodic verification only, every {every} (the bpf() watcher STOPPED: {why}): \
            a detached link, a program put ahead of ipq's TCX link and a map written by \
            another process are found within it"
        ),
        Ok(None) => {
            let pokes = bpf_watcher.as_ref().ok();
            let mode = pokes.map_or(WatchMode::None, |pokes| pokes.mode());
            let backstop = if mode == WatchMode::Trampolines {
                format!(
                    "periodic verification every {every} of the pins and filters, and of every \
                    link and map at least every {} as the backstop{}",
                    humantime::format_duration(crate::datapath::verify::FULL_SWEEP_EVERY),
                    if pokes.is_some_and(|pokes| !pokes.sees_every_change()) {
                        " (the maps at every pass: another process mapped them)"
                    } else {
                        ""
                    }
                )
            } else {
                format!(
                    "periodic verification every {every} as the backstop (a map written \
                    through a mapping, by a compat or relative-path call, or through a \
                    descriptor opened before the agent started or passed on){}",
                    pokes
                        .and_then(|pokes| pokes.why_not_trampolines())
                        .map(|why| format!("; not the trampolines: {why}"))
                        .unwrap_or_default()
                )
            };
            format!(
                "bpf() watcher ({}): another process's link detach, program attach or write \
                to ipq's maps is verified within milliseconds; {backstop}{}",
                crate::datapath::bpf_watch::describe(mode),
                match pokes.map_or(0, |pokes| pokes.lost_total()) {
                    0 => String::new(),
                    lost => format!(
                        "; {lost} calls lost to its full ring, each time answered by \
                        verifying everything"
                    ),
                }
            )
        }
        Err(why) => format!(
            "periodic verification only, every {every} (the bpf() watcher is not attached: \
            {why}): a detached link, a program put ahead of ipq's TCX link and a map \
            written by another process are found within it"
        ),
    }
}
