//! The journal's file operations, hardened against what another local user could leave in the
//! state directory: no symlink is ever followed (`O_NOFOLLOW`), only regular files are read or
//! written (opened `O_NONBLOCK`, so a FIFO cannot block the agent, then checked with fstat), and
//! temporary files are created exclusively (`O_EXCL`), never reused.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

/// Opens an existing journal file for reading and appending; `None` when there is none.
pub fn open_existing(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "is a symbolic link; refusing to follow it",
            ))
        }
        Err(e) => return Err(e),
    };
    require_regular(&file)?;
    clear_nonblock(&file)?;
    Ok(Some(file))
}

/// Creates `path` for writing, mode 0600; fails if anything (a file, a symlink) is there.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Removes a leftover temporary file of an earlier agent (whatever it is: only the directory
/// entry goes, nothing is followed).
pub fn remove_leftover(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// fsyncs the directory, so that a rename in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)?;
    dir.sync_all()
}

fn require_regular(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}; only a regular file is a journal"),
    ))
}

/// Regular files ignore `O_NONBLOCK`, but the descriptor should say what it does.
fn clear_nonblock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns, with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
