//! DELs that arrived while the agent was down, kept on disk until the agent replays them.
//!
//! The agent replays the spool at start (after recovering the registry, before the netlink
//! reconcile, so a replayed DEL lands where a live one would have) and on every tick: it drains
//! each [`SpooledDel`]'s attachment, saves its journal, then calls [`SpooledDel::done`].
//!
//! One file per DEL, `del-<unix ns, 20 digits>-<pid>-<n>.json`, holding the
//! `DrainAttachmentRequest` as JSON: names sort oldest first. ipq-cni writes a hidden temp file,
//! fsyncs it, renames it into place and fsyncs the directory before it reports success, so a
//! spooled DEL survives a crash and a half-written one is never read. A file that does not
//! parse is renamed to `*.corrupt` and logged, never replayed and never deleted.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ipq_api::model::DrainAttachmentRequest;
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;

use crate::safe_fs::{self, DirError, OpenError};

#[derive(Debug, Error)]
pub enum SpoolError {
    #[error("spool {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("spool: encoding a request: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("spool: {0}")]
    Dir(#[from] DirError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// One spooled request of type `T`.
#[derive(Debug)]
pub struct Spooled<T> {
    pub path: PathBuf,
    pub request: T,
}

/// One spooled DEL of `ipq-cni`.
pub type SpooledDel = Spooled<DrainAttachmentRequest>;

impl<T> Spooled<T> {
    /// Removes the spooled file once its DEL has been applied.
    pub fn done(self) -> Result<(), SpoolError> {
        fs::remove_file(&self.path).map_err(|source| SpoolError::Io {
            path: self.path,
            source,
        })
    }
}

const PREFIX: &str = "del-";
const SUFFIX: &str = ".json";
const CORRUPT_SUFFIX: &str = ".corrupt";
const TEMP_PREFIX: &str = ".del-";

/// A temp file older than this belongs to an ipq-cni that died before its rename: that DEL was
/// never reported done, so the runtime retries it, and the file can go.
const STALE_TEMP: Duration = Duration::from_secs(60);

static NEXT: AtomicU32 = AtomicU32::new(0);

mod batch;

pub use batch::write_all_at;

/// Writes `request` into `dir` (created 0700 if missing, refused if another user owns it),
/// durably, and returns its path.
pub fn spool(dir: &Path, request: &impl Serialize) -> Result<PathBuf, SpoolError> {
    let path = new_path(dir);
    write_at(&path, request)?;
    Ok(path)
}

/// A new spool file's path in `dir`: named after now (oldest first), this process and a
/// counter, so that no two writers pick the same.
pub fn new_path(dir: &Path) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    dir.join(format!(
        "{PREFIX}{nanos:020}-{}-{}{SUFFIX}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The hidden temp file a spool file at `path` is written as before its rename.
fn temp_path(path: &Path) -> Result<PathBuf, SpoolError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file in a spool directory",
        )));
    };
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(".tmp");
    Ok(dir.join(temp_name))
}

/// Writes `request` at `path` (a spool file's name in its spool directory), durably, as
/// [`spool`] does: the agent puts back a pending file that vanished under it.
pub fn write_at(path: &Path, request: &impl Serialize) -> Result<(), SpoolError> {
    let temp = temp_path(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    if let Some(state_dir) = dir.parent() {
        safe_fs::ensure_private_dir(state_dir)?;
    }
    safe_fs::ensure_private_dir(dir)?;
    let body = serde_json::to_vec(request).map_err(SpoolError::Encode)?;
    let write = || -> std::io::Result<()> {
        let mut file = safe_fs::create_excl_nofollow(&temp, 0o600)?;
        file.write_all(&body)?;
        file.sync_all()
    };
    if let Err(source) = write() {
        let _ = fs::remove_file(&temp);
        return Err(SpoolError::Io { path: temp, source });
    }
    if let Err(source) = fs::rename(&temp, path) {
        let _ = fs::remove_file(&temp);
        return Err(io(path)(source));
    }
    // The rename is durable once the directory is.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

/// The DELs waiting in `dir`, oldest first. A missing `dir` holds none. Unparsable files are
/// set aside as `*.corrupt` with a warning, and temp files of writers that died are removed.
pub fn pending(dir: &Path) -> Result<Vec<SpooledDel>, SpoolError> {
    pending_of(dir)
}

/// The requests of type `T` waiting in `dir`, oldest first, as [`pending`] reads them.
pub fn pending_of<T: DeserializeOwned>(dir: &Path) -> Result<Vec<Spooled<T>>, SpoolError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(io(dir)(source)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        let Ok(name) = entry.file_name().into_string() else {
            log::warn!(
                "cni spool: ignoring {} (not a spool file name)",
                entry.path().display()
            );
            continue;
        };
        if name.starts_with(TEMP_PREFIX) {
            remove_if_stale(&entry.path());
        } else if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
            names.push(name);
        }
    }
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        // Never blocks on a FIFO nor follows a link: what is not a regular file is set aside.
        let parsed = match safe_fs::read_regular(&path) {
            Ok(bytes) => serde_json::from_slice::<T>(&bytes).map_err(|e| e.to_string()),
            Err(OpenError::Missing) => continue,
            Err(OpenError::Io(e)) => {
                // Perhaps passing: left in place for the next replay.
                log::warn!("cni spool: reading {}: {e}", path.display());
                continue;
            }
            Err(e @ OpenError::NotRegular { .. }) => Err(e.to_string()),
        };
        match parsed {
            Ok(request) => out.push(Spooled { path, request }),
            Err(why) => set_aside(&path, &why),
        }
    }
    Ok(out)
}

fn set_aside(path: &Path, why: &str) {
    let mut aside = path.as_os_str().to_owned();
    aside.push(CORRUPT_SUFFIX);
    match fs::rename(path, &aside) {
        Ok(()) => log::warn!(
            "cni spool: {} is not a spooled DEL ({why}); not replayed, kept as {}",
            path.display(),
            Path::new(&aside).display()
        ),
        Err(e) => log::error!(
            "cni spool: {} is not a spooled DEL ({why}) and could not be set aside ({e}); not replayed",
            path.display()
        ),
    }
}

fn remove_if_stale(path: &Path) {
    let age = fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok());
    if age.is_some_and(|age| age > STALE_TEMP) {
        match fs::remove_file(path) {
            Ok(()) => log::info!(
                "cni spool: removed {}, left by an ipq-cni that died mid-write",
                path.display()
            ),
            Err(e) => log::warn!("cni spool: removing {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{net::IpAddr, os::unix::fs::PermissionsExt as _};

    use super::*;

    fn request(id: &str) -> DrainAttachmentRequest {
        DrainAttachmentRequest {
            container_id: id.to_owned(),
            cni_ifname: Some("eth0".into()),
            addresses: vec![
                "10.1.0.5".parse::<IpAddr>().unwrap(),
                "fd01::5".parse().unwrap(),
            ],
        }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_missing_dir_holds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(pending(&tmp.path().join("nope")).unwrap().is_empty());
    }

    #[test]
    fn written_dels_come_back_oldest_first_and_done_removes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/cni-spool");
        let ids = ["first", "second", "third"];
        let paths: Vec<PathBuf> = ids
            .iter()
            .map(|id| spool(&dir, &request(id)).unwrap())
            .collect();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            fs::metadata(&paths[0]).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            files(&dir).len(),
            3,
            "no temp files left: {:?}",
            files(&dir)
        );
        let waiting = pending(&dir).unwrap();
        let got: Vec<&str> = waiting
            .iter()
            .map(|s| s.request.container_id.as_str())
            .collect();
        assert_eq!(got, ids);
        assert_eq!(waiting[1].request, request("second"));
        // Reading does not consume: a crash before `done` replays again.
        assert_eq!(pending(&dir).unwrap().len(), 3);
        for spooled in waiting {
            spooled.done().unwrap();
        }
        assert!(pending(&dir).unwrap().is_empty());
        assert!(files(&dir).is_empty());
    }

    #[test]
    fn corrupt_files_are_set_aside_not_replayed_not_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = &tmp.path().join("cni-spool");
        spool(dir, &request("good")).unwrap();
        fs::write(
            dir.join("del-00000000000000000001-1-0.json"),
            b"{\"container_id\":",
        )
        .unwrap();
        fs::write(
            dir.join("del-00000000000000000002-1-0.json"),
            b"{\"containerID\":\"x\"}",
        )
        .unwrap();
        let waiting = pending(dir).unwrap();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].request.container_id, "good");
        let names = files(dir);
        assert!(
            names.contains(&"del-00000000000000000001-1-0.json.corrupt".to_owned()),
            "{names:?}"
        );
        assert!(
            names.contains(&"del-00000000000000000002-1-0.json.corrupt".to_owned()),
            "{names:?}"
        );
        // Set aside once: the next start neither replays nor renames them again.
        assert_eq!(pending(dir).unwrap().len(), 1);
        assert_eq!(files(dir).len(), 3);
    }

    #[test]
    fn temp_files_are_never_read_and_stale_ones_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let fresh = dir.join(".del-00000000000000000005-9-0.json.tmp");
        let stale = dir.join(".del-00000000000000000004-9-0.json.tmp");
        fs::write(&fresh, b"{\"container_id\":\"half").unwrap();
        fs::write(&stale, b"{\"container_id\":\"half").unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        fs::write(dir.join("unrelated.txt"), b"x").unwrap();
        assert!(pending(dir).unwrap().is_empty());
        assert!(fresh.exists(), "a writer may still be busy with it");
        assert!(!stale.exists());
        assert!(dir.join("unrelated.txt").exists());
    }

    #[test]
    fn a_fifo_or_a_link_in_the_spool_is_set_aside_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cni-spool");
        spool(&dir, &request("good")).unwrap();
        let fifo = dir.join("del-00000000000000000001-1-0.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let elsewhere = tmp.path().join("elsewhere.json");
        fs::write(&elsewhere, br#"{"container_id":"planted"}"#).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("del-00000000000000000002-1-0.json"))
            .unwrap();
        let waiting = pending(&dir).unwrap();
        let ids: Vec<&str> = waiting
            .iter()
            .map(|s| s.request.container_id.as_str())
            .collect();
        assert_eq!(ids, ["good"]);
        let names = files(&dir);
        assert!(
            names.contains(&"del-00000000000000000001-1-0.json.corrupt".to_owned()),
            "{names:?}"
        );
        assert!(
            names.contains(&"del-00000000000000000002-1-0.json.corrupt".to_owned()),
            "{names:?}"
        );
    }

    #[test]
    fn an_unwritable_dir_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("not-a-dir");
        fs::write(&file, b"").unwrap();
        let err = spool(&file.join("spool"), &request("x")).unwrap_err();
        assert!(err.to_string().contains("not-a-dir"), "{err}");
    }
}
