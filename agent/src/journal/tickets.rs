//! Which commits are durable. Every commit that appends gets a ticket; a flush that reports
//! success makes every commit up to its ticket durable (it began after their writes, and
//! flushes the whole file); a rewrite or a compaction put in place makes everything durable
//! (the new file holds it all, flushed). A commit whose flush is left to the pool is answered
//! when [`Journal::on_synced`](super::Journal::on_synced) says a flush covering it reported.

use super::JournalError;

/// Where a commit stands once written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Everything committed so far is durable.
    Durable,
    /// Written; durable once [`Journal::on_synced`](super::Journal::on_synced) reports this
    /// ticket or a later one.
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

/// The commits' tickets: the last one given, and the last one known durable.
#[derive(Debug, Default)]
pub(super) struct Tickets {
    last: u64,
    durable_through: u64,
}

impl Tickets {
    /// The ticket of a commit just appended.
    pub(super) fn issue(&mut self) -> u64 {
        self.last += 1;
        self.last
    }

    /// The last commit's ticket, when it is not known durable yet.
    pub(super) fn waiting(&self) -> Option<u64> {
        (self.durable_through < self.last).then_some(self.last)
    }

    /// A flush covering commits up to `ticket` reported success (a late report of an earlier
    /// flush takes nothing back); returns the last ticket known durable.
    pub(super) fn durable_through(&mut self, ticket: u64) -> u64 {
        self.durable_through = self.durable_through.max(ticket);
        self.durable_through
    }

    /// The journal file was replaced by one holding everything, flushed.
    pub(super) fn all_durable(&mut self) {
        self.durable_through = self.last;
    }

    /// Commits waiting for a flush.
    pub(super) fn unflushed(&self) -> u64 {
        self.last - self.durable_through
    }
}
