//! The owner loop: one input at a time, each handed to the tracker, then the work every turn
//! owes (a save of what changed, the publisher's changes, the heap's trim).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use log::{error, info, warn};

use super::{
    inputs::{Input, Inputs, Stop},
    spool_replay::replay_spool,
    waiting::WaitingAnswers,
};
use crate::{
    heap::Trimmer,
    metrics::Metrics,
    netdev, netlink,
    tracker::{Durable, Tracker},
};

/// Longest sleep between two ticks: the CNI spool is replayed on each.
const MAX_TICK: Duration = Duration::from_secs(1);

pub(super) struct OwnerLoop {
    pub(super) tracker: Tracker,
    /// The registry's durable copy: saved after every input, answers waiting for it.
    pub(super) durable: Durable,
    pub(super) inputs: Inputs,
    pub(super) metrics: Arc<Metrics>,
    pub(super) spool_dir: PathBuf,
    pub(super) waiting: WaitingAnswers,
    pub(super) trimmer: Trimmer,
    pub(super) last_tick: Instant,
}

impl OwnerLoop {
    /// Runs until told to stop; returns the tracker and its journal for the shutdown.
    pub(super) async fn run(mut self) -> (Tracker, Durable) {
        loop {
            let delay = tick_delay(&self.tracker, self.last_tick);
            match self.inputs.next(delay).await {
                Ok(input) => self.handle(input).await,
                Err(Stop(why)) => {
                    info!("stopping: {why}");
                    break;
                }
            }
            // Also the retry of a failed save: this runs at least once a second.
            self.waiting
                .after_quiet_save(&self.durable.persist_deferred(self.tracker.journaled()));
            self.tracker.publish_changes();
        }
        (self.tracker, self.durable)
    }

    /// One input, handed to the tracker.
    async fn handle(&mut self, input: Input) {
        let tracker = &mut self.tracker;
        if matches!(input, Input::Tick) {
            self.trimmer.on_tick();
        } else {
            self.trimmer.on_activity();
        }
        match input {
            Input::Net { events, overrun } => {
                for event in events {
                    tracker.on_event(event);
                }
                if overrun {
                    resync(tracker, &self.metrics).await;
                }
            }
            Input::TcNotices(notices) => notices.into_iter().for_each(|n| tracker.on_tc_notice(n)),
            Input::Verification(verification) => tracker.on_verification(*verification),
            Input::ReportedKeys(keys) => tracker.recheck_reported(&keys),
            Input::AttachReports(reports) => {
                reports
                    .into_iter()
                    .for_each(|r| tracker.on_attach_report(r));
            }
            Input::HygieneReports(reports) => {
                reports
                    .into_iter()
                    .for_each(|r| tracker.on_hygiene_report(r));
            }
            Input::Samples(samples) => samples.iter().for_each(|s| tracker.on_sample(s)),
            Input::Commands(commands) => {
                let answers = commands.into_iter().map(|c| tracker.handle(c)).collect();
                // Answered only once what they changed is on disk (the flush runs off this
                // loop); `unavailable`, with the journal's error, when it cannot be.
                let saved = self.durable.persist_deferred(tracker.journaled());
                self.waiting.after_save(answers, saved);
            }
            Input::Synced(reports) => {
                for report in reports {
                    self.waiting.on_synced(self.durable.on_synced(report));
                }
            }
            Input::Tick => {
                self.last_tick = Instant::now();
                tracker.tick();
                replay_spool(tracker, &mut self.durable, &self.spool_dir);
            }
        }
    }
}

/// Sleeps until the registry's next deadline or the next attach retry, and at most until
/// `MAX_TICK` after the last tick: the sleep starts again on every input, so a steady stream of
/// inputs less than `MAX_TICK` apart must not put off the periodic work (spool replay,
/// readiness) for ever.
fn tick_delay(tracker: &Tracker, last_tick: Instant) -> Duration {
    let now = netdev::monotonic_ns();
    let retry = tracker
        .attacher()
        .workers()
        .next_retry()
        .map_or(MAX_TICK, |at| at.saturating_duration_since(Instant::now()));
    tracker
        .next_deadline()
        .map_or(MAX_TICK, |at| Duration::from_nanos(at.saturating_sub(now)))
        .min(MAX_TICK.saturating_sub(last_tick.elapsed()))
        .min(retry)
}

/// Takes a fresh dump after lost events and feeds the difference to the tracker.
async fn resync(tracker: &mut Tracker, metrics: &Metrics) {
    metrics.netlink_resyncs.inc();
    match netlink::dump().await {
        Ok(state) => {
            warn!("netlink events were lost; resynced from a fresh dump");
            tracker.reconcile(state);
        }
        Err(e) => error!("netlink resync failed: {e}"),
    }
}
