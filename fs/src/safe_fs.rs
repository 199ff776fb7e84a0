//! Opening and creating files and directories that belong to ipq without trusting what a
//! less privileged user may have placed there first.
//!
//! - Reading a file never follows a symbolic link and never blocks: a FIFO, socket or device at
//!   a path where a regular file belongs is reported as such, so the caller can set it aside.
//! - A new file is created exclusively (`O_EXCL`), never through a link left in its place.
//! - A directory of ipq's (`bpffs_dir`, `state_dir`, the spool, the API socket's directory)
//!   must be a real directory owned by the agent's user. One owned by anyone else is refused:
//!   what that user placed inside cannot be trusted, and they could later remove what the agent
//!   puts there (link pins, and with them enforcement). One writable by others is tightened.

use std::{
    ffi::CString,
    fs::{self, File},
    io::{self, Read as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::{
            ffi::OsStrExt as _,
            fs::{DirBuilderExt as _, MetadataExt as _},
        },
    },
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Why a directory of ipq's cannot be used.
#[derive(Debug, Error)]
pub enum DirError {
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{}: is a symbolic link; ipq never follows one there: point the setting at the real directory", path.display())]
    Symlink { path: PathBuf },
    #[error("{}: is a {kind}, not a directory", path.display())]
    NotADirectory { path: PathBuf, kind: &'static str },
    #[error(
        "{}: owned by uid {owner}, not by the agent's uid {expected}: another user could remove \
         or replace what ipq keeps there; remove it (ipq creates it) or `chown {expected}` it \
         after checking its contents",
        path.display()
    )]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        expected: u32,
    },
    #[error(
        "{}: a shared sticky directory (mode {mode:o}) cannot be ipq's private directory",
        path.display()
    )]
    SharedSticky { path: PathBuf, mode: u32 },
}

/// Who may look into a directory of ipq's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirAccess {
    /// Only the agent's user: mode 0700 exactly (the state directory, the spool).
    Private,
    /// Others may traverse and list it but never write: mode 0755 at most (pins, the API
    /// socket's directory, which members of `api_group` must traverse). A sticky directory
    /// such as `/tmp` stays as it is: others cannot remove or rename what ipq puts there.
    Traversable,
}

impl DirAccess {
    fn new_mode(self) -> u32 {
        match self {
            Self::Private => 0o700,
            Self::Traversable => 0o755,
        }
    }
}

/// What kind of file `mode` (from `st_mode`) describes, in words.
pub fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn open_raw(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    let c_path = c_path(path)?;
    // SAFETY: a valid C string; the fd returned is owned by the File from here on.
    let fd = unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Why a file could not be opened as a regular file.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error("does not exist")]
    Missing,
    /// A FIFO, socket, device, directory or symbolic link: set it aside, never read it.
    #[error("is a {kind}, not a regular file")]
    NotRegular { kind: &'static str },
    #[error(transparent)]
    Io(io::Error),
}

/// Opens `path` for reading if it is a regular file. Never follows a symbolic link in its last
/// component and never blocks (`O_NONBLOCK`: opening a FIFO would wait for a writer).
pub fn open_regular_nofollow(path: &Path) -> Result<File, OpenError> {
    let file = match open_raw(
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    ) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(OpenError::NotRegular {
                kind: "symbolic link",
            })
        }
        // O_NONBLOCK on a FIFO's write side or a device without a reader.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(OpenError::NotRegular {
                kind: "FIFO or device",
            })
        }
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular {
            kind: kind_of(meta.mode()),
        });
    }
    Ok(file)
}

/// Opens the regular file `path` for appending, creating it with `mode` if missing: never
/// through a symbolic link and never blocking on a FIFO, which is reported instead (for an
/// append-only log such as the journal).
pub fn open_append_regular(path: &Path, mode: u32) -> Result<File, OpenError> {
    let flags =
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let file = match open_raw(path, flags, mode as libc::mode_t) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(OpenError::NotRegular {
                kind: "symbolic link",
            })
        }
        // A FIFO without a reader.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(OpenError::NotRegular {
                kind: "FIFO or device",
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular {
            kind: kind_of(meta.mode()),
        });
    }
    Ok(file)
}

/// The whole content of the regular file `path` (see [`open_regular_nofollow`]).
pub fn read_regular(path: &Path) -> Result<Vec<u8>, OpenError> {
    let mut file = open_regular_nofollow(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(OpenError::Io)?;
    Ok(bytes)
}

/// Creates `path` for writing with `mode`; fails if anything (a file, a link, a FIFO) is
/// already there, so nothing is ever written through a link left in its place.
pub fn create_excl_nofollow(path: &Path, mode: u32) -> io::Result<File> {
    open_raw(
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        mode as libc::mode_t,
    )
}

/// Like [`create_excl_nofollow`], after removing whatever a crashed run left at `path`
/// (unlinking removes a link itself, never its target).
pub fn create_fresh(path: &Path, mode: u32) -> io::Result<File> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create_excl_nofollow(path, mode)
}

/// Makes `path` a directory of ipq's: creates it (and missing parents) if needed, then checks
/// it without following a symbolic link: a directory, owned by the agent's user, and no more
/// open than `access` allows (tightened if it is; see [`DirAccess`]).
pub fn ensure_dir(path: &Path, access: DirAccess) -> Result<(), DirError> {
    let io_err = |what| {
        move |source| DirError::Io {
            path: path.to_owned(),
            what,
            source,
        }
    };
    let created = match fs::DirBuilder::new().mode(access.new_mode()).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(io_err("creating its parent"))?;
            }
            match fs::DirBuilder::new().mode(access.new_mode()).create(path) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(io_err("creating it")(e)),
            }
        }
        Err(e) => return Err(io_err("creating it")(e)),
    };
    let dir = match open_raw(
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    ) {
        Ok(dir) => dir,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(DirError::Symlink {
                path: path.to_owned(),
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            let kind = fs::symlink_metadata(path).map_or("file", |m| kind_of(m.mode()));
            // O_DIRECTORY fails a link with ENOTDIR before O_NOFOLLOW sees it.
            if kind == "symbolic link" {
                return Err(DirError::Symlink {
                    path: path.to_owned(),
                });
            }
            return Err(DirError::NotADirectory {
                path: path.to_owned(),
                kind,
            });
        }
        Err(e) => return Err(io_err("opening it")(e)),
    };
    let meta = dir.metadata().map_err(io_err("inspecting it"))?;
    let expected = euid();
    if meta.uid() != expected {
        return Err(DirError::ForeignOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            expected,
        });
    }
    let mode = meta.mode() & 0o7777;
    let wanted = match access {
        // New directories get exactly their mode, whatever the umask.
        _ if created => access.new_mode(),
        DirAccess::Private if mode & libc::S_ISVTX != 0 && mode & 0o022 != 0 => {
            return Err(DirError::SharedSticky {
                path: path.to_owned(),
                mode,
            })
        }
        DirAccess::Private => 0o700,
        DirAccess::Traversable if mode & libc::S_ISVTX != 0 => mode,
        DirAccess::Traversable => mode & !0o022,
    };
    if wanted != mode {
        // SAFETY: a valid open descriptor.
        if unsafe { libc::fchmod(dir.as_raw_fd(), wanted as libc::mode_t) } != 0 {
            return Err(io_err("setting its mode")(io::Error::last_os_error()));
        }
        if !created && mode & 0o022 != 0 {
            log::warn!(
                "{}: was writable by others (mode {mode:o}); tightened to {wanted:o}",
                path.display()
            );
        }
    }
    Ok(())
}

/// [`ensure_dir`] with [`DirAccess::Private`].
pub fn ensure_private_dir(path: &Path) -> Result<(), DirError> {
    ensure_dir(path, DirAccess::Private)
}

#[cfg(test)]
mod tests;
