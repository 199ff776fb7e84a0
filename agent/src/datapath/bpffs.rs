//! The filesystem the pins live on. Enforcement outlives the agent only through its pins, and
//! pins outlive it only on a bpf filesystem mounted where the node keeps it: the agent mounts
//! one at `bpffs_dir` where none is (a fresh machine, a `bpffs_dir` on another filesystem),
//! the verification notices when the mount is gone from under it (unmounted, lazily or not:
//! `bpffs_dir` then resolves to whatever lies below), and at TERM the agent says whether its
//! pins, and so enforcement, will still be there after it.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use log::{error, info, warn};

use super::{pin_check::check_bpffs, DatapathError};
use crate::paths::BPFFS_MOUNT;

/// Where this agent mounted a bpf filesystem itself, if it did.
static MOUNTED: OnceLock<PathBuf> = OnceLock::new();

/// Makes `root` lie on a bpf filesystem: if it does not, mounts one (at [`BPFFS_MOUNT`] when
/// `root` is below it, else at `root` itself). Fails, naming why, where the agent cannot
/// (no `CAP_SYS_ADMIN`, a read-only parent).
pub fn ensure(root: &Path) -> Result<(), DatapathError> {
    if check_bpffs(root).is_ok() {
        return Ok(());
    }
    let at = if root.starts_with(BPFFS_MOUNT) {
        PathBuf::from(BPFFS_MOUNT)
    } else {
        root.to_path_buf()
    };
    let mounted = std::fs::create_dir_all(&at).and_then(|()| mount(&at));
    if let Err(source) = mounted {
        warn!("mounting a bpf filesystem at {}: {source}", at.display());
        return Err(DatapathError::NotBpffs {
            path: root.to_owned(),
        });
    }
    warn!(
        "{} was not on a bpf filesystem: mounted one at {} (pins there last as long as this \
         mount: an unmount or a reboot drops them, and enforcement with them)",
        root.display(),
        at.display()
    );
    let _ = MOUNTED.set(at);
    check_bpffs(root)
}

fn mount(at: &Path) -> io::Result<()> {
    let target = CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: valid C strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the pins under `root` will outlive this agent: `root` still lies on a bpf
/// filesystem (not unmounted from under the agent), and a mount the agent made itself is in
/// a mount namespace some other process shares (one only the agent lives in ends with it).
/// `Err` says why not.
pub fn outlives_agent(root: &Path) -> Result<(), String> {
    if check_bpffs(root).is_err() {
        return Err(format!(
            "{} is no longer on a bpf filesystem (unmounted from under the agent?): its pins \
             are reachable only through this agent's descriptors",
            root.display()
        ));
    }
    if let Some(at) = MOUNTED.get() {
        if !mount_namespace_shared() {
            return Err(format!(
                "the bpf filesystem at {} was mounted by this agent in a mount namespace no \
                 other process shares, which ends with it",
                at.display()
            ));
        }
    }
    Ok(())
}

/// Whether another process lives in this agent's mount namespace (then a mount made in it
/// outlives the agent). O(processes) `readlink`s, only where the agent mounted the filesystem.
fn mount_namespace_shared() -> bool {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let Some(own) = ns("self") else {
        return false;
    };
    // This process as this `/proc` numbers it (its PID namespace may not be the process's).
    let me = super::lock::pid_in_proc().map(|pid| pid.to_string());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()) && Some(pid) != me.as_ref())
        .any(|pid| ns(&pid).as_ref() == Some(&own))
}

/// The agent's last line at TERM: what the kernel will have once it is gone, not what is
/// hoped. The pins keep the programs attached and the maps alive only if they are all in
/// place (`unrestored` could not be put back) on a mount that outlives this process.
pub fn say_at_stop(root: &Path, unrestored: usize) {
    match outlives_agent(root) {
        Ok(()) if unrestored == 0 => {
            info!("stopping; programs stay attached through their pins, enforcement continues")
        }
        Ok(()) => error!(
            "stopping; {unrestored} pins under {} could not be put back: what they held \
             (links, maps) goes with this agent, ENFORCEMENT ENDS there until an agent runs \
             again",
            root.display()
        ),
        Err(why) => error!(
            "stopping; {why}: the programs detach and the maps go with this agent, \
             ENFORCEMENT ENDS until an agent runs again"
        ),
    }
}
