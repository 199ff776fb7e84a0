//! A journal written by a newer agent, found after a rollback: it is not this agent's to read
//! or to judge, so it stays untouched for the newer agent's return, and this agent journals
//! beside it (`registry.journal.v<VERSION>`, [`format::beside_file`]). The registry starts
//! from that file when there is one (this agent's own changes since the rollback) merged with
//! the pinned maps, which hold every address's enforcement and deadline whatever the journal.

use std::{
    fs,
    io::{self, ErrorKind},
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::{
    super::{format, unix_ms, Entry, JournalError, JOURNAL_FILE},
    Found, Location,
};

/// What the agent says at start about a newer agent's journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewerJournal {
    /// The newer agent's file, untouched.
    pub path: PathBuf,
    /// Its format version.
    pub version: u32,
    /// Where this agent journals meanwhile.
    pub beside: PathBuf,
    /// A file this agent kept beside during an earlier rollback, older than the newer agent's
    /// last write (the newer agent ran since): set aside here, not trusted.
    pub stale_set_aside: Option<PathBuf>,
}

/// When `path` was last written; `None` when there is no such file.
fn modified(path: &Path) -> io::Result<Option<SystemTime>> {
    match fs::symlink_metadata(path) {
        Ok(meta) => meta.modified().map(Some),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Location {
    /// The newer agent's journal this agent found and left alone, if any.
    pub(in crate::journal) fn newer(&self) -> Option<&NewerJournal> {
        self.newer.as_ref()
    }

    /// Switches to the file beside the newer agent's `version` journal and loads it.
    pub(super) fn load_beside<E: Entry>(
        &mut self,
        version: u32,
    ) -> Result<Option<Found<E>>, JournalError> {
        let path = self.dir.join(JOURNAL_FILE);
        self.file = format::beside_file();
        let beside = self.path();
        let io_err = |source| JournalError::Io {
            path: beside.clone(),
            source,
        };
        let newer_written = modified(&path).map_err(io_err)?;
        let beside_written = modified(&beside).map_err(io_err)?;
        let stale_set_aside = match (beside_written, newer_written) {
            (Some(kept), Some(newer)) if kept < newer => {
                let moved_to = self.dir.join(format!("{}.stale-{}", self.file, unix_ms()));
                fs::rename(&beside, &moved_to).map_err(io_err)?;
                Some(moved_to)
            }
            _ => None,
        };
        self.newer = Some(NewerJournal {
            path,
            version,
            beside,
            stale_set_aside,
        });
        self.load_file()
    }
}
