//! The CNI spool: DELs that `ipq-cni` could not hand to an agent, replayed at start and then,
//! while the agent serves, read off the owner loop: a task reads the directory every
//! [`SPOOL_EVERY`], hands what it found to the loop ([`SpooledDels`]), which drains the
//! attachments and answers once the journal holds the drain (its flush runs off the loop too),
//! and only then removes the files. Nothing on the loop waits on the disk.

use std::{path::PathBuf, time::Duration};

use ipq_fs::spool::{self, SpooledDel};
use log::{error, info, warn};
use tokio::sync::{mpsc, oneshot};

use crate::tracker::{Answer, Durable, Tracker};

/// How often the spool is read while the agent serves.
pub(super) const SPOOL_EVERY: Duration = Duration::from_secs(1);

/// Spooled DELs for the owner loop to drain, and where to say whether the journal holds the
/// drains (`Err` names why not).
pub(super) struct SpooledDels {
    pub(super) dels: Vec<SpooledDel>,
    pub(super) saved: oneshot::Sender<Result<(), String>>,
}

/// Drains what `ipq-cni` spooled when it could not reach an agent, at start (before the loop:
/// the journal is saved here, then each file removed).
pub(super) fn replay_spool(tracker: &mut Tracker, durable: &mut Durable, dir: &std::path::Path) {
    let pending = match spool::pending(dir) {
        Ok(pending) => pending,
        Err(e) => {
            error!("CNI spool: {e}");
            return;
        }
    };
    for spooled in pending {
        drain(tracker, &spooled);
        // Saved before the spool file goes, so a crash in between replays it again (harmless:
        // draining is idempotent) rather than losing it. A failed save keeps every file left:
        // the reader replays them.
        if let Err(reason) = durable.persist(tracker.journaled()) {
            warn!(
                "CNI spool: the DEL of container {} is kept for a later replay: the journal \
                 could not be saved ({reason})",
                spooled.request.container_id
            );
            return;
        }
        if let Err(e) = spooled.done() {
            error!("CNI spool: {e}");
        }
    }
}

/// The owner loop's part: drains `dels`' attachments; the returned answer, called once the
/// journal's save of them is known, tells the reader whether it may remove their files.
pub(super) fn drain_spooled(tracker: &mut Tracker, dels: SpooledDels) -> Answer {
    for spooled in &dels.dels {
        drain(tracker, spooled);
    }
    let saved = dels.saved;
    Box::new(move |result: Result<(), &str>| {
        let _ = saved.send(result.map_err(str::to_owned));
    })
}

fn drain(tracker: &mut Tracker, spooled: &SpooledDel) {
    let drained = tracker.drain_attachment(&spooled.request);
    info!(
        "CNI spool: replayed the DEL of container {} ({} addresses drained)",
        spooled.request.container_id,
        drained.len()
    );
}

/// Reads `dir` every [`SPOOL_EVERY`], off the loop, and hands what it holds to the loop; a
/// file goes once the loop said the journal holds its drain. Ends when the loop is gone.
pub(super) async fn read_spool(dir: PathBuf, loop_tx: mpsc::Sender<SpooledDels>) {
    // Why the last replay's save failed, while saves fail: said once, not every second.
    let mut failing: Option<String> = None;
    loop {
        tokio::time::sleep(SPOOL_EVERY).await;
        let read = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || spool::pending(&dir)).await
        };
        let dels = match read {
            Ok(Ok(dels)) if dels.is_empty() => continue,
            Ok(Ok(dels)) => dels,
            Ok(Err(e)) => {
                error!("CNI spool: {e}");
                continue;
            }
            Err(e) => {
                error!("CNI spool: reading it stopped: {e}");
                continue;
            }
        };
        let (saved, answer) = oneshot::channel();
        let paths: Vec<PathBuf> = dels.iter().map(|d| d.path.clone()).collect();
        if loop_tx.send(SpooledDels { dels, saved }).await.is_err() {
            return;
        }
        match answer.await {
            Ok(Ok(())) => {
                failing = None;
                let removed = tokio::task::spawn_blocking(move || {
                    for path in paths {
                        if let Err(e) = std::fs::remove_file(&path) {
                            error!("CNI spool: removing {}: {e}", path.display());
                        }
                    }
                });
                if let Err(e) = removed.await {
                    error!("CNI spool: removing replayed DELs stopped: {e}");
                }
            }
            Ok(Err(reason)) => {
                if failing.as_deref() != Some(reason.as_str()) {
                    warn!(
                        "CNI spool: {} replayed DELs are kept for a later replay: the journal \
                         could not be saved ({reason})",
                        paths.len()
                    );
                }
                failing = Some(reason);
            }
            // The loop stopped before the save was known: the files stay for the next agent.
            Err(_) => return,
        }
    }
}
