//! Bringing the registry back at start, and taking a netlink dump as the truth.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::{AddrEntry, AddrKey, AddrState, FLAG_OBSERVE_ONLY, NO_IFINDEX};
use log::{error, info, warn};

use super::Tracker;
use crate::{
    journal::JournalError,
    netdev,
    netlink::NetState,
    registry::{
        datapath_entry, AddrRecord, AddrStatus, Holder, RegistrySettings, Snapshot,
        SNAPSHOT_VERSION,
    },
};

/// How the registry came back at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// From the journal.
    Journal,
    /// The journal was missing or unusable: rebuilt from the pinned maps.
    PinnedMaps,
}

/// A holder whose interface ipq cannot know any more (rebuilt from a bare datapath entry).
const UNKNOWN_IFINDEX: u32 = u32::MAX;

impl Tracker {
    /// Brings the registry back from the journal, merged with the pinned maps.
    ///
    /// The maps are written before the journal, so where an entry disagrees with the journal
    /// the map is the more recent truth (an agent killed between the two writes, or an
    /// operator's break-glass write): its enforcement is adopted, with the journal's richer
    /// holder identity where the interfaces match. A journal entry the maps lack is kept:
    /// maps are lost on reboot, and a quarantine must not be.
    pub fn recover(&mut self) -> Recovery {
        let (journal, recovery) = match self.journal.load() {
            Ok(Some(loaded)) => {
                if let Some(torn) = &loaded.torn_tail {
                    warn!(
                        "journal {}: dropped a torn tail of {} bytes at byte {} (a write cut \
                         short by a crash, never acknowledged)",
                        self.journal.path().display(),
                        torn.dropped,
                        torn.at
                    );
                }
                let mut snapshot = Snapshot {
                    version: SNAPSHOT_VERSION,
                    taken_at: loaded.written_mono_ns,
                    records: loaded.records,
                };
                if !loaded.same_boot {
                    // Monotonic stamps of another boot: carry them over by wall-clock time.
                    let now_unix_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let elapsed_ns = now_unix_ms.saturating_sub(loaded.written_unix_ms) * 1_000_000;
                    let written_now = netdev::monotonic_ns().saturating_sub(elapsed_ns);
                    snapshot.rebase(loaded.written_mono_ns, written_now);
                }
                (snapshot.records, Recovery::Journal)
            }
            Ok(None) => {
                info!("journal: none yet in {}", self.journal.path().display());
                (Vec::new(), Recovery::PinnedMaps)
            }
            Err(JournalError::Corrupt {
                path,
                reason,
                moved_to,
            }) => {
                error!(
                    "journal {} is corrupt ({reason}); kept as {}; rebuilding from the pinned \
                     maps",
                    path.display(),
                    moved_to.display()
                );
                (Vec::new(), Recovery::PinnedMaps)
            }
            Err(e) => {
                error!("journal: {e}; rebuilding from the pinned maps");
                (Vec::new(), Recovery::PinnedMaps)
            }
        };
        if let Some(newer) = self.journal.newer() {
            warn!(
                "journal {} was written by a newer ipq (format version {}; this agent writes \
                 {}): left untouched for its return; this agent journals to {} meanwhile{}, \
                 and its registry comes from there and the pinned maps",
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
        }
        let (merged, adopted) = self.merge_with_maps(journal);
        let count = merged.len();
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: netdev::monotonic_ns(),
            records: merged,
        };
        match self.registry.restore(snapshot) {
            Ok(effects) => {
                info!("registry recovered ({recovery:?}): {count} addresses");
                self.apply_effects(effects);
                // The journal already holds what it gave; only what the maps changed is new
                // (when the journal is rewritten anyway, it takes everything).
                self.registry.take_changed();
                self.journal.stage(adopted);
            }
            Err(e) => {
                error!("recovering the registry failed ({e}); starting empty");
                self.journal.invalidate();
            }
        }
        crate::heap::release_freed_memory();
        recovery
    }

    /// The merged records, and the addresses where the maps changed what the journal said.
    fn merge_with_maps(&self, journal: Vec<AddrRecord>) -> (Vec<AddrRecord>, Vec<IpAddr>) {
        let mut records: BTreeMap<IpAddr, AddrRecord> = journal
            .into_iter()
            .map(|r| (r.addr.to_canonical(), r))
            .collect();
        // As the table read them from the pinned map when it opened, a moment ago: a second
        // full read of the map (two syscalls per entry) would tell nothing more.
        let entries = self.datapath.table().cached();
        let mut adopted = Vec::new();
        let now = netdev::monotonic_ns();
        let settings = *self.registry.settings();
        let names: BTreeMap<u32, String> = netdev::interfaces()
            .map(|list| list.into_iter().collect())
            .unwrap_or_default();
        for (key, entry) in entries {
            let addr = key.to_ip();
            let known = records.get(&addr);
            if let Some(known) = known.filter(|r| same_enforcement(&datapath_entry(r), &entry)) {
                // The journal agrees; an observe-only flag only the map has (a journal written
                // before records carried it) is kept: observation never becomes enforcement.
                if entry.flags & FLAG_OBSERVE_ONLY != 0 && !known.observe_only {
                    if let Some(record) = records.get_mut(&addr) {
                        record.observe_only = true;
                        adopted.push(addr);
                    }
                }
                continue;
            }
            if let Some(mut record) = record_from_entry(addr, &entry, now, &settings, &names) {
                if let Some(known) = known {
                    keep_identities(&mut record, known);
                    record.observe_only |= known.observe_only;
                    warn!(
                        "{addr}: the datapath disagrees with the journal; adopting the datapath's"
                    );
                }
                records.insert(addr, record);
                adopted.push(addr);
            }
        }
        (records.into_values().collect(), adopted)
    }

    /// Takes a full netlink dump as the truth: attaches, claims what the routes say, and
    /// quarantines the addresses of holders whose interfaces went away while no agent ran.
    pub fn reconcile(&mut self, state: NetState) {
        let events = self.net.diff(&state);
        // The gauges once at the end: per event they would make a cold start with n links
        // O(n²).
        for event in events {
            self.apply_event(event);
        }
        let holders: Vec<u32> = self
            .registry
            .iter()
            .flat_map(|r| r.live_holders().map(|h| h.ifindex).collect::<Vec<_>>())
            .collect();
        for ifindex in holders {
            if !self.net.has_link(ifindex) {
                let result = self.registry.holder_gone(ifindex);
                self.apply(result, "holder gone while the agent was down");
            }
        }
        // The datapath mirrors the registry exactly, whatever an earlier agent left.
        self.sync_datapath();
        self.update_gauges();
        self.observe_protection();
    }

    /// Rewrites every datapath entry from the registry, removing what it does not hold.
    fn sync_datapath(&mut self) {
        let wanted = self.registry.datapath_entries();
        let present = match self.datapath.table().entries() {
            Ok(entries) => entries,
            Err(e) => {
                error!("reading the address map: {e}");
                return;
            }
        };
        let mut in_kernel = std::collections::HashMap::with_capacity(present.len());
        for (key, entry) in present {
            if !wanted.contains_key(&key.to_ip()) {
                if let Err(e) = self.datapath.table_mut().remove(&key) {
                    error!("{}: removing a stale datapath entry: {e}", key.to_ip());
                }
            } else {
                in_kernel.insert(key.to_ip(), entry);
            }
        }
        for (addr, entry) in wanted {
            // What the kernel holds already (an agent restart: nearly everything) is not
            // written again; what differs (a break-glass write) is.
            if !in_kernel
                .get(&addr)
                .is_some_and(|e| same_written(e, &entry))
            {
                self.put_entry(addr, entry);
            }
        }
    }

    /// Writes one datapath entry, as the registry derived it (observe-only flag included),
    /// unless the table already holds it as written (O(1), no syscall).
    pub(super) fn write_entry(&mut self, addr: IpAddr, entry: AddrEntry) {
        let current = self.datapath.table().get(&AddrKey::from(addr));
        if !current.is_some_and(|current| same_written(&current, &entry)) {
            self.put_entry(addr, entry);
        }
    }

    fn put_entry(&mut self, addr: IpAddr, entry: AddrEntry) {
        if let Err(e) = self.datapath.table_mut().put(AddrKey::from(addr), entry) {
            error!("{addr}: datapath write failed, enforcement may lag the registry: {e}");
        }
    }
}

/// Whether two datapath entries hold the same agent-written fields (the kernel's stamps aside).
fn same_written(a: &AddrEntry, b: &AddrEntry) -> bool {
    same_enforcement(a, b) && a.flags == b.flags && a.since_ns == b.since_ns
}

/// Whether two datapath entries enforce the same thing (ignoring the stamps).
fn same_enforcement(a: &AddrEntry, b: &AddrEntry) -> bool {
    a.state == b.state
        && a.holder_ifindex == b.holder_ifindex
        && a.fenced_ifindex == b.fenced_ifindex
}

/// Gives `adopted` the identities (container, pod, names) `known` had for the same interfaces.
fn keep_identities(adopted: &mut AddrRecord, known: &AddrRecord) {
    let known_holders: Vec<Holder> = known
        .status
        .holder()
        .into_iter()
        .chain(known.fenced())
        .chain(known.blocked_claimant())
        .chain(known.displaced().iter())
        .cloned()
        .collect();
    let restore = |h: &mut Holder| {
        if let Some(k) = known_holders.iter().find(|k| k.ifindex == h.ifindex) {
            *h = k.clone();
        }
    };
    match &mut adopted.status {
        AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => restore(holder),
        AddrStatus::Quarantined { .. } => {}
    }
    if let Some(fenced) = adopted.fenced_mut() {
        restore(fenced);
    }
}

/// A registry record for a bare datapath entry: all that is left when the journal is gone.
/// The entry's observe-only flag is the registry's own (it derives the flag from its record),
/// so it comes back with the record.
fn record_from_entry(
    addr: IpAddr,
    entry: &AddrEntry,
    now: u64,
    settings: &RegistrySettings,
    names: &BTreeMap<u32, String>,
) -> Option<AddrRecord> {
    let since = entry.since_ns.min(now);
    let holder = |ifindex: u32| {
        let name = names
            .get(&ifindex)
            .cloned()
            .unwrap_or_else(|| format!("if{ifindex}"));
        Holder::new(ifindex, name)
    };
    // A holder fenced on its own address is a Draining holder another machine claimed it from.
    let fenced = (entry.fenced_ifindex != NO_IFINDEX).then(|| holder(entry.fenced_ifindex));
    let status = match entry.state()? {
        AddrState::Active if entry.holder_ifindex != NO_IFINDEX => AddrStatus::Active {
            holder: holder(entry.holder_ifindex),
            since,
        },
        AddrState::Draining if entry.holder_ifindex != NO_IFINDEX => AddrStatus::Draining {
            holder: holder(entry.holder_ifindex),
            since,
        },
        AddrState::Quarantined => {
            let last_stale = (entry.last_stale_ns != 0).then_some(entry.last_stale_ns.min(now));
            AddrStatus::Quarantined {
                since,
                until: settings.release_at(since, last_stale),
                last_stale,
                previous: Holder::new(UNKNOWN_IFINDEX, "unknown (rebuilt from the datapath)"),
            }
        }
        _ => return None,
    };
    let mut record = AddrRecord::new(addr, status);
    record.set_fenced(fenced);
    record.observe_only = entry.flags & FLAG_OBSERVE_ONLY != 0;
    Some(record)
}
