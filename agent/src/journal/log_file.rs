//! The open file commits are appended to: whether it may be appended to, and how what was
//! appended reaches the disk (flushed here, or asked of the pool of flush threads, `syncer`).
//! A flush that fails poisons the file: it is never appended to again, its later reports are
//! ignored, and the next commit rewrites the journal whole.

use std::{
    fs::File,
    io::{self, Write as _},
    sync::Arc,
};

use log::warn;
use tokio::sync::mpsc;

use super::{
    syncer::{SyncFiles, SyncPool, Synced},
    Commit, COMPACT_MIN_BYTES,
};

/// One file as the log: a new one (and a new id) after every rewrite or compaction.
struct LogFile {
    file: File,
    /// Which file this is, as flush reports name it.
    id: u64,
    /// The descriptors the pool flushes it through; `None`: flushed on the loop.
    sync: Option<Arc<SyncFiles>>,
    /// Bytes written (durable once a flush that began after them reported).
    len: u64,
    /// Bytes of the header and base lines: compaction starts once the appended rest outgrows it.
    base_len: u64,
    /// A flush of it failed: never appended to again, its later reports ignored.
    poisoned: bool,
}

/// The log appended to, and the pool its flushes may be left to.
pub(super) struct Log {
    open: Option<LogFile>,
    /// The next commit writes the whole state to a new file: nothing appendable is open (none
    /// yet, another boot's, the old format, set aside), or a failure left the file in doubt.
    rewrite: bool,
    /// Where deferred flushes run; `None`: every flush runs on the caller.
    pool: Option<SyncPool>,
    /// The id the last file installed got.
    last_file_id: u64,
}

impl Log {
    pub(super) fn new() -> Self {
        Self {
            open: None,
            rewrite: true,
            pool: None,
            last_file_id: 0,
        }
    }

    /// From now on a deferred flush is left to a pool of threads, whose reports go to
    /// `reports`. Without the pool (it could not start) every flush runs on the caller.
    pub(super) fn defer_syncs(&mut self, reports: mpsc::Sender<Synced>) {
        match SyncPool::start(reports) {
            Ok(pool) => self.pool = Some(pool),
            Err(e) => {
                warn!("journal: starting the flush threads: {e}; flushing on the owner loop");
                return;
            }
        }
        // The file already open was flushed on the loop until now: whatever its descriptor has
        // still to report is seen here, before descriptors that would not see it are opened.
        if let Some(log) = self.open.take() {
            match log.file.sync_data() {
                Ok(()) => self.install(log.file, log.len, log.base_len),
                Err(e) => {
                    warn!("journal: flushing before the flush threads start: {e}; rewriting it");
                    self.rewrite = true;
                    self.open = Some(log);
                }
            }
        }
    }

    /// `file` as the log appended to from now on (a compaction put in place: whether it may be
    /// appended to stays as it was), with descriptors for the pool to flush it through (opened
    /// now, before anything is appended: they see every later error).
    pub(super) fn install(&mut self, file: File, len: u64, base_len: u64) {
        self.last_file_id += 1;
        let id = self.last_file_id;
        let sync = self
            .pool
            .as_ref()
            .and_then(|_| match SyncFiles::open(&file, id) {
                Ok(files) => Some(Arc::new(files)),
                Err(e) => {
                    warn!("journal: opening its file to flush it from the pool: {e}; flushing on the loop");
                    None
                }
            });
        self.open = Some(LogFile {
            file,
            id,
            sync,
            len,
            base_len,
            poisoned: false,
        });
    }

    /// `file`, which holds everything and is durable, as the log, appended to from now on.
    pub(super) fn start(&mut self, file: File, len: u64, base_len: u64) {
        self.install(file, len, base_len);
        self.rewrite = false;
    }

    /// No log until one is loaded or written.
    pub(super) fn close(&mut self) {
        self.open = None;
        self.rewrite = true;
    }

    /// Whether the next commit must write the whole state to a new file.
    pub(super) fn needs_rewrite(&self) -> bool {
        self.rewrite || self.open.is_none()
    }

    /// Makes the next commit rewrite the whole journal.
    pub(super) fn invalidate(&mut self) {
        self.rewrite = true;
    }

    /// Appends `line`. On `Err` what may have reached the file is taken back; if even that
    /// fails, the file is in doubt and the next commit rewrites it whole.
    pub(super) fn append(&mut self, line: &[u8]) -> io::Result<()> {
        let log = self.open.as_mut().expect("appended only to an open log");
        if let Err(e) = log.file.write_all(line) {
            if log.file.set_len(log.len).is_err() {
                self.rewrite = true;
            }
            return Err(e);
        }
        log.len += line.len() as u64;
        Ok(())
    }

    /// The lines appended outgrew the base: time for a compaction.
    pub(super) fn outgrown(&self) -> bool {
        self.open.as_ref().is_some_and(|log| {
            let appended = log.len - log.base_len;
            appended > COMPACT_MIN_BYTES.max(log.base_len)
        })
    }

    /// Makes everything appended up to commit `ticket` durable: `Syncing` when the pool was
    /// asked (`defer`), `Durable` when the file was flushed here. A failed flush poisons the
    /// file.
    pub(super) fn flush(&mut self, ticket: u64, defer: bool) -> io::Result<Commit> {
        let log = self.open.as_mut().expect("a commit was written to it");
        if defer {
            if let (Some(pool), Some(files)) = (&self.pool, &log.sync) {
                if pool.flush(ticket, files.clone()) {
                    return Ok(Commit::Syncing(ticket));
                }
            }
        }
        if let Err(e) = log.file.sync_data() {
            // See `on_synced`: this file is never appended to again.
            log.poisoned = true;
            self.rewrite = true;
            return Err(e);
        }
        Ok(Commit::Durable)
    }

    /// A flush's report: `Some(Ok(ticket))`, every commit up to it is durable; `Some(Err)`,
    /// the flush failed and the file is poisoned; `None`, a file no longer appended to
    /// (replaced, or already failed).
    pub(super) fn on_synced(&mut self, synced: Synced) -> Option<io::Result<u64>> {
        let log = self
            .open
            .as_mut()
            .filter(|log| log.id == synced.file_id && !log.poisoned)?;
        match synced.result {
            Ok(()) => Some(Ok(synced.ticket)),
            Err(e) => {
                // After a failed fsync the fate of the written pages is unknown, whatever a
                // later fsync says: never append to this file again.
                log.poisoned = true;
                self.rewrite = true;
                Some(Err(e))
            }
        }
    }

    /// The size of the log file as written (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> u64 {
        self.open.as_ref().map_or(0, |log| log.len)
    }

    /// The id flush reports name the open file by (for tests).
    #[cfg(test)]
    pub(super) fn file_id(&self) -> Option<u64> {
        self.open.as_ref().map(|log| log.id)
    }
}
