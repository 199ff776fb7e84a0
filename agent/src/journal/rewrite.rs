//! Replacing the journal file as a whole: a rewrite on the owner loop (at start, after a
//! failure, after a reboot) and a background compaction put in place once finished. After
//! either fails, neither is tried again before [`RETRY_AFTER`] on the injected clock: a full
//! disk is not rewritten on every loop iteration.

use std::{
    fs,
    io::{self, Write as _},
    sync::Arc,
};

use log::warn;

use super::{
    compact::{write_base, Compaction},
    files,
    location::Location,
    log_file::Log,
    Contents, Entry, JournalError, COMPACT_FILE, RETRY_AFTER, REWRITE_FILE,
};
use crate::{
    heap::release_freed_memory,
    registry::{duration_ns, Clock, MonoNs},
};

/// The running compaction, if any, and the retry timer of rewrites and compactions.
pub(super) struct Rewrites {
    compaction: Option<Compaction>,
    /// No rewrite or compaction is attempted before this, after one failed.
    retry_at: Option<MonoNs>,
    /// What `retry_at` is read against: the system's monotonic clock, a fake one in tests.
    clock: Arc<dyn Clock + Send + Sync>,
    last_failure: Option<String>,
}

impl Rewrites {
    pub(super) fn new(clock: Arc<dyn Clock + Send + Sync>) -> Self {
        Self {
            compaction: None,
            retry_at: None,
            clock,
            last_failure: None,
        }
    }

    /// Reads the retry timer against `clock` from now on.
    pub(super) fn set_clock(&mut self, clock: Arc<dyn Clock + Send + Sync>) {
        self.clock = clock;
    }

    fn may_retry(&self) -> bool {
        self.retry_at.is_none_or(|at| self.clock.now() >= at)
    }

    fn failed(&mut self, what: &str, e: &io::Error) {
        self.retry_at = Some(self.clock.now().saturating_add(duration_ns(RETRY_AFTER)));
        self.last_failure = Some(format!("{what}: {e}"));
    }

    /// Writes the whole of `state` to a new file and puts it in place, durably, as the `log`.
    pub(super) fn rewrite_all<E: Entry>(
        &mut self,
        location: &Location,
        log: &mut Log,
        state: &impl Contents<E>,
    ) -> Result<(), JournalError> {
        if !self.may_retry() {
            let last = self.last_failure.clone().unwrap_or_default();
            return Err(location.io_err(io::Error::other(format!(
                "{last} (retried at most once a second)"
            ))));
        }
        if let Some(compaction) = self.compaction.take() {
            // Its base is older than what this rewrite writes.
            compaction.abandon(&location.dir().join(COMPACT_FILE));
        }
        let tmp = location.dir().join(REWRITE_FILE);
        let result = files::remove_leftover(&tmp)
            .and_then(|()| write_base(&tmp, &state.all()))
            .and_then(|(file, len)| {
                fs::rename(&tmp, location.path())?;
                files::sync_dir(location.dir())?;
                Ok((file, len))
            });
        match result {
            Ok((file, len)) => {
                log.start(file, len, len);
                self.retry_at = None;
                release_freed_memory();
                Ok(())
            }
            Err(e) => {
                let _ = files::remove_leftover(&tmp);
                self.failed("rewriting", &e);
                Err(location.io_err(e))
            }
        }
    }

    /// A batch `line` was appended to the log: kept for the running compaction's file, or, when
    /// the log `outgrown` its base, a compaction of `state` is started.
    pub(super) fn appended<E: Entry>(
        &mut self,
        location: &Location,
        line: Vec<u8>,
        outgrown: bool,
        state: &impl Contents<E>,
    ) {
        if let Some(compaction) = self.compaction.as_mut() {
            compaction.pending.push(line);
        } else if outgrown && self.may_retry() {
            match Compaction::start(location.dir().join(COMPACT_FILE), state.all()) {
                Ok(compaction) => self.compaction = Some(compaction),
                Err(e) => {
                    warn!("journal: starting a compaction: {e}");
                    self.failed("compacting", &e);
                }
            }
        }
    }

    /// Puts a finished compaction in place as the `log`: appends the batches committed while it
    /// ran, then renames it over the journal. A failure keeps the current journal (still whole).
    /// `true` when the new file is in place, durably: it holds every commit so far, flushed.
    pub(super) fn finish_compaction(&mut self, location: &Location, log: &mut Log) -> bool {
        if !self
            .compaction
            .as_ref()
            .is_some_and(Compaction::is_finished)
        {
            return false;
        }
        let Some(compaction) = self.compaction.take() else {
            return false;
        };
        let tmp = location.dir().join(COMPACT_FILE);
        let pending = compaction.pending.concat();
        let (mut file, base_len) = match compaction.join() {
            Ok(done) => done,
            Err(e) => {
                let _ = files::remove_leftover(&tmp);
                warn!("journal: compaction failed, the journal grows until the next: {e}");
                self.failed("compacting", &e);
                return false;
            }
        };
        let appended = file
            .write_all(&pending)
            .and_then(|()| file.sync_data())
            .and_then(|()| fs::rename(&tmp, location.path()));
        if let Err(e) = appended {
            let _ = files::remove_leftover(&tmp);
            warn!("journal: finishing a compaction failed, the journal grows until the next: {e}");
            self.failed("compacting", &e);
            return false;
        }
        log.install(file, base_len + pending.len() as u64, base_len);
        release_freed_memory();
        if let Err(e) = files::sync_dir(location.dir()) {
            // The rename may not survive a crash, and what is appended next would go with it.
            warn!(
                "journal: syncing {} after a compaction: {e}",
                location.dir().display()
            );
            log.invalidate();
            self.failed("compacting", &e);
            return false;
        }
        true
    }

    /// Waits for a running compaction and puts it in place (see
    /// [`Rewrites::finish_compaction`]).
    pub(super) fn settle(&mut self, location: &Location, log: &mut Log) -> bool {
        if let Some(compaction) = self.compaction.as_mut() {
            compaction.wait();
        }
        self.finish_compaction(location, log)
    }

    /// Whether a compaction is running (for tests).
    #[cfg(test)]
    pub(super) fn compacting(&self) -> bool {
        self.compaction.is_some()
    }
}
