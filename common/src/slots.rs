//! `IPQ_SLOTS`: the exact copy of `IPQ_ADDRS` that the programs read without a helper call.
//!
//! A hash-map lookup is a call into the kernel (`__htab_map_lookup_elem`, which calls `memcmp`),
//! and on CPUs with return-stack mitigations (`spec_rstack_overflow`, retbleed) every return
//! costs more than the rest of a drop together: a hit measured 25–30 ns, twice an empty
//! program. An array lookup is inlined by the verifier into a bounds check and an add, so
//! the programs find an address here with loads and compares only.
//!
//! # Layout
//! A bucketed cuckoo table: every address has two buckets of [`SLOT_WAYS`] slots, chosen by a
//! keyed hash ([`slot_buckets`]), and lives in one slot of one of them. A lookup reads at most
//! eight slots, whatever the table holds. The table has at least 8/5 as many slots as the
//! registry can hold addresses (load ≤ 5/8 when full), rounded up to a power of two; a 2×4
//! cuckoo table holds some 95 % before an insert fails, so at 5/8 an insert practically never
//! fails; if one does, the agent reports the address as not stored, exactly as a full hash map
//! did. (Two slots an address, rounded up, made the table of `capacity = 81920` four times its
//! addresses, 16 MiB resident in the agent; at most 5/8 it is 8 MiB.)
//!
//! The seed of the hash is random per table, so no one who picks addresses can aim them at the
//! same two buckets. It lives in the table's last element ([`SlotsMeta`]), after every bucket,
//! so a pinned table and its seed cannot part; the programs get it as a `.rodata` constant.
//!
//! # Concurrency
//! The agent writes the table through a shared mapping (`BPF_F_MMAPABLE`), one slot at a time,
//! while programs read it on every CPU. Two counters keep every answer exact:
//! - each slot's `seq` is odd while the agent writes it: a reader that finds its address in a
//!   slot trusts what it copied only if `seq` was the same even number before and after;
//! - each bucket's `version` (kept in its first slot) is odd while the agent writes any slot of
//!   an address whose first bucket it is, including a move to its other bucket: a reader that
//!   did not find its address trusts the miss only if that version was the same even number
//!   before and after the probe.
//!
//! A reader that cannot trust its probe asks `IPQ_ADDRS`, which the agent keeps exact and
//! writes before the copy (an address is added here first and removed here first).
//!
//! # Memory order
//! The protocol needs the loads between two reads of a counter to happen after the first read
//! and before the second: a seqlock reader's acquire and read barrier. Loads are `volatile`, so
//! neither LLVM nor the JIT reorders them; what the CPU may do depends on it, and the loader
//! tells the programs which [`SlotsOrder`] to use:
//! - x86-64 keeps loads in order with loads (x86-TSO), and its JIT emits one load for each BPF
//!   load: [`SlotsOrder::InOrder`], plain loads, no barrier;
//! - a weakly ordered CPU (arm64) may take a later load early. The BPF instruction set has
//!   load-acquire only from Linux 6.15 (cpu v4), but from 5.12 on an atomic read-modify-write
//!   with `BPF_FETCH` is fully ordered on every JIT (arm64 emits `ldaddal`, or an exclusive
//!   pair and `dmb ish`; the kernel selftests' `bpf_atomic.h` builds `smp_mb()` the same way):
//!   [`SlotsOrder::FetchBarrier`], a fetch-add of 0 on the program's stack around each read. A
//!   plain atomic add (`lock` add, no fetch) would order nothing on arm64: the object has none,
//!   which a test of the built object checks. These programs are an object of their own (the
//!   eBPF crate's `fetch-barriers` feature): 5.10's verifier refuses a fetch atomic before it
//!   looks at any path, even in code the order's constant makes dead, so the object every
//!   other case loads has no atomic instruction at all.
//! - a weakly ordered CPU whose kernel has no fetch atomics (before 5.12):
//!   [`SlotsOrder::HashOnly`], the table is not read at all and every lookup asks `IPQ_ADDRS`.
//!
//! The barriers sit where the order matters, and only there: after a bucket's `version` is
//! read and before it is read again (a miss is trusted only across them), and, once a slot's
//! key matched without a barrier, after its `seq` and before its `seq` is read again (the key
//! and the entry are read again between them). A probe that misses pays two, one that hits four.

/// How the programs order their loads of the table: a `.rodata` constant
/// ([`SLOTS_ORDER_GLOBAL`]) the loader chooses for the CPU and the kernel; the branches of the
/// other orders are dead code the verifier removes.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[cfg_attr(
    feature = "names",
    derive(strum::IntoStaticStr),
    strum(serialize_all = "kebab-case")
)]
pub enum SlotsOrder {
    /// Plain loads: the CPU keeps loads in order (x86-64).
    #[default]
    InOrder = 0,
    /// A full barrier (an atomic fetch-add of 0 on the stack) where the protocol needs one.
    FetchBarrier = 1,
    /// The table is not read; every lookup asks `IPQ_ADDRS`.
    HashOnly = 2,
}

impl SlotsOrder {
    /// The order for a CPU that keeps loads in order or not, on a kernel with fetch atomics
    /// (`BPF_ATOMIC | BPF_FETCH`, Linux 5.12) or not.
    pub const fn choose(loads_in_order: bool, fetch_atomics: bool) -> Self {
        match (loads_in_order, fetch_atomics) {
            (true, _) => Self::InOrder,
            (false, true) => Self::FetchBarrier,
            (false, false) => Self::HashOnly,
        }
    }
}

/// The `.rodata` global holding the [`SlotsOrder`] the loader chose.
pub const SLOTS_ORDER_GLOBAL: &str = "IPQ_SLOTS_ORDER";

use crate::addr::{AddrEntry, AddrKey};

/// Slots per bucket: one bucket's slots fill four cache lines and are probed in order.
pub const SLOT_WAYS: u32 = 4;
/// The most of the table's slots a full registry fills: 5/8 (numerator, denominator). The
/// power of two above it leaves a load between 5/16 and 5/8.
pub const SLOTS_MAX_LOAD: (u32, u32) = (5, 8);
/// The fewest buckets a table has (a power of two, so two distinct buckets always exist).
pub const SLOT_BUCKETS_MIN: u32 = 16;
/// The `.rodata` globals the loader sets from the pinned (or new) table.
pub const SLOTS_MASK_GLOBAL: &str = "IPQ_SLOTS_MASK";
pub const SLOTS_SEED_GLOBAL: &str = "IPQ_SLOTS_SEED";
/// `BPF_F_MMAPABLE`: the agent writes the table through a shared mapping.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Marks a [`SlotsMeta`] the agent wrote ("IPQS").
pub const SLOTS_MAGIC: u32 = 0x5351_5049;

/// One slot of `IPQ_SLOTS`: exactly one 64-byte cache line.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AddrSlot {
    /// Odd while the agent writes this slot.
    pub seq: u32,
    /// In the first slot of a bucket only: odd while the agent writes any slot of an address
    /// whose first bucket this is. Unused (0) in the other slots.
    pub version: u32,
    /// The address; meaningful only when `entry.state` is not 0.
    pub key: AddrKey,
    /// As in `IPQ_ADDRS`; `state` 0 marks an empty slot. The programs write the stamps here.
    pub entry: AddrEntry,
}
crate::assert_layout!(AddrSlot, size = 64, align = 8);
crate::assert_offsets!(AddrSlot {
    seq: 0,
    version: 4,
    key: 8,
    entry: 24,
});

/// The element after the last bucket: what the table was made with.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SlotsMeta {
    /// [`SLOTS_MAGIC`] once the agent has written the seed; 0 in a table never set up.
    pub magic: u32,
    /// Buckets of the table (a power of two): the array holds `buckets * SLOT_WAYS + 1`.
    pub buckets: u32,
    /// The key of [`slot_hash`].
    pub seed: u64,
    pub _reserved: [u64; 6],
}
crate::assert_layout!(SlotsMeta, size = 64, align = 8);
crate::assert_offsets!(SlotsMeta {
    magic: 0,
    buckets: 4,
    seed: 8,
    _reserved: 16,
});

/// Buckets of a table for `capacity` addresses: the fewest, a power of two, that `capacity`
/// fills to at most [`SLOTS_MAX_LOAD`].
pub const fn slot_buckets(capacity: u32) -> u32 {
    let (load, of) = SLOTS_MAX_LOAD;
    let slots = (capacity as u64 * of as u64).div_ceil(load as u64);
    let buckets = slots.div_ceil(SLOT_WAYS as u64).next_power_of_two();
    if buckets < SLOT_BUCKETS_MIN as u64 {
        SLOT_BUCKETS_MIN
    } else {
        buckets as u32
    }
}

/// Array elements of a table of `buckets`: every slot, then the [`SlotsMeta`].
pub const fn slot_entries(buckets: u32) -> u32 {
    buckets * SLOT_WAYS + 1
}

/// The buckets of a pinned array of `entries` elements, if it is a table this build can read.
pub const fn buckets_of_entries(entries: u32) -> Option<u32> {
    if entries == 0 || !(entries - 1).is_multiple_of(SLOT_WAYS) {
        return None;
    }
    let buckets = (entries - 1) / SLOT_WAYS;
    if buckets.is_power_of_two() && buckets >= SLOT_BUCKETS_MIN {
        Some(buckets)
    } else {
        None
    }
}

/// A keyed 64-bit mix of the address (the quarantine filter's hash is this with key 0). Every
/// input bit must reach every output bit: addresses
/// of one subnet differ only in a few bits, and an IPv4 address's bits sit at the top of its
/// word (wire order read little-endian), where one multiply would carry them nowhere below.
#[inline(always)]
pub const fn slot_hash(addr: &AddrKey, seed: u64) -> u64 {
    let high = ((addr.words[0] as u64) << 32) | addr.words[1] as u64;
    let low = ((addr.words[2] as u64) << 32) | addr.words[3] as u64;
    let mut h = high.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ low ^ seed;
    h ^= h >> 31;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 29;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 32)
}

/// The two buckets of `addr` in a table of `mask + 1` buckets: always distinct.
#[inline(always)]
pub const fn slot_buckets_of(addr: &AddrKey, seed: u64, mask: u32) -> (u32, u32) {
    let h = slot_hash(addr, seed);
    let first = h as u32 & mask;
    let mut second = (h >> 32) as u32 & mask;
    if second == first {
        second = first ^ 1;
    }
    (first, second)
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn sizes_fill_a_power_of_two_of_buckets_to_at_most_five_eighths() {
        assert_eq!(slot_buckets(1), SLOT_BUCKETS_MIN);
        assert_eq!(slot_buckets(65536), 32768);
        // The bench's `capacity = 81920` fills 131072 slots to exactly 5/8 (it took 65536
        // buckets, 16 MiB, at two slots an address).
        assert_eq!(slot_buckets(81920), 32768);
        assert_eq!(slot_buckets(81921), 65536);
        for capacity in [1, 100, 4096, 65536, 81920, 81921, 100_000, 1 << 20] {
            let slots = u64::from(slot_buckets(capacity)) * u64::from(SLOT_WAYS);
            assert!(
                u64::from(capacity) * 8 <= slots * 5,
                "{capacity} in {slots} slots"
            );
            assert!(
                slots == u64::from(SLOT_BUCKETS_MIN * SLOT_WAYS)
                    || u64::from(capacity) * 8 > slots / 2 * 5,
                "{capacity}: {slots} slots, half would do"
            );
        }
        assert_eq!(slot_entries(32768), 131073);
        assert_eq!(buckets_of_entries(131073), Some(32768));
        assert_eq!(buckets_of_entries(131072), None);
        assert_eq!(buckets_of_entries(4 * 24 + 1), None);
        assert_eq!(buckets_of_entries(5), None);
        assert_eq!(slot_buckets(1 << 24), 1 << 23);
    }

    #[test]
    fn buckets_are_distinct_and_spread_a_subnet_evenly() {
        let mask = 1023;
        let mut load = std::vec![0u32; 1024];
        for i in 0..4096u32 {
            let key = AddrKey::from_ipv4(core::net::Ipv4Addr::from(0x0a00_0000 + i));
            let (a, b) = slot_buckets_of(&key, 0x1234_5678_9abc_def0, mask);
            assert_ne!(a, b);
            load[a as usize] += 1;
        }
        // 4 per bucket on average: a poor mix of a /20 would pile them up.
        assert!(load.iter().all(|&n| n <= 16), "{:?}", load.iter().max());
    }

    #[test]
    fn the_second_bucket_does_not_follow_from_the_first() {
        // With correlated halves, the pairs of a subnet's addresses would fall into a few
        // fixed bucket pairs, and cuckoo moves would have nowhere to go.
        let mask = 15;
        let mut pairs = std::collections::BTreeSet::new();
        for i in 0..256u32 {
            let key = AddrKey::from_ipv4(core::net::Ipv4Addr::from(0x0a00_0000 + i));
            pairs.insert(slot_buckets_of(&key, 0xfeed, mask));
        }
        // 240 ordered pairs of distinct buckets exist; 256 draws reach most of them.
        assert!(pairs.len() > 120, "{} distinct pairs", pairs.len());
    }

    #[test]
    fn the_seed_changes_the_buckets() {
        let key = AddrKey::from_ipv4(core::net::Ipv4Addr::new(10, 0, 0, 1));
        let a = slot_buckets_of(&key, 1, u32::MAX >> 8);
        let b = slot_buckets_of(&key, 2, u32::MAX >> 8);
        assert_ne!(a, b);
    }
}
