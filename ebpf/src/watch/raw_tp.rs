//! The fallback watcher: a raw tracepoint on `sys_enter`, where trampolines cannot attach.
//!
//! It needs neither kprobes, BPF trampolines (fentry), nor tracefs, only Linux 5.7 (for
//! [`super::is_agent`]'s helper). It runs for every system call of the node, so the first
//! thing it does is leave every one but `bpf()` (one compare); the tracepoint itself sends
//! system calls through the kernel's tracing entry path while it is attached (measured in
//! `cargo xtask bench`). It runs before the call does its work; the agent waits a moment
//! before it looks. The system call's number and registers are x86-64's: the agent attaches
//! it only there. The agent's own calls are left out first, then every command but the few
//! that matter; map writes only of the processes the agent put in `IPQ_WATCHED`. It reads the
//! attributes from the caller's memory (another thread may change them before the kernel
//! copies them) and sees native calls only: a compat call, a pin opened by a relative path or
//! `BPF_F_PATH_FD`, a descriptor inherited by a fork or passed to another process write
//! unseen, and the periodic pass finds those.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    programs::RawTracePointContext,
};
use ipq_common::watch::{BpfCmd, WATCH_KEY_BYTES};

use super::{is_agent, reserve, IPQ_WATCHED};

/// `__NR_bpf` on x86-64.
const NR_BPF: u64 = 321;
/// Offsets in x86-64's `struct pt_regs` of the first two arguments (`di`, `si`).
const PT_REGS_DI: usize = 112;
const PT_REGS_SI: usize = 104;

pub fn watch(ctx: &RawTracePointContext) -> Option<()> {
    // `sys_enter(struct pt_regs *regs, long id)`.
    if ctx.arg::<u64>(1) != NR_BPF {
        return None;
    }
    if is_agent() {
        return None;
    }
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    let regs = ctx.arg::<u64>(0) as *const u8;
    // SAFETY: the registers the system call was entered with, read by the helper.
    let cmd = unsafe { bpf_probe_read_kernel(regs.add(PT_REGS_DI).cast::<u64>()) }.ok()? as u32;
    if !BpfCmd::watched(cmd) {
        return None;
    }
    // SAFETY: a lookup whose value is not kept.
    if BpfCmd::writes_map(cmd) && unsafe { IPQ_WATCHED.get(tgid) }.is_none() {
        return None;
    }
    // SAFETY: as above: `uattr`, a user pointer.
    let attr = unsafe { bpf_probe_read_kernel(regs.add(PT_REGS_SI).cast::<u64>()) }.ok()?;
    let attr = attr as *const u32;
    let mut entry = reserve()?;
    let call = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field before it is submitted; user memory
    // only through the probe-read helpers (a failed read leaves the field zero).
    unsafe {
        (*call).cmd = cmd;
        (*call).tgid = tgid;
        (*call).target = 0;
        (*call).map_id = 0;
        (*call).path[0] = 0;
        if cmd == BpfCmd::ObjGet as u32 {
            // `pathname`, a user pointer, first in the attribute.
            if let Ok(path) = bpf_probe_read_user(attr as *const u64) {
                let _ = bpf_probe_read_user_str_bytes(path as *const u8, &mut (*call).path);
            }
        } else if cmd == BpfCmd::MapUpdateElem as u32 || cmd == BpfCmd::MapDeleteElem as u32 {
            // `key`, a user pointer after `map_fd` and its padding: the key written, so that
            // the agent looks at that entry at once. 16 bytes (an address of `IPQ_ADDRS`), or
            // 4 (an index of `IPQ_SLOTS` or `IPQ_IFACES`) where 16 cannot be read.
            if let Ok(key) = bpf_probe_read_user(attr.add(2) as *const u64) {
                if let Ok(bytes) = bpf_probe_read_user(key as *const [u8; WATCH_KEY_BYTES]) {
                    core::ptr::addr_of_mut!((*call).path)
                        .cast::<[u8; WATCH_KEY_BYTES]>()
                        .write(bytes);
                    (*call).target = WATCH_KEY_BYTES as u32;
                } else if let Ok(bytes) = bpf_probe_read_user(key as *const [u8; 4]) {
                    core::ptr::addr_of_mut!((*call).path)
                        .cast::<[u8; 4]>()
                        .write(bytes);
                    (*call).target = 4;
                }
            }
        } else if cmd == BpfCmd::LinkCreate as u32 {
            // `link_create.target_ifindex`, after `prog_fd`.
            (*call).target = bpf_probe_read_user(attr.add(1)).unwrap_or(0);
        } else if cmd == BpfCmd::ProgAttach as u32
            || cmd == BpfCmd::ProgDetach as u32
            || cmd == BpfCmd::MapGetFdById as u32
        {
            // `target_ifindex` (attach, detach) or `map_id`, first.
            (*call).target = bpf_probe_read_user(attr).unwrap_or(0);
        }
    }
    entry.submit(0);
    Some(())
}
