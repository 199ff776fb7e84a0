//! The pending releases as the releaser knows them, kept in memory besides their files. A
//! file is the durable copy, and only the releaser removes one (once its delegate DEL
//! succeeded): a file found missing at a scan, or the whole directory gone, was removed
//! behind its back (`rm -rf state_dir/ipam-releases`), and is written back from here, logged
//! and counted, rather than leaking its allocation in the IPAM for good.
//!
//! A release answered as stored is taken in from the store's thread ([`Known::remember`])
//! before its file is ever scanned: removed right after its answer, it is written back too.
//!
//! It also keeps, per release, what "never early" counts from for a release that names no
//! address: when the release was handed over, and when its attachment was last seen busy. Both
//! in CLOCK_BOOTTIME of this boot (`kernel_clock::boottime_ns`), which a wall-clock step does
//! not move; a release's own stamp counts only if it was taken in this boot
//! ([`held_in_this_boot`]).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use ipq_api::model::HeldRelease;
use ipq_fs::spool::{self, SpoolError, Spooled};
use log::{error, warn};

use super::held_in_this_boot;
use crate::{ipam::records::Records, metrics::Metrics};

struct Entry {
    request: HeldRelease,
    /// When this releaser first saw the release (CLOCK_BOOTTIME ns).
    first_seen_ns: u64,
    /// When its attachment was last seen busy (CLOCK_BOOTTIME ns).
    last_busy_ns: Option<u64>,
}

pub(super) struct Known {
    entries: HashMap<PathBuf, Entry>,
    /// A released allocation's record goes with its last release.
    records: Records,
    /// This boot's id: a release's own boot stamp counts only if it names it.
    boot_id: Option<String>,
}

impl Known {
    pub(super) fn new(records: Records, boot_id: Option<String>) -> Self {
        Self {
            entries: HashMap::new(),
            records,
            boot_id,
        }
    }

    /// Releases answered as stored (the store's thread's [`Handed`]), remembered from now
    /// whether or not their files are still there.
    ///
    /// [`Handed`]: crate::ipam::store::Handed
    pub(super) fn remember(&mut self, handed: Vec<Spooled<HeldRelease>>, now_ns: u64) {
        for spooled in handed {
            self.entries.entry(spooled.path).or_insert(Entry {
                request: spooled.request,
                first_seen_ns: now_ns,
                last_busy_ns: None,
            });
        }
    }

    /// One scan's files merged with what is remembered: new files remembered, remembered ones
    /// whose file is gone written back (WARN, `ipq_ipam_spool_restored_total`). Every pending
    /// release, oldest first; one whose file cannot be written back yet stays pending from
    /// memory and is written at the next scan.
    pub(super) fn reconcile(
        &mut self,
        mut scanned: Vec<Spooled<HeldRelease>>,
        now_ns: u64,
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
                    first_seen_ns: now_ns,
                    last_busy_ns: None,
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
    /// last moment its attachment was seen busy, in CLOCK_BOOTTIME (`now_ns`). Its hand-over
    /// is its own boot stamp when taken in this boot, unless this releaser saw it earlier;
    /// otherwise (another boot's, or an older agent's without one) when this releaser first
    /// saw it: across a reboot the whole wait counts from the restart, the safe side. Never
    /// this task's start, never the wall clock.
    pub(super) fn quiet_long_enough(
        &mut self,
        path: &Path,
        busy: bool,
        now_ns: u64,
        max_cooldown: Duration,
    ) -> bool {
        let boot_id = self.boot_id.as_deref();
        let Some(entry) = self.entries.get_mut(path) else {
            return false;
        };
        if busy {
            entry.last_busy_ns = Some(now_ns);
            return false;
        }
        let held_at = held_in_this_boot(&entry.request, boot_id)
            .map_or(entry.first_seen_ns, |at| at.min(entry.first_seen_ns));
        let since = held_at.max(entry.last_busy_ns.unwrap_or(0));
        let wait = u64::try_from(max_cooldown.as_nanos()).unwrap_or(u64::MAX);
        now_ns >= since.saturating_add(wait)
    }
}

#[cfg(test)]
mod tests;
