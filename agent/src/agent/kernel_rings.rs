//! What the kernel programs send the agent through their ring buffers: conflict samples (to
//! the tracker) and aya-log records (to the agent's log), each read as the ring becomes
//! readable, never polled.

use std::sync::Arc;

use ipq_common::sample::ConflictSample;
use log::warn;
use tokio::{
    io::{unix::AsyncFd, Interest},
    sync::mpsc::{self, error::TrySendError},
};

use super::AgentError;
use crate::{
    datapath::{decode_sample, KernelLogger, Samples},
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
