//! The address table: `IPQ_ADDRS` together with the three accelerators derived from it, its
//! inlined exact copy (`IPQ_SLOTS`, which the programs probe before the hash map), the
//! per-interface fast-path slots (`IPQ_IFACES`) and the quarantine Bloom filter (`IPQ_QBLOOM`).
//!
//! Each change costs O(log n) in the registry size: an index of every interface's
//! fast-path-eligible addresses gives a slot's listing without scanning the table, and the
//! filter keeps a reference count per (word, bits) it sets.
//!
//! The accelerators may only ever make a packet skip a lookup that would have passed it. Every
//! change is therefore written in an order that keeps that true at each step: an address leaves
//! a fast-path slot before its entry stops passing, and joins one only after; a bitmap bit is set
//! before an entry becomes quarantined, and cleared only after it stops being so. The copy
//! in `IPQ_SLOTS` is written so that `IPQ_ADDRS` holds the old or the new entry whenever a
//! slot of the address is mid-write (the programs fall back to it then): a new address goes
//! into the copy first, a changed one into the hash map first, a removed one leaves the copy
//! first.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, NO_IFINDEX},
    iface::IfaceEntry,
    verdict::{workload_receives, workload_sends},
};

mod accelerators;
mod drift;
mod opening;

use accelerators::affected_interfaces;
pub use drift::{MapDrift, MapsCheck};

use super::{
    intent::{IntentFeed, IntentMirror},
    maps::{AddrMap, IfaceSlots, QuarantineFilter},
    slots::SlotTable,
    DatapathError,
};

/// Whether packets of `ifindex` carrying the address of `entry` may skip the hash lookup: the
/// verdict functions pass them in both directions.
pub fn fast_path_eligible(ifindex: u32, entry: &AddrEntry) -> bool {
    ifindex != NO_IFINDEX
        && entry.holder_ifindex == ifindex
        && workload_sends(ifindex, entry).is_none()
        && workload_receives(ifindex, entry).is_none()
}

fn is_quarantined(entry: &AddrEntry) -> bool {
    entry.state() == Some(AddrState::Quarantined)
}

pub struct AddressTable {
    addrs: AddrMap,
    /// `IPQ_SLOTS`: every entry of `addrs`, probed by the programs without a helper call. It is
    /// also this table's own view of what `addrs` holds (no second copy on the heap).
    copy: SlotTable,
    slots: IfaceSlots,
    filter: QuarantineFilter,
    /// For each interface, the addresses it may list in its fast-path slot (in key order: the
    /// slot lists the first [`IFACE_OWN_ADDRS`]). Kept in step with `copy`.
    eligible: HashMap<u32, BTreeSet<AddrKey>>,
    /// Which interface each used slot describes.
    slot_owner: HashMap<u32, u32>,
    /// How many quarantined addresses set each (word, bits) pair of the filter.
    filter_refs: HashMap<(u32, u64), u32>,
    filter_words: Vec<u64>,
    /// Words of the filter minus one: the map's size, fixed at load.
    filter_mask: u32,
    /// Every write this table makes, for the verification's mirror: the maps themselves can
    /// be written by any process holding a pin, so the verification compares them (off the
    /// owner loop) with what was written here ([`super::map_check`]).
    feed: IntentFeed,
    /// That mirror until the verification takes it ([`Self::take_mirror`]).
    mirror: Option<IntentMirror>,
    /// Where `IPQ_ADDRS` and `IPQ_SLOTS` disagreed when the table opened (the stricter copy
    /// was kept), for the start-up report.
    opened_disagreeing: Vec<String>,
}

impl AddressTable {
    /// Opens the table over the maps and rebuilds the accelerators from `IPQ_ADDRS`, merged
    /// with `IPQ_SLOTS` where the copy is stricter (see [`opening`]): the slots and bitmap of a
    /// previous agent are rewritten, and no copy another tool loosened loosens the other.
    pub fn open(
        mut addrs: AddrMap,
        copy: SlotTable,
        slots: IfaceSlots,
        filter: QuarantineFilter,
    ) -> Result<Self, DatapathError> {
        let mut entries: BTreeMap<_, _> = addrs.entries()?.into_iter().collect();
        copy.cells().settle();
        let opened_disagreeing = opening::keep_stricter(&mut addrs, &copy, &mut entries)?;
        let mut eligible: HashMap<u32, BTreeSet<AddrKey>> = HashMap::new();
        for (addr, entry) in &entries {
            if fast_path_eligible(entry.holder_ifindex, entry) {
                eligible
                    .entry(entry.holder_ifindex)
                    .or_default()
                    .insert(*addr);
            }
        }
        let words = filter.len();
        let mut table = Self {
            addrs,
            copy,
            slots,
            filter,
            eligible,
            slot_owner: HashMap::new(),
            filter_refs: HashMap::new(),
            filter_words: vec![0; words as usize],
            filter_mask: words.saturating_sub(1),
            feed: IntentFeed::new(),
            mirror: None,
            opened_disagreeing,
        };
        table.rebuild_copy(&entries)?;
        table.rebuild_accelerators()?;
        let slots: Vec<IfaceEntry> = (0..table.slots.len())
            .map(|slot| table.expected_slot(slot))
            .collect();
        table.mirror = Some(table.feed.mirror(
            entries.iter(),
            slots.into_iter(),
            &table.filter_words,
            table.copy.cells().reader(),
        ));
        Ok(table)
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

    fn rebuild_accelerators(&mut self) -> Result<(), DatapathError> {
        let quarantined: Vec<AddrKey> = self
            .copy
            .iter()
            .filter(|(_, e)| is_quarantined(e))
            .map(|(k, _)| k)
            .collect();
        for addr in &quarantined {
            self.filter_ref(addr)?;
        }
        // Clear the words no current entry sets (left by a previous agent).
        for word in 0..self.filter.len() {
            self.filter
                .set_word(word, self.filter_words[word as usize])?;
        }
        let mut holders: Vec<u32> = self.copy.iter().map(|(_, e)| e.holder_ifindex).collect();
        holders.sort_unstable();
        holders.dedup();
        for slot in 0..self.slots.len() {
            let current = self.slots.get(slot)?;
            if current.ifindex != 0 {
                self.slots.set(slot, &IfaceEntry::default())?;
            }
        }
        for ifindex in holders {
            self.write_slot(ifindex, None)?;
        }
        Ok(())
    }

    /// The mirror of what this table wrote, for the verification to own off the owner loop
    /// (once; `None` after).
    pub fn take_mirror(&mut self) -> Option<IntentMirror> {
        self.mirror.take()
    }

    /// The entry of `addr` as written (with the stamps of its slot): O(1), no syscall.
    pub fn get(&self, addr: &AddrKey) -> Option<AddrEntry> {
        self.copy.get(addr)
    }

    pub fn len(&self) -> usize {
        self.copy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copy.len() == 0
    }

    /// Every entry, with the kernel-written stamps as they are now.
    pub fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        let mut entries = self.addrs.entries()?;
        for (addr, entry) in &mut entries {
            self.merge_stamps(addr, entry);
        }
        Ok(entries)
    }

    /// The programs stamp the copy they judged from: the slot, or the hash-map entry while
    /// the slot was being written. The newer stamp of each kind is the one that happened.
    fn merge_stamps(&self, addr: &AddrKey, entry: &mut AddrEntry) {
        if let Some(slot) = self.copy.get(addr) {
            entry.last_stale_ns = entry.last_stale_ns.max(slot.last_stale_ns);
            entry.last_sample_ns = entry.last_sample_ns.max(slot.last_sample_ns);
        }
    }

    /// Every entry as written (no syscall), in address order.
    pub fn cached(&self) -> Vec<(AddrKey, AddrEntry)> {
        let mut all: Vec<_> = self.copy.iter().collect();
        all.sort_unstable_by_key(|(addr, _)| *addr);
        all
    }

    /// The entry of `addr` as the kernel has it now, with its stamps: one lookup.
    pub fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        Ok(self.addrs.get(addr)?.map(|mut entry| {
            self.merge_stamps(addr, &mut entry);
            entry
        }))
    }

    /// Writes the entry of `addr`, keeping the kernel-written stamps.
    pub fn put(&mut self, addr: AddrKey, mut entry: AddrEntry) -> Result<(), DatapathError> {
        let old = self.copy.get(&addr);
        // The programs' stamps of an entry this table holds are kept; an address it does not
        // hold has none (this table is the map's one writer), so a new one costs no lookup.
        if old.is_some() {
            if let Some(current) = self.kernel_entry(&addr)? {
                entry.last_stale_ns = current.last_stale_ns;
                entry.last_sample_ns = current.last_sample_ns;
            }
        }
        let affected = affected_interfaces(old.as_ref(), Some(&entry));

        // 1. Leave the fast path where the new entry no longer passes.
        for &ifindex in &affected {
            let keep = old.is_some_and(|o| fast_path_eligible(ifindex, &o))
                && fast_path_eligible(ifindex, &entry);
            self.write_slot(ifindex, Some((addr, keep)))?;
        }
        // 2. Make the uplink look before the entry says quarantined.
        let newly_quarantined = is_quarantined(&entry) && !old.as_ref().is_some_and(is_quarantined);
        if newly_quarantined {
            self.filter_ref(&addr)?;
        }
        // 3. The authoritative write and its copy.
        if let Err(e) = self.store(addr, &entry, old.is_none()) {
            if newly_quarantined {
                self.filter_unref(&addr)?;
            }
            for &ifindex in &affected {
                self.write_slot(ifindex, None)?;
            }
            return Err(e);
        }
        self.record(addr, old.as_ref(), Some(entry));
        // 4. Stop looking once it no longer is.
        if old.as_ref().is_some_and(is_quarantined) && !is_quarantined(&entry) {
            self.filter_unref(&addr)?;
        }
        // 5. Join the fast path where the new entry passes.
        for &ifindex in &affected {
            self.write_slot(ifindex, None)?;
        }
        Ok(())
    }

    /// Removes `addr` (it becomes Free), returning what it was.
    pub fn remove(&mut self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        let Some(old) = self.copy.get(addr) else {
            self.addrs.remove(addr)?;
            self.feed.addr(*addr, None);
            return Ok(None);
        };
        let affected = affected_interfaces(Some(&old), None);
        // A free address passes everywhere, so the slots may follow the map.
        self.copy.remove(addr);
        self.addrs.remove(addr)?;
        self.feed.addr(*addr, None);
        self.record(*addr, Some(&old), None);
        if is_quarantined(&old) {
            self.filter_unref(addr)?;
        }
        for &ifindex in &affected {
            self.write_slot(ifindex, None)?;
        }
        Ok(Some(old))
    }

    /// Writes `entry` into `IPQ_ADDRS` and `IPQ_SLOTS`, in the order that keeps the hash map
    /// holding the old or new entry while the slot is mid-write. A new address that fits in
    /// neither is refused as `Full`, with neither map changed.
    fn store(&mut self, addr: AddrKey, entry: &AddrEntry, new: bool) -> Result<(), DatapathError> {
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

    /// Updates the eligibility index with the change of `addr`.
    fn record(&mut self, addr: AddrKey, old: Option<&AddrEntry>, new: Option<AddrEntry>) {
        if let Some(old) = old {
            if fast_path_eligible(old.holder_ifindex, old) {
                if let Some(own) = self.eligible.get_mut(&old.holder_ifindex) {
                    own.remove(&addr);
                    if own.is_empty() {
                        self.eligible.remove(&old.holder_ifindex);
                    }
                }
            }
        }
        if let Some(entry) = new {
            self.feed.addr(addr, Some(&entry));
            if fast_path_eligible(entry.holder_ifindex, &entry) {
                self.eligible
                    .entry(entry.holder_ifindex)
                    .or_default()
                    .insert(addr);
            }
        }
    }
}
