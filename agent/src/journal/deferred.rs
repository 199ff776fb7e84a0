//! Commits whose flush runs off the caller's thread, and the bookkeeping that says which of
//! them are durable: every commit gets a ticket; a flush that reports success makes every
//! commit up to its ticket durable (it began after their writes, and flushes the whole file);
//! a rewrite or a compaction put in place makes everything durable (the new file holds it all,
//! flushed). A flush that fails poisons its file: the next commit rewrites the journal whole,
//! and the file's later reports are ignored.

use std::{fs::File, io::Write as _, sync::Arc};

use log::warn;
use tokio::sync::mpsc;

use super::{
    syncer::{SyncFiles, SyncPool, Synced},
    Contents, Entry, Journal, JournalError, LogFile, COMPACT_MIN_BYTES,
};

/// Where a commit stands once written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Everything committed so far is durable.
    Durable,
    /// Written; durable once [`Journal::on_synced`] reports this ticket or a later one.
    Syncing(u64),
}

/// What a flush's report means for the commits waiting on it.
#[derive(Debug)]
pub enum SyncOutcome {
    /// Every commit up to this ticket is durable.
    DurableThrough(u64),
    /// Nothing written since the last durable ticket can be called durable; the next commit
    /// rewrites the journal.
    Failed(JournalError),
    /// A file the journal no longer appends to (replaced, or already failed): nothing changes.
    Stale,
}

impl<E: Entry> Journal<E> {
    /// From now on [`Journal::commit_deferred`] leaves its flush to a pool of threads, whose
    /// reports go to `reports` (to be handed to [`Journal::on_synced`]). Without the pool (it
    /// could not start) every commit flushes on the caller, as before.
    pub fn defer_syncs(&mut self, reports: mpsc::Sender<Synced>) {
        match SyncPool::start(reports) {
            Ok(pool) => self.syncer = Some(pool),
            Err(e) => {
                warn!("journal: starting the flush threads: {e}; flushing on the owner loop");
                return;
            }
        }
        // The file already open was flushed on the loop until now: whatever its descriptor has
        // still to report is seen here, before descriptors that would not see it are opened.
        if let Some(log) = self.log.take() {
            match log.file.sync_data() {
                Ok(()) => self.log = Some(self.log_file(log.file, log.len, log.base_len)),
                Err(e) => {
                    warn!("journal: flushing before the flush threads start: {e}; rewriting it");
                    self.rewrite = true;
                    self.log = Some(log);
                }
            }
        }
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
        let current = self.log.as_ref().map(|log| log.id);
        if current != Some(synced.file_id) || self.poisoned == Some(synced.file_id) {
            return SyncOutcome::Stale;
        }
        match synced.result {
            Ok(()) => {
                self.durable_through = self.durable_through.max(synced.ticket);
                SyncOutcome::DurableThrough(self.durable_through)
            }
            Err(e) => {
                // After a failed fsync the fate of the written pages is unknown, whatever a
                // later fsync says: never append to this file again.
                self.poisoned = Some(synced.file_id);
                self.rewrite = true;
                SyncOutcome::Failed(self.io_err(e))
            }
        }
    }

    /// Commits waiting for a flush.
    pub fn unflushed(&self) -> u64 {
        self.last_ticket - self.durable_through
    }

    pub(super) fn commit_as(
        &mut self,
        state: &mut impl Contents<E>,
        defer: bool,
    ) -> Result<Commit, JournalError> {
        self.staged.extend(state.take_changed());
        if self.finish_compaction() {
            self.all_durable();
        }
        if self.rewrite || self.log.is_none() {
            self.rewrite = true;
            self.rewrite_all(state)?;
            self.all_durable();
            return Ok(Commit::Durable);
        }
        if self.staged.is_empty() {
            return self.flush(defer);
        }
        let line = self.batch_line(state).map_err(|e| self.io_err(e))?;
        let log = self.log.as_mut().expect("checked above");
        if let Err(e) = log.file.write_all(&line) {
            // Take back what may have reached the file; if even that fails, the file is in
            // doubt: rewrite it whole next time.
            if log.file.set_len(log.len).is_err() {
                self.rewrite = true;
            }
            return Err(self.io_err(e));
        }
        log.len += line.len() as u64;
        let appended = log.len - log.base_len;
        let base_len = log.base_len;
        self.staged.clear();
        self.last_ticket += 1;
        if let Some(compaction) = self.compaction.as_mut() {
            compaction.pending.push(line);
        } else if appended > COMPACT_MIN_BYTES.max(base_len) && self.may_retry() {
            self.start_compaction(state.all());
        }
        self.flush(defer)
    }

    /// Makes what was written durable: the pool is asked (deferred), or the file flushed here.
    fn flush(&mut self, defer: bool) -> Result<Commit, JournalError> {
        if self.durable_through >= self.last_ticket {
            return Ok(Commit::Durable);
        }
        let ticket = self.last_ticket;
        let log = self.log.as_ref().expect("a commit was written to it");
        if defer {
            if let (Some(pool), Some(files)) = (&self.syncer, &log.sync) {
                if pool.flush(ticket, files.clone()) {
                    return Ok(Commit::Syncing(ticket));
                }
            }
        }
        if let Err(e) = log.file.sync_data() {
            // See `on_synced`: this file is never appended to again.
            self.poisoned = Some(log.id);
            self.rewrite = true;
            return Err(self.io_err(e));
        }
        self.durable_through = ticket;
        Ok(Commit::Durable)
    }

    /// The journal file was replaced by one holding everything, flushed.
    fn all_durable(&mut self) {
        self.durable_through = self.last_ticket;
    }

    /// `file` as the log appended to from now on, with descriptors for the pool to flush it
    /// through (opened now, before anything is appended: they see every later error).
    pub(super) fn log_file(&mut self, file: File, len: u64, base_len: u64) -> LogFile {
        self.next_file_id += 1;
        let id = self.next_file_id;
        let sync = self
            .syncer
            .as_ref()
            .and_then(|_| match SyncFiles::open(&file, id) {
                Ok(files) => Some(Arc::new(files)),
                Err(e) => {
                    warn!("journal: opening its file to flush it from the pool: {e}; flushing on the loop");
                    None
                }
            });
        LogFile {
            file,
            id,
            sync,
            len,
            base_len,
        }
    }
}
