//! The host's network interfaces, as the kernel names them now.

use std::{
    ffi::CStr,
    io,
    sync::atomic::{AtomicBool, Ordering},
};

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
///
/// Asked with `SIOCGIFINDEX` on a socket this thread keeps: `if_nametoindex` opens and closes
/// a socket per call, and the owner loop asks once per claim, where creating and releasing
/// that socket cost more than the lookup. (The agent's threads never change network
/// namespace; the flush probe that does is a process of its own.)
pub fn ifindex(name: &str) -> Option<u32> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return None;
    }
    IOCTL_SOCKET.with(|socket| {
        let Some(socket) = socket else {
            // No descriptor to spare: the C library's way, one socket per call.
            let c_name = std::ffi::CString::new(name).ok()?;
            // SAFETY: a valid C string.
            let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
            return (index != 0).then_some(index);
        };
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        for (to, from) in request.ifr_name.iter_mut().zip(bytes) {
            *to = *from as libc::c_char;
        }
        // SAFETY: a socket this thread owns and an ifreq with a NUL-terminated name.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(socket),
                libc::SIOCGIFINDEX as _,
                &mut request,
            )
        };
        // SAFETY: SIOCGIFINDEX filled the union's ifindex member.
        let index = unsafe { request.ifr_ifru.ifru_ifindex };
        (rc == 0 && index > 0).then_some(index as u32)
    })
}

thread_local! {
    /// The socket [`ifindex`] asks on (`None` when none could be opened).
    static IOCTL_SOCKET: Option<std::os::fd::OwnedFd> = {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        // SAFETY: a descriptor just opened and owned by nobody else.
        (fd >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
    };
}

/// Which clock the kernel programs stamp with; set once the datapath knows (see
/// [`use_coarse_clock`]). Until then (unit tests, tools that never load the datapath) the coarse
/// clock, the one every kernel from 5.11 stamps with.
static COARSE: AtomicBool = AtomicBool::new(true);

/// Chooses the clock of [`monotonic_ns`]: the one the loaded programs stamp with
/// (`bpf_ktime_get_coarse_ns` is CLOCK_MONOTONIC_COARSE, `bpf_ktime_get_ns` CLOCK_MONOTONIC).
/// Both count from the same origin (the coarse clock lags by at most one tick), so stamps
/// written under one stay comparable under the other across an agent restart or kernel change.
pub fn use_coarse_clock(coarse: bool) {
    COARSE.store(coarse, Ordering::Relaxed);
}

/// Whether [`monotonic_ns`] reads CLOCK_MONOTONIC_COARSE.
pub fn coarse_clock() -> bool {
    COARSE.load(Ordering::Relaxed)
}

/// The datapath's clock in nanoseconds: CLOCK_MONOTONIC_COARSE where the kernel programs use
/// `bpf_ktime_get_coarse_ns` (5.11+; one tick of resolution, the clock the drop path can afford:
/// it reads a cached value instead of the clock source), CLOCK_MONOTONIC where they fall back to
/// `bpf_ktime_get_ns`. Both sides then compare stamps directly: read as the kernel reads it,
/// without the offset of a time namespace the agent may run in ([`crate::kernel_clock`]).
pub fn monotonic_ns() -> u64 {
    crate::kernel_clock::monotonic_ns(coarse_clock())
}

/// Whether `name` no longer names interface `ifindex`: it was deleted (or renamed) after an
/// event reported it. Under pod churn that is a race, not a failure of what was tried on it.
pub fn vanished(name: &str, ifindex: u32) -> bool {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a valid C string.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        // Only "no such device" says it is gone: a lookup that failed otherwise (EMFILE while
        // file descriptors are exhausted) says nothing, and the failure must stay loud.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV);
    }
    index != ifindex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifindex_agrees_with_the_c_library() {
        for (index, name) in interfaces().expect("if_nameindex") {
            assert_eq!(ifindex(&name), Some(index), "{name}");
        }
        // Asked again on the socket the thread now keeps.
        assert_eq!(ifindex("lo"), Some(1));
    }

    #[test]
    fn ifindex_of_a_name_no_interface_can_have_is_none() {
        assert_eq!(ifindex("ipq-no-such-if"), None);
        assert_eq!(ifindex(""), None);
        assert_eq!(ifindex("a-name-of-16-chr"), None);
        assert_eq!(ifindex("lo\0"), None);
    }
}
