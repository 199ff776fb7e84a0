//! When each failed attach and each failed upgrade is tried again: one ordered index of due
//! times ([`Retries`]), so the next retry is found in O(log n), never by a scan of every
//! interface. The due times themselves are the targets' (`retry_at`, the upgrade's); the index
//! is brought in line with a target after each change ([`Retries::reindex`]).

use std::{collections::BTreeSet, time::Instant};

use super::Target;
#[cfg(test)]
use std::collections::BTreeMap;

/// What a waiting retry will do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum RetryKind {
    /// Attach again (the interface is `failed`).
    Attach,
    /// Move the netlink filters to TCX again.
    Upgrade,
}

/// Every retry that is waiting, by when it is due: (due, ifindex, [`RetryKind`]). The loop
/// asks for the next one after every event, so it must not walk every interface.
#[derive(Debug, Default)]
pub struct Retries {
    due: BTreeSet<(Instant, u32, RetryKind)>,
}

impl Retries {
    /// The retry times of `target` (attach, upgrade), to [`reindex`](Self::reindex) with
    /// after a change.
    pub(super) fn times(target: Option<&Target>) -> [Option<Instant>; 2] {
        target.map_or([None, None], |t| [t.retry_at, t.upgrade.retry_at()])
    }

    /// Brings the index in line with `ifindex`'s target after a change; `before` is what
    /// [`times`](Self::times) said before it, `target` the target now (`None`: forgotten).
    pub(super) fn reindex(
        &mut self,
        ifindex: u32,
        before: [Option<Instant>; 2],
        target: Option<&Target>,
    ) {
        let after = Self::times(target);
        for (kind, (was, is)) in [RetryKind::Attach, RetryKind::Upgrade]
            .into_iter()
            .zip(before.into_iter().zip(after))
        {
            if was != is {
                if let Some(at) = was {
                    self.due.remove(&(at, ifindex, kind));
                }
                if let Some(at) = is {
                    self.due.insert((at, ifindex, kind));
                }
            }
        }
    }

    /// Takes the first retry due by `now` out of the index, if there is one. Whoever takes it
    /// clears the target's own due time (the index and the targets then agree again).
    pub(super) fn take_due(&mut self, now: Instant) -> Option<(u32, RetryKind)> {
        let &(at, ifindex, kind) = self.due.first()?;
        if at > now {
            return None;
        }
        self.due.pop_first();
        Some((ifindex, kind))
    }

    /// When the next retry (of an attach or an upgrade) is due: O(log n).
    pub fn next_retry(&self) -> Option<Instant> {
        self.due.first().map(|(at, _, _)| *at)
    }

    /// The index matches `targets` (tests).
    #[cfg(test)]
    pub(crate) fn is_consistent_with(&self, targets: &BTreeMap<u32, Target>) -> bool {
        let derived: BTreeSet<(Instant, u32, RetryKind)> = targets
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
        derived == self.due
    }
}
