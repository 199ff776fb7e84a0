//! Every map of the kernel side, and the only code that touches them. Pinned by name so that an
//! agent restart or upgrade re-opens the same maps and enforcement never starts from empty.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use ipq_common::{
    addr::{AddrEntry, AddrKey, BPF_F_NO_PREALLOC},
    config::{DatapathConfig, Mode, DEFAULT_SAMPLE_INTERVAL_NS},
    counters::{Counter, Hook, COUNTER_SLOTS, SAMPLES_LOST_INDEX},
    filter::{filter_position, FILTER_WORDS_DEFAULT},
    iface::{iface_slot, IfaceEntry, IFACE_SLOTS},
    names::{DEFAULT_ADDR_CAPACITY, SAMPLES_RING_BYTES},
    probe::PROBE_SLOTS,
    sample::ConflictSample,
};

/// Not preallocated: see [`BPF_F_NO_PREALLOC`] and [`hashed`].
#[map]
static IPQ_ADDRS: HashMap<AddrKey, AddrEntry> =
    HashMap::pinned(DEFAULT_ADDR_CAPACITY, BPF_F_NO_PREALLOC);

#[map]
static IPQ_IFACES: Array<IfaceEntry> = Array::pinned(IFACE_SLOTS, 0);

/// Sized by the agent from `capacity` at load time, together with [`IPQ_QBLOOM_MASK`].
#[map]
static IPQ_QBLOOM: Array<u64> = Array::pinned(FILTER_WORDS_DEFAULT, 0);

/// Words of `IPQ_QBLOOM` minus one (a power of two minus one); set by the agent at load time.
/// A `.rodata` constant: the verifier knows its value, so the mask costs one `and`.
#[unsafe(no_mangle)]
static IPQ_QBLOOM_MASK: u32 = FILTER_WORDS_DEFAULT - 1;

#[map]
static IPQ_COUNTERS: PerCpuArray<Counter> = PerCpuArray::pinned(COUNTER_SLOTS, 0);

#[map]
static IPQ_SAMPLES: RingBuf = RingBuf::pinned(SAMPLES_RING_BYTES, 0);

#[map]
static IPQ_CONFIG: Array<DatapathConfig> = Array::pinned(1, 0);

/// Co-tenant probes seen, per hook: the programs are its one writer, the agent reads it.
#[map]
static IPQ_PROBES: Array<u64> = Array::pinned(PROBE_SLOTS, 0);

/// What a lookup found for an address: the entry as it was at one instant (only its first
/// block is copied; the stamps are read and written through `stamps`), and where the programs
/// stamp it.
#[derive(Clone, Copy)]
pub struct Found {
    pub entry: AddrEntry,
    pub stamps: *mut AddrEntry,
}

/// The entry of an address: from `IPQ_SLOTS` without a helper call, or from `IPQ_ADDRS` when
/// the agent was writing the slots that decide (see `slots`).
#[inline(always)]
pub fn addr_entry(addr: &AddrKey) -> Option<Found> {
    // The probe works on a copy of the key, never on the parsed packet: a reference into it
    // would make LLVM keep the whole packet struct in memory, every field stored on every path,
    // instead of in registers.
    let key: AddrKey = *addr;
    match crate::slots::probe(&key) {
        crate::slots::Probe::Hit(found) => Some(found),
        crate::slots::Probe::Miss => None,
        crate::slots::Probe::Unsure => hashed(key),
    }
}

/// How many times [`hashed`] looks an address up before it takes what it read last.
const HASH_READS: usize = 4;

/// The entry of an address in the authoritative hash map.
///
/// A value of `IPQ_ADDRS` can change under the program that reads it where the kernel reuses
/// an element the agent replaced or deleted before the program's run ends: a preallocated map
/// (an earlier build's pin) always does, and from Linux 6.1 the map this build creates may too
/// ([`BPF_F_NO_PREALLOC`]). The next update, of this or any address, may then copy another
/// value into the element this run is still reading. One copy may thus be torn, or another
/// address's (the kernel tier saw it under QEMU, which lets one vCPU stall mid-read while the
/// other writes: 75 of 42 million runs of the racing test on 6.12, 122 of 9 million on arm64
/// 5.10 with a preallocated map; 20 of 34 million on 6.1 with the reads below). So the
/// verdict's fields are read, the address looked up again and the fields read again through
/// the new lookup: two equal reads are a value the address had, unless both lookups' elements
/// were reused between lookup and read. That narrows the window, it does not close it; what
/// closes it is where the programs read this map: every verdict only where the loader chose
/// [`SlotsOrder::HashOnly`], a weakly ordered CPU before 5.12, whose kernel frees this map's
/// elements after a grace period; elsewhere only a probe of `IPQ_SLOTS` that overlapped the
/// agent's write of the slot that decides. Pointers are not compared: the verifier allows that
/// only with CAP_PERFMON.
///
/// [`SlotsOrder::HashOnly`]: ipq_common::slots::SlotsOrder::HashOnly
#[inline(always)]
fn hashed(key: AddrKey) -> Option<Found> {
    let mut entry = IPQ_ADDRS.get_ptr_mut(key)?;
    let mut first = verdict_fields(entry);
    for _ in 0..HASH_READS {
        let again = IPQ_ADDRS.get_ptr_mut(key)?;
        let second = verdict_fields(again);
        entry = again;
        if second == first {
            break;
        }
        first = second;
    }
    // Little-endian words (the bpfel target): the lower half is the field at the lower offset.
    let [head, tail] = first;
    Some(Found {
        entry: AddrEntry {
            state: head as u32,
            holder_ifindex: (head >> 32) as u32,
            fenced_ifindex: tail as u32,
            flags: (tail >> 32) as u32,
            since_ns: 0,
            last_stale_ns: 0,
            last_sample_ns: 0,
        },
        stamps: entry,
    })
}

/// The verdict's fields of an entry (state, holder, fenced interface, flags: its first 16
/// bytes) as two volatile 8-byte loads, so that the compiler reads them once each, where
/// [`hashed`] asks.
#[inline(always)]
fn verdict_fields(entry: *mut AddrEntry) -> [u64; 2] {
    let words = entry.cast::<u64>();
    // SAFETY: a map value of 40 bytes, 8-aligned (`AddrEntry`'s layout asserts), alive for
    // this program run.
    unsafe {
        [
            core::ptr::read_volatile(words),
            core::ptr::read_volatile(words.add(1)),
        ]
    }
}

/// The fast-path slot of a workload interface, if the slot currently describes it.
#[inline(always)]
pub fn iface_entry(ifindex: u32) -> Option<&'static IfaceEntry> {
    match IPQ_IFACES.get(iface_slot(ifindex)) {
        Some(entry) if entry.ifindex == ifindex => Some(entry),
        _ => None,
    }
}

/// Whether the filter says the address may be quarantined: both of its bits are set.
#[inline(always)]
pub fn maybe_quarantined(addr: &AddrKey) -> bool {
    // SAFETY: a plain read of a constant; volatile so that the compiler does not fold the
    // object's default into the code and the agent's value (set at load) is the one used.
    let words_mask = unsafe { core::ptr::read_volatile(&IPQ_QBLOOM_MASK) };
    let (word, bits) = filter_position(addr, words_mask);
    match IPQ_QBLOOM.get(word) {
        // A missing word (never, for an in-range index) must not hide a quarantined address.
        Some(set) => *set & bits == bits,
        None => true,
    }
}

/// The time of the current jiffy on this CPU, as the clock read at its first use.
#[repr(C)]
pub struct TickClock {
    jiffies: u64,
    ns: u64,
}

/// Per-CPU cache of [`TickClock`]: plain scratch, neither pinned nor read by the agent.
#[map]
static IPQ_TICK_CLOCK: PerCpuArray<TickClock> = PerCpuArray::with_max_entries(1, 0);

/// The clock's value for tick `jiffies` on this CPU: `read` runs on the first call in a tick.
#[inline(always)]
pub fn clock_for_tick(jiffies: u64, read: impl FnOnce() -> u64) -> u64 {
    match IPQ_TICK_CLOCK.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not migrate while they run.
        Some(cache) => unsafe {
            if (*cache).jiffies != jiffies || (*cache).ns == 0 {
                (*cache).jiffies = jiffies;
                (*cache).ns = read();
            }
            (*cache).ns
        },
        None => read(),
    }
}

/// What the drop path needs of the configuration, read in one lookup.
#[derive(Clone, Copy)]
pub struct Settings {
    pub mode: Mode,
    pub sample_interval_ns: u64,
}

#[inline(always)]
pub fn settings() -> Settings {
    match IPQ_CONFIG.get(0) {
        Some(config) => Settings {
            mode: Mode::from_raw(config.mode),
            sample_interval_ns: if config.sample_interval_ns != 0 {
                config.sample_interval_ns
            } else {
                DEFAULT_SAMPLE_INTERVAL_NS
            },
        },
        None => Settings {
            mode: Mode::Enforce,
            sample_interval_ns: DEFAULT_SAMPLE_INTERVAL_NS,
        },
    }
}

/// The cookie a probe must carry; 0 (an agent that sends none) matches nothing.
#[inline(always)]
pub fn probe_cookie() -> u32 {
    IPQ_CONFIG.get(0).map_or(0, |config| config.probe_cookie)
}

/// One probe seen on `hook`. A plain add: the agent sends one probe at a time and only looks
/// for a change, which a lost concurrent increment would not hide.
#[inline(always)]
pub fn count_probe(hook: Hook) {
    if let Some(seen) = IPQ_PROBES.get_ptr_mut(hook as u32) {
        // SAFETY: a map value alive for this program run.
        unsafe { *seen += 1 };
    }
}

#[inline(always)]
pub fn count(index: u32, bytes: u32) {
    if let Some(counter) = IPQ_COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot: no other CPU writes it, plain adds are exact.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(bytes);
        }
    }
}

/// Sends one sample; a full ring is counted, never waited on.
#[inline(always)]
pub fn send_sample(sample: &ConflictSample) {
    if IPQ_SAMPLES.output::<ConflictSample>(sample, 0).is_err() {
        count(SAMPLES_LOST_INDEX, 0);
    }
}
