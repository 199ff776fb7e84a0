//! What another tool does to ipq's datapath with raw `bpf()` calls from the test's own process
//! (not the agent's): a link detached or updated through its pin, a program put ahead of
//! ipq's, an entry of one of its maps rewritten. Nothing in the kernel announces these.

use std::{ffi::CString, os::unix::ffi::OsStrExt as _, path::Path};

pub const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_OBJ_GET: libc::c_long = 7;
pub const BPF_LINK_CREATE: libc::c_long = 28;
pub const BPF_LINK_UPDATE: libc::c_long = 29;
pub const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_F_BEFORE: u32 = 1 << 3;

pub fn bpf(cmd: libc::c_long, attr: &[u8; 64]) -> std::io::Result<i32> {
    // SAFETY: `attr` outlives the call and the pointers in it point to live buffers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

/// `BPF_OBJ_GET` of `path`: a descriptor of the pinned object.
pub fn obj_get(path: &Path) -> std::io::Result<i32> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let mut attr = [0u8; 64];
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET, &attr)
}

/// `bpftool link detach pinned <path>`: the link stays, its program leaves the hook.
pub fn detach_through_pin(path: &Path) {
    let fd = obj_get(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    let detached = bpf(BPF_LINK_DETACH, &attr);
    // SAFETY: our own fd from BPF_OBJ_GET.
    unsafe { libc::close(fd) };
    detached.unwrap_or_else(|e| panic!("detaching {}: {e}", path.display()));
}

/// A foreign program (`TCX_PASS`) loaded on its own: its descriptor.
pub fn foreign_program() -> i32 {
    // r0 = 0 (TCX_PASS); exit
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    let code: Vec<u8> = insns.iter().flatten().copied().collect();
    let license = b"GPL\0";
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..55].copy_from_slice(b"foreign");
    bpf(BPF_PROG_LOAD, &attr).expect("loading the foreign program")
}

/// Another tool's TCX program put first on `ifindex`'s ingress, ahead of ipq's: it returns
/// `TCX_PASS`, which ends processing, so ipq's program never sees a packet. The returned
/// descriptors keep the program and its link alive.
pub fn foreign_program_first(ifindex: u32) -> (i32, i32) {
    let prog = foreign_program();
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(prog as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_TCX_INGRESS.to_ne_bytes());
    attr[12..16].copy_from_slice(&BPF_F_BEFORE.to_ne_bytes());
    let link = bpf(BPF_LINK_CREATE, &attr).expect("attaching the foreign program first");
    (prog, link)
}
