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
//! carried across a reboot as if the last write were the agent's start, never by the wall
//! clock, which can step ([`Loaded::same_boot`]); the first commit after such a load rewrites
//! the file for this boot.
//!
//! [`Journal`] composes parts that each own one concern and its state:
//! - `location::Location`: the state directory, the file in it this agent journals to,
//!   loading it and setting a bad one aside;
//! - `staged::Staged`: the keys changed and not yet written, and their batch line;
//! - `log_file::Log`: the file appended to, and its flushes (here or in the pool);
//! - `tickets::Tickets`: which commits are durable;
//! - `rewrite::Rewrites`: rewrites and compactions, and their retry timer on an injectable
//!   clock.

mod compact;
mod files;
mod format;
mod location;
mod log_file;
mod read;
mod rewrite;
mod staged;
mod syncer;
#[cfg(test)]
mod tests;
mod tickets;

use std::{
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;
use tokio::sync::mpsc;

use self::{
    location::{Appendable, Location},
    log_file::Log,
    rewrite::Rewrites,
    staged::Staged,
    tickets::Tickets,
};
use crate::registry::{AddrRecord, Clock, Registry, SystemClock};

pub use self::{
    format::VERSION,
    location::NewerJournal,
    read::TornTail,
    syncer::{Synced, REPORT_QUEUE},
    tickets::{Commit, SyncOutcome},
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
    /// The clocks at the latest write: monotonic ns and Unix ms (the latter for the record:
    /// recovery does not carry deadlines by it).
    pub written_mono_ns: u64,
    pub written_unix_ms: u64,
    /// The format version read (1: the earlier full-snapshot format, rewritten on commit).
    pub version: u32,
    /// A line cut short at the end, dropped.
    pub torn_tail: Option<TornTail>,
}

/// The registry's durable copy: the composition of its parts, each owning its state.
pub struct Journal<E: Entry = AddrRecord> {
    /// Where the file is, and loading it.
    location: Location,
    /// The file appended to, and how its appends are flushed.
    log: Log,
    /// Which commits are durable.
    tickets: Tickets,
    /// Keys changed and not yet written (a failed commit keeps them here).
    staged: Staged<E>,
    /// Whole-file replacements (rewrites, compactions) and their retry timer.
    rewrites: Rewrites,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The kernel's id of this boot: monotonic clocks restart with it.
pub fn boot_id() -> Option<String> {
    crate::kernel_clock::boot_id()
}

fn invalid_data(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl<E: Entry> Journal<E> {
    /// Opens (creating, mode 0700) the state directory.
    pub fn open(state_dir: &Path) -> Result<Self, JournalError> {
        Ok(Self {
            location: Location::open(state_dir)?,
            log: Log::new(),
            tickets: Tickets::default(),
            staged: Staged::new(),
            rewrites: Rewrites::new(Arc::new(SystemClock)),
        })
    }

    /// The journal with its retry timer read against `clock` (a test's fake clock).
    pub fn with_clock(mut self, clock: impl Clock + Send + Sync + 'static) -> Self {
        self.rewrites.set_clock(Arc::new(clock));
        self
    }

    /// The file this agent journals to (see [`Journal::newer`]).
    pub fn path(&self) -> PathBuf {
        self.location.path()
    }

    /// The newer agent's journal this agent found and left alone, if any.
    pub fn newer(&self) -> Option<&NewerJournal> {
        self.location.newer()
    }

    /// The journal's content; `None` when there is none yet. A torn tail is truncated (and
    /// reported in [`Loaded::torn_tail`]); a corrupt journal is moved aside
    /// ([`JournalError::Corrupt`]). Either way the next commit knows what to write. A newer
    /// agent's journal is left untouched, and this agent's file beside it is loaded instead
    /// ([`Journal::newer`]).
    pub fn load(&mut self) -> Result<Option<Loaded<E>>, JournalError> {
        self.log.close();
        let Some((loaded, appendable)) = self.location.load()? else {
            return Ok(None);
        };
        if let Some(Appendable {
            file,
            len,
            base_len,
        }) = appendable
        {
            self.log.start(file, len, base_len);
        }
        Ok(Some(loaded))
    }

    /// Makes the next commit rewrite the whole journal: the state no longer follows from it
    /// (e.g. a recovery that could not use what it loaded).
    pub fn invalidate(&mut self) {
        self.log.invalidate();
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

    /// From now on [`Journal::commit_deferred`] leaves its flush to a pool of threads, whose
    /// reports go to `reports` (to be handed to [`Journal::on_synced`]). Without the pool (it
    /// could not start) every commit flushes on the caller, as before.
    pub fn defer_syncs(&mut self, reports: mpsc::Sender<Synced>) {
        self.log.defer_syncs(reports);
    }

    /// Like [`Journal::commit`], but the flush is left to the pool: `Syncing(ticket)` until
    /// [`Journal::on_synced`] says so. `Durable` when nothing is waiting (nothing to write and
    /// nothing unflushed, or a rewrite that flushed everything here).
    pub fn commit_deferred(
        &mut self,
        state: &mut impl Contents<E>,
    ) -> Result<Commit, JournalError> {
        self.commit_as(state, true)
    }

    /// A flush's report: which commits it made durable, or that they are not.
    pub fn on_synced(&mut self, synced: Synced) -> SyncOutcome {
        match self.log.on_synced(synced) {
            None => SyncOutcome::Stale,
            Some(Ok(ticket)) => SyncOutcome::DurableThrough(self.tickets.durable_through(ticket)),
            Some(Err(e)) => SyncOutcome::Failed(self.location.io_err(e)),
        }
    }

    /// Commits waiting for a flush.
    pub fn unflushed(&self) -> u64 {
        self.tickets.unflushed()
    }

    /// Waits for a running compaction and puts it in place (for shutdown and tests).
    pub fn settle(&mut self) {
        if self.rewrites.settle(&self.location, &mut self.log) {
            self.tickets.all_durable();
        }
    }

    /// Writes what changed (a line appended, or the whole state to a new file), then makes it
    /// durable: flushed here, or (`defer`) asked of the pool when there is one.
    fn commit_as(
        &mut self,
        state: &mut impl Contents<E>,
        defer: bool,
    ) -> Result<Commit, JournalError> {
        self.staged.extend(state.take_changed());
        if self
            .rewrites
            .finish_compaction(&self.location, &mut self.log)
        {
            self.tickets.all_durable();
        }
        if self.log.needs_rewrite() {
            self.log.invalidate();
            self.rewrites
                .rewrite_all(&self.location, &mut self.log, state)?;
            self.staged.clear();
            self.tickets.all_durable();
            return Ok(Commit::Durable);
        }
        if !self.staged.is_empty() {
            let line = self
                .staged
                .line(state)
                .map_err(|e| self.location.io_err(e))?;
            self.log
                .append(&line)
                .map_err(|e| self.location.io_err(e))?;
            self.staged.clear();
            self.tickets.issue();
            let outgrown = self.log.outgrown();
            self.rewrites
                .appended(&self.location, line, outgrown, state);
        }
        let Some(ticket) = self.tickets.waiting() else {
            return Ok(Commit::Durable);
        };
        let flushed = self
            .log
            .flush(ticket, defer)
            .map_err(|e| self.location.io_err(e))?;
        if flushed == Commit::Durable {
            self.tickets.durable_through(ticket);
        }
        Ok(flushed)
    }
}
