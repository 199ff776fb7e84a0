//! What the attacher found wrong with ipq's attachments, kept for the tracker to count, publish
//! and show: attach failures and bypasses counted per attach point since start, the
//! attachments repairs found taken away, and what the last verifications found.

use std::collections::BTreeMap;

use log::warn;

use super::{JobReport, Lost, LostAttachment, Target};
use crate::{datapath::verify::Summary, paths::AttachPoint};

#[derive(Debug, Default)]
pub struct Findings {
    /// Failed attach attempts, per attach point, since start
    /// (`ipq_datapath_attach_failures_total`).
    failures: BTreeMap<AttachPoint, u64>,
    /// Hooks found bypassed by a filter or program ahead of ipq's, per attach point, since
    /// start (`ipq_datapath_bypasses_total`).
    bypasses: BTreeMap<AttachPoint, u64>,
    /// Attachments repairs found taken away, for the tracker to count and publish.
    lost: Vec<LostAttachment>,
    /// What the last verification of the datapath found.
    verified: Option<Summary>,
    /// The last verification that found something wrong.
    last_found: Option<Summary>,
}

impl Findings {
    pub(super) fn count_failure(&mut self, point: AttachPoint) {
        *self.failures.entry(point).or_default() += 1;
    }

    pub(super) fn count_bypass(&mut self, point: AttachPoint) {
        *self.bypasses.entry(point).or_default() += 1;
    }

    /// Failed attempts per attach point since start.
    pub fn failures(&self) -> &BTreeMap<AttachPoint, u64> {
        &self.failures
    }

    /// Times a hook was found bypassed, per attach point, since start
    /// (`ipq_datapath_bypasses_total`).
    pub fn bypasses(&self) -> &BTreeMap<AttachPoint, u64> {
        &self.bypasses
    }

    /// Records what a repair of `target` found missing: only hooks ipq had attached count (one
    /// that never got ipq's program is a failed attach, not a lost one).
    pub(super) fn record_lost(
        &mut self,
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
            self.lost.push(LostAttachment {
                ifindex,
                name: target.name.clone(),
                point: *point,
                what,
                error: error.map(|e| e.to_string()),
            });
        }
    }

    /// The lost attachments found since the last call.
    pub fn take_lost(&mut self) -> Vec<LostAttachment> {
        std::mem::take(&mut self.lost)
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
}
