//! The writer task: keeps the listed entries, and writes them coalesced, retrying with backoff.

use std::{
    collections::BTreeMap,
    future::Future,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use ipq_api::PublishState;
use log::{info, warn};
use serde_json::Value;
use thiserror::Error;
use tokio::{sync::mpsc, time::Instant};

use super::{
    api_health::{ApiHealth, RETURN_SPREAD},
    backoff::Backoff,
    entry::status_body,
    lock, Change, FailureReason, PublishMetrics, PublishedEntry,
};
use crate::{api::model::PublishView, api::views::TimeBase};

/// How often a failure that keeps happening is logged (every one is counted).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);
/// How long a change that only moves a quarantine's end later (stale traffic arriving) may
/// wait for a write: on a node with stale traffic on many addresses such moves would otherwise
/// be a write every `min_interval` for as long as it lasts.
pub const LAZY_DELAY: Duration = Duration::from_secs(5);
/// How often `ipq_publish_pending_seconds` is refreshed while a change waits.
const PENDING_REFRESH: Duration = Duration::from_secs(1);

/// A write that did not happen, and why.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct WriteError {
    pub reason: FailureReason,
    pub message: String,
}

/// Where the status goes: the API server, or a test's recorder.
pub trait Sink {
    /// Writes `status` as the object's whole status.
    fn write(&mut self, status: &Value) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// The writer's pace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two writes at least: the bound on the write rate per node.
    pub min_interval: Duration,
    /// The first retry after a failure; doubled per failure up to `max_retry`, each with up to
    /// half of it more at random ([`Backoff`]).
    pub first_retry: Duration,
    pub max_retry: Duration,
    /// Entries listed at most (the rest counted as omitted).
    pub max_entries: usize,
}

/// The writer's own state.
struct Writer {
    node: String,
    timing: Timing,
    entries: BTreeMap<IpAddr, PublishedEntry>,
    /// Since when the object lacks a change (the start counts: the object is written once
    /// whatever it held, so a previous run's entries go).
    pending_since: Option<Instant>,
    /// Since when the object lacks a later end of a quarantine it lists (and nothing else).
    lazy_since: Option<Instant>,
    last_attempt: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Backoff,
    health: ApiHealth,
    failing_since: Option<SystemTime>,
    last_logged: Option<(Instant, String)>,
    view: Arc<Mutex<PublishView>>,
    metrics: Arc<PublishMetrics>,
}

/// Runs until the owner's end of the channel is dropped. `health` is told of every write's
/// outcome, and a return of the API server it announces ends a backoff at once.
pub async fn run<S: Sink>(
    node: String,
    mut sink: S,
    mut changes: mpsc::Receiver<Vec<Change>>,
    timing: Timing,
    view: Arc<Mutex<PublishView>>,
    metrics: Arc<PublishMetrics>,
    health: ApiHealth,
) {
    let mut returns = health.returns();
    let mut writer = Writer {
        node,
        timing,
        entries: BTreeMap::new(),
        pending_since: Some(Instant::now()),
        lazy_since: None,
        last_attempt: None,
        retry_at: None,
        backoff: Backoff::new(timing.first_retry, timing.max_retry),
        health,
        failing_since: None,
        last_logged: None,
        view,
        metrics,
    };
    loop {
        let due = writer.due();
        tokio::select! {
            batch = changes.recv() => {
                let Some(batch) = batch else { break };
                writer.apply_all(batch);
                while let Ok(batch) = changes.try_recv() {
                    writer.apply_all(batch);
                }
            }
            () = sleep_until(due), if due.is_some() => {
                // Everything sent before the write is in it: `select!` picks among ready
                // branches at random, and a write chosen over waiting changes (at start: the
                // registry's whole state) would publish a list that lacks them.
                while let Ok(batch) = changes.try_recv() {
                    writer.apply_all(batch);
                }
                writer.attempt(&mut sink).await;
            }
            // The API server answers again: the backoff (tens of seconds by the end of an
            // outage) gives way to a write within a moment.
            returned = returns.changed() => {
                if returned.is_ok() {
                    writer.api_returned();
                }
            }
            // While a change waits (a failing API server backs off up to `max_retry`), the
            // pending gauge still moves every second.
            () = tokio::time::sleep(PENDING_REFRESH), if due.is_some() => {}
        }
        writer.observe_pending();
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

impl Writer {
    /// When the next write is due: none while the object holds everything.
    fn due(&self) -> Option<Instant> {
        let lazy = self.lazy_since.map(|since| since + LAZY_DELAY);
        let pending = match (self.pending_since, lazy) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let paced = self
            .last_attempt
            .map_or(pending, |at| (at + self.timing.min_interval).max(pending));
        Some(self.retry_at.map_or(paced, |retry| retry.max(paced)))
    }

    /// The API server is back: a write that waits on the backoff is made within
    /// [`RETURN_SPREAD`] (at random, so that the nodes do not all write at once).
    fn api_returned(&mut self) {
        if self.retry_at.is_some() {
            self.backoff.reset();
            self.retry_at = Some(Instant::now() + self.backoff.up_to(RETURN_SPREAD));
        }
    }

    fn apply_all(&mut self, batch: Vec<Change>) {
        for change in batch {
            self.apply(change);
        }
    }

    fn apply(&mut self, change: Change) {
        let listed = self.entries.get(&change.addr);
        let urgent = match (&change.entry, listed) {
            (Some(new), Some(old)) if new == old => return,
            (Some(new), Some(old)) => !new.only_ends_later_than(old),
            (None, None) => return,
            _ => true,
        };
        match change.entry {
            Some(entry) => self.entries.insert(change.addr, entry),
            None => self.entries.remove(&change.addr),
        };
        let since = if urgent {
            &mut self.pending_since
        } else {
            &mut self.lazy_since
        };
        since.get_or_insert_with(Instant::now);
    }

    /// Since when the object lacks a change, urgent or lazy.
    fn waiting_since(&self) -> Option<Instant> {
        match (self.pending_since, self.lazy_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn observe_pending(&self) {
        let waited = self
            .waiting_since()
            .map_or(0.0, |since| since.elapsed().as_secs_f64());
        self.metrics.pending_seconds.set(waited);
        if self.waiting_since().is_some() && self.failing_since.is_none() {
            let mut view = lock(&self.view);
            if view.state == PublishState::Published {
                view.state = PublishState::Pending;
            }
        }
    }

    async fn attempt<S: Sink>(&mut self, sink: &mut S) {
        let now = Instant::now();
        self.last_attempt = Some(now);
        let carried_since = self.waiting_since();
        let body = status_body(
            &self.node,
            &self.entries,
            self.timing.max_entries,
            &TimeBase::now(),
            SystemTime::now(),
        );
        match sink.write(&body.status).await {
            Ok(()) => {
                self.health.answered();
                let m = &self.metrics;
                m.writes.inc();
                if let Some(since) = carried_since {
                    m.latency.observe(since.elapsed().as_secs_f64());
                }
                m.entries.set(body.listed as i64);
                m.omitted_entries.set(body.omitted as i64);
                // Changes received during the write set it again when they are applied.
                self.pending_since = None;
                self.lazy_since = None;
                self.retry_at = None;
                self.backoff.reset();
                if let Some(since) = self.failing_since.take() {
                    let for_s = SystemTime::now()
                        .duration_since(since)
                        .unwrap_or_default()
                        .as_secs_f64();
                    info!(
                        "NodeQuarantine {}: written again after {for_s:.1}s of failures",
                        self.node
                    );
                }
                self.last_logged = None;
                let mut view = lock(&self.view);
                view.state = PublishState::Published;
                view.last_published_at =
                    Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
                view.entries = body.listed as u64;
                view.omitted = body.omitted as u64;
                view.writes_total += 1;
                view.last_error = None;
                view.failing_since = None;
            }
            Err(e) => {
                self.metrics.failed(e.reason);
                if e.reason == FailureReason::Unreachable {
                    self.health.unreachable();
                }
                let delay = self.backoff.next_delay();
                self.retry_at = Some(now + delay);
                let since = *self.failing_since.get_or_insert_with(SystemTime::now);
                self.log_failure(&e, delay);
                let mut view = lock(&self.view);
                view.state = PublishState::Failing;
                view.failures_total += 1;
                view.last_error = Some(format!("{}: {e}", <&str>::from(e.reason)));
                view.failing_since = Some(humantime::format_rfc3339_millis(since).to_string());
            }
        }
    }

    /// Logs a failure when its reason is new, and every `FAILURE_LOG_EVERY` while it lasts.
    fn log_failure(&mut self, e: &WriteError, retry_in: Duration) {
        let text = e.to_string();
        let due = self
            .last_logged
            .as_ref()
            .is_none_or(|(at, last)| *last != text || at.elapsed() >= FAILURE_LOG_EVERY);
        if due {
            warn!(
                "NodeQuarantine {}: write failed ({}): {text}; retrying in {:?} (enforcement \
                 on this node is not affected)",
                self.node,
                <&str>::from(e.reason),
                retry_in
            );
            self.last_logged = Some((Instant::now(), text));
        }
    }
}
