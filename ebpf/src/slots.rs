//! The kernel side of `IPQ_SLOTS` (see `ipq_common::slots` for the table and its protocol): a
//! probe of an address's two buckets with loads and compares only, no helper call.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{macros::map, maps::Array};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    names::DEFAULT_ADDR_CAPACITY,
    slots::{
        slot_buckets, slot_buckets_of, slot_entries, AddrSlot, SlotsOrder, BPF_F_MMAPABLE,
        SLOT_WAYS,
    },
};

use crate::maps::Found;

/// Sized by the agent from `capacity` at load time, together with the two globals below.
#[map]
static IPQ_SLOTS: Array<AddrSlot> = Array::pinned(
    slot_entries(slot_buckets(DEFAULT_ADDR_CAPACITY)),
    BPF_F_MMAPABLE,
);

/// Buckets of `IPQ_SLOTS` minus one, and the key of its hash: `.rodata` constants the loader
/// sets from the table it loads with, so the verifier sees them as constants.
#[unsafe(no_mangle)]
static IPQ_SLOTS_MASK: u32 = slot_buckets(DEFAULT_ADDR_CAPACITY) - 1;
#[unsafe(no_mangle)]
static IPQ_SLOTS_SEED: u64 = 0;
/// The [`SlotsOrder`] the loader chose for this CPU and kernel (`ipq_common::slots`, "Memory
/// order"): a constant to the verifier, which removes the other orders' branches.
#[unsafe(no_mangle)]
static IPQ_SLOTS_ORDER: u32 = SlotsOrder::InOrder as u32;

/// Whether the loads of the table need barriers between them: only in the object built with
/// `fetch-barriers` (an object without it has no atomic instruction at all, which 5.10 needs),
/// and there as the loader chose.
#[inline(always)]
fn fenced() -> bool {
    // SAFETY: a plain read of a constant; volatile so that the default is not folded in.
    cfg!(feature = "fetch-barriers")
        && unsafe { read_volatile(&IPQ_SLOTS_ORDER) == SlotsOrder::FetchBarrier as u32 }
}

/// A full memory barrier where [`fenced`]: an atomic fetch-add of 0 on a word of the stack, which
/// every JIT emits fully ordered (arm64: `ldaddal`, or an exclusive pair and `dmb ish`). Written
/// as the instruction itself so that no compiler can turn it into an add without `BPF_FETCH`
/// (which orders nothing on arm64) and none reorders memory accesses across it (the asm may
/// read and write any memory).
#[inline(always)]
fn barrier() {
    if !fenced() {
        return;
    }
    #[cfg(feature = "fetch-barriers")]
    fetch_add_zero();
}

#[cfg(feature = "fetch-barriers")]
#[inline(always)]
fn fetch_add_zero() {
    let mut word: u64 = 0;
    // SAFETY: the instruction reads and writes `word`, an initialised stack slot, and nothing
    // else.
    unsafe {
        core::arch::asm!(
            "{old} = atomic_fetch_add((u64 *)({word} + 0), {old})",
            word = in(reg) core::ptr::addr_of_mut!(word),
            old = inout(reg) 0u64 => _,
            options(nostack),
        );
    }
}

/// What a probe of the table concluded.
pub enum Probe {
    /// The address's entry, copied while its slot was stable.
    Hit(Found),
    /// The address is in neither bucket, and nothing moved it while the probe looked.
    Miss,
    /// The agent was writing a slot that decides: ask the hash map.
    Unsure,
}

/// The key as the two 8-byte words it occupies in a slot (little-endian, like the target).
#[derive(Clone, Copy)]
struct Words {
    high: u64,
    low: u64,
}

#[inline(always)]
pub fn probe(key: &AddrKey) -> Probe {
    // SAFETY: plain reads of constants; volatile so that the compiler does not fold the
    // object's defaults into the code and the values the loader set are the ones used.
    let mask = unsafe { read_volatile(&IPQ_SLOTS_MASK) };
    let seed = unsafe { read_volatile(&IPQ_SLOTS_SEED) };
    if unsafe { read_volatile(&IPQ_SLOTS_ORDER) } == SlotsOrder::HashOnly as u32 {
        return Probe::Unsure;
    }
    let (first, second) = slot_buckets_of(key, seed, mask);
    let want = Words {
        high: u64::from(key.words[0]) | u64::from(key.words[1]) << 32,
        low: u64::from(key.words[2]) | u64::from(key.words[3]) << 32,
    };
    let Some(home) = IPQ_SLOTS.get_ptr_mut(first * SLOT_WAYS) else {
        return Probe::Unsure;
    };
    // SAFETY (every read below): pointers into map values the kernel keeps alive for this
    // program run, at offsets inside the 64-byte value.
    let version = unsafe { read_volatile(addr_of!((*home).version)) };
    // Acquire: no slot is read before the version.
    barrier();
    match bucket(first, want) {
        Probe::Miss => {}
        decided => return decided,
    }
    match bucket(second, want) {
        Probe::Miss => {}
        decided => return decided,
    }
    // Read barrier: every slot was read before the version is read again.
    barrier();
    let again = unsafe { read_volatile(addr_of!((*home).version)) };
    if version == again && version & 1 == 0 {
        Probe::Miss
    } else {
        Probe::Unsure
    }
}

#[inline(always)]
fn bucket(bucket: u32, want: Words) -> Probe {
    let mut way = 0;
    while way < SLOT_WAYS {
        let Some(slot) = IPQ_SLOTS.get_ptr_mut(bucket * SLOT_WAYS + way) else {
            return Probe::Unsure;
        };
        match read(slot, want) {
            Probe::Miss => {}
            decided => return decided,
        }
        way += 1;
    }
    Probe::Miss
}

/// Reads one slot: a hit only if it holds the key and `seq` was the same even number around
/// the copy; `Unsure` if it holds the key but was being written.
///
/// The key is compared first without a barrier: a slot that does not hold it is a miss the
/// bucket's version vouches for. Only a slot that matched is read again between two reads of
/// its `seq` with the barriers the protocol needs, key included, so that what is returned was
/// all read after the first `seq` and before the second.
#[inline(always)]
fn read(slot: *mut AddrSlot, want: Words) -> Probe {
    unsafe {
        let seq = read_volatile(addr_of!((*slot).seq));
        let key = addr_of!((*slot).key).cast::<u64>();
        if read_volatile(key) != want.high || read_volatile(key.add(1)) != want.low {
            return Probe::Miss;
        }
        // Acquire: the key and the entry below are read after `seq`.
        barrier();
        if fenced() && (read_volatile(key) != want.high || read_volatile(key.add(1)) != want.low) {
            // The slot changed between the two reads of its key: a write is under way.
            return Probe::Unsure;
        }
        let entry = addr_of!((*slot).entry);
        let state = read_volatile(addr_of!((*entry).state));
        let holder_ifindex = read_volatile(addr_of!((*entry).holder_ifindex));
        let fenced_ifindex = read_volatile(addr_of!((*entry).fenced_ifindex));
        let flags = read_volatile(addr_of!((*entry).flags));
        // Read barrier: everything above is read before `seq` is read again.
        barrier();
        let after = read_volatile(addr_of!((*slot).seq));
        if seq != after || seq & 1 != 0 {
            return Probe::Unsure;
        }
        if state == 0 {
            // An empty slot (its key is `::`, which is never registered).
            return Probe::Miss;
        }
        Probe::Hit(Found {
            entry: AddrEntry {
                state,
                holder_ifindex,
                fenced_ifindex,
                flags,
                since_ns: 0,
                last_stale_ns: 0,
                last_sample_ns: 0,
            },
            stamps: addr_of!((*slot).entry).cast_mut(),
        })
    }
}
