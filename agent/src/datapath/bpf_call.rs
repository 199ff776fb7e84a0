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

/// `bpf(cmd, attr)` with the kernel's own `union bpf_attr` (aya-obj's generated binding of
/// linux/bpf.h), which the kernel may write back into (a query's counts). `attr` starts zeroed
/// ([`zeroed_attr`]): the kernel requires the bytes a command does not use to be zero.
pub(crate) fn bpf_with(
    cmd: aya_obj::generated::bpf_cmd,
    attr: &mut aya_obj::generated::bpf_attr,
) -> io::Result<i32> {
    // SAFETY: `attr` is a live, writable `bpf_attr` of the size passed; the pointers inside it
    // point to live buffers of the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            std::mem::size_of::<aya_obj::generated::bpf_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

/// An all-zero `bpf_attr`, what every command's attributes start from.
pub(crate) fn zeroed_attr() -> aya_obj::generated::bpf_attr {
    // SAFETY: `bpf_attr` is a C union of integers and arrays of them: all zeros is valid (and
    // is what the kernel expects of every byte a command does not use).
    unsafe { std::mem::zeroed() }
}
