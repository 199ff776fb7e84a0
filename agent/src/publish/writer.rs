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
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

use super::{
    api_health::{ApiHealth, RETURN_SPREAD},
    backoff::Backoff,
    entry::status_body,
    lock, Change, FailureReason, Orphans, PublishMetrics, PublishedEntry,
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

/// Whether `e` is the API server refusing the `orphaned` state (an enum of an older CRD):
/// `... status.entries[0].state: Unsupported value: "orphaned": supported values: ...`.
fn refuses_orphaned(e: &WriteError) -> bool {
    e.reason == FailureReason::Refused && e.message.contains("\"orphaned\"")
}

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
    /// How long orphaned entries are left out after the API server refused their state (a
    /// NodeQuarantine CRD older than the agent: Helm never upgrades a CRD), before a write
    /// tries them again: the operator's `kubectl apply` of the new CRD is picked up within it.
    pub orphans_retry: Duration,
}

/// The writer's own state.
struct Writer {
    node: String,
    timing: Timing,
    entries: BTreeMap<IpAddr, PublishedEntry>,
    /// The whereabouts projection's orphaned holders, as it last handed them over.
    orphans: Orphans,
    /// Since when the API server refuses the `orphaned` state: until `timing.orphans_retry` after
    /// it, writes leave the orphans out (counted and shown) rather than fail whole.
    orphans_refused_at: Option<Instant>,
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

/// What the writer is handed: the owner loop's changed entries, and the whereabouts
/// projection's orphans, whole.
pub struct Inputs {
    pub changes: mpsc::Receiver<Vec<Change>>,
    pub orphans: watch::Receiver<Orphans>,
}

/// Runs until the owner's end of the channel is dropped. `health` is told of every write's
/// outcome, and a return of the API server it announces ends a backoff at once.
pub async fn run<S: Sink>(
    node: String,
    mut sink: S,
    inputs: Inputs,
    timing: Timing,
    view: Arc<Mutex<PublishView>>,
    metrics: Arc<PublishMetrics>,
    health: ApiHealth,
) {
    let Inputs {
        mut changes,
        mut orphans,
    } = inputs;
    let mut returns = health.returns();
    // Closed when the feed is dropped with no projection holding a sender: never again then.
    let mut orphans_open = true;
    let mut writer = Writer {
        node,
        timing,
        entries: BTreeMap::new(),
        orphans: Orphans::default(),
        orphans_refused_at: None,
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
            changed = orphans.changed(), if orphans_open => match changed {
                Ok(()) => {
                    let now = orphans.borrow_and_update().clone();
                    writer.set_orphans(now);
                }
                Err(_) => orphans_open = false,
            },
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
        // Orphans left out try again once their refusal is old.
        let orphans_again = self
            .orphans_refused_at
            .filter(|_| !self.orphans.is_empty())
            .map(|at| at + self.timing.orphans_retry);
        let pending = [self.pending_since, lazy, orphans_again]
            .into_iter()
            .flatten()
            .min()?;
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

    /// The projection's orphans now: a change to write unless they are being left out.
    fn set_orphans(&mut self, orphans: Orphans) {
        if *orphans == *self.orphans {
            return;
        }
        self.orphans = orphans;
        if !self.withholding_orphans() {
            self.pending_since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether writes leave the orphans out: the API server refused their state a short while
    /// ago.
    fn withholding_orphans(&self) -> bool {
        self.orphans_refused_at
            .is_some_and(|at| at.elapsed() < self.timing.orphans_retry)
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
        let withheld = self.withholding_orphans();
        let none = BTreeMap::new();
        let body = status_body(
            &self.node,
            &self.entries,
            if withheld { &none } else { &self.orphans },
            self.timing.max_entries,
            &TimeBase::now(),
            SystemTime::now(),
        );
        let withheld_count = if withheld { self.orphans.len() } else { 0 };
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
                m.orphans_withheld.set(withheld_count as i64);
                // Only a write that carried orphans shows the API server takes them now.
                if !withheld && body.orphaned > 0 && self.orphans_refused_at.take().is_some() {
                    info!(
                        "NodeQuarantine {}: the API server takes orphaned entries now (its \
                         CRD was updated); {} listed",
                        self.node, body.orphaned
                    );
                }
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
                view.orphaned = body.orphaned as u64;
                view.orphans_withheld = (withheld_count > 0).then_some(withheld_count as u64);
                view.writes_total += 1;
                view.last_error = None;
                view.failing_since = None;
            }
            Err(e) if !withheld && !self.orphans.is_empty() && refuses_orphaned(&e) => {
                // A CRD older than this agent: everything else is still written, at once.
                self.metrics.failed(e.reason);
                self.orphans_refused_at = Some(now);
                self.retry_at = None;
                self.pending_since.get_or_insert(now);
                warn!(
                    "NodeQuarantine {}: the API server refuses the state `orphaned` (the \
                     cluster's NodeQuarantine CRD is older than this agent; Helm does not \
                     upgrade CRDs: kubectl apply -f deploy/helm/ipq/crds/): {e}; writing \
                     without the {} orphaned entries, trying them again every {:?}",
                    self.node,
                    self.orphans.len(),
                    self.timing.orphans_retry
                );
                let mut view = lock(&self.view);
                view.failures_total += 1;
                view.orphans_withheld = Some(self.orphans.len() as u64);
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
