//! Opening a delegate binary so that what is checked is what runs. The path is walked from `/`
//! one component at a time with `openat(O_PATH | O_NOFOLLOW)`, every descriptor checked with
//! `fstat`: each directory owned by root (or the agent's user) and writable by nobody else
//! unless sticky, the file a regular executable with the same owners and no group or other
//! write bit. The caller then executes that descriptor, never the path: nothing another user
//! may change lies between the check and the exec, since every directory on the way is one
//! only root or the agent's user can change.
//!
//! A symbolic link met on the way (a node's plugin directory linking a distribution's
//! plugins) is resolved here, not by the kernel: read off its own descriptor, its owner
//! checked, its target walked with the same checks, at most [`MAX_LINKS`] of them.

use std::{
    collections::VecDeque,
    ffi::{CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::{OsStrExt as _, OsStringExt as _},
    },
    path::{Component, Path, PathBuf},
};

/// As the kernel's own bound on links in one lookup.
pub const MAX_LINKS: usize = 40;

/// Why a delegate's binary cannot be opened as one root may run.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The last component is absent: the caller looks in its next directory.
    #[error("{}: does not exist", path.display())]
    Missing { path: PathBuf },
    #[error("{}: {reason}", path.display())]
    Unsafe { path: PathBuf, reason: String },
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
}

/// The opened delegate: `fd` (an `O_PATH` descriptor of the checked file) is what runs.
#[derive(Debug)]
pub struct Opened {
    pub fd: OwnedFd,
    /// The file's path as walked (links resolved), for messages.
    pub path: PathBuf,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn fstat(fd: &OwnedFd, path: &Path) -> Result<libc::stat, ResolveError> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(ResolveError::Io {
            path: path.to_owned(),
            what: "inspecting it",
            source: io::Error::last_os_error(),
        });
    }
    Ok(st)
}

/// `openat(dir, name, O_PATH | O_NOFOLLOW)`: the entry itself, a link not followed.
fn open_entry(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let name = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: a valid descriptor and C string; the descriptor returned is owned from here on.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The target of the link open as `link` (`readlinkat` with an empty name reads the link the
/// descriptor is).
fn read_link(link: &OwnedFd) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid descriptor, an empty C string, and a buffer of buf.len() bytes.
    let n = unsafe {
        libc::readlinkat(
            link.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    if n == buf.len() {
        // Filled to the brim: perhaps cut short, and a cut path is another path.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the link's target is longer than PATH_MAX",
        ));
    }
    buf.truncate(n);
    Ok(PathBuf::from(OsString::from_vec(buf)))
}

/// Whose files root may trust: root's and the agent's own user's.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

fn check_dir(st: &libc::stat, path: &Path) -> Result<(), ResolveError> {
    let unsafe_because = |reason: String| ResolveError::Unsafe {
        path: path.to_owned(),
        reason,
    };
    let mode = st.st_mode;
    if !trusted_owner(st.st_uid) {
        return Err(unsafe_because(format!(
            "directory owned by uid {}, neither root nor the agent's user",
            st.st_uid
        )));
    }
    // A sticky directory (/tmp) lets nobody replace an entry they do not own.
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(unsafe_because(format!(
            "directory (mode {:o}) lets group or others replace what is in it",
            mode & 0o7777
        )));
    }
    Ok(())
}

fn check_file(st: &libc::stat, path: &Path) -> Result<(), ResolveError> {
    let unsafe_because = |reason: String| ResolveError::Unsafe {
        path: path.to_owned(),
        reason,
    };
    let mode = st.st_mode;
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(unsafe_because(format!(
            "not a regular file but a {}",
            ipq_fs::safe_fs::kind_of(mode)
        )));
    }
    if mode & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "mode {:o} lets group or others write it",
            mode & 0o7777
        )));
    }
    if mode & 0o111 == 0 {
        return Err(unsafe_because("not executable".into()));
    }
    if !trusted_owner(st.st_uid) {
        return Err(unsafe_because(format!(
            "owned by uid {}, neither root nor the agent's user",
            st.st_uid
        )));
    }
    Ok(())
}

/// The components of `path` to walk, refusing what cannot be walked from `/`.
fn components(path: &Path) -> Result<VecDeque<OsString>, ResolveError> {
    let mut out = VecDeque::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => out.push_back(OsString::from("..")),
            Component::Normal(name) => out.push_back(name.to_owned()),
            Component::Prefix(_) => {
                return Err(ResolveError::Unsafe {
                    path: path.to_owned(),
                    reason: "not a Unix path".into(),
                })
            }
        }
    }
    Ok(out)
}

/// The directories walked so far, `/` first, with their paths.
struct Walk {
    dirs: Vec<(OwnedFd, PathBuf)>,
}

impl Walk {
    fn from_root() -> Result<Self, ResolveError> {
        let root = Path::new("/");
        let fd = std::fs::File::open(root)
            .map(OwnedFd::from)
            .map_err(|source| ResolveError::Io {
                path: root.to_owned(),
                what: "opening it",
                source,
            })?;
        check_dir(&fstat(&fd, root)?, root)?;
        Ok(Self {
            dirs: vec![(fd, root.to_owned())],
        })
    }

    fn current(&self) -> &(OwnedFd, PathBuf) {
        self.dirs.last().expect("the walk always holds /")
    }

    fn up(&mut self) {
        if self.dirs.len() > 1 {
            self.dirs.pop();
        }
    }
}

/// Opens `path` (absolute) as a binary root may run; see the module's documentation.
pub fn open_trusted(path: &Path) -> Result<Opened, ResolveError> {
    if !path.is_absolute() {
        return Err(ResolveError::Unsafe {
            path: path.to_owned(),
            reason: "not an absolute path".into(),
        });
    }
    let mut walk = Walk::from_root()?;
    let mut rest = components(path)?;
    let mut links = 0;
    while let Some(name) = rest.pop_front() {
        if name == ".." {
            walk.up();
            continue;
        }
        let (dir, dir_path) = walk.current();
        let here = dir_path.join(&name);
        let fd = match open_entry(dir, &name) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ResolveError::Missing { path: here })
            }
            Err(source) => {
                return Err(ResolveError::Io {
                    path: here,
                    what: "opening it",
                    source,
                })
            }
        };
        let st = fstat(&fd, &here)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(ResolveError::Unsafe {
                        path: path.to_owned(),
                        reason: format!("more than {MAX_LINKS} symbolic links on the way"),
                    });
                }
                // The link's directory is checked, so only a trusted user could have placed
                // it; its owner is checked alike.
                if !trusted_owner(st.st_uid) {
                    return Err(ResolveError::Unsafe {
                        path: here,
                        reason: format!(
                            "symbolic link owned by uid {}, neither root nor the agent's user",
                            st.st_uid
                        ),
                    });
                }
                let target = read_link(&fd).map_err(|source| ResolveError::Io {
                    path: here.clone(),
                    what: "reading the link",
                    source,
                })?;
                let mut walked = components(&target)?;
                walked.extend(rest);
                rest = walked;
                if target.is_absolute() {
                    walk = Walk::from_root()?;
                }
            }
            libc::S_IFDIR => {
                check_dir(&st, &here)?;
                walk.dirs.push((fd, here));
            }
            _ if rest.is_empty() => {
                check_file(&st, &here)?;
                return Ok(Opened { fd, path: here });
            }
            _ => {
                return Err(ResolveError::Unsafe {
                    path: here,
                    reason: "not a directory, yet the path goes on".into(),
                })
            }
        }
    }
    // The path named a directory (or `/`).
    let (_, last) = walk.current();
    Err(ResolveError::Unsafe {
        path: last.clone(),
        reason: "not a regular file but a directory".into(),
    })
}

#[cfg(test)]
mod tests;
