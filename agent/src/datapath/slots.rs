//! The user side of `IPQ_SLOTS` (the table and its protocol: `ipq_common::slots`): a bucketed
//! cuckoo table the agent writes through a shared mapping of the map, slot by slot, while the
//! programs read it on every CPU.
//!
//! Every write follows the protocol the programs check: the first bucket's `version` of the
//! address is odd around any write of a slot holding (or about to hold) it, and a slot's `seq`
//! is odd around the write of its content. Whoever calls this writes `IPQ_ADDRS` so that it
//! holds the address's old or new entry whenever one of its slots is being written (the
//! programs fall back to it then).
//!
//! Three parts: [`SlotCells`] (the shared mapping of the pinned map, its meta element, readers
//! for other threads, the settling of half-done writes), [`SlotLayout`] (the buckets and the
//! keyed hash that say where an address may live) and [`SlotTable`] (which slot holds each
//! address, and the moves that make room for a new one).

use std::sync::atomic::AtomicU32;

use aya::maps::MapData;

use ipq_common::addr::{AddrEntry, AddrKey};
#[cfg(test)]
use ipq_common::slots::SLOT_WAYS;

use super::DatapathError;

mod cell;
mod layout;
mod mapping;

use cell::odd_around;
pub use cell::SlotCell;
pub use layout::SlotLayout;
pub use mapping::{CellRead, SlotCells, SlotsReader};

/// Slots to visit at most when an insert must move others; ≥ the 8 of the first step.
const MOVE_SEARCH_SLOTS: usize = 512;

/// The cuckoo table in the cells: which slot holds each address, and the moves that make room
/// for a new one, every write under the protocol.
pub struct SlotTable {
    cells: SlotCells,
    layout: SlotLayout,
    len: usize,
    /// Occupants moved to make room, ever (tests check that their races cover moves).
    moves: u64,
}

impl SlotTable {
    /// Maps the table of `map`. A table whose meta is set keeps its seed (`expected`, the seed
    /// the programs were loaded with, must then be the same); a new table is cleared and given
    /// `expected`. Only the loader, which knows the programs' seed, may set a table up.
    pub fn open(map: MapData, expected: Option<u64>) -> Result<Self, DatapathError> {
        let (cells, buckets) = SlotCells::map(map)?;
        let layout = cells.adopt(buckets, expected)?;
        let len = cells.slots().iter().filter(|c| c.occupied()).count();
        Ok(Self {
            cells,
            layout,
            len,
            moves: 0,
        })
    }

    /// A table on the heap (leaked, so that test readers may share it), for unit tests.
    #[cfg(test)]
    pub fn on_heap(buckets: u32, seed: u64) -> Self {
        let cells = SlotCells::leaked(Box::leak(
            (0..buckets * SLOT_WAYS + 1)
                .map(|_| SlotCell::default())
                .collect(),
        ));
        let layout = cells
            .adopt(buckets, Some(seed))
            .expect("a new table takes its seed");
        Self {
            cells,
            layout,
            len: 0,
            moves: 0,
        }
    }

    /// The cells under the table: readers for other threads, and the settling of writes
    /// another process left half done.
    pub fn cells(&self) -> &SlotCells {
        &self.cells
    }

    pub fn layout(&self) -> SlotLayout {
        self.layout
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Occupants moved between their buckets to make room, since the table was opened.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// The cell holding the version of `key` (the first slot of its first bucket).
    fn version_of(&self, key: &AddrKey) -> &AtomicU32 {
        &self.cells.slots()[self.layout.version_slot(key)].version
    }

    fn find(&self, key: &AddrKey) -> Option<usize> {
        let (first, second) = self.layout.buckets_of(key);
        let cells = self.cells.slots();
        SlotLayout::slot_range(first)
            .chain(SlotLayout::slot_range(second))
            .find(|&i| cells[i].occupied() && cells[i].key() == *key)
    }

    /// The entry of `key` with the stamps the programs wrote into its slot.
    pub fn get(&self, key: &AddrKey) -> Option<AddrEntry> {
        self.find(key).map(|i| self.cells.slots()[i].entry())
    }

    /// Writes `entry` for `key`. An existing slot keeps its kernel-written stamps; a new one
    /// takes those of `entry`. Fails only when neither bucket can make room.
    pub fn put(&mut self, key: &AddrKey, entry: &AddrEntry) -> Result<(), DatapathError> {
        debug_assert!(entry.state != 0, "state 0 marks an empty slot");
        let cells = self.cells.slots();
        if let Some(i) = self.find(key) {
            let cell = &cells[i];
            odd_around(self.version_of(key), || {
                odd_around(&cell.seq, || cell.store(None, entry, false))
            });
            return Ok(());
        }
        let path = self
            .room_for(key)
            .ok_or(DatapathError::Full { addr: key.to_ip() })?;
        // Move the occupants along the path, last first, each into the free slot after it.
        for pair in path.windows(2).rev() {
            self.relocate(pair[0], pair[1]);
            self.moves += 1;
        }
        let cell = &cells[path[0]];
        odd_around(self.version_of(key), || {
            odd_around(&cell.seq, || cell.store(Some(key), entry, true))
        });
        self.len += 1;
        Ok(())
    }

    /// Removes `key`, returning its entry (with stamps) if it was there.
    pub fn remove(&mut self, key: &AddrKey) -> Option<AddrEntry> {
        let i = self.find(key)?;
        let cell = &self.cells.slots()[i];
        let old = cell.entry();
        odd_around(self.version_of(key), || {
            odd_around(&cell.seq, || clear(cell))
        });
        self.len -= 1;
        Some(old)
    }

    /// Every stored address and entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (AddrKey, AddrEntry)> + '_ {
        self.cells
            .slots()
            .iter()
            .filter(|c| c.occupied())
            .map(|c| (c.key(), c.entry()))
    }

    /// Counts the occupied slots again: another process writing the map adds or clears slots
    /// behind this table's count.
    pub fn recount(&mut self) {
        self.len = self.iter().count();
    }

    /// Moves the occupant of slot `from` into the free slot `to` (in its other bucket): it is
    /// in the table at every instant, and its version is odd throughout.
    fn relocate(&self, from: usize, to: usize) {
        let cells = self.cells.slots();
        let (source, target) = (&cells[from], &cells[to]);
        let key = source.key();
        let entry = source.entry();
        odd_around(self.version_of(&key), || {
            odd_around(&target.seq, || target.store(Some(&key), &entry, true));
            odd_around(&source.seq, || clear(source));
        });
    }

    /// A path of slots ending in a free one: `path[0]` is in one of `key`'s buckets, and each
    /// next slot is in the other bucket of the previous slot's occupant. Breadth-first, so the
    /// path (and the number of moves) is the shortest there is within the search bound.
    fn room_for(&self, key: &AddrKey) -> Option<Vec<usize>> {
        let cells = self.cells.slots();
        let (first, second) = self.layout.buckets_of(key);
        // (slot, index of the node it was reached from)
        let mut nodes: Vec<(usize, usize)> = Vec::new();
        for i in SlotLayout::slot_range(first).chain(SlotLayout::slot_range(second)) {
            if !cells[i].occupied() {
                return Some(vec![i]);
            }
            nodes.push((i, usize::MAX));
        }
        let mut next = 0;
        while next < nodes.len() && nodes.len() < MOVE_SEARCH_SLOTS {
            let (slot, _) = nodes[next];
            let other = self.layout.other_bucket(slot, &cells[slot].key());
            for i in SlotLayout::slot_range(other) {
                if !cells[i].occupied() {
                    let mut path = vec![i, slot];
                    let mut from = nodes[next].1;
                    while from != usize::MAX {
                        path.push(nodes[from].0);
                        from = nodes[from].1;
                    }
                    path.reverse();
                    return Some(path);
                }
                if !nodes.iter().any(|&(s, _)| s == i) {
                    nodes.push((i, next));
                }
            }
            next += 1;
        }
        None
    }
}

fn clear(cell: &SlotCell) {
    cell.store(Some(&AddrKey::UNSPECIFIED), &AddrEntry::default(), true);
}

#[cfg(test)]
mod tests;
