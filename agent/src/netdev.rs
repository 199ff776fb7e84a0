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

/// CLOCK_BOOTTIME in nanoseconds: the clock of `bpf_ktime_get_boot_ns`, so user space and the
/// kernel programs compare stamps directly. It keeps counting across suspend.
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter; CLOCK_BOOTTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
