//! Where the journal is and what is found there: the state directory, the file in it this agent
//! journals to (its own, or the one beside a newer agent's, see `newer`), and loading that file.
//! A torn tail is truncated; anything else that is no journal of this agent's is set aside
//! (never deleted: it is evidence).

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
};

mod newer;

use super::{files, format, read, unix_ms, Entry, JournalError, Loaded, JOURNAL_FILE};

pub use self::newer::NewerJournal;

/// The journal's place in `state_dir`, and the newer agent's journal found there at the last load.
pub(super) struct Location {
    dir: PathBuf,
    /// The file journaled to: [`JOURNAL_FILE`], or the one beside a newer agent's journal.
    file: String,
    /// A newer agent's journal found at the last load, left untouched.
    newer: Option<NewerJournal>,
}

/// A loaded file that commits may go on appending to: written during this boot, in the current
/// format.
pub(super) struct Appendable {
    pub file: File,
    /// Bytes up to the end of the last valid line.
    pub len: u64,
    /// Bytes of the header and base lines.
    pub base_len: u64,
}

/// A journal as loaded, and its file when commits may go on appending to it.
pub(super) type Found<E> = (Loaded<E>, Option<Appendable>);

impl Location {
    /// Opens (creating, mode 0700) the state directory.
    pub(super) fn open(state_dir: &Path) -> Result<Self, JournalError> {
        ipq_fs::safe_fs::ensure_private_dir(state_dir)?;
        Ok(Self {
            dir: state_dir.to_owned(),
            file: JOURNAL_FILE.to_owned(),
            newer: None,
        })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file this agent journals to.
    pub(super) fn path(&self) -> PathBuf {
        self.dir.join(&self.file)
    }

    /// `source` as a failure of the journal's file.
    pub(super) fn io_err(&self, source: io::Error) -> JournalError {
        JournalError::Io {
            path: self.path(),
            source,
        }
    }

    /// The journal's content, and the file if commits may append to it; `None` when there is
    /// none yet. A torn tail is truncated (and reported in [`Loaded::torn_tail`]); a corrupt
    /// journal is moved aside ([`JournalError::Corrupt`]). A newer agent's journal is left
    /// untouched, and this agent's file beside it is loaded instead.
    pub(super) fn load<E: Entry>(&mut self) -> Result<Option<Found<E>>, JournalError> {
        self.file = JOURNAL_FILE.to_owned();
        self.newer = None;
        self.load_file()
    }

    fn load_file<E: Entry>(&mut self) -> Result<Option<Found<E>>, JournalError> {
        let path = self.path();
        let opened = match files::open_existing(&path) {
            Ok(opened) => opened,
            // A FIFO, a directory or a symlink where the journal belongs is no journal: set it
            // aside like a corrupt one, so the agent starts and writes a real one.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(self.set_aside(e.to_string()))
            }
            Err(e) => return Err(self.io_err(e)),
        };
        let Some(mut file) = opened else {
            return Ok(None);
        };
        let read = match read::read::<E>(&mut file) {
            Ok(read) => read,
            Err(read::ReadError::Io(e)) => return Err(self.io_err(e)),
            Err(read::ReadError::Newer(version)) if self.newer.is_none() => {
                drop(file);
                return self.load_beside(version);
            }
            Err(read::ReadError::Newer(version)) => {
                drop(file);
                return Err(self.set_aside(format!(
                    "this agent's own file claims format version {version}"
                )));
            }
            Err(read::ReadError::Corrupt(reason)) => {
                drop(file);
                return Err(self.set_aside(reason));
            }
        };
        let loaded = read.loaded;
        if let Some(torn) = &loaded.torn_tail {
            file.set_len(torn.at)
                .and_then(|()| file.sync_data())
                .map_err(|e| self.io_err(e))?;
        }
        let appendable =
            (loaded.same_boot && loaded.version == format::VERSION).then_some(Appendable {
                file,
                len: read.valid_len,
                base_len: read.base_len,
            });
        Ok(Some((loaded, appendable)))
    }

    /// Moves a bad journal aside and says so.
    fn set_aside(&self, reason: String) -> JournalError {
        let path = self.path();
        let moved_to = self
            .dir
            .join(format!("{}.corrupt-{}", self.file, unix_ms()));
        if let Err(source) = fs::rename(&path, &moved_to) {
            return JournalError::Io { path, source };
        }
        JournalError::Corrupt {
            path,
            reason,
            moved_to,
        }
    }
}
