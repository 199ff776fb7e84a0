//! The host's network interfaces, as the kernel names them now.

use std::{ffi::CStr, io};

/// Every interface of the current network namespace: (ifindex, name).
pub fn interfaces() -> io::Result<Vec<(u32, String)>> {
    // SAFETY: if_nameindex returns a heap array terminated by a zeroed entry, freed below.
    let head = unsafe { libc::if_nameindex() };
    if head.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = head;
    unsafe {
        while (*cursor).if_index != 0 && !(*cursor).if_name.is_null() {
            let name = CStr::from_ptr((*cursor).if_name)
                .to_string_lossy()
                .into_owned();
            out.push(((*cursor).if_index, name));
            cursor = cursor.add(1);
        }
        libc::if_freenameindex(head);
    }
    Ok(out)
}

/// The ifindex of `name`, if such an interface exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c_name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid C string.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    (index != 0).then_some(index)
}

/// CLOCK_MONOTONIC_COARSE in nanoseconds: the clock of the kernel programs'
/// `bpf_ktime_get_coarse_ns`, so both sides compare stamps directly. The coarse clock (one tick
/// of resolution) is the one the drop path can afford: it reads a cached value instead of the
/// clock source.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter; CLOCK_MONOTONIC_COARSE always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
