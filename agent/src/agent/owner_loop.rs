//! The owner loop: one input at a time, each handed to the tracker, then the work every turn
//! owes (a save of what changed, the publisher's changes, the heap's trim).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use log::{error, info, warn};

use super::{
    inputs::{Input, Inputs, Stop},
    spool_replay::drain_spooled,
    waiting::WaitingAnswers,
};
use crate::{
    heap::Trimmer,
    metrics::Metrics,
    netlink,
    tracker::{Durable, Observed, Tracker},
};

/// Longest sleep between two ticks.
const MAX_TICK: Duration = Duration::from_secs(1);

pub(super) struct OwnerLoop {
    pub(super) tracker: Tracker,
    /// The registry's durable copy: saved after every input, answers waiting for it.
    pub(super) durable: Durable,
    pub(super) inputs: Inputs,
    pub(super) metrics: Arc<Metrics>,
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

    /// One input: what the node and the kernel said handed to the tracker, API requests
    /// answered once what they changed is saved, the journal's flushes to the answers waiting
    /// for them.
    async fn handle(&mut self, input: Input) {
        let tracker = &mut self.tracker;
        match input {
            Input::Observed { what, resync } => {
                let tick = matches!(what, Observed::Tick);
                if tick {
                    self.trimmer.on_tick();
                    self.last_tick = Instant::now();
                } else {
                    self.trimmer.on_activity();
                }
                tracker.on_input(what);
                if resync {
                    self::resync(tracker, &self.metrics).await;
                }
            }
            Input::Spooled(dels) => {
                self.trimmer.on_activity();
                // The reader removes the files once the journal holds their drains.
                let answer = drain_spooled(tracker, dels);
                let saved = self.durable.persist_deferred(tracker.journaled());
                self.waiting.after_save(vec![answer], saved);
            }
            Input::Commands(commands) => {
                self.trimmer.on_activity();
                let answers = commands.into_iter().map(|c| tracker.handle(c)).collect();
                // Answered only once what they changed is on disk (the flush runs off this
                // loop); `unavailable`, with the journal's error, when it cannot be.
                let saved = self.durable.persist_deferred(tracker.journaled());
                self.waiting.after_save(answers, saved);
            }
            Input::Synced(reports) => {
                self.trimmer.on_activity();
                for report in reports {
                    self.waiting.on_synced(self.durable.on_synced(report));
                }
            }
        }
    }
}

/// Sleeps until the registry's next deadline or the next attach retry, and at most until
/// `MAX_TICK` after the last tick: the sleep starts again on every input, so a steady stream of
/// inputs less than `MAX_TICK` apart must not put off the periodic work (a failed save's
/// retry, readiness) for ever.
fn tick_delay(tracker: &Tracker, last_tick: Instant) -> Duration {
    tracker
        .until_next_work()
        .unwrap_or(MAX_TICK)
        .min(MAX_TICK.saturating_sub(last_tick.elapsed()))
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
