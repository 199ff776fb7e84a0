//! The maps verified, not only written: what the kernel's `IPQ_ADDRS`, `IPQ_SLOTS`,
//! `IPQ_IFACES` and `IPQ_QBLOOM` hold, compared with what this table (their one writer) wrote,
//! and rewritten where they differ.
//!
//! The whole maps are read off the owner loop ([`crate::datapath::map_check`]); the comparison
//! runs on it, where no write of the table's own can be under way. A reading may predate a
//! write the loop made since, so every difference is read again (one lookup) before it counts:
//! only what the kernel still holds differently now is another process's doing. The
//! comparison is O(n) hash lookups with no allocation when nothing differs; `IPQ_SLOTS` is the
//! table's shared mapping, read in memory.

use std::time::{Duration, Instant};

use ipq_common::{
    addr::{AddrEntry, AddrKey},
    iface::IfaceEntry,
    names,
};

use super::AddressTable;
use crate::datapath::{map_check::MapsReading, strict::describe};

/// What the table wrote for an address: the entry without the programs' stamps (24 bytes a
/// address instead of 40, at 64k addresses the difference is 1 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    state: u32,
    holder_ifindex: u32,
    fenced_ifindex: u32,
    flags: u32,
    since_ns: u64,
}

impl Written {
    pub(crate) fn of(entry: &AddrEntry) -> Self {
        Self {
            state: entry.state,
            holder_ifindex: entry.holder_ifindex,
            fenced_ifindex: entry.fenced_ifindex,
            flags: entry.flags,
            since_ns: entry.since_ns,
        }
    }

    fn entry(self) -> AddrEntry {
        AddrEntry {
            state: self.state,
            holder_ifindex: self.holder_ifindex,
            fenced_ifindex: self.fenced_ifindex,
            flags: self.flags,
            since_ns: self.since_ns,
            ..AddrEntry::default()
        }
    }

    fn matches(self, entry: &AddrEntry) -> bool {
        self.entry().written_as(entry)
    }
}

/// One thing a map held that the table did not write, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDrift {
    /// `IPQ_ADDRS`, `IPQ_SLOTS`, `IPQ_IFACES` or `IPQ_QBLOOM`.
    pub map: &'static str,
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
    /// Compares `reading` (and `IPQ_SLOTS` as mapped) with what the table wrote, and writes
    /// the table's own back where the kernel still differs.
    pub fn verify(&mut self, reading: &MapsReading) -> MapsCheck {
        let started = Instant::now();
        let mut drift = Vec::new();
        self.verify_addrs(reading, &mut drift);
        self.verify_copy(&mut drift);
        self.verify_ifaces(reading, &mut drift);
        self.verify_filter(reading, &mut drift);
        MapsCheck {
            drift,
            addresses: self.intent.len(),
            took: started.elapsed(),
        }
    }

    /// Where `IPQ_ADDRS` and `IPQ_SLOTS` disagreed when the table opened.
    pub fn opened_disagreeing(&self) -> &[String] {
        &self.opened_disagreeing
    }

    fn verify_addrs(&mut self, reading: &MapsReading, drift: &mut Vec<MapDrift>) {
        let mut suspects = Vec::new();
        let mut agreeing = 0;
        for (addr, entry) in &reading.addrs {
            match self.intent.get(addr) {
                Some(written) if written.matches(entry) => agreeing += 1,
                _ => suspects.push(*addr),
            }
        }
        if agreeing != self.intent.len() {
            // Some address the table wrote did not agree: those the reading lacks altogether.
            let read: std::collections::HashSet<AddrKey> =
                reading.addrs.iter().map(|(addr, _)| *addr).collect();
            suspects.extend(self.intent.keys().filter(|addr| !read.contains(addr)));
        }
        for addr in suspects {
            let want = self.intent.get(&addr).copied();
            let now = match self.addrs.get(&addr) {
                Ok(now) => now,
                Err(e) => {
                    drift.push(MapDrift {
                        map: names::MAP_ADDRS,
                        key: addr.to_ip().to_string(),
                        found: "unreadable".to_owned(),
                        wanted: describe(want.map(Written::entry).as_ref()),
                        error: Some(e.to_string()),
                    });
                    continue;
                }
            };
            let agrees = match (want, &now) {
                (Some(written), Some(entry)) => written.matches(entry),
                (None, None) => true,
                _ => false,
            };
            if agrees {
                // The reading predates one of the table's own writes.
                continue;
            }
            let result = match want {
                Some(written) => {
                    let mut entry = written.entry();
                    if let Some(now) = &now {
                        entry.last_stale_ns = now.last_stale_ns;
                        entry.last_sample_ns = now.last_sample_ns;
                    }
                    self.addrs.insert(&addr, &entry)
                }
                None => self.addrs.remove(&addr),
            };
            drift.push(MapDrift {
                map: names::MAP_ADDRS,
                key: addr.to_ip().to_string(),
                found: describe(now.as_ref()),
                wanted: describe(want.map(Written::entry).as_ref()),
                error: result.err().map(|e| e.to_string()),
            });
        }
    }

    /// `IPQ_SLOTS`, read through the table's own mapping (after `IPQ_ADDRS` is right again,
    /// which the protocol needs while a slot is rewritten).
    fn verify_copy(&mut self, drift: &mut Vec<MapDrift>) {
        // A foreign write may have left a counter odd: the programs would fall back to the
        // hash map for that address for ever.
        self.copy.settle();
        let mut wrong: Vec<(AddrKey, Option<AddrEntry>)> = Vec::new();
        let mut agreeing = 0;
        for (addr, entry) in self.copy.iter() {
            match self.intent.get(&addr) {
                Some(written) if written.matches(&entry) => agreeing += 1,
                _ => wrong.push((addr, Some(entry))),
            }
        }
        if agreeing != self.intent.len() {
            for (addr, written) in &self.intent {
                let held = self.copy.get(addr);
                if !held.is_some_and(|e| written.matches(&e))
                    && !wrong.iter().any(|(a, _)| a == addr)
                {
                    wrong.push((*addr, held));
                }
            }
        }
        if wrong.is_empty() {
            return;
        }
        for (addr, found) in wrong {
            let want = self.intent.get(&addr).copied();
            let result = match want {
                Some(written) => self.copy.put(&addr, &written.entry()),
                None => {
                    self.copy.remove(&addr);
                    Ok(())
                }
            };
            drift.push(MapDrift {
                map: names::MAP_SLOTS,
                key: addr.to_ip().to_string(),
                found: describe(found.as_ref()),
                wanted: describe(want.map(Written::entry).as_ref()),
                error: result.err().map(|e| e.to_string()),
            });
        }
        // A foreign write adds or clears slots behind the count.
        self.copy.recount();
    }

    /// What [`Self::write_slot`] keeps in `slot` when no write is under way.
    fn expected_slot(&self, slot: u32) -> IfaceEntry {
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

    fn verify_ifaces(&mut self, reading: &MapsReading, drift: &mut Vec<MapDrift>) {
        for (slot, read) in reading.ifaces.iter().enumerate() {
            let slot = slot as u32;
            let want = self.expected_slot(slot);
            if *read == want {
                continue;
            }
            let now = match self.slots.get(slot) {
                Ok(now) if now == want => continue,
                Ok(now) => describe_iface(&now),
                Err(e) => format!("unreadable ({e})"),
            };
            drift.push(MapDrift {
                map: names::MAP_IFACES,
                key: format!("slot {slot}"),
                found: now,
                wanted: describe_iface(&want),
                error: self.slots.set(slot, &want).err().map(|e| e.to_string()),
            });
        }
    }

    fn verify_filter(&mut self, reading: &MapsReading, drift: &mut Vec<MapDrift>) {
        for (word, read) in reading.filter.iter().enumerate() {
            let Some(&want) = self.filter_words.get(word) else {
                break;
            };
            let word = word as u32;
            if *read == want || self.filter.word(word).is_ok_and(|now| now == want) {
                continue;
            }
            drift.push(MapDrift {
                map: names::MAP_QFILTER,
                key: format!("word {word}"),
                found: format!("{read:#018x}"),
                wanted: format!("{want:#018x}"),
                error: self
                    .filter
                    .set_word(word, want)
                    .err()
                    .map(|e| e.to_string()),
            });
        }
    }
}
