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
    sync::{mpsc as std_mpsc, Arc, Mutex},
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

/// The pool: jobs in, reports out (to the owner loop, which answers the requests).
pub(super) struct SyncPool {
    jobs: std_mpsc::Sender<Job>,
}

impl SyncPool {
    pub(super) fn start(reports: mpsc::UnboundedSender<Synced>) -> io::Result<Self> {
        let (jobs, queue) = std_mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..SYNC_THREADS {
            let (queue, reports) = (queue.clone(), reports.clone());
            thread::Builder::new()
                .name(format!("ipq-journal-{index}"))
                .spawn(move || flush_jobs(index, &queue, &reports))?;
        }
        Ok(Self { jobs })
    }

    /// Asks for a flush of `files` covering commit `ticket`; `false` when the pool is gone.
    pub(super) fn flush(&self, ticket: u64, files: Arc<SyncFiles>) -> bool {
        self.jobs.send(Job { ticket, files }).is_ok()
    }
}

fn flush_jobs(
    index: usize,
    queue: &Mutex<std_mpsc::Receiver<Job>>,
    reports: &mpsc::UnboundedSender<Synced>,
) {
    loop {
        // The lock is held only to take a job, never through a flush.
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        // A failure is logged where it is decided on (the owner's save), not here.
        let result = job.files.files[index].sync_data();
        let report = Synced {
            ticket: job.ticket,
            file_id: job.files.file_id,
            result,
        };
        if reports.send(report).is_err() {
            return;
        }
    }
}
