//! Every map of the kernel side, and the only code that touches them. Pinned by name so that an
//! agent restart or upgrade re-opens the same maps and enforcement never starts from empty.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    config::{DatapathConfig, Mode, DEFAULT_SAMPLE_INTERVAL_NS},
    counters::{Counter, COUNTER_SLOTS, SAMPLES_LOST_INDEX},
    filter::{filter_position, FILTER_WORDS},
    iface::{iface_slot, IfaceEntry, IFACE_SLOTS},
    names::{DEFAULT_ADDR_CAPACITY, SAMPLES_RING_BYTES},
    sample::ConflictSample,
};

#[map]
static IPQ_ADDRS: HashMap<AddrKey, AddrEntry> = HashMap::pinned(DEFAULT_ADDR_CAPACITY, 0);

#[map]
static IPQ_IFACES: Array<IfaceEntry> = Array::pinned(IFACE_SLOTS, 0);

#[map]
static IPQ_QFILTER: Array<u64> = Array::pinned(FILTER_WORDS, 0);

#[map]
static IPQ_COUNTERS: PerCpuArray<Counter> = PerCpuArray::pinned(COUNTER_SLOTS, 0);

#[map]
static IPQ_SAMPLES: RingBuf = RingBuf::pinned(SAMPLES_RING_BYTES, 0);

#[map]
static IPQ_CONFIG: Array<DatapathConfig> = Array::pinned(1, 0);

/// The entry of an address, writable for the kernel-owned fields.
#[inline(always)]
pub fn addr_entry(addr: &AddrKey) -> Option<*mut AddrEntry> {
    IPQ_ADDRS.get_ptr_mut(addr)
}

/// The fast-path slot of a workload interface, if the slot currently describes it.
#[inline(always)]
pub fn iface_entry(ifindex: u32) -> Option<&'static IfaceEntry> {
    match IPQ_IFACES.get(iface_slot(ifindex)) {
        Some(entry) if entry.ifindex == ifindex => Some(entry),
        _ => None,
    }
}

/// Whether the bitmap says the address may be quarantined.
#[inline(always)]
pub fn maybe_quarantined(addr: &AddrKey) -> bool {
    let (word, mask) = filter_position(addr);
    match IPQ_QFILTER.get(word) {
        Some(bits) => *bits & mask != 0,
        None => false,
    }
}

#[inline(always)]
fn config() -> Option<&'static DatapathConfig> {
    IPQ_CONFIG.get(0)
}

#[inline(always)]
pub fn mode() -> Mode {
    match config() {
        Some(config) => Mode::from_raw(config.mode),
        None => Mode::Enforce,
    }
}

#[inline(always)]
pub fn sample_interval_ns() -> u64 {
    match config() {
        Some(config) if config.sample_interval_ns != 0 => config.sample_interval_ns,
        _ => DEFAULT_SAMPLE_INTERVAL_NS,
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
