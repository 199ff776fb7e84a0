//! What this kernel can do, found by trying it rather than by reading its version: distribution
//! kernels backport features (RHEL 9.4 has TCX at 5.14) and may lack others.
//!
//! Each probe loads a two-instruction program with a raw `bpf(2)` call, the way `bpftool
//! feature probe` does, and reads the kernel's answer from the error code.

use crate::datapath::bpf_call::bpf;
use std::{
    io,
    os::fd::{FromRawFd, OwnedFd},
};

/// What the probes found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `bpf_ktime_get_coarse_ns` (5.11+).
    pub coarse_clock: bool,
    /// TCX links (`BPF_TCX_INGRESS`/`EGRESS`, 6.6+ or a backport).
    pub tcx: bool,
    /// Atomic read-modify-writes with `BPF_FETCH` (5.12+): the full barrier the programs' reads
    /// of `IPQ_SLOTS` need on a weakly ordered CPU (`ipq_common::slots::SlotsOrder`).
    pub fetch_atomics: bool,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_FUNC_KTIME_GET_COARSE_NS: i32 = 160;

/// One `struct bpf_insn`, as its 8 bytes.
fn insn(code: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[0] = code;
    out[1] = regs;
    out[2..4].copy_from_slice(&off.to_ne_bytes());
    out[4..8].copy_from_slice(&imm.to_ne_bytes());
    out
}

/// `call imm` (BPF_JMP | BPF_CALL).
fn call(helper: i32) -> [u8; 8] {
    insn(0x85, 0, 0, helper)
}

/// `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
fn mov_r0(imm: i32) -> [u8; 8] {
    insn(0xb7, 0, 0, imm)
}

/// `*(u64 *)(r10 - 8) = 0` (BPF_ST | BPF_MEM | BPF_DW).
fn zero_stack_word() -> [u8; 8] {
    insn(0x7a, 10, -8, 0)
}

/// `r1 = atomic_fetch_add((u64 *)(r10 - 8), r1)` (BPF_STX | BPF_DW | BPF_ATOMIC, imm BPF_ADD |
/// BPF_FETCH): src r1, dst r10.
fn fetch_add_stack_word() -> [u8; 8] {
    insn(0xdb, (1 << 4) | 10, -8, 0x01)
}

/// `exit`.
fn exit() -> [u8; 8] {
    insn(0x95, 0, 0, 0)
}

/// Loads a SCHED_CLS program of `insns`; the fd closes when dropped.
fn load_sched_cls(insns: &[[u8; 8]]) -> io::Result<OwnedFd> {
    let code: Vec<u8> = insns.iter().flatten().copied().collect();
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..57].copy_from_slice(b"ipq_probe");
    let fd = bpf(BPF_PROG_LOAD, &attr)?;
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether a program calling `bpf_ktime_get_coarse_ns` loads. The verifier refuses an unknown
/// helper with EINVAL; anything else (EPERM, ENOMEM) is an error of the probe itself.
pub fn coarse_clock() -> io::Result<bool> {
    match load_sched_cls(&[call(BPF_FUNC_KTIME_GET_COARSE_NS), exit()]) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a program with an atomic fetch-add loads. Before 5.12 the instruction was
/// `BPF_XADD`, whose verifier refuses any `imm` but 0 with EINVAL.
pub fn fetch_atomics() -> io::Result<bool> {
    let program = [
        zero_stack_word(),
        insn(0xb7, 1, 0, 0),
        fetch_add_stack_word(),
        mov_r0(0),
        exit(),
    ];
    match load_sched_cls(&program) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the kernel has TCX links: `BPF_LINK_CREATE` with `BPF_TCX_INGRESS` on ifindex 0.
/// A kernel with TCX looks the device up and answers ENODEV, with nothing attached anywhere;
/// one without it does not know the attach type and answers EINVAL.
pub fn tcx() -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let prog = load_sched_cls(&[mov_r0(-1), exit()])?;
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    // target_ifindex (bytes 4..8) stays 0: no such device.
    attr[8..12].copy_from_slice(&BPF_TCX_INGRESS.to_ne_bytes());
    match bpf(BPF_LINK_CREATE, &attr) {
        Ok(fd) => {
            // Cannot happen (no device 0); close what the kernel gave anyway.
            // SAFETY: a new fd owned by nobody else.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Both probes.
pub fn features() -> io::Result<KernelFeatures> {
    Ok(KernelFeatures {
        coarse_clock: coarse_clock()?,
        tcx: tcx()?,
        fetch_atomics: fetch_atomics()?,
    })
}
