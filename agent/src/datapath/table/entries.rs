//! The table's entries: `IPQ_ADDRS` and its inlined exact copy `IPQ_SLOTS`, which the programs
//! probe before the hash map. The copy is also the table's own view of what `IPQ_ADDRS` holds
//! (no second copy on the heap). Both are written so that `IPQ_ADDRS` holds the old or the new
//! entry whenever a slot of the address is mid-write (the programs fall back to it then): a
//! new address goes into the copy first, a changed one into the hash map first, a removed one
//! leaves the copy first.

use std::collections::BTreeMap;

use ipq_api::CheckedMap;
use ipq_common::addr::{AddrEntry, AddrKey};

use super::{drift::MapDrift, opening};
use crate::datapath::{
    maps::AddrMap,
    slots::{SlotCells, SlotTable},
    strict::describe,
    DatapathError,
};

pub(super) struct Entries {
    addrs: AddrMap,
    copy: SlotTable,
}

/// What [`Entries::open`] found in the maps.
pub(super) struct Opened {
    pub entries: Entries,
    /// Every entry, the stricter of each address's two copies.
    pub held: BTreeMap<AddrKey, AddrEntry>,
    /// Where `IPQ_ADDRS` and `IPQ_SLOTS` disagreed (the stricter copy was kept).
    pub disagreeing: Vec<String>,
}

impl Entries {
    /// Opens the entries over the maps, merged where the copy is stricter (see [`opening`]),
    /// and makes `IPQ_SLOTS` hold exactly what `IPQ_ADDRS` then holds.
    pub(super) fn open(mut addrs: AddrMap, copy: SlotTable) -> Result<Opened, DatapathError> {
        let mut held: BTreeMap<_, _> = addrs.entries()?.into_iter().collect();
        copy.cells().settle();
        let disagreeing = opening::keep_stricter(&mut addrs, &copy, &mut held)?;
        let mut entries = Self { addrs, copy };
        entries.rebuild_copy(&held)?;
        Ok(Opened {
            entries,
            held,
            disagreeing,
        })
    }

    /// Makes `IPQ_SLOTS` hold exactly `IPQ_ADDRS`: a table of an earlier agent may lag (it
    /// was killed mid-write, or an older agent ran meanwhile and wrote only the hash map).
    /// Each slot is rewritten under the protocol, so programs attached meanwhile stay exact.
    fn rebuild_copy(
        &mut self,
        entries: &BTreeMap<AddrKey, AddrEntry>,
    ) -> Result<(), DatapathError> {
        let gone: Vec<AddrKey> = self
            .copy
            .iter()
            .map(|(addr, _)| addr)
            .filter(|addr| !entries.contains_key(addr))
            .collect();
        for addr in &gone {
            self.copy.remove(addr);
        }
        for (addr, entry) in entries {
            let stored = self.copy.get(addr);
            if stored.is_none_or(|stored| !entry.written_as(&stored)) {
                self.copy.put(addr, entry)?;
            }
        }
        Ok(())
    }

    /// The cells of `IPQ_SLOTS`: readers for the verification, the settling of half-done
    /// writes.
    pub(super) fn cells(&self) -> &SlotCells {
        self.copy.cells()
    }

    /// The entry of `addr` as written (with the stamps of its slot): O(1), no syscall.
    pub(super) fn get(&self, addr: &AddrKey) -> Option<AddrEntry> {
        self.copy.get(addr)
    }

    pub(super) fn len(&self) -> usize {
        self.copy.len()
    }

    /// Every entry as written (no syscall), in address order.
    pub(super) fn cached(&self) -> Vec<(AddrKey, AddrEntry)> {
        let mut all: Vec<_> = self.copy.iter().collect();
        all.sort_unstable_by_key(|(addr, _)| *addr);
        all
    }

    /// Every entry, with the kernel-written stamps as they are now.
    pub(super) fn read_all(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        let mut entries = self.addrs.entries()?;
        for (addr, entry) in &mut entries {
            merge_stamps(self.copy.get(addr), entry);
        }
        Ok(entries)
    }

    /// The entry of `addr` as the kernel has it now, with its stamps: one lookup.
    pub(super) fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        Ok(self.addrs.get(addr)?.map(|mut entry| {
            merge_stamps(self.copy.get(addr), &mut entry);
            entry
        }))
    }

    /// Writes `entry` into `IPQ_ADDRS` and `IPQ_SLOTS`, in the order that keeps the hash map
    /// holding the old or new entry while the slot is mid-write. A new address that fits in
    /// neither is refused as `Full`, with neither map changed.
    pub(super) fn store(
        &mut self,
        addr: AddrKey,
        entry: &AddrEntry,
        new: bool,
    ) -> Result<(), DatapathError> {
        if new {
            self.copy.put(&addr, entry)?;
            if let Err(e) = self.addrs.insert(&addr, entry) {
                self.copy.remove(&addr);
                return Err(e);
            }
        } else {
            self.addrs.insert(&addr, entry)?;
            self.copy.put(&addr, entry)?;
        }
        Ok(())
    }

    /// Removes `addr`: from the copy first (nothing to do if it holds none), then from
    /// `IPQ_ADDRS`.
    pub(super) fn remove(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        self.copy.remove(addr);
        self.addrs.remove(addr)
    }

    /// Looks at `addr` again (a suspect of the comparison), in `IPQ_ADDRS` then in its copy
    /// (which the protocol needs right while a slot is rewritten), and writes `want` back where
    /// the kernel still differs. Whether the copy was written.
    pub(super) fn recheck(
        &mut self,
        addr: &AddrKey,
        want: Option<&AddrEntry>,
        drift: &mut Vec<MapDrift>,
    ) -> bool {
        self.recheck_addr(addr, want, drift);
        self.recheck_copy(addr, want, drift)
    }

    fn recheck_addr(
        &mut self,
        addr: &AddrKey,
        want: Option<&AddrEntry>,
        drift: &mut Vec<MapDrift>,
    ) {
        let now = match self.addrs.get(addr) {
            Ok(now) => now,
            Err(e) => {
                drift.push(MapDrift {
                    map: CheckedMap::IpqAddrs,
                    key: addr.to_ip().to_string(),
                    found: "unreadable".to_owned(),
                    wanted: describe(want),
                    error: Some(e.to_string()),
                });
                return;
            }
        };
        if agrees(want, now.as_ref()) {
            // The reading predates one of the table's own writes.
            return;
        }
        let result = match want {
            Some(want) => {
                let mut entry = *want;
                if let Some(now) = &now {
                    entry.last_stale_ns = now.last_stale_ns;
                    entry.last_sample_ns = now.last_sample_ns;
                }
                self.addrs.insert(addr, &entry)
            }
            None => self.addrs.remove(addr),
        };
        drift.push(MapDrift {
            map: CheckedMap::IpqAddrs,
            key: addr.to_ip().to_string(),
            found: describe(now.as_ref()),
            wanted: describe(want),
            error: result.err().map(|e| e.to_string()),
        });
    }

    /// `IPQ_SLOTS`, probed through the table's own mapping. Whether it wrote.
    fn recheck_copy(
        &mut self,
        addr: &AddrKey,
        want: Option<&AddrEntry>,
        drift: &mut Vec<MapDrift>,
    ) -> bool {
        let held = self.copy.get(addr);
        if agrees(want, held.as_ref()) {
            return false;
        }
        let result = match want {
            Some(want) => self.copy.put(addr, want),
            None => {
                self.copy.remove(addr);
                Ok(())
            }
        };
        drift.push(MapDrift {
            map: CheckedMap::IpqSlots,
            key: addr.to_ip().to_string(),
            found: describe(held.as_ref()),
            wanted: describe(want),
            error: result.err().map(|e| e.to_string()),
        });
        true
    }

    /// Counts the copy's occupied slots again: another process writing the map adds or clears
    /// slots behind the table's count (O(slots), only after one).
    pub(super) fn recount(&mut self) {
        self.copy.recount();
    }
}

/// The programs stamp the copy they judged from: the slot (`slot`), or the hash-map entry while
/// the slot was being written. The newer stamp of each kind is the one that happened.
fn merge_stamps(slot: Option<AddrEntry>, entry: &mut AddrEntry) {
    if let Some(slot) = slot {
        entry.last_stale_ns = entry.last_stale_ns.max(slot.last_stale_ns);
        entry.last_sample_ns = entry.last_sample_ns.max(slot.last_sample_ns);
    }
}

/// Whether `held` is what the table writes as `want` (the programs' stamps aside).
fn agrees(want: Option<&AddrEntry>, held: Option<&AddrEntry>) -> bool {
    match (want, held) {
        (Some(want), Some(held)) => want.written_as(held),
        (None, None) => true,
        _ => false,
    }
}
