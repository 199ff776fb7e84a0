//! The user side of `IPQ_SLOTS` (the table and its protocol: `ipq_common::slots`): a bucketed
//! cuckoo table the agent writes through a shared mapping of the map, slot by slot, while the
//! programs read it on every CPU.
//!
//! Every write follows the protocol the programs check: the first bucket's `version` of the
//! address is odd around any write of a slot holding (or about to hold) it, and a slot's `seq`
//! is odd around the write of its content. Whoever calls this writes `IPQ_ADDRS` so that it
//! holds the address's old or new entry whenever one of its slots is being written (the
//! programs fall back to it then).

use std::{
    os::fd::{AsFd, AsRawFd},
    sync::{
        atomic::{fence, AtomicU32, Ordering},
        Arc,
    },
};

use aya::maps::MapData;
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    names,
    slots::{
        buckets_of_entries, slot_buckets_of, AddrSlot, BPF_F_MMAPABLE, SLOTS_MAGIC, SLOT_WAYS,
    },
};

use super::DatapathError;

mod cell;

use cell::odd_around;
pub use cell::SlotCell;

/// The shared mapping of the map's values, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by the table (and shared with its reader) and only touched
// through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access to the mapped cells is atomic.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value created, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Slots to visit at most when an insert must move others; ≥ the 8 of the first step.
const MOVE_SEARCH_SLOTS: usize = 512;

pub struct SlotTable {
    /// Owns what `cells` points into (shared with [`SlotsReader`]s); `None` for a test table on
    /// leaked heap memory.
    mapping: Option<Arc<Mapping>>,
    /// Every cell: `buckets * SLOT_WAYS` slots, then the meta element.
    cells: &'static [SlotCell],
    buckets: u32,
    seed: u64,
    len: usize,
    /// Occupants moved to make room, ever (tests check that their races cover moves).
    moves: u64,
    /// Kept open for the mapping's lifetime (the mapping holds the map too; this is for clarity
    /// in `/proc/<pid>/fd`).
    _map: Option<MapData>,
}

impl SlotTable {
    /// Maps the table of `map`. A table whose meta is set keeps its seed (`expected`, the seed
    /// the programs were loaded with, must then be the same); a new table is cleared and given
    /// `expected`. Only the loader, which knows the programs' seed, may set a table up.
    pub fn open(map: MapData, expected: Option<u64>) -> Result<Self, DatapathError> {
        let name = names::MAP_SLOTS;
        let info = map
            .info()
            .map_err(|source| DatapathError::Map { name, source })?;
        let entries = info.max_entries();
        let buckets = buckets_of_entries(entries).ok_or(DatapathError::SlotsLayout {
            what: "elements",
            found: entries,
        })?;
        if info.map_flags() & BPF_F_MMAPABLE == 0 {
            return Err(DatapathError::SlotsLayout {
                what: "flags",
                found: info.map_flags(),
            });
        }
        let bytes = entries as usize * size_of::<AddrSlot>();
        // SAFETY: a shared read-write mapping of the map's values (mmap offset 0 is element 0);
        // checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(DatapathError::Mmap {
                name,
                source: std::io::Error::last_os_error(),
            });
        }
        let mapping = Mapping { ptr, len: bytes };
        // SAFETY: `entries` cells of the layout asserted above, alive as long as `mapping`,
        // which the table owns and drops after its last use of `cells`.
        let cells = unsafe { std::slice::from_raw_parts(ptr.cast::<SlotCell>(), entries as usize) };
        Self::adopt(Some(Arc::new(mapping)), cells, buckets, expected, Some(map))
    }

    fn adopt(
        mapping: Option<Arc<Mapping>>,
        cells: &'static [SlotCell],
        buckets: u32,
        expected: Option<u64>,
        map: Option<MapData>,
    ) -> Result<Self, DatapathError> {
        let meta = cells[(buckets * SLOT_WAYS) as usize].meta();
        let seed = if meta.magic == SLOTS_MAGIC && meta.buckets == buckets {
            if let Some(expected) = expected {
                if expected != meta.seed {
                    return Err(DatapathError::SlotsSeed);
                }
            }
            meta.seed
        } else {
            let seed = expected.ok_or(DatapathError::SlotsNotSetUp)?;
            // No program reads a table before its meta is set (the loader sets it before any
            // attach), so it may be cleared directly.
            for cell in &cells[..(buckets * SLOT_WAYS) as usize] {
                cell.seq.store(0, Ordering::Relaxed);
                cell.version.store(0, Ordering::Relaxed);
                cell.store(Some(&AddrKey::UNSPECIFIED), &AddrEntry::default(), true);
            }
            cells[(buckets * SLOT_WAYS) as usize].set_meta(buckets, seed);
            seed
        };
        let len = cells[..(buckets * SLOT_WAYS) as usize]
            .iter()
            .filter(|c| c.occupied())
            .count();
        Ok(Self {
            mapping,
            cells,
            buckets,
            seed,
            len,
            moves: 0,
            _map: map,
        })
    }

    /// A table on the heap (leaked, so that test readers may share it), for unit tests.
    #[cfg(test)]
    pub fn on_heap(buckets: u32, seed: u64) -> Self {
        let cells: &'static [SlotCell] = Box::leak(
            (0..buckets * SLOT_WAYS + 1)
                .map(|_| SlotCell::default())
                .collect(),
        );
        Self::adopt(None, cells, buckets, Some(seed), None).expect("a new table takes its seed")
    }

    /// The cells, for test readers running the programs' protocol.
    #[cfg(test)]
    pub fn cells(&self) -> &'static [SlotCell] {
        self.cells
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Occupants moved between their buckets to make room, since the table was opened.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    fn mask(&self) -> u32 {
        self.buckets - 1
    }

    fn slot_range(bucket: u32) -> std::ops::Range<usize> {
        let first = (bucket * SLOT_WAYS) as usize;
        first..first + SLOT_WAYS as usize
    }

    fn buckets_of(&self, key: &AddrKey) -> (u32, u32) {
        slot_buckets_of(key, self.seed, self.mask())
    }

    /// The cell holding the version of `key` (the first slot of its first bucket).
    fn version_of(&self, key: &AddrKey) -> &AtomicU32 {
        let (first, _) = self.buckets_of(key);
        &self.cells[(first * SLOT_WAYS) as usize].version
    }

    fn find(&self, key: &AddrKey) -> Option<usize> {
        let (first, second) = self.buckets_of(key);
        Self::slot_range(first)
            .chain(Self::slot_range(second))
            .find(|&i| self.cells[i].occupied() && self.cells[i].key() == *key)
    }

    /// The entry of `key` with the stamps the programs wrote into its slot.
    pub fn get(&self, key: &AddrKey) -> Option<AddrEntry> {
        self.find(key).map(|i| self.cells[i].entry())
    }

    /// Writes `entry` for `key`. An existing slot keeps its kernel-written stamps; a new one
    /// takes those of `entry`. Fails only when neither bucket can make room.
    pub fn put(&mut self, key: &AddrKey, entry: &AddrEntry) -> Result<(), DatapathError> {
        debug_assert!(entry.state != 0, "state 0 marks an empty slot");
        if let Some(i) = self.find(key) {
            let cell = &self.cells[i];
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
        let cell = &self.cells[path[0]];
        odd_around(self.version_of(key), || {
            odd_around(&cell.seq, || cell.store(Some(key), entry, true))
        });
        self.len += 1;
        Ok(())
    }

    /// Removes `key`, returning its entry (with stamps) if it was there.
    pub fn remove(&mut self, key: &AddrKey) -> Option<AddrEntry> {
        let i = self.find(key)?;
        let cell = &self.cells[i];
        let old = cell.entry();
        odd_around(self.version_of(key), || {
            odd_around(&cell.seq, || clear(cell))
        });
        self.len -= 1;
        Some(old)
    }

    /// Every stored address and entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (AddrKey, AddrEntry)> + '_ {
        self.cells[..(self.buckets * SLOT_WAYS) as usize]
            .iter()
            .filter(|c| c.occupied())
            .map(|c| (c.key(), c.entry()))
    }

    /// A reader of the same cells for another thread (the verification), keeping the mapping
    /// alive as long as it lives.
    pub fn reader(&self) -> SlotsReader {
        SlotsReader {
            _mapping: self.mapping.clone(),
            cells: &self.cells[..(self.buckets * SLOT_WAYS) as usize],
        }
    }

    /// Ends a write another process left half done in slot `index` (a counter still odd): the
    /// owner loop calls it between its own writes, when no counter of its own is odd.
    pub fn settle_cell(&mut self, index: usize) {
        if let Some(cell) = self.cells[..(self.buckets * SLOT_WAYS) as usize].get(index) {
            for counter in [&cell.seq, &cell.version] {
                let now = counter.load(Ordering::Relaxed);
                if now & 1 != 0 {
                    counter.store(now.wrapping_add(1), Ordering::Release);
                }
            }
        }
    }

    /// Counts the occupied slots again: another process writing the map adds or clears slots
    /// behind this table's count.
    pub fn recount(&mut self) {
        self.len = self.iter().count();
    }

    /// Ends any write an earlier agent left half done: a slot or version still odd. The caller
    /// then rewrites every slot from `IPQ_ADDRS`, so whatever such a slot holds is corrected.
    pub fn settle(&mut self) {
        for cell in &self.cells[..(self.buckets * SLOT_WAYS) as usize] {
            for counter in [&cell.seq, &cell.version] {
                let now = counter.load(Ordering::Relaxed);
                if now & 1 != 0 {
                    counter.store(now.wrapping_add(1), Ordering::Release);
                }
            }
        }
    }

    /// Moves the occupant of slot `from` into the free slot `to` (in its other bucket): it is
    /// in the table at every instant, and its version is odd throughout.
    fn relocate(&self, from: usize, to: usize) {
        let (source, target) = (&self.cells[from], &self.cells[to]);
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
        let (first, second) = self.buckets_of(key);
        // (slot, index of the node it was reached from)
        let mut nodes: Vec<(usize, usize)> = Vec::new();
        for i in Self::slot_range(first).chain(Self::slot_range(second)) {
            if !self.cells[i].occupied() {
                return Some(vec![i]);
            }
            nodes.push((i, usize::MAX));
        }
        let mut next = 0;
        while next < nodes.len() && nodes.len() < MOVE_SEARCH_SLOTS {
            let (slot, _) = nodes[next];
            let occupant = self.cells[slot].key();
            let (a, b) = self.buckets_of(&occupant);
            let here = (slot / SLOT_WAYS as usize) as u32;
            let other = if here == a { b } else { a };
            for i in Self::slot_range(other) {
                if !self.cells[i].occupied() {
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

/// What one slot held when a [`SlotsReader`] read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellRead {
    Empty,
    Held(AddrKey, AddrEntry),
    /// A counter was odd or moved while it was read: a write under way (the owner's, or one
    /// another process left half done). The key as read, possibly torn.
    Unsettled(AddrKey),
}

/// `IPQ_SLOTS` read from another thread than its writer's, through the writer's mapping (a
/// second mapping would make the whole map resident twice).
pub struct SlotsReader {
    _mapping: Option<Arc<Mapping>>,
    cells: &'static [SlotCell],
}

impl SlotsReader {
    /// Slots, the meta element aside.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Slot `index` as the programs' readers would take it: between two equal even counters.
    pub fn read(&self, index: usize) -> CellRead {
        let cell = &self.cells[index];
        let seq = cell.seq.load(Ordering::Acquire);
        let version = cell.version.load(Ordering::Acquire);
        let occupied = cell.occupied();
        let key = cell.key();
        let entry = cell.entry();
        fence(Ordering::Acquire);
        let settled = seq & 1 == 0
            && version & 1 == 0
            && cell.seq.load(Ordering::Relaxed) == seq
            && cell.version.load(Ordering::Relaxed) == version;
        match (settled, occupied) {
            (false, _) => CellRead::Unsettled(key),
            (true, true) => CellRead::Held(key, entry),
            (true, false) => CellRead::Empty,
        }
    }
}

fn clear(cell: &SlotCell) {
    cell.store(Some(&AddrKey::UNSPECIFIED), &AddrEntry::default(), true);
}

#[cfg(test)]
mod tests;
