//! Making appended lines durable off the owner loop.
//!
//! A journal commit is a `write` (into the page cache, quick) and an `fdatasync` (the disk's
//! cache flush: about 4 ms on a virtual disk, whatever the size). Done on the owner loop, the
//! flushes of a burst of claims run one after the other and the loop waits through each, so a
//! node's fresh claims queue behind the disk. Here the owner only writes; the flush runs on a
//! small pool of threads, several at once (the block layer merges flushes that overlap), and
//! each commit's requests are answered when a flush that began after its write reports.
//!
//! Each thread flushes through a descriptor of its own, opened on the log file when the file
//! became the journal (before anything was appended to it). The kernel reports a writeback
//! error once per open file description, so every thread sees every error that happened since
//! the file was opened: a flush that reports success means that everything written before it
//! began is on disk. The journal still never appends to a file after any flush of it failed.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
};

use tokio::sync::mpsc;

/// Flushes in flight at once.
pub(super) const SYNC_THREADS: usize = 4;

/// The descriptors one log file is flushed through: one per pool thread.
#[derive(Debug)]
pub struct SyncFiles {
    /// Which log file these are (a new one after every rewrite and compaction).
    pub(super) file_id: u64,
    files: Vec<File>,
}

impl SyncFiles {
    /// Opens `SYNC_THREADS` descriptions of the file `file` is open on (through
    /// `/proc/self/fd`: the same inode whatever its name is now, each with its own error
    /// cursor).
    pub(super) fn open(file: &File, file_id: u64) -> io::Result<Self> {
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let files = (0..SYNC_THREADS)
            .map(|_| File::open(&path))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { file_id, files })
    }
}

/// A flush asked for: everything written to the file before it was asked.
struct Job {
    ticket: u64,
    files: Arc<SyncFiles>,
}

/// What a flush found.
#[derive(Debug)]
pub struct Synced {
    /// Every commit up to this ticket is durable when `result` is `Ok`.
    pub ticket: u64,
    pub(super) file_id: u64,
    pub(super) result: io::Result<()>,
}

/// The reports' queue to the owner loop: at most one per thread waits in it; a thread whose
/// report finds it full waits for the loop (the loop never waits for the pool).
pub const REPORT_QUEUE: usize = SYNC_THREADS;

/// The flush asked for that no thread has taken yet. One slot, not a queue: a later flush
/// covers every commit an earlier one would have (it begins after their writes, and a new file
/// replaces an old one only once flushed whole), so a newer request replaces an untaken one and
/// a burst of commits costs at most one waiting flush besides those in flight.
#[derive(Default)]
struct Slot {
    next: Option<Job>,
    /// The pool is being dropped: the threads finish.
    closed: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
    /// Threads still running; none left means nothing will ever be flushed.
    running: AtomicUsize,
}

/// The pool: flushes asked for in, reports out (to the owner loop, which answers the requests).
pub(super) struct SyncPool {
    shared: Arc<Shared>,
}

impl SyncPool {
    pub(super) fn start(reports: mpsc::Sender<Synced>) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::default()),
            wake: Condvar::new(),
            running: AtomicUsize::new(0),
        });
        for index in 0..SYNC_THREADS {
            let (thread_shared, reports) = (shared.clone(), reports.clone());
            shared.running.fetch_add(1, Ordering::SeqCst);
            let spawned = thread::Builder::new()
                .name(format!("ipq-journal-{index}"))
                .spawn(move || {
                    flush_jobs(index, &thread_shared, &reports);
                    thread_shared.running.fetch_sub(1, Ordering::SeqCst);
                });
            if let Err(e) = spawned {
                shared.running.fetch_sub(1, Ordering::SeqCst);
                return Err(e);
            }
        }
        Ok(Self { shared })
    }

    /// Asks for a flush of `files` covering commit `ticket` (replacing one asked for earlier
    /// that no thread has taken yet); `false` when the pool is gone.
    pub(super) fn flush(&self, ticket: u64, files: Arc<SyncFiles>) -> bool {
        if self.shared.running.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let Ok(mut slot) = self.shared.slot.lock() else {
            return false;
        };
        slot.next = Some(Job { ticket, files });
        drop(slot);
        self.shared.wake.notify_one();
        true
    }
}

impl Drop for SyncPool {
    fn drop(&mut self) {
        if let Ok(mut slot) = self.shared.slot.lock() {
            slot.closed = true;
        }
        self.shared.wake.notify_all();
    }
}

fn flush_jobs(index: usize, shared: &Shared, reports: &mpsc::Sender<Synced>) {
    loop {
        // The lock is held only to take a job, never through a flush.
        let job = {
            let Ok(mut slot) = shared.slot.lock() else {
                return;
            };
            loop {
                if let Some(job) = slot.next.take() {
                    break job;
                }
                if slot.closed {
                    return;
                }
                slot = match shared.wake.wait(slot) {
                    Ok(slot) => slot,
                    Err(_) => return,
                };
            }
        };
        // A failure is logged where it is decided on (the owner's save), not here.
        let result = job.files.files[index].sync_data();
        let report = Synced {
            ticket: job.ticket,
            file_id: job.files.file_id,
            result,
        };
        if reports.blocking_send(report).is_err() {
            return;
        }
    }
}
