//! The quarantine Bloom filter (`IPQ_QBLOOM`): the bits of every quarantined address, each
//! (word, bits) pair reference-counted so that an address leaving quarantine clears only what
//! no other quarantined address still sets. The uplink program looks an address up in the hash
//! map only when its bits are set.

use std::collections::HashMap;

use ipq_api::CheckedMap;
use ipq_common::{addr::AddrKey, filter::filter_position};

use super::drift::MapDrift;
use crate::datapath::{intent::IntentFeed, maps::QuarantineFilter, DatapathError};

pub(super) struct QuarantineBits {
    filter: QuarantineFilter,
    /// How many quarantined addresses set each (word, bits) pair of the filter.
    refs: HashMap<(u32, u64), u32>,
    words: Vec<u64>,
    /// Words of the filter minus one: the map's size, fixed at load.
    mask: u32,
    /// Every word written, for the verification's mirror.
    feed: IntentFeed,
}

impl QuarantineBits {
    /// No bit set yet: [`Self::rebuild`] from what the entries hold.
    pub(super) fn new(filter: QuarantineFilter, feed: IntentFeed) -> Self {
        let words = filter.len();
        Self {
            filter,
            refs: HashMap::new(),
            words: vec![0; words as usize],
            mask: words.saturating_sub(1),
            feed,
        }
    }

    /// Sets the bits of `addr` (before its entry says quarantined).
    pub(super) fn add(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        let (word, mask) = filter_position(addr, self.mask);
        let refs = self.refs.entry((word, mask)).or_insert(0);
        *refs += 1;
        if *refs == 1 {
            self.words[word as usize] |= mask;
            self.filter.set_word(word, self.words[word as usize])?;
            self.feed.word(word, self.words[word as usize]);
        }
        Ok(())
    }

    /// Clears the bits of `addr` no other quarantined address sets (after its entry stopped
    /// saying quarantined).
    pub(super) fn remove(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        let (word, mask) = filter_position(addr, self.mask);
        if let Some(refs) = self.refs.get_mut(&(word, mask)) {
            *refs -= 1;
            if *refs == 0 {
                self.refs.remove(&(word, mask));
                self.words[word as usize] &= !mask;
                self.filter.set_word(word, self.words[word as usize])?;
                self.feed.word(word, self.words[word as usize]);
            }
        }
        Ok(())
    }

    /// Sets the bits of every address of `quarantined` in memory, then writes each word once,
    /// with its final value; words no current entry sets (left by a previous agent) are
    /// cleared. The pinned programs enforce through the whole start-up: a word written as each
    /// address is added would, at its first write, drop the bits the pinned word held for the
    /// addresses not added yet, and the uplink program would skip their lookup until then.
    pub(super) fn rebuild<'a>(
        &mut self,
        quarantined: impl Iterator<Item = &'a AddrKey>,
    ) -> Result<(), DatapathError> {
        for addr in quarantined {
            let (word, mask) = filter_position(addr, self.mask);
            *self.refs.entry((word, mask)).or_insert(0) += 1;
            self.words[word as usize] |= mask;
        }
        self.write_all()
    }

    /// Writes every word as this table has it.
    fn write_all(&mut self) -> Result<(), DatapathError> {
        for word in 0..self.filter.len() {
            self.filter.set_word(word, self.words[word as usize])?;
        }
        Ok(())
    }

    /// Every word as written.
    pub(super) fn words(&self) -> &[u64] {
        &self.words
    }

    /// Looks at `word` again (a suspect of the comparison) and writes it back if the kernel
    /// still has something else.
    pub(super) fn recheck(&mut self, word: u32, drift: &mut Vec<MapDrift>) {
        let Some(&want) = self.words.get(word as usize) else {
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
