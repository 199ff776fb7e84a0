//! The pending releases as the releaser knows them, kept in memory besides their files. A
//! file is the durable copy, and only the releaser removes one (once its delegate DEL
//! succeeded): a file found missing at a scan, or the whole directory gone, was removed
//! behind its back (`rm -rf state_dir/ipam-releases`), and is written back from here, logged
//! and counted, rather than leaking its allocation in the IPAM for good.
//!
//! It also keeps, per release, what "never early" counts from for a release that names no
//! address: when the release was handed over, and when its attachment was last seen busy.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use ipq_api::model::HeldRelease;
use ipq_fs::spool::{self, SpoolError, Spooled};
use log::{error, warn};

use crate::{ipam::records::Records, metrics::Metrics};

struct Entry {
    request: HeldRelease,
    /// When this releaser first saw the release (ms since the epoch).
    first_seen_ms: u64,
    /// When its attachment was last seen busy (ms since the epoch).
    last_busy_ms: Option<u64>,
}

pub(super) struct Known {
    entries: HashMap<PathBuf, Entry>,
    /// A released allocation's record goes with its last release.
    records: Records,
}

impl Known {
    pub(super) fn new(records: Records) -> Self {
        Self {
            entries: HashMap::new(),
            records,
        }
    }

    /// One scan's files merged with what is remembered: new files remembered, remembered ones
    /// whose file is gone written back (WARN, `ipq_ipam_spool_restored_total`). Every pending
    /// release, oldest first; one whose file cannot be written back yet stays pending from
    /// memory and is written at the next scan.
    pub(super) fn reconcile(
        &mut self,
        mut scanned: Vec<Spooled<HeldRelease>>,
        now_ms: u64,
        metrics: &Metrics,
    ) -> Vec<Spooled<HeldRelease>> {
        let on_disk: HashSet<&Path> = scanned.iter().map(|s| s.path.as_path()).collect();
        let vanished: Vec<PathBuf> = self
            .entries
            .keys()
            .filter(|path| !on_disk.contains(path.as_path()))
            .cloned()
            .collect();
        for path in vanished {
            let request = self.entries[&path].request.clone();
            match spool::write_at(&path, &request) {
                Ok(()) => {
                    metrics.ipam.spool_restored.inc();
                    warn!(
                        "ipam releases: {} vanished while its release was pending (container {}, \
                         {}); written back from memory",
                        path.display(),
                        request.container_id,
                        request.ifname
                    );
                }
                Err(e) => error!(
                    "ipam releases: {} vanished while its release was pending and cannot be \
                     written back yet ({e}); kept in memory",
                    path.display()
                ),
            }
            scanned.push(Spooled { path, request });
        }
        for spooled in &scanned {
            self.entries
                .entry(spooled.path.clone())
                .or_insert_with(|| Entry {
                    request: spooled.request.clone(),
                    first_seen_ms: now_ms,
                    last_busy_ms: None,
                });
        }
        // File names sort oldest first.
        scanned.sort_by(|a, b| a.path.cmp(&b.path));
        scanned
    }

    /// Removes `spooled`'s file, its delegate DEL done, and forgets it and its allocation's
    /// record.
    pub(super) fn done(&mut self, spooled: Spooled<HeldRelease>) -> Result<(), SpoolError> {
        self.entries.remove(&spooled.path);
        let held = &spooled.request;
        self.records
            .forget(held.network.as_deref(), &held.container_id, &held.ifname);
        spooled.done()
    }

    /// The records of the allocations, for a scan to adopt ipq-ipam's new ones.
    pub(super) fn records(&self) -> &Records {
        &self.records
    }

    /// Whether the release at `path`, which names no address, has waited long enough:
    /// `max_cooldown` (which no quarantine outlasts) since the later of its hand-over and the
    /// last moment its attachment was seen busy. Its hand-over is its own stamp, unless this
    /// releaser saw it earlier than that (a clock that jumped) or it has none (an older
    /// ipq-ipam's): then when this releaser first saw it. Never this task's start.
    pub(super) fn quiet_long_enough(
        &mut self,
        path: &Path,
        busy: bool,
        now_ms: u64,
        max_cooldown: Duration,
    ) -> bool {
        let Some(entry) = self.entries.get_mut(path) else {
            return false;
        };
        if busy {
            entry.last_busy_ms = Some(now_ms);
            return false;
        }
        let held_at = match entry.request.held_at_unix_ms {
            0 => entry.first_seen_ms,
            at => at.min(entry.first_seen_ms),
        };
        let since = held_at.max(entry.last_busy_ms.unwrap_or(0));
        let wait = u64::try_from(max_cooldown.as_millis()).unwrap_or(u64::MAX);
        now_ms >= since.saturating_add(wait)
    }
}

#[cfg(test)]
mod tests;
