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
    iface::{IfaceEntry, IFACE_SLOTS},
};

use super::AddressTable;
use crate::datapath::{
    bpf_watch::ReportedKey, map_check::MapSuspects, slots::CellRead, strict::describe,
};

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

fn describe_iface(entry: &IfaceEntry) -> String {
    if entry.ifindex == 0 {
        return "empty".to_owned();
    }
    let own: Vec<String> = entry
        .own
        .iter()
        .filter(|a| **a != AddrKey::UNSPECIFIED)
        .map(|a| a.to_ip().to_string())
        .collect();
    format!("if{} fast path for [{}]", entry.ifindex, own.join(", "))
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
            self.copy.cells().settle_cell(index);
        }
        let mut copy_changed = false;
        for addr in &suspects.addrs {
            let want = wanted(addr);
            self.recheck_addr(addr, want.as_ref(), &mut drift);
            copy_changed |= self.recheck_copy(addr, want.as_ref(), &mut drift);
            self.feed.addr(*addr, want.as_ref());
        }
        if copy_changed {
            // A foreign write adds or clears slots behind the count (O(slots), only after one).
            self.copy.recount();
        }
        for &slot in &suspects.slots {
            self.recheck_slot(slot, &mut drift);
        }
        for &word in &suspects.words {
            self.recheck_word(word, &mut drift);
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
        let cells = self.copy.cells().reader();
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
            if (index as usize) < self.filter_words.len() {
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

    /// `IPQ_SLOTS`, probed through the table's own mapping (after `IPQ_ADDRS` is right again,
    /// which the protocol needs while a slot is rewritten). Whether it wrote.
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

    /// What [`Self::write_slot`] keeps in `slot` when no write is under way.
    pub(super) fn expected_slot(&self, slot: u32) -> IfaceEntry {
        let mut value = IfaceEntry::default();
        if let Some(&owner) = self.slot_owner.get(&slot) {
            let own = self.listing(owner, None);
            if !own.is_empty() {
                value.ifindex = owner;
                value.own[..own.len()].copy_from_slice(&own);
            }
        }
        value
    }

    fn recheck_slot(&mut self, slot: u32, drift: &mut Vec<MapDrift>) {
        let want = self.expected_slot(slot);
        self.feed.slot(slot, &want);
        let now = match self.slots.get(slot) {
            Ok(now) if now == want => return,
            Ok(now) => describe_iface(&now),
            Err(e) => format!("unreadable ({e})"),
        };
        drift.push(MapDrift {
            map: CheckedMap::IpqIfaces,
            key: format!("slot {slot}"),
            found: now,
            wanted: describe_iface(&want),
            error: self.slots.set(slot, &want).err().map(|e| e.to_string()),
        });
    }

    fn recheck_word(&mut self, word: u32, drift: &mut Vec<MapDrift>) {
        let Some(&want) = self.filter_words.get(word as usize) else {
            return;
        };
        self.feed.word(word, want);
        let found = match self.filter.word(word) {
            Ok(now) if now == want => return,
            Ok(now) => format!("{now:#018x}"),
            Err(e) => format!("unreadable ({e})"),
        };
        drift.push(MapDrift {
            map: CheckedMap::IpqQbloom,
            key: format!("word {word}"),
            found,
            wanted: format!("{want:#018x}"),
            error: self
                .filter
                .set_word(word, want)
                .err()
                .map(|e| e.to_string()),
        });
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
