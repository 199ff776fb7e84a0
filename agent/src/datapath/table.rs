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
//!
//! The table is the composition root of three parts, each owning its maps and state:
//! [`entries`] (`IPQ_ADDRS` and its copy `IPQ_SLOTS`), [`fast_path`] (`IPQ_IFACES` and the index
//! of eligible addresses) and [`bloom`] (`IPQ_QBLOOM` and its reference counts). The order of
//! their writes for one change is the table's ([`AddressTable::put`], [`AddressTable::remove`]).

use std::collections::BTreeMap;

use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, NO_IFINDEX},
    verdict::{workload_receives, workload_sends},
};

mod bloom;
pub(crate) mod by_interface;
mod drift;
mod entries;
mod fast_path;
mod opening;

pub use drift::{MapDrift, MapsCheck};

use self::{
    bloom::QuarantineBits,
    entries::{Entries, Opened},
    fast_path::{affected_interfaces, FastPath},
};
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
    entries: Entries,
    fast_path: FastPath,
    bloom: QuarantineBits,
    /// Every write this table makes, for the verification's mirror: the maps themselves can
    /// be written by any process holding a pin, so the verification compares them (off the
    /// owner loop) with what was written here ([`super::map_check`]). The parts hold clones
    /// of it, one feed in the order written.
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
        addrs: AddrMap,
        copy: SlotTable,
        slots: IfaceSlots,
        filter: QuarantineFilter,
    ) -> Result<Self, DatapathError> {
        let Opened {
            entries,
            held,
            disagreeing,
        } = Entries::open(addrs, copy)?;
        let feed = IntentFeed::new();
        let mut table = Self {
            entries,
            fast_path: FastPath::new(slots, &held, feed.clone()),
            bloom: QuarantineBits::new(filter, feed.clone()),
            feed,
            mirror: None,
            opened_disagreeing: disagreeing,
        };
        table.rebuild_accelerators(&held)?;
        by_interface::rebuild(held.iter());
        table.mirror = Some(table.feed.mirror(
            held.iter(),
            table.fast_path.expected_all().into_iter(),
            table.bloom.words(),
            table.entries.cells().reader(),
        ));
        Ok(table)
    }

    /// Rewrites the filter and the fast-path slots for `held`, what the entries now hold.
    fn rebuild_accelerators(
        &mut self,
        held: &BTreeMap<AddrKey, AddrEntry>,
    ) -> Result<(), DatapathError> {
        self.bloom.rebuild(
            held.iter()
                .filter(|(_, e)| is_quarantined(e))
                .map(|(addr, _)| addr),
        )?;
        let mut holders: Vec<u32> = held.values().map(|e| e.holder_ifindex).collect();
        holders.sort_unstable();
        holders.dedup();
        self.fast_path.rebuild(&holders)
    }

    /// The mirror of what this table wrote, for the verification to own off the owner loop
    /// (once; `None` after).
    pub fn take_mirror(&mut self) -> Option<IntentMirror> {
        self.mirror.take()
    }

    /// The entry of `addr` as written (with the stamps of its slot): O(1), no syscall.
    pub fn get(&self, addr: &AddrKey) -> Option<AddrEntry> {
        self.entries.get(addr)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// Every entry, with the kernel-written stamps as they are now.
    pub fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        self.entries.read_all()
    }

    /// Every entry as written (no syscall), in address order.
    pub fn cached(&self) -> Vec<(AddrKey, AddrEntry)> {
        self.entries.cached()
    }

    /// The entry of `addr` as the kernel has it now, with its stamps: one lookup.
    pub fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        self.entries.kernel_entry(addr)
    }

    /// Writes the entry of `addr`, keeping the kernel-written stamps.
    pub fn put(&mut self, addr: AddrKey, mut entry: AddrEntry) -> Result<(), DatapathError> {
        let old = self.entries.get(&addr);
        // The programs' stamps of an entry this table holds are kept; an address it does not
        // hold has none (this table is the map's one writer), so a new one costs no lookup.
        if old.is_some() {
            if let Some(current) = self.entries.kernel_entry(&addr)? {
                entry.last_stale_ns = current.last_stale_ns;
                entry.last_sample_ns = current.last_sample_ns;
            }
        }
        let affected = affected_interfaces(old.as_ref(), Some(&entry));

        // 1. Leave the fast path where the new entry no longer passes.
        for &ifindex in &affected {
            let keep = old.is_some_and(|o| fast_path_eligible(ifindex, &o))
                && fast_path_eligible(ifindex, &entry);
            self.fast_path.write(ifindex, Some((addr, keep)))?;
        }
        // 2. Make the uplink look before the entry says quarantined.
        let newly_quarantined = is_quarantined(&entry) && !old.as_ref().is_some_and(is_quarantined);
        if newly_quarantined {
            self.bloom.add(&addr)?;
        }
        // 3. The authoritative write and its copy.
        if let Err(e) = self.entries.store(addr, &entry, old.is_none()) {
            if newly_quarantined {
                self.bloom.remove(&addr)?;
            }
            for &ifindex in &affected {
                self.fast_path.write(ifindex, None)?;
            }
            return Err(e);
        }
        self.feed.addr(addr, Some(&entry));
        self.fast_path.record(addr, old.as_ref(), Some(&entry));
        by_interface::record(addr, old.as_ref(), Some(&entry));
        // 4. Stop looking once it no longer is.
        if old.as_ref().is_some_and(is_quarantined) && !is_quarantined(&entry) {
            self.bloom.remove(&addr)?;
        }
        // 5. Join the fast path where the new entry passes.
        for &ifindex in &affected {
            self.fast_path.write(ifindex, None)?;
        }
        Ok(())
    }

    /// Removes `addr` (it becomes Free), returning what it was.
    pub fn remove(&mut self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        let old = self.entries.get(addr);
        // A free address passes everywhere, so the slots may follow the map.
        self.entries.remove(addr)?;
        self.feed.addr(*addr, None);
        let Some(old) = old else {
            return Ok(None);
        };
        self.fast_path.record(*addr, Some(&old), None);
        by_interface::record(*addr, Some(&old), None);
        if is_quarantined(&old) {
            self.bloom.remove(addr)?;
        }
        for &ifindex in &affected_interfaces(Some(&old), None) {
            self.fast_path.write(ifindex, None)?;
        }
        Ok(Some(old))
    }
}
