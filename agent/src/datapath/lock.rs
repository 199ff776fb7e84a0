//! One writer of a `bpffs_dir`'s maps: an exclusive `flock` on the directory itself, held by an
//! agent for its whole life and by the break-glass `ipq-agent datapath set|delete` while they
//! write.
//!
//! The lock is on the directory (opened `O_DIRECTORY`), not on a file in it: bpffs holds only
//! bpf objects and directories, and a lock file elsewhere could name another directory than
//! the maps it guards. A second agent, or a break-glass write while an agent runs, is refused
//! with the holder's pid, read from `/proc/locks` (the kernel's own record of who holds it).
//! The lock goes with the holder's last descriptor: a SIGKILLed agent leaves none behind.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::{
        fd::AsRawFd as _,
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LockError {
    #[error(
        "{} is in use by another process ({}): one ipq-agent per bpffs_dir, and no break-glass \
         write beside it",
        dir.display(),
        holder.map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"))
    )]
    Held { dir: PathBuf, holder: Option<u32> },
    #[error("locking {}: {source}", dir.display())]
    Io { dir: PathBuf, source: io::Error },
}

/// The exclusive lock of one `bpffs_dir`, released when dropped.
#[derive(Debug)]
pub struct BpffsLock {
    _dir: File,
}

/// How long a lock held only by this process's own forks is waited for: a child between its
/// `fork` and its `exec` holds a copy of every descriptor (`O_CLOEXEC` closes it at the
/// `exec`), and with it the lock of a directory this process released a moment before.
const FORK_WINDOW: std::time::Duration = std::time::Duration::from_millis(200);

/// Takes the lock of `dir` without waiting for another holder.
pub fn acquire(dir: &Path) -> Result<BpffsLock, LockError> {
    let io_err = |source| LockError::Io {
        dir: dir.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io_err)?;
    let deadline = std::time::Instant::now() + FORK_WINDOW;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(BpffsLock { _dir: file });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err(e));
        }
        // The kernel records the pid that took a lock; a fork's copy keeps it. Gone already,
        // or ours: a child of this process that has not reached its exec yet. Both numbers
        // are of the PID namespace of the `/proc` read (in a pod, every agent is pid 1 of its
        // own, and another namespace's holder is not listed at all): either way a holder that
        // is not this process is refused when the window ends.
        let holder = holder(dir);
        let ours = holder.is_none_or(|pid| Some(pid) == pid_in_proc());
        if !ours || std::time::Instant::now() >= deadline {
            return Err(LockError::Held {
                dir: dir.to_owned(),
                holder,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// This process's id as `/proc` numbers processes (`/proc/self`): the PID namespace of the
/// `/proc` mounted, which need not be the process's own; `None` if it does not show this
/// process at all.
pub fn pid_in_proc() -> Option<u32> {
    fs::read_link("/proc/self").ok()?.to_str()?.parse().ok()
}

/// Who holds the flock of `dir`, as `/proc/locks` says: lines like
/// `1: FLOCK  ADVISORY  WRITE 4242 00:1a:1234 0 EOF` (pid, then device major:minor in hex and
/// inode in decimal).
fn holder(dir: &Path) -> Option<u32> {
    let meta = fs::metadata(dir).ok()?;
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let locks = fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, major, minor, meta.ino())
}

fn holder_in(locks: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        // "->" marks a waiter, which shifts the fields by one.
        let at = usize::from(fields.get(2) == Some(&"->"));
        let mut id = fields.get(5 + at)?.split(':');
        let dev_major = u32::from_str_radix(id.next()?, 16).ok()?;
        let dev_minor = u32::from_str_radix(id.next()?, 16).ok()?;
        let inode: u64 = id.next()?.parse().ok()?;
        ((dev_major, dev_minor, inode) == (major, minor, ino) && at == 0)
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let locks = "\
1: POSIX  ADVISORY  WRITE 100 00:1a:77 0 EOF
2: FLOCK  ADVISORY  WRITE 4242 00:2c:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 4343 00:2c:1234 0 EOF
3: FLOCK  ADVISORY  WRITE 99 00:2c:1235 0 EOF
";
        assert_eq!(holder_in(locks, 0, 0x2c, 1234), Some(4242));
        assert_eq!(
            holder_in(locks, 0, 0x1a, 77),
            None,
            "a POSIX lock is not ours"
        );
        assert_eq!(holder_in(locks, 0, 0x2c, 1), None);
    }

    #[test]
    fn a_second_lock_is_refused_naming_this_process_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path()).unwrap();
        match acquire(dir.path()) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        acquire(dir.path()).expect("free again once dropped");
    }

    #[test]
    fn a_fork_that_has_not_exec_ed_yet_does_not_keep_a_released_lock_from_this_process() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path()).unwrap();
        // SAFETY: the child only sleeps and exits, both async-signal-safe.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::usleep(50_000);
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork: {}", io::Error::last_os_error());
        // The child's copy of the descriptor holds the lock after this process let it go.
        drop(first);
        let again = acquire(dir.path());
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        again.expect("taken once the fork's copy is gone");
    }

    /// How the DaemonSet runs agents: each in a PID namespace (and a `/proc`) of its own, where
    /// each is pid 1. A second agent on the same directory is refused all the same. Needs
    /// root (a PID namespace, a mount of `/proc`); the outcome is the child's exit code.
    #[test]
    fn a_second_agent_as_pid_1_of_another_pid_namespace_is_refused() {
        const REFUSED: i32 = 10;
        const TAKEN: i32 = 11;
        const NOT_PID_1: i32 = 12;
        const SETUP: i32 = 13;
        let dir = tempfile::tempdir().unwrap();
        let _first = acquire(dir.path()).unwrap();
        // SAFETY: the child and its child make system calls and exit; the grandchild runs
        // `acquire` in a fresh PID namespace, where it is pid 1, with its own `/proc`.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
                    libc::_exit(SETUP + 1);
                }
                let grandchild = libc::fork();
                if grandchild == 0 {
                    let root = c"/";
                    let (proc_, fstype) = (c"/proc", c"proc");
                    if libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                        || libc::mount(
                            fstype.as_ptr(),
                            proc_.as_ptr(),
                            fstype.as_ptr(),
                            0,
                            std::ptr::null(),
                        ) != 0
                    {
                        libc::_exit(SETUP + 2);
                    }
                    if std::process::id() != 1 {
                        libc::_exit(NOT_PID_1);
                    }
                    libc::_exit(match acquire(dir.path()) {
                        Err(LockError::Held { .. }) => REFUSED,
                        Ok(_) => TAKEN,
                        Err(_) => SETUP + 3,
                    });
                }
                let mut status = 0;
                libc::waitpid(grandchild, &mut status, 0);
                libc::_exit(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    SETUP
                });
            }
        }
        assert!(child > 0, "fork: {}", io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child ended by a signal: {status}");
        match libc::WEXITSTATUS(status) {
            REFUSED => {}
            TAKEN => panic!("an agent in another PID namespace took the held lock"),
            NOT_PID_1 => panic!("the grandchild is not pid 1 of its namespace"),
            other => panic!("setting the namespaces up failed (root needed): exit {other}"),
        }
    }
}
