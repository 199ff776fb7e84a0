//! When each failed attach and each failed upgrade is tried again: one ordered index of due
//! times, so the next retry is found in O(log n), never by a scan of every interface.

#[cfg(test)]
use std::collections::BTreeSet;
use std::time::Instant;

use super::{Attacher, JobKind, RetryKind};

impl Attacher {
    /// Queues the retries that are due, of attaches and of upgrades. Returns how many.
    pub fn retry_due(&mut self, now: Instant) -> usize {
        let mut queued = 0;
        while let Some(&(at, ifindex, kind)) = self.retries.first() {
            if at > now {
                break;
            }
            self.retries.pop_first();
            let generation = self.next_generation + 1;
            let Some(target) = self.targets.get_mut(&ifindex) else {
                continue;
            };
            let job = match kind {
                RetryKind::Attach => {
                    target.retry_at = None;
                    target.generation = generation;
                    JobKind::Protect
                }
                RetryKind::Upgrade => {
                    target.upgrade.queued();
                    JobKind::Upgrade
                }
            };
            let target = target.clone();
            if kind == RetryKind::Attach {
                self.next_generation = generation;
            }
            self.queue(ifindex, &target, job);
            queued += 1;
        }
        queued
    }

    /// When the next retry (of an attach or an upgrade) is due: O(log n).
    pub fn next_retry(&self) -> Option<Instant> {
        self.retries.first().map(|(at, _, _)| *at)
    }

    /// The retry times of `ifindex`'s target (attach, upgrade), to [`reindex`](Self::reindex)
    /// after a change.
    pub(super) fn retry_times(&self, ifindex: u32) -> [Option<Instant>; 2] {
        self.targets
            .get(&ifindex)
            .map_or([None, None], |t| [t.retry_at, t.upgrade.retry_at()])
    }

    /// Brings [`retries`](Self::retries) in line with `ifindex`'s target after a change; `before`
    /// is what [`retry_times`](Self::retry_times) said before it.
    pub(super) fn reindex(&mut self, ifindex: u32, before: [Option<Instant>; 2]) {
        let after = self.retry_times(ifindex);
        for (kind, (was, is)) in [RetryKind::Attach, RetryKind::Upgrade]
            .into_iter()
            .zip(before.into_iter().zip(after))
        {
            if was != is {
                if let Some(at) = was {
                    self.retries.remove(&(at, ifindex, kind));
                }
                if let Some(at) = is {
                    self.retries.insert((at, ifindex, kind));
                }
            }
        }
    }

    /// The retry index matches the targets (tests).
    #[cfg(test)]
    pub(crate) fn retry_index_is_consistent(&self) -> bool {
        let derived: BTreeSet<(Instant, u32, RetryKind)> = self
            .targets
            .iter()
            .flat_map(|(ifindex, t)| {
                [
                    t.retry_at.map(|at| (at, *ifindex, RetryKind::Attach)),
                    t.upgrade
                        .retry_at()
                        .map(|at| (at, *ifindex, RetryKind::Upgrade)),
                ]
            })
            .flatten()
            .collect();
        derived == self.retries
    }
}
