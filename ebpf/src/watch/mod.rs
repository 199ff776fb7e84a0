//! The watcher: every `bpf()` call of another process that can take an attachment from ipq or
//! write its maps, reported to the agent through `IPQ_BPF_CALLS` (see `ipq_common::watch`).
//!
//! Two ways to see the calls, the agent attaches one:
//! - [`fentry`]: BPF trampolines on the kernel's own bpf() path (Linux 5.5+ on x86-64, 6.0+
//!   on arm64, with BTF). Only the functions that run for bpf() pay; they see the kernel's
//!   copy of the attributes and of a written key (no user-memory race), every command however
//!   it was entered (compat included), and every write of ipq's maps by map identity, however
//!   the caller got its descriptor.
//! - [`raw_tp`]: a raw tracepoint on `sys_enter` (x86-64 only), the fallback where trampolines
//!   cannot attach; every system call of the node pays for it.
//!
//! Both leave out the agent's own calls first ([`is_agent`]), in whatever PID namespace it
//! runs.

pub mod fentry;
pub mod raw_tp;

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::generated::bpf_get_ns_current_pid_tgid,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
};
use ipq_common::watch::{BpfCall, BPF_CALLS_RING_BYTES, WATCHED_MAPS, WATCHED_TGIDS};

/// What the watcher reports; read by the agent that loaded it (not pinned).
#[map]
static IPQ_BPF_CALLS: RingBuf = RingBuf::with_byte_size(BPF_CALLS_RING_BYTES, 0);

/// Calls not reported because `IPQ_BPF_CALLS` was full: the agent, which cannot know what
/// they were, verifies everything when this grows (per CPU; read by the agent that loaded it).
#[map]
static IPQ_BPF_CALLS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The raw tracepoint's processes that opened one of ipq's maps, whose map writes are
/// reported. Written by the agent only.
#[map]
static IPQ_WATCHED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(WATCHED_TGIDS, 0);

/// The trampolines': the ids of ipq's pinned maps (0: none), whose writes, opens and
/// mappings are reported, by any process. Written by the agent only, before it attaches them.
#[map]
static IPQ_WATCHED_MAPS: Array<u32> = Array::with_max_entries(WATCHED_MAPS, 0);

/// The agent's process id in its own PID namespace, set at load.
#[unsafe(no_mangle)]
static IPQ_WATCH_TGID: u32 = 0;

/// The agent's PID namespace, device (the kernel's `dev_t`) and inode, set at load.
#[unsafe(no_mangle)]
static IPQ_WATCH_PIDNS_DEV: u64 = 0;
#[unsafe(no_mangle)]
static IPQ_WATCH_PIDNS_INO: u64 = 0;

/// Reads a `.rodata` constant the loader sets; volatile so that the default is not folded
/// into the code.
#[inline(always)]
fn global<T: Copy>(value: &T) -> T {
    // SAFETY: a plain read of a static.
    unsafe { core::ptr::read_volatile(value) }
}

/// Whether the current task is the agent: its thread group id translated into the agent's
/// PID namespace is the agent's. A task of another PID namespace (the helper fails) is
/// someone else, whatever its number there.
#[inline(always)]
fn is_agent() -> bool {
    let mut ids = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes at most `size_of::<bpf_pidns_info>()` bytes into `ids`.
    let rc = unsafe {
        bpf_get_ns_current_pid_tgid(
            global(&IPQ_WATCH_PIDNS_DEV),
            global(&IPQ_WATCH_PIDNS_INO),
            &mut ids,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    rc == 0 && ids.tgid == global(&IPQ_WATCH_TGID)
}

/// Whether `id` is one of ipq's pinned maps (one compare per slot; unrolled).
#[inline(always)]
fn is_ipq_map(id: u32) -> bool {
    if id == 0 {
        return false;
    }
    let mut i = 0;
    while i < WATCHED_MAPS {
        if IPQ_WATCHED_MAPS
            .get(i)
            .is_some_and(|watched| *watched == id)
        {
            return true;
        }
        i += 1;
    }
    false
}

/// Reserves a record of the ring, or counts a lost call where it is full.
#[inline(always)]
fn reserve() -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<BpfCall>> {
    let entry = IPQ_BPF_CALLS.reserve::<BpfCall>(0);
    if entry.is_none() {
        if let Some(lost) = IPQ_BPF_CALLS_LOST.get_ptr_mut(0) {
            // SAFETY: this CPU's slot. A task preempted on this CPU between the load and the
            // store may lose an increment of another: the agent needs to know that calls were
            // lost, not exactly how many.
            unsafe { *lost += 1 };
        }
    }
    entry
}
