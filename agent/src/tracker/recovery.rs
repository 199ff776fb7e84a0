//! Bringing the registry back at start, and taking a netlink dump as the truth.

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use log::{error, info, warn};

use super::{decide, Tracker};
use crate::{
    api::model::RecoveryView,
    journal::{Journal, JournalError, Loaded, NewerJournal},
    netdev,
    netlink::NetState,
    registry::{entry, AddrRecord, Snapshot, SNAPSHOT_VERSION},
};

/// How the registry came back at start: from the journal, or (the journal missing or unusable)
/// rebuilt from the pinned maps; the API's name for it, which `ipq status` shows.
pub use ipq_api::RecoveredFrom as Recovery;

/// What the journal gave at start: its records (rebased onto this boot's clock), where they
/// came from, and what went wrong reading it, each a line of `ipq status`.
#[derive(Debug)]
pub(super) struct JournalReading {
    pub(super) records: Vec<AddrRecord>,
    pub(super) from: Recovery,
    pub(super) problems: Vec<String>,
}

/// Reads `Journal::load`'s answer (`path`: the journal's file; `newer`: a newer agent's journal
/// left beside) into the records to recover, with no I/O: a journal missing, corrupt or
/// unreadable leaves the pinned maps to rebuild from.
pub(super) fn read_journal(
    loaded: Result<Option<Loaded<AddrRecord>>, JournalError>,
    path: &Path,
    newer: Option<&NewerJournal>,
    now_mono_ns: u64,
) -> JournalReading {
    let mut problems = Vec::new();
    let (records, from) = match loaded {
        Ok(Some(loaded)) => {
            if let Some(torn) = &loaded.torn_tail {
                let problem = format!(
                    "journal {}: dropped a torn tail of {} bytes at byte {} (a write cut short \
                     by a crash, never acknowledged)",
                    path.display(),
                    torn.dropped,
                    torn.at
                );
                warn!("{problem}");
                problems.push(problem);
            }
            let mut snapshot = Snapshot {
                version: SNAPSHOT_VERSION,
                taken_at: loaded.written_mono_ns,
                records: loaded.records,
            };
            if !loaded.same_boot {
                // Monotonic stamps of another boot, carried over on the safe side: as if the
                // journal's last write were now, so that every deadline keeps at least the
                // time it had left then, counted from this start. The wall clock is not
                // asked how long the node was down: a step of it (NTP at boot, an RTC off by
                // hours) would end carried quarantines early.
                snapshot.rebase(loaded.written_mono_ns, now_mono_ns);
            }
            (snapshot.records, Recovery::Journal)
        }
        Ok(None) => {
            info!("journal: none yet in {}", path.display());
            (Vec::new(), Recovery::PinnedMaps)
        }
        Err(JournalError::Corrupt {
            path,
            reason,
            moved_to,
        }) => {
            let problem = format!(
                "journal {} is corrupt ({reason}); kept as {}",
                path.display(),
                moved_to.display()
            );
            error!("{problem}; rebuilding from the pinned maps");
            problems.push(problem);
            (Vec::new(), Recovery::PinnedMaps)
        }
        Err(e) => {
            error!("journal: {e}; rebuilding from the pinned maps");
            problems.push(format!("journal: {e}"));
            (Vec::new(), Recovery::PinnedMaps)
        }
    };
    if let Some(newer) = newer {
        let problem = format!(
            "journal {} was written by a newer ipq (format version {}; this agent writes {}): \
             left untouched for its return; this agent journals to {} meanwhile{}, and its \
             registry comes from there and the pinned maps",
            newer.path.display(),
            newer.version,
            crate::journal::VERSION,
            newer.beside.display(),
            newer
                .stale_set_aside
                .as_ref()
                .map_or(String::new(), |stale| format!(
                    " (its older copy there predates the newer agent's last write: kept as {})",
                    stale.display()
                )),
        );
        warn!("{problem}");
        problems.push(problem);
    }
    JournalReading {
        records,
        from,
        problems,
    }
}

/// The journal's records merged with what the pinned maps hold (`written`, as the table read
/// them when it opened: a second full read of the map, two syscalls per entry, would tell
/// nothing more): the merged records, the addresses where the maps changed what the journal
/// said, and where the two disagreed.
fn merge_with_maps(
    journal: Vec<AddrRecord>,
    written: Vec<(ipq_common::addr::AddrKey, ipq_common::addr::AddrEntry)>,
    settings: &crate::registry::RegistrySettings,
) -> (Vec<AddrRecord>, Vec<IpAddr>, Vec<String>) {
    let names: BTreeMap<u32, String> = netdev::interfaces()
        .map(|list| list.into_iter().collect())
        .unwrap_or_default();
    entry::merge(journal, written, netdev::monotonic_ns(), settings, &names)
}

impl Tracker {
    /// Brings the registry back from the journal as loaded (`Journal::load`'s answer: the
    /// agent reads it beside the datapath's load), merged with the pinned maps (see
    /// [`entry::merge`]: where they disagree, the stricter wins, and the disagreement is one
    /// of the recovery's problems in `ipq status`).
    /// `journal` is the one `loaded` came from: what the maps added to its records is staged
    /// in it, or it is set aside to be rewritten whole when the registry could not be restored.
    pub fn recover(
        &mut self,
        loaded: Result<Option<Loaded<AddrRecord>>, JournalError>,
        journal: &mut Journal,
    ) -> Recovery {
        let JournalReading {
            records,
            from: recovery,
            mut problems,
        } = read_journal(
            loaded,
            &journal.path(),
            journal.newer(),
            netdev::monotonic_ns(),
        );
        for line in self.sinks.enforcer.table().opened_disagreeing() {
            problems.push(format!("pinned maps at start: {line}"));
        }
        let (merged, adopted, disagreeing) = merge_with_maps(
            records,
            self.sinks.enforcer.table().cached(),
            self.core.registry.settings(),
        );
        problems.extend(disagreeing);
        let count = merged.len();
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: netdev::monotonic_ns(),
            records: merged,
        };
        match self.core.registry.lifecycle_mut().restore(snapshot) {
            Ok(effects) => {
                info!("registry recovered ({recovery:?}): {count} addresses");
                self.sinks.apply(&mut self.core, effects);
                // The journal already holds what it gave; only what the maps changed is new
                // (when the journal is rewritten anyway, it takes everything).
                self.core.registry.changes_mut().take_changed();
                journal.stage(adopted);
            }
            Err(e) => {
                let problem = format!("recovering the registry failed ({e}); started empty");
                error!("{problem}");
                problems.push(problem);
                journal.invalidate();
            }
        }
        self.recovered = Some(RecoveryView {
            from: recovery,
            addresses: self.core.registry.records().len() as u64,
            problems,
        });
        crate::heap::release_freed_memory();
        recovery
    }

    /// Takes a full netlink dump as the truth: attaches, claims what the routes say, and
    /// quarantines the addresses of holders whose interfaces went away while no agent ran.
    pub fn reconcile(&mut self, state: NetState) {
        let events = self.core.net.diff(&state);
        // The gauges once at the end: per event they would make a cold start with n links
        // O(n²).
        for event in events {
            self.apply_event(event);
        }
        let holders: Vec<u32> = self
            .core
            .registry
            .records()
            .iter()
            .flat_map(|r| r.live_holders().map(|h| h.ifindex).collect::<Vec<_>>())
            .collect();
        for ifindex in holders {
            if !self.core.net.has_link(ifindex) {
                let result = self.core.registry.lifecycle_mut().holder_gone(ifindex);
                let effects = decide::settled(result, "holder gone while the agent was down");
                self.sinks.apply(&mut self.core, effects);
            }
        }
        // The datapath mirrors the registry exactly, whatever an earlier agent left.
        self.sinks.hand_written.clear();
        self.sinks
            .enforcer
            .sync(self.core.registry.records().datapath_entries());
        self.sinks
            .observe_gauges(&self.core.registry, &self.metrics);
        self.protection.observe();
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
