//! ipq's kernel programs. Entry points are thin: each calls a `try_*` function of its hook's
//! module and turns the verdict into the hook's return code.
#![no_std]
#![no_main]
// `asm!` on the bpf target: the slots' barrier is one instruction that must stay what it is.
#![cfg_attr(feature = "fetch-barriers", feature(asm_experimental_arch))]

mod act;
mod floor;
mod maps;
mod parse;
mod probe;
mod slots;
mod tc;
mod watch;
mod xdp;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    macros::{classifier, fentry, raw_tracepoint, xdp},
    programs::{FEntryContext, RawTracePointContext, TcContext, XdpContext},
};
use ipq_common::{counters::Hook, watch::BpfCmd};

/// What a program decided for one packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
}

/// Pass: hand the packet to the next program on the interface (or the stack when we are last),
/// so ipq never short-circuits another CNI's programs. -1 is both TCX_NEXT and TC_ACT_UNSPEC:
/// as a direct-action cls_bpf filter (kernels without TCX) the next filter runs the same way.
const TCX_NEXT: i32 = -1;

#[inline(always)]
fn tc_code(verdict: Verdict) -> i32 {
    match verdict {
        Verdict::Pass => TCX_NEXT,
        Verdict::Drop => TC_ACT_SHOT,
    }
}

#[inline(always)]
fn xdp_code(verdict: Verdict) -> u32 {
    match verdict {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

/// Workload interface, ingress: what the workload sends.
#[classifier]
pub fn ipq_tc_ingress(ctx: TcContext) -> i32 {
    tc_code(tc::try_workload(&ctx, Hook::TcIngress))
}

/// Workload interface, egress: what the workload receives.
#[classifier]
pub fn ipq_tc_egress(ctx: TcContext) -> i32 {
    tc_code(tc::try_workload(&ctx, Hook::TcEgress))
}

/// Uplink: stale traffic to quarantined addresses, and remote claims.
///
/// `inline(always)`: the macro's entry point calls this function, and once the lookup code grew
/// (58a5292) LLVM stopped inlining it, so every packet paid a BPF-to-BPF call: XDP pass 33 →
/// 42 ns on the bench's VM (bisected, 2026-11-29), back to 35 ns with it.
#[xdp]
#[inline(always)]
pub fn ipq_xdp_uplink(ctx: XdpContext) -> u32 {
    xdp_code(xdp::try_uplink(&ctx))
}

/// The fallback watcher: `bpf()` calls of other processes that can undo ipq's attachments or
/// write its maps, reported to the agent (a raw tracepoint on `sys_enter`, leaving all but
/// `bpf()`; x86-64).
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn ipq_watch_bpf(ctx: RawTracePointContext) -> i32 {
    let _ = watch::raw_tp::watch(&ctx);
    0
}

/// The watcher's trampolines ([`watch::fentry`]): every bpf() command.
#[fentry(function = "security_bpf")]
pub fn ipq_watch_security_bpf(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::security_bpf(&ctx);
    0
}

/// Every new descriptor of a map.
#[fentry(function = "security_bpf_map")]
pub fn ipq_watch_security_bpf_map(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_open(&ctx);
    0
}

/// `bpf_map_update_value(map, map_file, key, value, flags)` (older: `(map, struct fd, key, ...)`):
/// every update by bpf().
#[fentry(function = "bpf_map_update_value")]
pub fn ipq_watch_bpf_map_update_value(ctx: FEntryContext) -> i32 {
    let key = watch::fentry::update_key(&ctx);
    let _ = watch::fentry::map_write(BpfCmd::MapUpdateElem, ctx.arg(0), Some(key));
    0
}

/// `htab_map_update_elem(map, key, value, flags)`: where `bpf_map_update_value` is not in the
/// kernel's BTF, every update of a hash map (bpf()'s and BPF programs').
#[fentry(function = "htab_map_update_elem")]
pub fn ipq_watch_htab_map_update_elem(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_write(BpfCmd::MapUpdateElem, ctx.arg(0), Some(ctx.arg(1)));
    0
}

/// `array_map_update_elem(map, key, value, flags)`: likewise, every update of an array.
#[fentry(function = "array_map_update_elem")]
pub fn ipq_watch_array_map_update_elem(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_write(BpfCmd::MapUpdateElem, ctx.arg(0), Some(ctx.arg(1)));
    0
}

/// `htab_map_delete_elem(map, key)`: a hash map's delete, single or batch.
#[fentry(function = "htab_map_delete_elem")]
pub fn ipq_watch_htab_map_delete_elem(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_write(BpfCmd::MapDeleteElem, ctx.arg(0), Some(ctx.arg(1)));
    0
}

/// `htab_map_lookup_and_delete_elem(map, key, value, flags)`.
#[fentry(function = "htab_map_lookup_and_delete_elem")]
pub fn ipq_watch_htab_map_lookup_and_delete_elem(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_write(BpfCmd::MapDeleteElem, ctx.arg(0), Some(ctx.arg(1)));
    0
}

/// `htab_map_lookup_and_delete_batch(map, attr, uattr)`: no key; the maps are compared.
#[fentry(function = "htab_map_lookup_and_delete_batch")]
pub fn ipq_watch_htab_map_lookup_and_delete_batch(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_write(BpfCmd::MapDeleteBatch, ctx.arg(0), None);
    0
}

/// `bpf_map_mmap(file, vma)`: a memory mapping of a map.
#[fentry(function = "bpf_map_mmap")]
pub fn ipq_watch_bpf_map_mmap(ctx: FEntryContext) -> i32 {
    let _ = watch::fentry::map_mmap(&ctx);
    0
}

/// The floor of the TC hook for tests and benchmarks: does nothing.
#[classifier]
pub fn ipq_tc_empty(_ctx: TcContext) -> i32 {
    TCX_NEXT
}

/// The floor of the XDP hook for tests and benchmarks: does nothing.
#[xdp]
pub fn ipq_xdp_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The floor of a TC drop for benchmarks: parse and look up, nothing else ([`floor`]).
#[classifier]
pub fn ipq_tc_floor(ctx: TcContext) -> i32 {
    tc_code(floor::tc(&ctx))
}

/// The floor of an XDP drop for benchmarks: parse, filter and look up, nothing else.
#[xdp]
pub fn ipq_xdp_floor(ctx: XdpContext) -> u32 {
    xdp_code(floor::xdp(&ctx))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
