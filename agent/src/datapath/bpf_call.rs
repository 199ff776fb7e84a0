//! The raw `bpf(2)` call, for the few commands aya does not offer on a plain descriptor (feature
//! probes, pinning and querying the agent's own held objects).

use std::io;

/// `bpf(cmd, attr)`: `attr` is the attribute block, zero-padded (the kernel requires the bytes
/// it does not know to be zero). Returns the kernel's non-negative answer (often a new fd).
pub(crate) fn bpf(cmd: libc::c_long, attr: &[u8]) -> io::Result<i32> {
    // SAFETY: the kernel reads at most `attr.len()` bytes of `attr`, which outlives the call;
    // the pointers inside it point to live buffers of the caller.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}
