//! Where ipq-ipam's held releases are written, off the owner loop: one thread that writes each
//! release's file (a write, an fsync of it and one of its directory) and answers ipq-ipam only
//! once the file is durable. A burst of held DELs then waits on the disk here, never in front
//! of a claim on the owner loop; and what is queued is written in one pass
//! (`spool::write_all_at`: concurrent fsyncs, one per directory), so that the burst costs the
//! file system a few commits instead of two per release, which the journal's own flushes (and
//! the claims waiting for them) would queue behind.
//!
//! A release answered as stored is remembered from that moment ([`Handed`]): the releaser
//! takes it into its memory at its next scan whether or not its file is still there, writes
//! the file back if it vanished, and runs the release when due. Nothing depends on a scan
//! having seen the file first.
//!
//! While a release cannot be written (a full or read-only `state_dir`), ipq-ipam's DEL is
//! answered `unavailable` (CNI error 11: the runtime retries), readiness says why, and the
//! thread tries a small write every [`PROBE_EVERY`] until one goes through, to clear it.

use std::{
    path::{Path, PathBuf},
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use ipq_api::model::{now_unix_ms, BootStamp, HeldRelease};
use ipq_fs::spool::{self, SpoolError, Spooled};
use log::{debug, info, warn};

use super::holds::Holds;
use crate::{
    api::{command::Reply, model::ErrorCode, views::ApiError},
    kernel_clock,
    metrics::Metrics,
};

/// Releases waiting for the thread at most: beyond, ipq-ipam is told to retry.
const QUEUE: usize = 1024;
/// Releases written in one pass at most.
const BATCH: usize = 64;
/// How often a write is tried while releases cannot be written, to say when they can again.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// What readiness names while releases cannot be written.
const UNSAVED: &str = "ipam releases";
/// The probe's file name: not a release's (`del-`…), so no scan takes it for one.
const PROBE: &str = "write-probe";

/// Where a release goes.
#[derive(Debug)]
pub enum ReleaseFile {
    /// The file named after the allocation's record: a runtime repeating its DEL gets the
    /// release stored first (its time, and so its wait, kept).
    Recorded(PathBuf),
    /// A new spool file (a release with no record).
    New,
}

/// One release to write, and who waits for it.
pub struct StoreRequest {
    pub release: HeldRelease,
    pub file: ReleaseFile,
    pub reply: Reply<HeldRelease>,
}

/// The releases answered as stored since the releaser last took them.
#[derive(Clone, Debug, Default)]
pub struct Handed(Arc<Mutex<Vec<Spooled<HeldRelease>>>>);

impl Handed {
    fn push(&self, stored: Spooled<HeldRelease>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stored);
    }

    /// Every release answered as stored since the last call.
    pub fn take(&self) -> Vec<Spooled<HeldRelease>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The owner loop's end of the store: hands a release over without waiting.
#[derive(Clone, Debug)]
pub struct ReleaseStore {
    requests: mpsc::SyncSender<StoreRequest>,
}

impl ReleaseStore {
    /// Starts the thread writing releases into `dir` (`state_dir/ipam-releases`); what it
    /// stored goes to `handed` (for the releaser) and `holds` (for `ipq get` at once).
    pub fn start(
        dir: PathBuf,
        handed: Handed,
        holds: Holds,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let (requests, queue) = mpsc::sync_channel(QUEUE);
        let writer = Writer {
            dir,
            handed,
            holds,
            metrics,
            failing: None,
        };
        std::thread::Builder::new()
            .name("ipq-ipam-store".into())
            .spawn(move || writer.run(&queue))?;
        Ok(Self { requests })
    }

    /// Hands `request` to the thread; answered from there. A full queue (the disk far behind)
    /// or a stopped thread answers `unavailable` here at once.
    pub fn store(&self, request: StoreRequest) {
        if let Err(refused) = self.requests.try_send(request) {
            let (request, why) = match refused {
                mpsc::TrySendError::Full(r) => (r, "too many releases waiting to be written"),
                mpsc::TrySendError::Disconnected(r) => (r, "the release writer stopped"),
            };
            let _ = request.reply.send(Err(ApiError::new(
                ErrorCode::Unavailable,
                format!("{why}: nothing stored; retry later"),
            )));
        }
    }
}

struct Writer {
    dir: PathBuf,
    handed: Handed,
    holds: Holds,
    metrics: Arc<Metrics>,
    /// Why the last write failed, while writes fail.
    failing: Option<String>,
}

impl Writer {
    fn run(mut self, queue: &mpsc::Receiver<StoreRequest>) {
        loop {
            let wait = if self.failing.is_some() {
                PROBE_EVERY
            } else {
                Duration::MAX
            };
            match queue.recv_timeout(wait) {
                Ok(first) => {
                    // What else is queued goes in the same pass: a burst of held DELs costs
                    // the file system a few commits, not two per release.
                    let mut batch = vec![first];
                    while batch.len() < BATCH {
                        match queue.try_recv() {
                            Ok(request) => batch.push(request),
                            Err(_) => break,
                        }
                    }
                    self.store(batch);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.probe(),
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Writes `batch`'s releases durably and answers each once its file is.
    fn store(&mut self, batch: Vec<StoreRequest>) {
        let mut to_write: Vec<(PathBuf, HeldRelease, Reply<HeldRelease>)> = Vec::new();
        for StoreRequest {
            mut release,
            file,
            reply,
        } in batch
        {
            let path = match file {
                ReleaseFile::Recorded(path) => {
                    // A runtime repeating its DEL: the release stored first, its time kept.
                    if let Some(stored) = read_stored(&path) {
                        let _ = reply.send(Ok(stored));
                        continue;
                    }
                    if to_write.iter().any(|(p, ..)| *p == path) {
                        let _ = reply.send(Err(ApiError::new(
                            ErrorCode::Unavailable,
                            "the same release is being stored: retry later",
                        )));
                        continue;
                    }
                    path
                }
                ReleaseFile::New => spool::new_path(&self.dir),
            };
            release.held_at_unix_ms = now_unix_ms();
            release.held_at_boot = kernel_clock::boot_id().map(|boot_id| BootStamp {
                boot_id,
                boottime_ns: kernel_clock::boottime_ns(),
            });
            to_write.push((path, release, reply));
        }
        let requests: Vec<(&Path, &HeldRelease)> = to_write
            .iter()
            .map(|(path, release, _)| (path.as_path(), release))
            .collect();
        let written = spool::write_all_at(&requests);
        for ((path, release, reply), written) in to_write.into_iter().zip(written) {
            match written {
                Ok(()) => {
                    self.succeeded();
                    debug!(
                        "ipam: holding the allocation of container {} ({}) until {:?} are free \
                         ({})",
                        release.container_id,
                        release.ifname,
                        release.addresses,
                        path.display()
                    );
                    self.holds.hold(&release);
                    self.handed.push(Spooled {
                        path,
                        request: release.clone(),
                    });
                    let _ = reply.send(Ok(release));
                }
                Err(e) => {
                    self.failed(&e);
                    let _ = reply.send(Err(ApiError::new(
                        ErrorCode::Unavailable,
                        format!("storing the release: {e}; nothing stored: retry later"),
                    )));
                }
            }
        }
    }

    /// A small durable write into the directory, to learn whether releases can be written again.
    fn probe(&mut self) {
        let probe = self.dir.join(PROBE);
        match spool::write_at(&probe, &()) {
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                self.succeeded();
            }
            Err(e) => self.failed(&e),
        }
    }

    fn succeeded(&mut self) {
        if let Some(reason) = self.failing.take() {
            info!("ipam releases: written again (failing before: {reason})");
            self.metrics.readiness.set_unsaved(UNSAVED, None);
        }
    }

    fn failed(&mut self, e: &SpoolError) {
        let reason = e.to_string();
        if self.failing.as_deref() != Some(reason.as_str()) {
            warn!(
                "ipam releases: {reason}; held DELs are answered `unavailable` until a write \
                 succeeds (tried every {PROBE_EVERY:?})"
            );
            self.metrics
                .readiness
                .set_unsaved(UNSAVED, Some(reason.clone()));
        }
        self.failing = Some(reason);
    }
}

/// The release stored at `path`, if there is one that reads.
fn read_stored(path: &Path) -> Option<HeldRelease> {
    let bytes = ipq_fs::safe_fs::read_regular(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests;
