//! The maps verified, not only written: the suspects the off-loop comparison found
//! ([`crate::datapath::map_check`]) looked at again on the owner loop, where no write of the
//! table's own can be under way, and what the kernel still holds differently is rewritten.
//!
//! O(suspects): one lookup per suspect address in `IPQ_ADDRS` and one probe of `IPQ_SLOTS`, a
//! lookup per suspect `IPQ_IFACES` slot and `IPQ_QBLOOM` word. What each should hold is not
//! taken from the comparison (it keeps digests, and may predate a write made since) but from
//! the owner: the registry's entry of the address (`wanted`), the table's own listing of the
//! slot and its filter words. What agrees is given back to the mirror as agreeing, so that a
//! suspect is not one again at the next pass.

use std::time::{Duration, Instant};

use ipq_api::CheckedMap;
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    iface::IFACE_SLOTS,
};

use super::AddressTable;
use crate::datapath::{bpf_watch::ReportedKey, map_check::MapSuspects, slots::CellRead};

/// One thing a map held that the table did not write, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDrift {
    /// `IPQ_ADDRS`, `IPQ_SLOTS`, `IPQ_IFACES` or `IPQ_QBLOOM`, spelled as `ipq_common::names`
    /// names them (`vocabulary_tests` holds the two equal).
    pub map: CheckedMap,
    /// The address, or `slot N` (`IPQ_IFACES`), `word N` (`IPQ_QBLOOM`).
    pub key: String,
    pub found: String,
    pub wanted: String,
    /// `None` once the table's own is written back.
    pub error: Option<String>,
}

/// One comparison's outcome.
#[derive(Clone, Debug, Default)]
pub struct MapsCheck {
    pub drift: Vec<MapDrift>,
    /// Addresses compared.
    pub addresses: usize,
    /// The comparison's own time on the owner loop (the reading's is the reading's).
    pub took: Duration,
}

impl AddressTable {
    /// Looks again at what the comparison found differing, and writes the table's own back
    /// where the kernel still differs. `wanted` is the entry the table should hold for an
    /// address (`None`: none at all).
    pub fn recheck(
        &mut self,
        suspects: &MapSuspects,
        wanted: &dyn Fn(&AddrKey) -> Option<AddrEntry>,
    ) -> MapsCheck {
        let started = Instant::now();
        let mut drift = Vec::new();
        for &index in &suspects.unsettled {
            // A foreign write may have left a counter odd: the programs would fall back to the
            // hash map for that address for ever.
            self.entries.cells().settle_cell(index);
        }
        let mut copy_changed = false;
        for addr in &suspects.addrs {
            let want = wanted(addr);
            copy_changed |= self.entries.recheck(addr, want.as_ref(), &mut drift);
            self.feed.addr(*addr, want.as_ref());
        }
        if copy_changed {
            // A foreign write adds or clears slots behind the count (O(slots), only after one).
            self.entries.recount();
        }
        for &slot in &suspects.slots {
            self.fast_path.recheck(slot, &mut drift);
        }
        for &word in &suspects.words {
            self.bloom.recheck(word, &mut drift);
        }
        MapsCheck {
            drift,
            addresses: suspects.addresses,
            took: started.elapsed(),
        }
    }

    /// The entries another process's single-entry writes may have changed, by the keys the
    /// bpf() watcher reported: each key as an address (of `IPQ_ADDRS`; an address the
    /// registry does not want is removed), and its first 4 bytes as an `IPQ_SLOTS` cell (the
    /// address held there now, or the cell to settle) and an `IPQ_IFACES` slot. O(keys).
    pub fn reported_suspects(&self, keys: &[ReportedKey]) -> MapSuspects {
        let mut suspects = MapSuspects {
            addresses: self.len(),
            ..MapSuspects::default()
        };
        let cells = self.entries.cells().reader();
        for key in keys {
            let words = std::array::from_fn(|i| {
                u32::from_ne_bytes([key[4 * i], key[4 * i + 1], key[4 * i + 2], key[4 * i + 3]])
            });
            suspects.addrs.push(AddrKey { words });
            let index = words[0];
            if (index as usize) < cells.len() {
                match cells.read(index as usize) {
                    CellRead::Empty => {}
                    CellRead::Held(addr, _) => suspects.addrs.push(addr),
                    CellRead::Unsettled(addr) => {
                        suspects.unsettled.push(index as usize);
                        suspects.addrs.push(addr);
                    }
                }
            }
            if index < IFACE_SLOTS {
                suspects.slots.push(index);
            }
            if (index as usize) < self.bloom.words().len() {
                suspects.words.push(index);
            }
        }
        suspects.addrs.sort_unstable();
        suspects.addrs.dedup();
        suspects.slots.sort_unstable();
        suspects.slots.dedup();
        suspects.words.sort_unstable();
        suspects.words.dedup();
        suspects
    }

    /// Where `IPQ_ADDRS` and `IPQ_SLOTS` disagreed when the table opened.
    pub fn opened_disagreeing(&self) -> &[String] {
        &self.opened_disagreeing
    }
}
