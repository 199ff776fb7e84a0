//! What every hook does once it has a reason about a packet: count it, stamp the entry, send a
//! rate-limited sample, and drop unless the mode is `observe`.
//!
//! This is the drop path, kept cheap: the configuration is read once, the clock at most once
//! per tick per CPU ([`now`]), and a sample is built (out of line) only when one is due.

use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    programs::{TcContext, XdpContext},
    EbpfContext,
};
use aya_log_ebpf::debug;
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    counters::{counter_index, Action, Hook, Reason},
    sample::ConflictSample,
    verdict::action_for_entry,
};

use crate::{
    maps::{self, Found},
    parse::{Frame, SOURCE_MAC_OFFSET},
    Verdict,
};

/// Which clock stamps the entries and samples, set by the loader in `.rodata`
/// (`names::GLOBAL_COARSE_CLOCK`): 1 where the kernel has `bpf_ktime_get_coarse_ns` (5.11+),
/// 0 elsewhere. The map is frozen, so the verifier sees a constant and prunes the branch not
/// taken: a 5.10 kernel never meets the helper it does not know. The agent reads the matching
/// clock (CLOCK_MONOTONIC_COARSE or CLOCK_MONOTONIC) wherever it compares stamps.
#[unsafe(no_mangle)]
static IPQ_COARSE_CLOCK: u32 = 0;

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a read of a plain static; volatile so the compiler keeps the load the loader's
    // value reaches instead of folding the default.
    if unsafe { core::ptr::read_volatile(&IPQ_COARSE_CLOCK) } != 0 {
        // SAFETY: helpers without arguments.
        unsafe { bpf_ktime_get_coarse_ns() }
    } else {
        unsafe { bpf_ktime_get_ns() }
    }
}

/// What only a sample reports of a packet: its interface and its source MAC. Read from the
/// context when a sample is sent, never before: on every other packet these loads (three
/// dependent ones for an XDP ifindex, a 6-byte copy for the MAC) would be spent for nothing.
pub trait Hooked: EbpfContext {
    fn frame(&self) -> Frame;
    fn ifindex(&self) -> u32;
    /// Whether another of ipq's programs on this hook already counted this packet and let it
    /// through ([`mark_passed`](Self::mark_passed)).
    fn passed_before(&self, hook: Hook) -> bool;
    /// Says to a later ipq program on this hook that this packet was counted and let through.
    fn mark_passed(&self, hook: Hook);
}

/// The mark of a packet ipq counted and let through on a TC hook, in the skb's control block
/// (`__sk_buff.cb[0]`, with the interface in `cb[1]`): "ipq" and the hook.
///
/// Twice ipq runs two of its programs on one hook, for a moment: when an interface moves from
/// its netlink filter to a TCX link, and when its TCX link moves ahead of a co-tenant's (the
/// spare instance goes in before the old link goes). A packet ipq drops never meets the second
/// program; one it counts and passes (`observe`) would be counted twice. (A reported claim is
/// XDP's, where one program runs: its context's mark is a no-op.)
/// The control block is the tc layer's scratch space, kept from one program of a hook to the
/// next: the first program marks the packet, the second sees the mark and only passes it.
/// The mark names the interface and the hook, and IPv4's and IPv6's receive paths zero these
/// words, so a mark left from one hook is not mistaken on another; the layer above's leftovers
/// would have to hold this word and the interface's index side by side. Written only on the
/// packets ipq counts and passes: every other packet's control block is left as it came.
const PASSED_MARK: u32 = 0x6970_7100;

#[inline(always)]
fn passed_mark(hook: Hook) -> u32 {
    PASSED_MARK | hook as u32
}

impl Hooked for TcContext {
    #[inline(always)]
    fn frame(&self) -> Frame {
        Frame::new(self.data(), self.data_end())
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // The context pointer as the program got it, then the field: otherwise LLVM may keep
        // a pointer to the field (ctx + 40) from the workload program's own read of it, which
        // the verifier refuses to dereference ("modified ctx ptr"). Rare path: a sample.
        let skb = core::hint::black_box(self.skb.skb);
        // SAFETY: the context of a running program.
        unsafe { (*skb).ifindex }
    }

    #[inline(always)]
    fn passed_before(&self, hook: Hook) -> bool {
        // As in `ifindex`: constant offsets from the context pointer itself.
        let skb = core::hint::black_box(self.skb.skb);
        // SAFETY: the context of a running program; `cb` is readable by TC programs.
        let (mark, ifindex) = unsafe { ((*skb).cb[0], (*skb).cb[1]) };
        mark == passed_mark(hook) && ifindex == self.ifindex()
    }

    #[inline(always)]
    fn mark_passed(&self, hook: Hook) {
        let ifindex = self.ifindex();
        let skb = core::hint::black_box(self.skb.skb);
        // SAFETY: the context of a running program; `cb` is writable by TC programs.
        unsafe {
            (*skb).cb[0] = passed_mark(hook);
            (*skb).cb[1] = ifindex;
        }
    }
}

impl Hooked for XdpContext {
    #[inline(always)]
    fn frame(&self) -> Frame {
        Frame::new(self.data(), self.data_end())
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        self.ingress_ifindex() as u32
    }

    /// One XDP program per interface: ipq's never runs twice on a frame.
    #[inline(always)]
    fn passed_before(&self, _hook: Hook) -> bool {
        false
    }

    #[inline(always)]
    fn mark_passed(&self, _hook: Hook) {}
}

/// Where and what a program saw.
pub struct Seen<'a, C: Hooked> {
    pub ctx: &'a C,
    pub hook: Hook,
    pub len: u32,
}

/// The stamp clock (see [`now_ns`]) at tick granularity: the one place the programs read it.
///
/// Drops need a timestamp (the stale stamp and the sample rate limit), and the clock helper
/// costs more than the rest of the drop path together on this kind of machine. The time is
/// therefore cached per CPU for the current jiffy: `bpf_jiffies64` (5.5+) is a plain load,
/// and the clock itself is read once per tick per CPU. The coarse clock only moves on ticks
/// anyway, so the stamps are as precise as they were (on 5.10, with the fine clock, they are
/// one tick coarse, which neither the release timer nor the rate limit notices).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helpers without arguments or preconditions.
    let jiffies = unsafe { bpf_jiffies64() };
    maps::clock_for_tick(jiffies, now_ns)
}

#[inline(always)]
pub fn act<C: Hooked>(seen: &Seen<C>, addr: &AddrKey, found: &Found, reason: Reason) -> Verdict {
    let entry = &found.entry;
    // SAFETY: `stamps` points into a map value that the kernel keeps alive for this program
    // run. The two stamps are plain 8-byte stores; a concurrent CPU can only make one of them a
    // few nanoseconds older, which neither the release timer nor the rate limit cares about.
    // (If the agent moves the slot meanwhile, a stamp may land on the slot's next occupant,
    // which at worst delays one sample or extends one cool-down by a few seconds.)
    let stamps = unsafe { &mut *found.stamps };
    // One read of the configuration for the whole decision.
    let settings = maps::settings();
    let action = action_for_entry(settings.mode, reason, entry);
    let passes = action != Action::Dropped;
    if passes && seen.ctx.passed_before(seen.hook) {
        return Verdict::Pass;
    }
    maps::count(counter_index(action, seen.hook, reason), seen.len);

    let now = now();
    // Rewrite the stamp only when the tick moved: no cache-line traffic between CPUs
    // dropping the same address within one tick.
    if reason == Reason::StaleTraffic && stamps.last_stale_ns != now {
        stamps.last_stale_ns = now;
    }
    if now.wrapping_sub(stamps.last_sample_ns) >= settings.sample_interval_ns {
        stamps.last_sample_ns = now;
        sample(seen, addr, entry, judged(reason, action), now);
    }

    if passes {
        seen.ctx.mark_passed(seen.hook);
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}

/// Sends a conflict sample: rare by construction (one per address per interval).
/// BPF functions take at most five arguments (and LLVM splits structs into their fields), so
/// reason and action travel as one word: the reason in the low byte, the action above it.
#[inline(always)]
fn judged(reason: Reason, action: Action) -> u32 {
    reason as u32 | (action as u32) << 8
}

#[inline(always)]
fn sample<C: Hooked>(seen: &Seen<C>, addr: &AddrKey, entry: &AddrEntry, judged: u32, now: u64) {
    let reason = judged & 0xff;
    let action = judged >> 8;
    // The parse saw the whole Ethernet header, so the MAC is there (zero if it ever is not).
    let src_mac = seen
        .ctx
        .frame()
        .load::<[u8; 6]>(SOURCE_MAC_OFFSET)
        .unwrap_or([0; 6]);
    maps::send_sample(&ConflictSample {
        ts_ns: now,
        addr: *addr,
        ifindex: seen.ctx.ifindex(),
        hook: seen.hook as u32,
        reason,
        action,
        state: entry.state,
        holder_ifindex: entry.holder_ifindex,
        src_mac,
        _pad: [0; 2],
        pkt_len: seen.len,
        _reserved: 0,
    });
    // Never per packet. Filtered in the kernel unless the agent runs at debug level.
    debug!(seen.ctx, "ipq: conflict sample, reason {}", reason);
}
