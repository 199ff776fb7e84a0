//! `IPQ_SLOTS` in the agent's memory: one shared read-write mapping of the pinned map's values
//! ([`SlotCells`]), its meta element (the layout and seed the programs were loaded with), and
//! [`SlotsReader`]s of the same mapping for other threads (the verification).

use std::{
    os::fd::{AsFd, AsRawFd},
    sync::{
        atomic::{fence, Ordering},
        Arc,
    },
};

use aya::maps::MapData;
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    names,
    slots::{buckets_of_entries, AddrSlot, BPF_F_MMAPABLE, SLOTS_MAGIC},
};

use super::{SlotCell, SlotLayout};
use crate::datapath::DatapathError;

/// The shared mapping of the map's values, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by the cells (and shared with their readers) and only touched
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

/// Every cell of the map: its slots, then the meta element.
pub struct SlotCells {
    /// Owns what `cells` points into (shared with [`SlotsReader`]s); `None` for test cells on
    /// leaked heap memory.
    mapping: Option<Arc<Mapping>>,
    cells: &'static [SlotCell],
    /// Kept open for the mapping's lifetime (the mapping holds the map too; this is for clarity
    /// in `/proc/<pid>/fd`).
    _map: Option<MapData>,
}

impl SlotCells {
    /// Maps the values of `map`, after checking that it has the layout the programs read;
    /// returns the cells and the table's buckets.
    pub(super) fn map(map: MapData) -> Result<(Self, u32), DatapathError> {
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
        // which these cells own and drop after their last use of `cells`.
        let cells = unsafe { std::slice::from_raw_parts(ptr.cast::<SlotCell>(), entries as usize) };
        let cells = Self {
            mapping: Some(Arc::new(mapping)),
            cells,
            _map: Some(map),
        };
        Ok((cells, buckets))
    }

    /// Cells on leaked heap memory (so that test readers may share them), for unit tests.
    #[cfg(test)]
    pub fn leaked(cells: &'static [SlotCell]) -> Self {
        Self {
            mapping: None,
            cells,
            _map: None,
        }
    }

    /// The table's layout from its meta element. A table whose meta is set keeps its seed
    /// (`expected`, the seed the programs were loaded with, must then be the same); a new
    /// table is cleared and given `expected`. Only the loader, which knows the programs' seed,
    /// may set a table up.
    pub(super) fn adopt(
        &self,
        buckets: u32,
        expected: Option<u64>,
    ) -> Result<SlotLayout, DatapathError> {
        let slots = SlotLayout::new(buckets, 0).slots();
        let meta = self.cells[slots].meta();
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
            for cell in &self.cells[..slots] {
                cell.seq.store(0, Ordering::Relaxed);
                cell.version.store(0, Ordering::Relaxed);
                cell.store(Some(&AddrKey::UNSPECIFIED), &AddrEntry::default(), true);
            }
            self.cells[slots].set_meta(buckets, seed);
            seed
        };
        Ok(SlotLayout::new(buckets, seed))
    }

    /// Every cell, the meta element last.
    pub fn all(&self) -> &'static [SlotCell] {
        self.cells
    }

    /// The slots, the meta element aside.
    pub(super) fn slots(&self) -> &'static [SlotCell] {
        &self.cells[..self.cells.len() - 1]
    }

    /// A reader of the same cells for another thread (the verification), keeping the mapping
    /// alive as long as it lives.
    pub fn reader(&self) -> SlotsReader {
        SlotsReader {
            _mapping: self.mapping.clone(),
            cells: self.slots(),
        }
    }

    /// Ends a write another process left half done in slot `index` (a counter still odd): the
    /// owner loop calls it between its own writes, when no counter of its own is odd.
    pub fn settle_cell(&self, index: usize) {
        if let Some(cell) = self.slots().get(index) {
            settle(cell);
        }
    }

    /// Ends any write an earlier agent left half done: a slot or version still odd. The caller
    /// then rewrites every slot from `IPQ_ADDRS`, so whatever such a slot holds is corrected.
    pub fn settle(&self) {
        for cell in self.slots() {
            settle(cell);
        }
    }
}

fn settle(cell: &SlotCell) {
    for counter in [&cell.seq, &cell.version] {
        let now = counter.load(Ordering::Relaxed);
        if now & 1 != 0 {
            counter.store(now.wrapping_add(1), Ordering::Release);
        }
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
