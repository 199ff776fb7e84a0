//! The writer task: takes what the agent's loop handed over, aggregates it per pod and reason
//! ([`Aggregator`]) and writes the Events, one at a time; a failing API server is waited out
//! with backoff (what arrives meanwhile is aggregated or, past the queue's bound, dropped and
//! counted).

use std::{sync::Arc, time::Duration};

use log::{debug, warn};
use tokio::{
    sync::mpsc,
    time::{sleep_until, Instant},
};

use crate::publish::Backoff;

use super::{
    aggregate::{Aggregator, Pacing, Taken, Write},
    kube_events::{EventSink, SinkError},
    metrics::{DropCause, EventMetrics},
    notice::Happening,
};

/// The first wait after a failed write; doubled per failure up to [`MAX_RETRY`], each with up
/// to half of it more at random (the publisher's [`Backoff`]: the nodes do not retry in
/// lockstep after an outage).
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How often a failure that keeps happening is logged (every one is counted).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

struct Writer<S> {
    node: String,
    sink: S,
    aggregator: Aggregator,
    metrics: Arc<EventMetrics>,
    /// No write before then (a failure's backoff).
    retry_at: Option<Instant>,
    backoff: Backoff,
    last_logged: Option<Instant>,
}

/// Runs until the agent's end of the channel is dropped.
pub async fn run<S: EventSink>(
    node: String,
    sink: S,
    mut happenings: mpsc::Receiver<Happening>,
    pacing: Pacing,
    metrics: Arc<EventMetrics>,
) {
    let mut writer = Writer {
        node,
        sink,
        aggregator: Aggregator::new(pacing),
        metrics,
        retry_at: None,
        backoff: Backoff::new(FIRST_RETRY, MAX_RETRY),
        last_logged: None,
    };
    loop {
        let wake = writer.next_wake();
        tokio::select! {
            happening = happenings.recv() => match happening {
                Some(happening) => writer.take(happening).await,
                None => return,
            },
            () = sleep_until(wake.unwrap_or_else(far_future)), if wake.is_some() => {
                writer.write_due().await;
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

impl<S: EventSink> Writer<S> {
    fn next_wake(&self) -> Option<Instant> {
        let due = self.aggregator.next_due().map(Instant::from_std);
        match (due, self.retry_at) {
            (Some(due), Some(retry)) => Some(due.max(retry)),
            (due, _) => due,
        }
    }

    async fn take(&mut self, happening: Happening) {
        for notice in happening.notices(&self.node) {
            let reason = notice.reason;
            match self.aggregator.take(notice, Instant::now().into_std()) {
                Taken::Write(write) => {
                    if self.backing_off() {
                        // The API server failed a moment ago: the series starts with a later
                        // occurrence rather than a write that would fail the same way.
                        if let Write::Create { key, .. } = &write {
                            self.aggregator.lost(key);
                        }
                        self.metrics.dropped(DropCause::Backoff);
                    } else {
                        self.write(write).await;
                    }
                }
                Taken::Aggregated => self.metrics.aggregated(reason),
                Taken::SeriesFull => self.metrics.dropped(DropCause::SeriesFull),
            }
        }
        self.metrics
            .series
            .set(self.aggregator.series_kept() as i64);
    }

    fn backing_off(&self) -> bool {
        self.retry_at.is_some_and(|at| Instant::now() < at)
    }

    async fn write_due(&mut self) {
        if self.backing_off() {
            return;
        }
        for write in self.aggregator.due(Instant::now().into_std()) {
            if self.backing_off() {
                break;
            }
            self.write(write).await;
        }
        self.metrics
            .series
            .set(self.aggregator.series_kept() as i64);
    }

    async fn write(&mut self, write: Write) {
        let (key, result) = match write {
            Write::Create { key, notice } => {
                let result = self.sink.create(&notice).await;
                if let Ok(name) = &result {
                    self.aggregator.created(&key, name.clone());
                }
                (key, result.map(|_| ()))
            }
            Write::Patch {
                key,
                event,
                count,
                last_observed,
            } => {
                let result = self
                    .sink
                    .patch(&key.namespace, &event, count, last_observed)
                    .await;
                if result.is_ok() {
                    self.aggregator
                        .patched(&key, count, Instant::now().into_std());
                }
                (key, result)
            }
        };
        match result {
            Ok(()) => {
                self.metrics.emitted(key.reason);
                self.retry_at = None;
                self.backoff.reset();
            }
            Err(SinkError::Gone) => {
                debug!(
                    "the {} Event of pod {}/{} is gone; its next occurrence starts a new one",
                    key.reason, key.namespace, key.name
                );
                self.aggregator.lost(&key);
            }
            Err(SinkError::Failed(e)) => {
                self.metrics.failed(e.reason);
                self.aggregator.lost(&key);
                self.retry_at = Some(Instant::now() + self.backoff.next_delay());
                let now = Instant::now();
                if self
                    .last_logged
                    .is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_EVERY)
                {
                    self.last_logged = Some(now);
                    warn!("writing pod Events: {e} (retried with backoff; counted in ipq_events_failed_total)");
                }
            }
        }
    }
}
