//! Replacing the journal file as a whole: a rewrite on the owner loop (at start, after a
//! failure, after a reboot) and a background compaction put in place once finished.

use std::{
    fs,
    io::{self, Write as _},
};

use log::warn;

use super::{
    compact::{write_base, Compaction},
    files, Contents, Entry, Journal, JournalError, COMPACT_FILE, REWRITE_FILE,
};
use crate::heap::release_freed_memory;

impl<E: Entry> Journal<E> {
    /// Writes the whole state to a new file and puts it in place, durably.
    pub(super) fn rewrite_all(&mut self, state: &impl Contents<E>) -> Result<(), JournalError> {
        if !self.may_retry() {
            let last = self.last_failure.clone().unwrap_or_default();
            return Err(self.io_err(io::Error::other(format!(
                "{last} (retried at most once a second)"
            ))));
        }
        if let Some(compaction) = self.compaction.take() {
            // Its base is older than what this rewrite writes.
            compaction.abandon(&self.dir.join(COMPACT_FILE));
        }
        let tmp = self.dir.join(REWRITE_FILE);
        let result = files::remove_leftover(&tmp)
            .and_then(|()| write_base(&tmp, &state.all()))
            .and_then(|(file, len)| {
                fs::rename(&tmp, self.path())?;
                files::sync_dir(&self.dir)?;
                Ok((file, len))
            });
        match result {
            Ok((file, len)) => {
                self.log = Some(self.log_file(file, len, len));
                self.rewrite = false;
                self.staged.clear();
                self.retry_at = None;
                release_freed_memory();
                Ok(())
            }
            Err(e) => {
                let _ = files::remove_leftover(&tmp);
                self.failed("rewriting", &e);
                Err(self.io_err(e))
            }
        }
    }

    pub(super) fn start_compaction(&mut self, records: Vec<E>) {
        match Compaction::start(self.dir.join(COMPACT_FILE), records) {
            Ok(compaction) => self.compaction = Some(compaction),
            Err(e) => {
                warn!("journal: starting a compaction: {e}");
                self.failed("compacting", &e);
            }
        }
    }

    /// Puts a finished compaction in place: appends the batches committed while it ran, then
    /// renames it over the journal. A failure keeps the current journal (still whole). `true`
    /// when the new file is in place, durably: it holds every commit so far, flushed.
    pub(super) fn finish_compaction(&mut self) -> bool {
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
        let tmp = self.dir.join(COMPACT_FILE);
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
            .and_then(|()| fs::rename(&tmp, self.path()));
        if let Err(e) = appended {
            let _ = files::remove_leftover(&tmp);
            warn!("journal: finishing a compaction failed, the journal grows until the next: {e}");
            self.failed("compacting", &e);
            return false;
        }
        self.log = Some(self.log_file(file, base_len + pending.len() as u64, base_len));
        release_freed_memory();
        if let Err(e) = files::sync_dir(&self.dir) {
            // The rename may not survive a crash, and what is appended next would go with it.
            warn!(
                "journal: syncing {} after a compaction: {e}",
                self.dir.display()
            );
            self.rewrite = true;
            self.failed("compacting", &e);
            return false;
        }
        true
    }

    /// Waits for a running compaction and puts it in place (for shutdown and tests).
    pub fn settle(&mut self) {
        if let Some(compaction) = self.compaction.as_mut() {
            compaction.wait();
        }
        if self.finish_compaction() {
            self.durable_through = self.last_ticket;
        }
    }
}
