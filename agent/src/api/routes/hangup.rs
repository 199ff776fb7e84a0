//! Whether an event follower's peer has gone, without an event to write to it: a follower
//! killed while nothing happens would otherwise hold its connection slot until the next event.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd, RawFd},
};

use tokio::io::{unix::AsyncFd, Interest};

/// A watch on a connection's hang-up, through a descriptor of its own on the same socket.
pub struct Hangup {
    fd: AsyncFd<OwnedFd>,
}

impl Hangup {
    /// Watches the connection `connection`, which must be open for the call (its request is
    /// being answered).
    pub fn watch(connection: RawFd) -> io::Result<Self> {
        // SAFETY: the connection is open while its request is answered, which is now.
        let borrowed = unsafe { BorrowedFd::borrow_raw(connection) };
        let own = borrowed.try_clone_to_owned()?;
        // SAFETY: `own` is an open descriptor this watch owns until it is dropped, and an
        // OwnedFd always answers the same descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(own, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    /// Returns once the peer has hung up (or the socket failed). Bytes the peer sends in the
    /// meantime (a pipelined request) wake it without ending it: the readiness is edge
    /// triggered, so it waits for the next change instead of spinning.
    pub async fn wait(&self) {
        loop {
            let Ok(mut ready) = self.fd.readable().await else {
                return;
            };
            if hung_up(self.fd.get_ref().as_raw_fd()) {
                return;
            }
            ready.clear_ready();
        }
    }
}

/// Whether the socket's peer has closed it (or the socket is in error): `poll` with no wait
/// (a failed `poll` says nothing, and the next change is waited for).
fn hung_up(fd: RawFd) -> bool {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut pollfd, 1, 0) };
    n > 0 && pollfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}
