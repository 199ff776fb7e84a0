//! One slot of `IPQ_SLOTS` as the agent reads and writes it in the shared mapping, and the
//! odd/even counter protocol the programs' readers check around every write.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use ipq_common::{
    addr::{AddrEntry, AddrKey},
    slots::{AddrSlot, SlotsMeta, SLOTS_MAGIC},
};

/// [`AddrSlot`] as the agent accesses it in the shared mapping: every field an atomic, so that
/// reads of the kernel-written stamps and the ordering of the agent's own stores are defined.
#[repr(C)]
#[derive(Default)]
pub struct SlotCell {
    pub(super) seq: AtomicU32,
    pub(super) version: AtomicU32,
    pub(super) key: [AtomicU32; 4],
    pub(super) state: AtomicU32,
    pub(super) holder_ifindex: AtomicU32,
    pub(super) fenced_ifindex: AtomicU32,
    pub(super) flags: AtomicU32,
    pub(super) since_ns: AtomicU64,
    pub(super) last_stale_ns: AtomicU64,
    pub(super) last_sample_ns: AtomicU64,
}
const _: () = assert!(size_of::<SlotCell>() == size_of::<AddrSlot>());
const _: () = assert!(align_of::<SlotCell>() == align_of::<AddrSlot>());
const _: () = assert!(core::mem::offset_of!(SlotCell, key) == core::mem::offset_of!(AddrSlot, key));
const _: () =
    assert!(core::mem::offset_of!(SlotCell, state) == core::mem::offset_of!(AddrSlot, entry));
const _: () = assert!(
    core::mem::offset_of!(SlotCell, last_sample_ns)
        == core::mem::offset_of!(AddrSlot, entry)
            + core::mem::offset_of!(AddrEntry, last_sample_ns)
);

impl SlotCell {
    pub(super) fn key(&self) -> AddrKey {
        AddrKey {
            words: [0, 1, 2, 3].map(|i| self.key[i].load(Ordering::Relaxed)),
        }
    }

    pub(super) fn occupied(&self) -> bool {
        self.state.load(Ordering::Relaxed) != 0
    }

    pub(super) fn entry(&self) -> AddrEntry {
        AddrEntry {
            state: self.state.load(Ordering::Relaxed),
            holder_ifindex: self.holder_ifindex.load(Ordering::Relaxed),
            fenced_ifindex: self.fenced_ifindex.load(Ordering::Relaxed),
            flags: self.flags.load(Ordering::Relaxed),
            since_ns: self.since_ns.load(Ordering::Relaxed),
            last_stale_ns: self.last_stale_ns.load(Ordering::Relaxed),
            last_sample_ns: self.last_sample_ns.load(Ordering::Relaxed),
        }
    }

    /// Stores the agent-owned part of `entry`, and the stamps too when `stamps`.
    pub(super) fn store(&self, key: Option<&AddrKey>, entry: &AddrEntry, stamps: bool) {
        let relaxed = Ordering::Relaxed;
        if let Some(key) = key {
            for (cell, word) in self.key.iter().zip(key.words) {
                cell.store(word, relaxed);
            }
        }
        self.state.store(entry.state, relaxed);
        self.holder_ifindex.store(entry.holder_ifindex, relaxed);
        self.fenced_ifindex.store(entry.fenced_ifindex, relaxed);
        self.flags.store(entry.flags, relaxed);
        self.since_ns.store(entry.since_ns, relaxed);
        if stamps {
            self.last_stale_ns.store(entry.last_stale_ns, relaxed);
            self.last_sample_ns.store(entry.last_sample_ns, relaxed);
        }
    }

    pub(super) fn meta(&self) -> SlotsMeta {
        let relaxed = Ordering::Relaxed;
        SlotsMeta {
            magic: self.seq.load(relaxed),
            buckets: self.version.load(relaxed),
            seed: u64::from(self.key[0].load(relaxed)) | u64::from(self.key[1].load(relaxed)) << 32,
            _reserved: [0; 6],
        }
    }

    /// Writes the table's [`SlotsMeta`] into this (its last) element, the magic last.
    pub(super) fn set_meta(&self, buckets: u32, seed: u64) {
        let relaxed = Ordering::Relaxed;
        self.version.store(buckets, relaxed);
        self.key[0].store(seed as u32, relaxed);
        self.key[1].store((seed >> 32) as u32, relaxed);
        self.seq.store(SLOTS_MAGIC, Ordering::Release);
    }
}

// The meta element is read through the same cells: its fields must sit where `SlotsMeta` says.
const _: () = assert!(core::mem::offset_of!(SlotsMeta, magic) == 0);
const _: () = assert!(core::mem::offset_of!(SlotsMeta, buckets) == 4);
const _: () = assert!(core::mem::offset_of!(SlotsMeta, seed) == 8);

/// Runs `write` with `counter` odd, the way the programs' readers expect: odd first (and
/// visible before anything `write` stores), even after. A counter left odd by an agent killed
/// mid-write is resumed, not flipped back to even before the write.
pub(super) fn odd_around<R>(counter: &AtomicU32, write: impl FnOnce() -> R) -> R {
    let now = counter.load(Ordering::Relaxed);
    let odd = now | 1;
    counter.store(odd, Ordering::Relaxed);
    fence(Ordering::Release);
    let result = write();
    counter.store(odd.wrapping_add(1), Ordering::Release);
    result
}
