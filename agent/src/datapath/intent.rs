//! What the address table wrote, as the off-loop verification needs it: a digest per address,
//! per `IPQ_IFACES` slot and per `IPQ_QBLOOM` word, kept by the verification's own thread.
//!
//! The table (on the owner loop) only appends each write to a [`IntentFeed`] (a lock held for a
//! push, O(1)); the verification absorbs the feed into its [`IntentMirror`] between passes and
//! compares the kernel's maps with it there, handing the owner loop only the suspects.
//!
//! A digest, not the entry: 8 bytes an IPv4 address (its key and a 32-bit digest in one sorted
//! vector), where a copy of each entry in a hash map cost 40 bytes and half its buckets again
//! (5 MB at 64k addresses). The digests are keyed with a secret chosen at start: another process
//! cannot write a different entry that digests the same except by a 2^-32 chance. What the entry
//! should be is not the mirror's to say: the owner loop derives it again for each suspect.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::{Arc, Mutex},
};

use prometheus::IntCounter;

use ipq_common::{
    addr::{AddrEntry, AddrKey},
    iface::IfaceEntry,
};

use super::slots::SlotsReader;

/// Writes kept in the order made before the mirror takes them in (every 250 ms, or after a
/// verification pass, which holds the mirror while it reads the maps). A pass that takes long
/// (a slow `bpf()` read) would otherwise let the feed grow by every write meanwhile; past this
/// (2 MiB of writes, a full 64k registry written over) each later write takes the place of the
/// last one of its key instead, so the feed holds at most one per address, slot and word. The
/// mirror ends up the same: only the last write of a key counts.
const FEED_IN_ORDER: usize = 64 * 1024;

/// One write the table made, as the mirror keeps it.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// An address's entry written (its digest), or removed.
    Addr(AddrKey, Option<u32>),
    /// An `IPQ_IFACES` slot written.
    Slot(u32, u32),
    /// An `IPQ_QBLOOM` word written.
    Word(u32, u32),
}

/// What a [`Change`] writes to: its last write is what the mirror keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Written {
    Addr(AddrKey),
    Slot(u32),
    Word(u32),
}

impl Change {
    fn written(&self) -> Written {
        match *self {
            Self::Addr(addr, _) => Written::Addr(addr),
            Self::Slot(slot, _) => Written::Slot(slot),
            Self::Word(word, _) => Written::Word(word),
        }
    }
}

/// The writes waiting for the mirror.
#[derive(Debug, Default)]
struct Pending {
    /// In the order made, up to the feed's bound.
    in_order: Vec<Change>,
    /// Past the bound: the last write of each key (all of them newer than `in_order`).
    last_of_key: HashMap<Written, Change>,
    /// Writes that went to `last_of_key` since the mirror last took the feed.
    coalesced: u64,
}

/// The keyed digest of what the table writes (the programs' stamps left out): three multiplies
/// a value, since a pass digests every entry of two 64k maps. Keyed with words drawn at start,
/// so that no value another tool writes by accident or design digests as ipq's except by a
/// 2^-32 chance. (Not a MAC against a process that can read the agent's memory: such a process
/// can do anything to the agent anyway.)
#[derive(Clone, Copy, Debug)]
pub struct Digests {
    keys: [u64; 3],
}

/// The high and low halves of a 128-bit product folded together (wyhash's mixer).
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl Digests {
    fn new() -> Self {
        let random = RandomState::new();
        Self {
            keys: [0u8, 1, 2].map(|i| random.hash_one(i) | 1),
        }
    }

    fn digest(&self, words: [u64; 3]) -> u32 {
        let [k0, k1, k2] = self.keys;
        let h = fold(words[0] ^ k0, words[1] ^ k1);
        fold(h ^ words[2], k2) as u32
    }

    pub fn entry(&self, entry: &AddrEntry) -> u32 {
        self.digest([
            u64::from(entry.state) | u64::from(entry.holder_ifindex) << 32,
            u64::from(entry.fenced_ifindex) | u64::from(entry.flags) << 32,
            entry.since_ns,
        ])
    }

    pub fn slot(&self, slot: &IfaceEntry) -> u32 {
        let mut h = u64::from(slot.ifindex);
        for addr in &slot.own {
            let [a, b, c, d] = addr.words.map(u64::from);
            h = u64::from(self.digest([h, a | b << 32, c | d << 32]));
        }
        self.digest([h, 0, 0])
    }

    pub fn word(&self, word: u64) -> u32 {
        self.digest([word, 0, 0])
    }
}

/// The table's side: every write it made, appended for the mirror (bounded: see
/// [`FEED_IN_ORDER`]).
#[derive(Clone, Debug)]
pub struct IntentFeed {
    pending: Arc<Mutex<Pending>>,
    digests: Digests,
    in_order_max: usize,
}

impl IntentFeed {
    pub fn new() -> Self {
        Self::with_bound(FEED_IN_ORDER)
    }

    fn with_bound(in_order_max: usize) -> Self {
        Self {
            pending: Arc::default(),
            digests: Digests::new(),
            in_order_max,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// O(1): an append, or past the bound one hash map insert.
    fn push(&self, change: Change) {
        let mut pending = self.pending();
        if pending.last_of_key.is_empty() && pending.in_order.len() < self.in_order_max {
            pending.in_order.push(change);
        } else {
            pending.last_of_key.insert(change.written(), change);
            pending.coalesced += 1;
        }
    }

    pub fn addr(&self, addr: AddrKey, entry: Option<&AddrEntry>) {
        self.push(Change::Addr(addr, entry.map(|e| self.digests.entry(e))));
    }

    pub fn slot(&self, slot: u32, value: &IfaceEntry) {
        self.push(Change::Slot(slot, self.digests.slot(value)));
    }

    pub fn word(&self, word: u32, value: u64) {
        self.push(Change::Word(word, self.digests.word(value)));
    }

    /// A mirror of what the table holds now (`entries`, `slots`, `words`), fed from here on.
    pub fn mirror<'a>(
        &self,
        entries: impl Iterator<Item = (&'a AddrKey, &'a AddrEntry)>,
        slots: impl Iterator<Item = IfaceEntry>,
        words: &[u64],
        cells: SlotsReader,
    ) -> IntentMirror {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for (addr, entry) in entries {
            let digest = self.digests.entry(entry);
            match v4_word(addr) {
                Some(word) => v4.push((word, digest)),
                None => v6.push((addr.words, digest)),
            }
        }
        let mirror = IntentMirror {
            feed: self.clone(),
            v4: Sorted::from(v4),
            v6: Sorted::from(v6),
            slots: slots.map(|s| self.digests.slot(&s)).collect(),
            words: words.iter().map(|w| self.digests.word(*w)).collect(),
            cells,
            overflows: None,
        };
        // Anything the feed held before is in what the mirror was built from.
        mirror.feed.take();
        mirror
    }

    /// The writes since the last take, in an order where the last of each key comes last,
    /// and how many of them were coalesced past the bound.
    fn take(&self) -> (Vec<Change>, u64) {
        let Pending {
            mut in_order,
            last_of_key,
            coalesced,
        } = std::mem::take(&mut *self.pending());
        in_order.extend(last_of_key.into_values());
        (in_order, coalesced)
    }

    fn is_empty(&self) -> bool {
        let pending = self.pending();
        pending.in_order.is_empty() && pending.last_of_key.is_empty()
    }
}

impl Default for IntentFeed {
    fn default() -> Self {
        Self::new()
    }
}

fn v4_word(addr: &AddrKey) -> Option<u32> {
    addr.is_v4().then_some(addr.words[3])
}

/// Keys and their digests, in key order: a binary search to find one, a merge to change many.
#[derive(Debug, Default)]
pub(crate) struct Sorted<K> {
    entries: Vec<(K, u32)>,
}

impl<K: Ord + Copy> Sorted<K> {
    fn from(mut entries: Vec<(K, u32)>) -> Self {
        entries.sort_unstable_by_key(|(k, _)| *k);
        entries.dedup_by_key(|(k, _)| *k);
        entries.shrink_to_fit();
        Self { entries }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The index and digest of `key`.
    pub(crate) fn find(&self, key: &K) -> Option<(usize, u32)> {
        self.entries
            .binary_search_by_key(key, |(k, _)| *k)
            .ok()
            .map(|i| (i, self.entries[i].1))
    }

    pub(crate) fn key(&self, index: usize) -> K {
        self.entries[index].0
    }

    /// Applies `changes` (in the order made: the last of a key wins). Digests of keys already
    /// here change in place; keys added or removed cost one merge of the whole vector.
    fn apply(&mut self, mut changes: Vec<(K, Option<u32>)>) {
        if changes.is_empty() {
            return;
        }
        // Stable: the changes of one key stay in the order made.
        changes.sort_by_key(|(k, _)| *k);
        let mut last: Vec<(K, Option<u32>)> = Vec::with_capacity(changes.len());
        for change in changes {
            match last.last_mut() {
                Some(prev) if prev.0 == change.0 => *prev = change,
                _ => last.push(change),
            }
        }
        let mut structural = false;
        for (key, digest) in &last {
            match (self.entries.binary_search_by_key(key, |(k, _)| *k), digest) {
                (Ok(i), Some(digest)) => self.entries[i].1 = *digest,
                (Err(_), None) => {}
                _ => structural = true,
            }
        }
        if !structural {
            return;
        }
        let old = std::mem::take(&mut self.entries);
        let mut merged = Vec::with_capacity(old.len() + last.len());
        let mut changes = last.into_iter().peekable();
        for (key, digest) in old {
            while let Some((k, d)) = changes.next_if(|(k, _)| *k < key) {
                if let Some(d) = d {
                    merged.push((k, d));
                }
            }
            match changes.next_if(|(k, _)| *k == key) {
                Some((_, Some(d))) => merged.push((key, d)),
                Some((_, None)) => {}
                None => merged.push((key, digest)),
            }
        }
        merged.extend(changes.filter_map(|(k, d)| d.map(|d| (k, d))));
        merged.shrink_to_fit();
        self.entries = merged;
    }
}

/// What the table wrote, as digests, owned by the verification off the owner loop.
pub struct IntentMirror {
    feed: IntentFeed,
    pub(crate) v4: Sorted<u32>,
    pub(crate) v6: Sorted<[u32; 4]>,
    /// By `IPQ_IFACES` slot.
    pub(crate) slots: Vec<u32>,
    /// By `IPQ_QBLOOM` word.
    pub(crate) words: Vec<u32>,
    /// `IPQ_SLOTS`, read through the table's own mapping.
    pub(crate) cells: SlotsReader,
    /// Counts the writes the feed coalesced past its bound
    /// (`ipq_queue_overflows_total{queue="map_writes"}`), once the agent says where.
    overflows: Option<IntCounter>,
}

impl IntentMirror {
    /// Counts the writes its feed coalesces past the bound in `overflows`.
    pub fn counting_overflows(mut self, overflows: IntCounter) -> Self {
        self.overflows = Some(overflows);
        self
    }

    /// Takes in what the table wrote since the last call.
    pub fn absorb(&mut self) {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        let (changes, coalesced) = self.feed.take();
        if let (Some(overflows), 1..) = (&self.overflows, coalesced) {
            overflows.inc_by(coalesced);
        }
        for change in changes {
            match change {
                Change::Addr(addr, digest) => match v4_word(&addr) {
                    Some(word) => v4.push((word, digest)),
                    None => v6.push((addr.words, digest)),
                },
                Change::Slot(slot, digest) => {
                    if let Some(d) = self.slots.get_mut(slot as usize) {
                        *d = digest;
                    }
                }
                Change::Word(word, digest) => {
                    if let Some(d) = self.words.get_mut(word as usize) {
                        *d = digest;
                    }
                }
            }
        }
        self.v4.apply(v4);
        self.v6.apply(v6);
    }

    /// Whether the table wrote anything since the last [`Self::absorb`].
    pub fn behind(&self) -> bool {
        !self.feed.is_empty()
    }

    pub fn digests(&self) -> &Digests {
        &self.feed.digests
    }

    /// Addresses the table holds.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where `addr` is in the mirror (v4 indexes first, then v6) and its digest.
    pub(crate) fn find(&self, addr: &AddrKey) -> Option<(usize, u32)> {
        match v4_word(addr) {
            Some(word) => self.v4.find(&word),
            None => self
                .v6
                .find(&addr.words)
                .map(|(i, d)| (self.v4.len() + i, d)),
        }
    }

    /// The address at `index` of [`Self::find`]'s numbering.
    pub(crate) fn addr_at(&self, index: usize) -> AddrKey {
        if index < self.v4.len() {
            AddrKey::from_v4_wire(self.v4.key(index))
        } else {
            AddrKey::from_v6_wire(self.v6.key(index - self.v4.len()))
        }
    }
}

#[cfg(test)]
mod tests;
