//! Who is at the other end of an API connection, and what it may do there (issue #39).
//!
//! Three roles ([`Role`]), from the socket's credentials and, for uid 0, the peer's process:
//!
//! - **read** (status, addresses, conflicts, events, the probes): members of `api_group`, and
//!   uid 0 *without* `CAP_NET_ADMIN` in the initial user namespace (a container running as
//!   root with the socket mounted);
//! - **admin** (besides reading: claims, drains, releases, GC, break-glass datapath writes):
//!   members of `api_admin_group`;
//! - **root** (everything, the IPAM routes included): uid 0 whose process holds
//!   `CAP_NET_ADMIN` in its effective set and runs in the agent's user namespace (the initial
//!   one: the agent needs `CAP_BPF` there). The CNI plugins, run by the runtime with every
//!   capability, and an operator's `sudo ipq` are that.
//!
//! Groups are what the socket says (`SO_PEERCRED`'s primary group, `SO_PEERGROUPS`), fixed at
//! `connect`. Capabilities are not in the socket's credentials: they are read from the peer's
//! process, found through `SO_PEERPIDFD` (Linux 6.5), a pidfd that names that very process
//! whatever PID namespace it is in: its PID as the agent's `/proc` numbers it is read from the
//! pidfd's `fdinfo`, then `/proc/<pid>/status` (`CapEff`) and `/proc/<pid>/ns/user` (or, when
//! the agent may not read that link, `/proc/<pid>/uid_map`: the initial namespace's is the
//! identity map of every id), and the `fdinfo` again, which proves the process read was alive
//! all along (a PID of an exited process is never the one read). On a kernel without
//! `SO_PEERPIDFD`, `SO_PEERCRED`'s PID is used; it may be reused between the peer's exit and
//! the read (a window of microseconds for a process that connected, then exited).
//!
//! What this relies on and where it stops: the agent's `/proc` must show the peer. An agent in
//! its own PID namespace with a `/proc` of that namespace sees no peer outside it (a DaemonSet
//! pod without `hostPID`): `api_peer_procfs` names a procfs of the node's PID namespace to
//! read instead (the host's `/proc` mounted read-only). A uid-0 peer whose process is not
//! found there is read-only, and a refusal says why. The capability is the process's at
//! `accept`, not at `connect`: a process that dropped `CAP_NET_ADMIN` after connecting (or
//! passed the connection to one that never had it) is judged by what it holds then. And group
//! membership is the credentials' word: a process holding `CAP_SETGID` can join any group, so
//! the socket must not be mounted into containers that hold it.

use std::{
    fs, io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use ipq_api::model::Role;
use tokio::net::UnixStream;

/// `CAP_NET_ADMIN` (linux/capability.h): what ipq's changes exercise in the kernel.
const CAP_NET_ADMIN: u32 = 12;

/// Why a uid-0 peer is not given the root role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotRoot {
    /// Its effective capabilities lack `CAP_NET_ADMIN`.
    NoNetAdmin,
    /// It runs in another user namespace than the agent's (its capabilities are that
    /// namespace's).
    OtherUserNamespace,
    /// Its process is not in the procfs the agent reads (another PID namespace).
    NotVisible,
    /// Its process exited before its privileges could be read.
    Exited,
    /// Its process's status could not be read.
    Unreadable,
}

impl NotRoot {
    pub const fn reason(self) -> &'static str {
        match self {
            Self::NoNetAdmin => "uid 0 without CAP_NET_ADMIN in its effective capabilities",
            Self::OtherUserNamespace => "uid 0 of another user namespace than the agent's",
            Self::NotVisible => {
                "uid 0 whose process the agent cannot see (another PID namespace: set \
                 api_peer_procfs to a procfs of the node's PID namespace)"
            }
            Self::Exited => "uid 0 whose process exited before its capabilities were read",
            Self::Unreadable => "uid 0 whose process's capabilities could not be read",
        }
    }
}

/// Who asks, and what it may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub role: Role,
    /// For uid 0 below the root role: why.
    pub not_root: Option<NotRoot>,
}

impl Peer {
    /// A peer with the root role (tests, and the agent's own calls).
    #[cfg(test)]
    pub const fn root() -> Self {
        Self {
            uid: 0,
            role: Role::Root,
            not_root: None,
        }
    }

    fn who(&self) -> String {
        match self.not_root {
            Some(why) => why.reason().to_owned(),
            None => format!("uid {} ({} role)", self.uid, self.role),
        }
    }

    /// Whether this peer may ask for what needs `role`; the refusal names what it needed and
    /// why this peer does not have it.
    pub fn needs(&self, role: Role, what: &str) -> Result<(), String> {
        if self.role >= role {
            return Ok(());
        }
        Err(format!(
            "{what}: {} may not ask for this: it needs the {role} role ({})",
            self.who(),
            role.holders()
        ))
    }
}

/// The uid-0 peer's privilege as its process shows it.
pub fn root_privilege(
    procfs: &Path,
    stream: &UnixStream,
    cred_pid: Option<i32>,
) -> Option<NotRoot> {
    match peer_pidfd(stream) {
        Ok(pidfd) => Process::by_pidfd(procfs, pidfd).map_or_else(Some, |p| p.not_root()),
        // Before Linux 6.5: SO_PEERCRED's PID, as the agent's PID namespace numbers it.
        Err(_) => match cred_pid {
            Some(pid) if pid > 0 => {
                Process::by_pid(procfs, pid).map_or_else(Some, |p| p.not_root())
            }
            // A peer outside the agent's PID namespace (the runtime's CNI plugins, when the
            // agent runs in a pod without hostPID) on a kernel without SO_PEERPIDFD: its
            // process cannot be found by any PID the agent is given. Refusing it would refuse
            // every pod's claim on the node; uid 0 is taken as root there, said once at WARN
            // and in docs/api.md ("Roles").
            _ => {
                unverifiable_root_once();
                None
            }
        },
    }
}

/// Says once per agent that uid 0 is root without a look at its capabilities.
fn unverifiable_root_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        log::warn!(
            "API: this kernel has no SO_PEERPIDFD (Linux 6.5) and a uid-0 peer is outside the \
             agent's PID namespace: its capabilities cannot be read, so uid 0 is taken as root \
             (run the agent with hostPID, or on 6.5+, for the CAP_NET_ADMIN check)"
        );
    });
}

/// What was read of the peer's process.
struct Process {
    cap_eff: u64,
    same_user_ns: bool,
}

impl Process {
    fn by_pidfd(procfs: &Path, pidfd: OwnedFd) -> Result<Self, NotRoot> {
        let fdinfo = procfs.join(format!("self/fdinfo/{}", pidfd.as_raw_fd()));
        let pid = pidfd_pid(&fdinfo)?;
        let process = Self::by_pid(procfs, pid)?;
        // Still the same PID and alive: what was read under it was the peer's.
        if pidfd_pid(&fdinfo)? != pid {
            return Err(NotRoot::Exited);
        }
        Ok(process)
    }

    fn by_pid(procfs: &Path, pid: i32) -> Result<Self, NotRoot> {
        let dir = procfs.join(pid.to_string());
        let status = fs::read_to_string(dir.join("status")).map_err(|e| gone_or(&e))?;
        let cap_eff = cap_eff(&status).ok_or(NotRoot::Unreadable)?;
        let same_user_ns = same_user_ns(procfs, &dir)?;
        Ok(Self {
            cap_eff,
            same_user_ns,
        })
    }

    fn not_root(&self) -> Option<NotRoot> {
        if !self.same_user_ns {
            Some(NotRoot::OtherUserNamespace)
        } else if self.cap_eff & (1 << CAP_NET_ADMIN) == 0 {
            Some(NotRoot::NoNetAdmin)
        } else {
            None
        }
    }
}

fn gone_or(error: &io::Error) -> NotRoot {
    if error.kind() == io::ErrorKind::NotFound {
        NotRoot::Exited
    } else {
        NotRoot::Unreadable
    }
}

/// The PID the procfs numbers the pidfd's process with: `Pid:` in its fdinfo, 0 when it is in
/// no PID namespace that procfs shows, -1 once it exited.
fn pidfd_pid(fdinfo: &Path) -> Result<i32, NotRoot> {
    let text = fs::read_to_string(fdinfo).map_err(|_| NotRoot::Unreadable)?;
    let pid = text
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|raw| raw.trim().parse::<i32>().ok())
        .ok_or(NotRoot::Unreadable)?;
    match pid {
        -1 => Err(NotRoot::Exited),
        0 => Err(NotRoot::NotVisible),
        pid => Ok(pid),
    }
}

/// `CapEff:` of a `/proc/<pid>/status`.
fn cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|raw| u64::from_str_radix(raw.trim(), 16).ok())
}

/// Whether the process of `dir` runs in the agent's user namespace: its `ns/user` link names
/// the agent's; where the agent may not read that link (the peer holds capabilities the agent
/// lacks), its `uid_map` equals the agent's.
fn same_user_ns(procfs: &Path, dir: &Path) -> Result<bool, NotRoot> {
    let own = procfs.join("self");
    match fs::read_link(dir.join("ns/user")) {
        Ok(theirs) => {
            let ours = fs::read_link(own.join("ns/user")).map_err(|_| NotRoot::Unreadable)?;
            Ok(theirs == ours)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(NotRoot::Exited),
        Err(_) => {
            let theirs = fs::read_to_string(dir.join("uid_map")).map_err(|e| gone_or(&e))?;
            let ours = fs::read_to_string(own.join("uid_map")).map_err(|_| NotRoot::Unreadable)?;
            Ok(uid_map_lines(&theirs) == uid_map_lines(&ours))
        }
    }
}

fn uid_map_lines(map: &str) -> Vec<Vec<&str>> {
    map.lines()
        .map(|line| line.split_whitespace().collect())
        .collect()
}

/// The peer's pidfd (`SO_PEERPIDFD`, Linux 6.5).
fn peer_pidfd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket and an int-sized out-parameter.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            std::ptr::from_mut(&mut fd).cast(),
            &mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just made for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The procfs the agent reads peers from (`api_peer_procfs`).
pub fn procfs_or_default(configured: Option<&Path>) -> PathBuf {
    configured.map_or_else(|| PathBuf::from("/proc"), Path::to_owned)
}

#[cfg(test)]
mod tests;
