//! What the kernel programs send the agent through their ring buffers: conflict samples (to
//! the tracker) and aya-log records (to the agent's log), each read as the ring becomes
//! readable, never polled.

use std::sync::Arc;

use ipq_common::{sample::ConflictSample, watch::BpfCmd};
use log::{error, warn};
use prometheus::IntCounter;
use tokio::{
    io::{unix::AsyncFd, Interest},
    sync::mpsc::{self, error::TrySendError},
};

use super::AgentError;
use crate::{
    datapath::{
        attach::cotenant,
        bpf_watch::{
            BpfWatch, Pokes, ReportedKey, ReportedKeys, Seen, POKE_DETACH, POKE_LINKS, POKE_MAPS,
            REPORTED_KEYS_AT_ONCE,
        },
        decode_sample,
        verify::{POKED_GAP, WATCH_SETTLE},
        KernelLogger, Samples,
    },
    metrics::{LostAt, Metrics},
};

/// Samples waiting for the owner loop. The kernel's ring is bounded and counts what it cannot
/// take; this queue is bounded too, so a flood costs counted samples, never the agent's heap.
pub(super) const SAMPLE_QUEUE: usize = 4096;

/// Reads the sample ring until the agent stops and hands each sample to the tracker, which logs
/// and publishes it. A sample that finds the queue full is dropped and counted
/// (`ipq_events_lost_total{source="queue"}`).
pub(super) async fn read_samples(
    samples: Samples,
    to_tracker: mpsc::Sender<ConflictSample>,
    metrics: Arc<Metrics>,
) -> Result<(), AgentError> {
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long as
    // the AsyncFd owns the ring.
    let mut ring = unsafe { AsyncFd::register_with_interest(samples.0, Interest::READABLE) }
        .map_err(|e| AgentError::Io {
            what: "polling the sample ring buffer",
            source: e.into_parts().1,
        })?;
    loop {
        let mut guard = ring.readable_mut().await.map_err(|source| AgentError::Io {
            what: "polling the sample ring buffer",
            source,
        })?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode_sample(&item) {
                Some(sample) => match to_tracker.try_send(sample) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => metrics.events_lost(LostAt::Queue, 1),
                    Err(TrySendError::Closed(_)) => return Ok(()),
                },
                None => warn!("sample ring: record of {} bytes ignored", item.len()),
            }
        }
        guard.clear_ready();
    }
}

/// Forwards the kernel programs' aya-log records to the agent's log (debug level).
pub(super) async fn forward_kernel_logs(logger: KernelLogger) -> Result<(), AgentError> {
    // SAFETY: the logger owns its ring buffer's fd for as long as the AsyncFd owns it.
    let mut logger = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
        .map_err(|e| AgentError::Io {
            what: "polling the kernel log ring",
            source: e.into_parts().1,
        })?;
    loop {
        let mut guard = logger
            .readable_mut()
            .await
            .map_err(|source| AgentError::Io {
                what: "polling the kernel log ring",
                source,
            })?;
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

/// Starts the bpf() watcher: its ring's reader, and the task that hands the reported map
/// writes' keys to the owner loop through `settled` once their calls are done. Returns the
/// pokes the verification reads; when the reader stops, the watcher is reported gone
/// (metrics, log, `ipq status`) and the periodic verification is what is left.
pub(super) fn start_bpf_watch(
    watch: BpfWatch,
    settled: mpsc::Sender<Vec<ReportedKey>>,
    metrics: &Arc<Metrics>,
) -> Arc<Pokes> {
    let pokes = Arc::new(Pokes::new(watch.mode, watch.why_not_trampolines.clone()));
    metrics.tamper.set_bpf_watcher_mode(watch.mode);
    let (keys_tx, keys_rx) = mpsc::channel(REPORTED_KEY_BATCHES);
    tokio::spawn(settle_reported_keys(keys_rx, settled, pokes.clone()));
    let reader = pokes.clone();
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let lost_calls = metrics.tamper.bpf_watcher_lost_calls.clone();
        let keys_overflow = metrics.queues.of(crate::queues::Queue::ReportedKeys);
        let reading = read_bpf_calls(watch, reader.clone(), lost_calls, keys_tx, keys_overflow);
        let why = match reading.await {
            Ok(()) => "its ring reader ended".to_owned(),
            Err(e) => e.to_string(),
        };
        metrics.tamper.bpf_watcher.set(0);
        metrics
            .tamper
            .set_bpf_watcher_mode(ipq_common::watch::WatchMode::None);
        metrics.tamper.bpf_watcher_stops.inc();
        error!("bpf() watcher stopped: {why}; periodic verification only");
        reader.stop(why);
    });
    pokes
}

/// Batches of reported keys waiting to be looked at: a burst beyond them is found by the
/// comparison of the whole maps, which every reported write pokes too.
pub(super) const REPORTED_KEY_BATCHES: usize = 16;

/// Hands each batch of reported map writes' keys to the owner loop once the calls are done
/// (the watcher sees a call as it starts): [`WATCH_SETTLE`] after it was seen. The whole maps
/// are compared [`POKED_GAP`] later, as the backstop for what a key cannot show (an address
/// moved out of its `IPQ_SLOTS` cell by a write to that cell), so that the look at the keys,
/// O(keys), is what repairs a single write, not the O(addresses) comparison.
pub(super) async fn settle_reported_keys(
    mut reported: mpsc::Receiver<ReportedKeys>,
    settled: mpsc::Sender<Vec<ReportedKey>>,
    pokes: Arc<Pokes>,
) {
    while let Some(ReportedKeys { seen_at, mut keys }) = reported.recv().await {
        tokio::time::sleep_until(seen_at + WATCH_SETTLE).await;
        keys.sort_unstable();
        keys.dedup();
        if settled.send(keys).await.is_err() {
            return;
        }
        let pokes = pokes.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(seen_at + POKED_GAP).await;
            pokes.poke(POKE_MAPS);
        });
    }
}

/// Reads the watcher's ring until the agent stops: each reported `bpf()` call of another
/// process that may have touched ipq's links or maps pokes the verification, which looks at
/// once (one pass for a burst of calls).
pub(super) async fn read_bpf_calls(
    watch: BpfWatch,
    pokes: Arc<Pokes>,
    lost_calls: IntCounter,
    reported_keys: mpsc::Sender<ReportedKeys>,
    keys_overflow: IntCounter,
) -> Result<(), AgentError> {
    let BpfWatch {
        calls,
        lost,
        mut classifier,
        ..
    } = watch;
    // SAFETY: as for the samples: the ring owns its map fd for as long as the AsyncFd owns it.
    let mut ring =
        unsafe { AsyncFd::register_with_interest(calls, Interest::READABLE) }.map_err(|e| {
            AgentError::Io {
                what: "polling the bpf() watcher's ring buffer",
                source: e.into_parts().1,
            }
        })?;
    // The last writer of IPQ_PROBES warned about: once per writer, not per write.
    let mut probes_written_by = None;
    loop {
        let mut guard = ring.readable_mut().await.map_err(|source| AgentError::Io {
            what: "polling the bpf() watcher's ring buffer",
            source,
        })?;
        let ring = guard.get_inner_mut();
        let mut scope = 0;
        let mut keys = Vec::new();
        while let Some(item) = ring.next() {
            match classifier.classify(&item) {
                Some(Seen::Attachment { cmd, tgid, target }) => {
                    log::debug!("process {tgid}: bpf({cmd:?}) on target {target}: verifying");
                    scope |= match cmd {
                        BpfCmd::LinkDetach => POKE_DETACH,
                        _ => POKE_LINKS,
                    };
                }
                Some(Seen::Probes { cmd, tgid }) => {
                    if probes_written_by != Some(tgid) {
                        warn!(
                            "process {tgid}: bpf({cmd:?}) wrote IPQ_PROBES, the count of \
                             co-tenant probes: every co-tenant ahead of ipq is judged again"
                        );
                        probes_written_by = Some(tgid);
                    }
                    cotenant::forget_all();
                    scope |= POKE_LINKS;
                }
                Some(Seen::Maps { cmd, tgid, key }) => {
                    // A write the raw tracepoint cannot place may be of IPQ_PROBES.
                    if BpfCmd::writes_map(cmd as u32) && !classifier.names_written_maps() {
                        cotenant::forget_all();
                        scope |= POKE_LINKS;
                    }
                    match key {
                        // One entry written, with its key: looked at by its key first, then the
                        // whole maps compared (`settle_reported_keys`).
                        Some(key) if keys.len() < REPORTED_KEYS_AT_ONCE => {
                            log::debug!(
                                "process {tgid}: bpf({cmd:?}) of ipq's maps: its key first"
                            );
                            keys.push(key);
                        }
                        _ => {
                            log::debug!(
                                "process {tgid}: bpf({cmd:?}) of ipq's maps: comparing them"
                            );
                            scope |= POKE_MAPS;
                        }
                    }
                }
                Some(Seen::Mapped { tgid, foreign }) => {
                    if foreign {
                        log::debug!("process {tgid}: a memory mapping of ipq's maps");
                        pokes.mapped_by_another();
                    }
                }
                Some(Seen::Elsewhere) => {}
                None => warn!("bpf() watcher: record of {} bytes ignored", item.len()),
            }
        }
        if scope != 0 {
            pokes.poke(scope);
        }
        if !keys.is_empty() {
            let seen_at = tokio::time::Instant::now();
            // Full (or gone): the owner has keys enough to look at; the comparison of the
            // whole maps finds these writes instead.
            if let Err(e) = reported_keys.try_send(ReportedKeys { seen_at, keys }) {
                if let TrySendError::Full(_) = e {
                    keys_overflow.inc();
                }
                pokes.poke(POKE_MAPS);
            }
        }
        // A call the kernel could not report may have been anything: everything is verified.
        // One lookup a wakeup; wakeups come only with calls that concern ipq.
        match lost.total() {
            Ok(total) => {
                let new = pokes.lost(total);
                if new > 0 {
                    lost_calls.inc_by(new);
                    warn!(
                        "bpf() watcher: {new} calls lost to a full ring ({total} in all); \
                         verifying every link and map"
                    );
                }
            }
            Err(e) => {
                pokes.poke(POKE_LINKS | POKE_MAPS);
                warn!("bpf() watcher: reading its lost-call count: {e}; verifying everything");
            }
        }
        guard.clear_ready();
    }
}
