//! The tracker's publications (its feed): the API's event feed (a backlog plus a live broadcast), the
//! recent conflicts, and the rate limit on conflict log lines, whose excess is counted rather
//! than written.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use tokio::sync::{broadcast, mpsc};

use crate::api::{
    command::{Subscription, RECENT_CONFLICTS},
    model::{ConflictView, Event, EventBody},
};

/// Events kept for a new subscriber and for `ipq events` without `--follow`.
pub const BACKLOG: usize = 256;
/// Live events a subscriber may fall behind by before it loses some (and is told how many).
const LIVE_BUFFER: usize = 4096;

/// Conflict log lines: a burst of this many, then this many per second.
const LOG_BURST: f64 = 200.0;
const LOG_PER_SECOND: f64 = 50.0;

pub struct EventHub {
    next_seq: u64,
    backlog: VecDeque<Event>,
    conflicts: VecDeque<ConflictView>,
    live: broadcast::Sender<Event>,
    /// Each open stream holds a clone ([`Subscription::open`]); the receiver learns when the
    /// last one ended.
    streams: (mpsc::Sender<()>, mpsc::Receiver<()>),
    log_tokens: f64,
    log_refilled: Instant,
}

/// The event streams of a stopping agent: each sends what was published before the stop, then
/// ends ([`EventHub::close`]).
pub struct StreamsClosing(mpsc::Receiver<()>);

impl StreamsClosing {
    /// Waits until every stream ended, at most `bound` (a follower that reads nothing must not
    /// hold the stop); whether they all did.
    pub async fn ended_within(mut self, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.0.recv()).await.is_ok()
    }
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

impl EventHub {
    pub fn new() -> Self {
        Self {
            next_seq: 1,
            backlog: VecDeque::with_capacity(BACKLOG),
            conflicts: VecDeque::with_capacity(RECENT_CONFLICTS),
            live: broadcast::channel(LIVE_BUFFER).0,
            streams: mpsc::channel(1),
            log_tokens: LOG_BURST,
            log_refilled: Instant::now(),
        }
    }

    /// Publishes one event at wall-clock time `at`.
    pub fn publish(&mut self, at: String, body: EventBody) {
        let event = Event {
            seq: self.next_seq,
            at,
            body,
        };
        self.next_seq += 1;
        if self.backlog.len() == BACKLOG {
            self.backlog.pop_front();
        }
        self.backlog.push_back(event.clone());
        // No subscriber is no error: the backlog keeps what a later one needs.
        let _ = self.live.send(event);
    }

    /// Records a conflict for `GET /v1/conflicts` and publishes it.
    pub fn conflict(&mut self, view: ConflictView) {
        if self.conflicts.len() == RECENT_CONFLICTS {
            self.conflicts.pop_front();
        }
        self.conflicts.push_back(view.clone());
        // The event carries the time once, as its own `at` (see `ConflictView::at`).
        let mut view = view;
        let at = std::mem::take(&mut view.at);
        self.publish(at, EventBody::Conflict(Box::new(view)));
    }

    /// The last `limit` conflicts, oldest first.
    pub fn recent_conflicts(&self, limit: usize) -> Vec<ConflictView> {
        let skip = self.conflicts.len().saturating_sub(limit);
        self.conflicts.iter().skip(skip).cloned().collect()
    }

    pub fn subscribe(&self) -> Subscription {
        Subscription {
            backlog: self.backlog.iter().cloned().collect(),
            live: self.live.subscribe(),
            open: self.streams.0.clone(),
        }
    }

    /// The agent stops: every open stream is told the feed ends once it has sent what was
    /// published (its live receiver closes), and the answer says when all have. Later
    /// subscribers (none: the API stopped first) would get the backlog alone.
    pub fn close(&mut self) -> StreamsClosing {
        let (open, ended) = mpsc::channel(1);
        self.live = broadcast::channel(LIVE_BUFFER).0;
        let (own, ended_before) = std::mem::replace(&mut self.streams, (open, ended));
        // Only the streams' tokens remain.
        drop(own);
        StreamsClosing(ended_before)
    }

    /// Whether one more conflict log line fits the rate limit now.
    pub fn may_log(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.log_refilled).as_secs_f64() * LOG_PER_SECOND;
        self.log_tokens = (self.log_tokens + refill).min(LOG_BURST);
        self.log_refilled = now;
        if self.log_tokens >= 1.0 {
            self.log_tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(n: u64) -> EventBody {
        EventBody::Lost { n }
    }

    #[test]
    fn backlog_keeps_the_latest_events_in_order() {
        let mut hub = EventHub::new();
        for n in 0..(BACKLOG as u64 + 10) {
            hub.publish("t".into(), lost(n));
        }
        let sub = hub.subscribe();
        assert_eq!(sub.backlog.len(), BACKLOG);
        assert_eq!(sub.backlog[0].seq, 11);
        assert_eq!(sub.backlog.last().unwrap().seq, BACKLOG as u64 + 10);
    }

    #[test]
    fn a_subscriber_sees_what_comes_after_its_backlog() {
        let mut hub = EventHub::new();
        hub.publish("t".into(), lost(1));
        let mut sub = hub.subscribe();
        hub.publish("t".into(), lost(2));
        assert_eq!(sub.backlog.len(), 1);
        assert_eq!(sub.live.try_recv().unwrap().seq, 2);
    }

    /// At the stop, a follower takes every event published before it, then its stream ends;
    /// the stop learns that only once the stream let go of the feed, and not at all while a
    /// stream stays open.
    #[tokio::test(start_paused = true)]
    async fn a_closed_feed_ends_each_stream_after_what_was_published() {
        let mut hub = EventHub::new();
        let mut follower = hub.subscribe();
        let idle = hub.subscribe();
        hub.publish("t".into(), lost(1));
        hub.publish("t".into(), lost(2));
        let mut closing = hub.close();
        assert_eq!(follower.live.recv().await.unwrap().seq, 1);
        assert_eq!(follower.live.recv().await.unwrap().seq, 2);
        assert!(matches!(
            follower.live.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        drop(follower);
        // A stream still open holds the stop to its bound.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), closing.0.recv())
                .await
                .is_err(),
            "a stream is still open"
        );
        drop(idle);
        assert!(closing.ended_within(Duration::from_secs(1)).await);
        // What the stop published after closing is still kept for the backlog.
        hub.publish("t".into(), lost(3));
        assert_eq!(hub.subscribe().backlog.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_feed_without_streams_has_ended() {
        let mut hub = EventHub::new();
        drop(hub.subscribe());
        assert!(hub.close().ended_within(Duration::from_secs(1)).await);
        let open = hub.subscribe();
        assert!(!hub.close().ended_within(Duration::from_millis(10)).await);
        drop(open);
    }

    #[test]
    fn a_conflict_event_names_its_time_once_and_reads_back() {
        use crate::registry::{ConflictKind, Holder};
        let mut hub = EventHub::new();
        let view = ConflictView {
            kind: ConflictKind::EarlyReuse,
            address: "10.0.0.1".parse().unwrap(),
            old_holder: Some(Holder::new(2, "veth0")),
            new_holder: Some(Holder::new(3, "veth1")),
            policy: crate::config::EarlyReusePolicy::FenceOld,
            outcome: ipq_api::ConflictOutcome::FencedOld,
            at: "2026-11-22T10:00:00Z".into(),
        };
        hub.conflict(view.clone());
        assert_eq!(hub.recent_conflicts(1), [view]);
        let event = hub.subscribe().backlog.remove(0);
        assert_eq!(event.at, "2026-11-22T10:00:00Z");
        let line = serde_json::to_string(&event).unwrap();
        assert_eq!(line.matches("\"at\":").count(), 1, "{line}");
        let back: Event = serde_json::from_str(&line).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn log_lines_past_the_burst_are_refused() {
        let mut hub = EventHub::new();
        let allowed = (0..1000).filter(|_| hub.may_log()).count();
        // The burst, plus whatever trickled in while the loop ran.
        assert!((200..260).contains(&allowed), "{allowed}");
    }
}
