//! Where an address may live in `IPQ_SLOTS`: the table's geometry (buckets of [`SLOT_WAYS`]
//! slots) and its keyed hash, the same the programs compute (`ipq_common::slots`). An address
//! lives in one of its two buckets; the first slot of its first bucket holds its version.

use ipq_common::{
    addr::AddrKey,
    slots::{slot_buckets_of, SLOT_WAYS},
};

/// The buckets of a table and the seed of its hash, fixed when the table was set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    buckets: u32,
    seed: u64,
}

impl SlotLayout {
    /// `buckets` is a power of two (the programs mask the hash with `buckets - 1`).
    pub(super) fn new(buckets: u32, seed: u64) -> Self {
        Self { buckets, seed }
    }

    pub fn buckets(self) -> u32 {
        self.buckets
    }

    pub fn seed(self) -> u64 {
        self.seed
    }

    /// Slots of the table, the meta element aside.
    pub fn slots(self) -> usize {
        (self.buckets * SLOT_WAYS) as usize
    }

    /// The two buckets `key` may live in.
    pub fn buckets_of(self, key: &AddrKey) -> (u32, u32) {
        slot_buckets_of(key, self.seed, self.buckets - 1)
    }

    /// The slots of `bucket`.
    pub fn slot_range(bucket: u32) -> std::ops::Range<usize> {
        let first = (bucket * SLOT_WAYS) as usize;
        first..first + SLOT_WAYS as usize
    }

    /// The slot holding the version of `key` (the first slot of its first bucket).
    pub(super) fn version_slot(self, key: &AddrKey) -> usize {
        let (first, _) = self.buckets_of(key);
        (first * SLOT_WAYS) as usize
    }

    /// The bucket other than the one of `slot` that `occupant` (the key in `slot`) may move to.
    pub(super) fn other_bucket(self, slot: usize, occupant: &AddrKey) -> u32 {
        let (a, b) = self.buckets_of(occupant);
        let here = (slot / SLOT_WAYS as usize) as u32;
        if here == a {
            b
        } else {
            a
        }
    }
}
