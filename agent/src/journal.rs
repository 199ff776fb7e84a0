//! The registry's durable copy in `state_dir`: one file, replaced atomically.
//!
//! Layout: a header line (JSON: format, version, boot id, clocks at write time, and the length
//! and FNV-1a checksum of the body) and the body line (JSON). A write goes to a temporary file
//! that is fsynced, renamed over the journal, and the directory fsynced, so a crash leaves the
//! old journal or the new one, never a mix. A journal that does not check out is moved aside
//! (never deleted: it is evidence) and reported; the caller rebuilds from the pinned maps and
//! netlink, and trusts nothing in it.

use std::{
    fs::{self, File},
    io::{self, Write as _},
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use thiserror::Error;

use crate::{
    netdev,
    safe_fs::{self, DirError, OpenError},
};

pub const JOURNAL_FILE: &str = "registry.journal";
const FORMAT: &str = "ipq-journal";
const VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("state_dir: {0}")]
    Dir(#[from] DirError),
    #[error("journal {path} is corrupt ({reason}); moved to {moved_to}")]
    Corrupt {
        path: PathBuf,
        reason: String,
        moved_to: PathBuf,
    },
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    boot_id: Option<String>,
    written_mono_ns: u64,
    written_unix_ms: u64,
    body_len: usize,
    body_fnv64: u64,
}

/// A journal as loaded, with what is needed to carry its monotonic deadlines across a reboot.
#[derive(Debug)]
pub struct Loaded<T> {
    pub body: T,
    /// Written during this boot: its monotonic stamps compare with the clock directly.
    pub same_boot: bool,
    pub written_mono_ns: u64,
    pub written_unix_ms: u64,
}

pub struct Journal {
    dir: PathBuf,
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The kernel's id of this boot: monotonic clocks restart with it.
pub fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

impl Journal {
    /// Opens (creating, mode 0700) the state directory.
    pub fn open(state_dir: &Path) -> Result<Self, JournalError> {
        safe_fs::ensure_private_dir(state_dir)?;
        Ok(Self {
            dir: state_dir.to_owned(),
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// The journal's content; `None` when there is none yet.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Option<Loaded<T>>, JournalError> {
        let path = self.path();
        // Never blocks on a FIFO nor follows a link: what is not a regular file is set aside.
        let bytes = match safe_fs::read_regular(&path) {
            Ok(bytes) => bytes,
            Err(OpenError::Missing) => return Ok(None),
            Err(e @ OpenError::NotRegular { .. }) => {
                return Err(self.quarantine_file(e.to_string()))
            }
            Err(OpenError::Io(source)) => return Err(JournalError::Io { path, source }),
        };
        match Self::decode(&bytes) {
            Ok(loaded) => Ok(Some(loaded)),
            Err(reason) => Err(self.quarantine_file(reason)),
        }
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<Loaded<T>, String> {
        let newline = bytes
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("no header line")?;
        let header: Header =
            serde_json::from_slice(&bytes[..newline]).map_err(|e| format!("header: {e}"))?;
        if header.format != FORMAT {
            return Err(format!("not an ipq journal (format {:?})", header.format));
        }
        if header.version != VERSION {
            return Err(format!(
                "journal version {} is not the version {VERSION} this agent reads",
                header.version
            ));
        }
        let body = &bytes[newline + 1..];
        let body = body.strip_suffix(b"\n").unwrap_or(body);
        if body.len() != header.body_len {
            return Err(format!(
                "truncated: body has {} bytes, header says {}",
                body.len(),
                header.body_len
            ));
        }
        if fnv64(body) != header.body_fnv64 {
            return Err("checksum mismatch".into());
        }
        let value = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
        Ok(Loaded {
            body: value,
            same_boot: header.boot_id.is_some() && header.boot_id == boot_id(),
            written_mono_ns: header.written_mono_ns,
            written_unix_ms: header.written_unix_ms,
        })
    }

    /// Moves a bad journal aside and says so.
    fn quarantine_file(&self, reason: String) -> JournalError {
        let path = self.path();
        let moved_to = self
            .dir
            .join(format!("{JOURNAL_FILE}.corrupt-{}", unix_ms()));
        if let Err(source) = fs::rename(&path, &moved_to) {
            return JournalError::Io { path, source };
        }
        JournalError::Corrupt {
            path,
            reason,
            moved_to,
        }
    }

    /// Replaces the journal with `value`, durably.
    pub fn save<T: Serialize>(&self, value: &T) -> Result<(), JournalError> {
        let path = self.path();
        let io_err = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let body = serde_json::to_vec(value)
            .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
            boot_id: boot_id(),
            written_mono_ns: netdev::monotonic_ns(),
            written_unix_ms: unix_ms(),
            body_len: body.len(),
            body_fnv64: fnv64(&body),
        };
        let header = serde_json::to_vec(&header)
            .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;

        let tmp = self.dir.join(format!("{JOURNAL_FILE}.tmp"));
        let mut file = safe_fs::create_fresh(&tmp, 0o600).map_err(io_err)?;
        file.write_all(&header).map_err(io_err)?;
        file.write_all(b"\n").map_err(io_err)?;
        file.write_all(&body).map_err(io_err)?;
        file.write_all(b"\n").map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        drop(file);
        fs::rename(&tmp, &path).map_err(io_err)?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Body {
        addrs: Vec<String>,
    }

    fn body() -> Body {
        Body {
            addrs: vec!["10.0.0.1".into(), "fd00::1".into()],
        }
    }

    #[test]
    fn round_trip_in_the_same_boot() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("state")).unwrap();
        assert!(journal.load::<Body>().unwrap().is_none());
        journal.save(&body()).unwrap();
        let loaded = journal.load::<Body>().unwrap().unwrap();
        assert_eq!(loaded.body, body());
        assert!(loaded.same_boot);
        assert!(loaded.written_mono_ns > 0);
        let mode = fs::metadata(journal.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    fn corrupt_with(edit: impl FnOnce(&mut Vec<u8>)) -> String {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.save(&body()).unwrap();
        let mut bytes = fs::read(journal.path()).unwrap();
        edit(&mut bytes);
        fs::write(journal.path(), &bytes).unwrap();
        let err = journal.load::<Body>().unwrap_err();
        let JournalError::Corrupt { moved_to, .. } = &err else {
            panic!("expected Corrupt, got {err}");
        };
        // Moved aside, not deleted; the next load starts from nothing.
        assert_eq!(fs::read(moved_to).unwrap(), bytes);
        assert!(journal.load::<Body>().unwrap().is_none());
        err.to_string()
    }

    #[test]
    fn truncation_is_detected_and_the_file_kept_aside() {
        let e = corrupt_with(|b| b.truncate(b.len() - 10));
        assert!(e.contains("truncated"), "{e}");
        let e = corrupt_with(|b| b.truncate(20));
        assert!(e.contains("header") || e.contains("no header"), "{e}");
    }

    #[test]
    fn a_flipped_byte_is_detected() {
        let e = corrupt_with(|b| {
            let at = b.len() - 5;
            b[at] ^= 0x01;
        });
        assert!(e.contains("checksum"), "{e}");
    }

    #[test]
    fn garbage_and_other_versions_are_refused() {
        let e = corrupt_with(|b| *b = b"\x00\x01garbage".to_vec());
        assert!(e.contains("no header") || e.contains("header"), "{e}");
        let e = corrupt_with(|b| {
            let text = String::from_utf8(b.clone()).unwrap();
            *b = text
                .replacen("\"version\":1", "\"version\":9", 1)
                .into_bytes();
        });
        assert!(e.contains("version 9"), "{e}");
    }
}
