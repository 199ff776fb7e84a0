//! The registry's durable copy in `state_dir`: an append-only log of changed records, compacted
//! from time to time, with group commit.
//!
//! - [`Journal::commit`] appends one line holding every record changed since the last commit
//!   (a whole burst of API requests, netlink events, samples) and fdatasyncs once: one fsync per
//!   batch, O(changes) bytes. The caller answers the batch's requests only after it returned
//!   `Ok`; an `Err` leaves the changes staged, to be written by the next commit.
//!   [`Journal::commit_deferred`] writes the same line and leaves the fdatasync to a pool of
//!   threads (`syncer`): the owner loop goes on serving while the disk flushes, and answers the
//!   batch when [`Journal::on_synced`] says a flush covering it reported.
//! - When the appended lines outgrow the base, a compaction writes the whole registry to a new
//!   file on a background thread, while commits go on appending to the current one; the next
//!   commit after it finished appends what came meanwhile, renames it over the journal and
//!   fsyncs the directory. O(n), but rarely and off the owner loop.
//! - [`Journal::load`] replays the log. A torn tail (a line cut short by a crash or power loss:
//!   a write never acknowledged) is truncated and reported; any other damage sets the file
//!   aside (never deleted: it is evidence) and is reported, and the caller rebuilds from the
//!   pinned maps and netlink. A journal of the earlier full-snapshot format is read and
//!   rewritten in the current one.
//!
//! Each file belongs to one boot: its header names the boot id, and monotonic stamps are
//! carried across a reboot by wall-clock time ([`Loaded::same_boot`]); the first commit after
//! such a load rewrites the file for this boot.

mod compact;
mod deferred;
mod files;
mod format;
mod newer;
mod read;
mod rewrite;
mod syncer;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeSet,
    fs::{self, File},
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;

use self::{
    compact::Compaction,
    format::{frame, Line},
};
use crate::{
    netdev,
    registry::{duration_ns, AddrRecord, Clock, MonoNs, Registry, SystemClock},
};

pub use self::{
    deferred::{Commit, SyncOutcome},
    format::VERSION,
    newer::NewerJournal,
    read::TornTail,
    syncer::{Synced, REPORT_QUEUE},
};

pub const JOURNAL_FILE: &str = "registry.journal";
/// Where a synchronous rewrite builds the next journal.
const REWRITE_FILE: &str = "registry.journal.tmp";
/// Where a background compaction builds the next journal.
const COMPACT_FILE: &str = "registry.journal.compact";
/// Appended bytes below which no compaction starts, whatever the base's size.
const COMPACT_MIN_BYTES: u64 = 1 << 20;
/// After a failed rewrite or compaction, how long before the next attempt: a full disk is not
/// rewritten on every loop iteration.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("state_dir: {0}")]
    Dir(#[from] ipq_fs::safe_fs::DirError),
    #[error("journal {path} is corrupt ({reason}); moved to {moved_to}")]
    Corrupt {
        path: PathBuf,
        reason: String,
        moved_to: PathBuf,
    },
}

/// What the journal stores: records with a key.
pub trait Entry: Serialize + DeserializeOwned + Clone + Send + 'static {
    type Key: Ord + Clone + Serialize + DeserializeOwned + Send + 'static;
    fn key(&self) -> Self::Key;
}

/// The live state the journal copies: which keys changed, and their records now.
pub trait Contents<E: Entry> {
    /// The keys changed since the last call (each at least once), forgetting them.
    fn take_changed(&mut self) -> Vec<E::Key>;
    /// The record of `key`; `None` when it went.
    fn get(&self, key: &E::Key) -> Option<&E>;
    /// Every record (for a rewrite or a compaction).
    fn all(&self) -> Vec<E>;
}

impl Entry for AddrRecord {
    type Key = IpAddr;
    fn key(&self) -> IpAddr {
        self.addr
    }
}

impl<C: Clock> Contents<AddrRecord> for Registry<C> {
    fn take_changed(&mut self) -> Vec<IpAddr> {
        self.changes_mut().take_changed()
    }
    fn get(&self, key: &IpAddr) -> Option<&AddrRecord> {
        self.records().get(*key)
    }
    fn all(&self) -> Vec<AddrRecord> {
        self.records().iter().cloned().collect()
    }
}

/// A journal as loaded, with what is needed to carry its monotonic deadlines across a reboot.
#[derive(Debug)]
pub struct Loaded<E> {
    /// Every record, in key order.
    pub records: Vec<E>,
    /// Written during this boot: its monotonic stamps compare with the clock directly.
    pub same_boot: bool,
    /// The clocks at the latest write: monotonic ns and Unix ms.
    pub written_mono_ns: u64,
    pub written_unix_ms: u64,
    /// The format version read (1: the earlier full-snapshot format, rewritten on commit).
    pub version: u32,
    /// A line cut short at the end, dropped.
    pub torn_tail: Option<TornTail>,
}

/// The open log being appended to.
struct LogFile {
    file: File,
    /// Which file this is, as flush reports name it (a new one after a rewrite or compaction).
    id: u64,
    /// The descriptors the pool flushes it through; `None`: flushed on the loop.
    sync: Option<std::sync::Arc<syncer::SyncFiles>>,
    /// Bytes written (durable once a flush that began after them reported).
    len: u64,
    /// Bytes of the header and base lines: compaction starts once the appended rest outgrows it.
    base_len: u64,
}

pub struct Journal<E: Entry = AddrRecord> {
    dir: PathBuf,
    /// The file journaled to: [`JOURNAL_FILE`], or the one beside a newer agent's journal.
    file: String,
    /// A newer agent's journal found at the last load, left untouched.
    newer: Option<NewerJournal>,
    log: Option<LogFile>,
    /// Keys changed and not yet durable (a failed commit keeps them here).
    staged: BTreeSet<E::Key>,
    /// The next commit writes the whole state to a new file: nothing appendable is open (none
    /// yet, another boot's, the old format, set aside), or a failure left the file in doubt.
    rewrite: bool,
    compaction: Option<Compaction>,
    /// No rewrite or compaction is attempted before this, after one failed.
    retry_at: Option<MonoNs>,
    /// What `retry_at` is read against: the system's monotonic clock, a fake one in tests.
    clock: Arc<dyn Clock + Send + Sync>,
    last_failure: Option<String>,
    /// Where deferred commits are flushed; `None`: every commit flushes on the caller.
    syncer: Option<syncer::SyncPool>,
    /// The id the next log file gets.
    next_file_id: u64,
    /// The last commit's ticket, and the last one known durable.
    last_ticket: u64,
    durable_through: u64,
    /// A log file a flush of which failed: never appended to again, its later reports ignored.
    poisoned: Option<u64>,
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

fn invalid_data(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl<E: Entry> Journal<E> {
    /// Opens (creating, mode 0700) the state directory.
    pub fn open(state_dir: &Path) -> Result<Self, JournalError> {
        ipq_fs::safe_fs::ensure_private_dir(state_dir)?;
        Ok(Self {
            dir: state_dir.to_owned(),
            file: JOURNAL_FILE.to_owned(),
            newer: None,
            log: None,
            staged: BTreeSet::new(),
            rewrite: true,
            compaction: None,
            retry_at: None,
            clock: Arc::new(SystemClock),
            last_failure: None,
            syncer: None,
            next_file_id: 0,
            last_ticket: 0,
            durable_through: 0,
            poisoned: None,
        })
    }

    /// The journal with its retry timer read against `clock` (a test's fake clock).
    pub fn with_clock(mut self, clock: impl Clock + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The file this agent journals to (see [`Journal::newer`]).
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file)
    }

    fn io_err(&self, source: io::Error) -> JournalError {
        JournalError::Io {
            path: self.path(),
            source,
        }
    }

    /// The journal's content; `None` when there is none yet. A torn tail is truncated (and
    /// reported in [`Loaded::torn_tail`]); a corrupt journal is moved aside
    /// ([`JournalError::Corrupt`]). Either way the next commit knows what to write. A newer
    /// agent's journal is left untouched, and this agent's file beside it is loaded instead
    /// ([`Journal::newer`]).
    pub fn load(&mut self) -> Result<Option<Loaded<E>>, JournalError> {
        self.file = JOURNAL_FILE.to_owned();
        self.newer = None;
        self.load_file()
    }

    fn load_file(&mut self) -> Result<Option<Loaded<E>>, JournalError> {
        self.log = None;
        self.rewrite = true;
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
        if loaded.same_boot && loaded.version == format::VERSION {
            self.log = Some(self.log_file(file, read.valid_len, read.base_len));
            self.rewrite = false;
        }
        Ok(Some(loaded))
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

    /// Makes the next commit rewrite the whole journal: the state no longer follows from it
    /// (e.g. a recovery that could not use what it loaded).
    pub fn invalidate(&mut self) {
        self.rewrite = true;
    }

    /// Also writes `keys` at the next commit (records a recovery changed without the registry
    /// knowing, e.g. adopted from the maps).
    pub fn stage(&mut self, keys: impl IntoIterator<Item = E::Key>) {
        self.staged.extend(keys);
    }

    /// Makes every change of `state` durable: one appended line and one fdatasync for all of
    /// them (nothing when nothing changed). On `Err` nothing of it may be reported as saved; the
    /// changes stay staged and the next commit writes them.
    pub fn commit(&mut self, state: &mut impl Contents<E>) -> Result<(), JournalError> {
        self.commit_as(state, false).map(|_| ())
    }

    fn batch_line(&self, state: &impl Contents<E>) -> io::Result<Vec<u8>> {
        let mut put = Vec::new();
        let mut del = Vec::new();
        for key in &self.staged {
            match state.get(key) {
                Some(record) => put.push(record),
                None => del.push(key),
            }
        }
        let json = serde_json::to_vec(&Line {
            m: Some(netdev::monotonic_ns()),
            u: Some(unix_ms()),
            put,
            del,
        })
        .map_err(invalid_data)?;
        let mut line = Vec::with_capacity(json.len() + 18);
        frame(&json, &mut line);
        Ok(line)
    }

    fn may_retry(&self) -> bool {
        self.retry_at.is_none_or(|at| self.clock.now() >= at)
    }

    fn failed(&mut self, what: &str, e: &io::Error) {
        self.retry_at = Some(self.clock.now().saturating_add(duration_ns(RETRY_AFTER)));
        self.last_failure = Some(format!("{what}: {e}"));
    }

    /// The size of the journal file as written (for tests and metrics).
    pub fn len(&self) -> u64 {
        self.log.as_ref().map_or(0, |log| log.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
