//! What the registry's owner tells the outside about what happened: each effect and sample
//! turned into its counter, its event-feed entry and, for what an operator must see, its log
//! line (conflicts rate-limited; per-address transitions at DEBUG, the feed has them all).

use std::sync::Arc;

use ipq_common::sample::ConflictSample;
use log::{debug, info, warn};

use super::feed::{EventHub, StreamsClosing};
use crate::{
    api::{
        model::{ConflictView, EventBody},
        views::{conflict_view, sample_body, Outcome, TimeBase},
    },
    metrics::{LostAt, Metrics},
    netdev,
    registry::{Conflict, Holder, StateName},
};

pub struct Observer {
    metrics: Arc<Metrics>,
    /// The API's event feed and recent conflicts.
    feed: EventHub,
    /// The pod Events' writer, when the agent writes them.
    pod_events: Option<crate::pod_events::Feed>,
}

impl Observer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            feed: EventHub::new(),
            pod_events: None,
        }
    }

    /// From now on conflicts, fences and held quarantines also go to `feed` (Events on pods).
    pub fn set_pod_events(&mut self, feed: crate::pod_events::Feed) {
        self.pod_events = Some(feed);
    }

    /// The pod Events' writer, when the agent writes them.
    pub fn pod_events(&self) -> Option<&crate::pod_events::Feed> {
        self.pod_events.as_ref()
    }

    /// The feed, for its subscribers and the recent conflicts.
    pub fn feed(&self) -> &EventHub {
        &self.feed
    }

    /// The agent stops: the feed's streams end once they sent what was published.
    pub fn close_feed(&mut self) -> StreamsClosing {
        self.feed.close()
    }

    /// Publishes one event stamped `at` (RFC 3339).
    pub fn publish(&mut self, at: String, body: EventBody) {
        self.feed.publish(at, body);
    }

    /// Counts, logs (rate-limited) and publishes one conflict.
    pub fn conflict(&mut self, conflict: &Conflict, outcome: Outcome) {
        self.metrics
            .conflicts
            .with_label_values(&[conflict.kind.as_ref()])
            .inc();
        let view: ConflictView = conflict_view(conflict, outcome, &TimeBase::now());
        if self.feed.may_log() {
            let line = serde_json::json!({ "event": "conflict", "conflict": &view });
            warn!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.feed.conflict(view);
        if let Some(events) = &self.pod_events {
            events.conflict(conflict, outcome);
        }
    }

    /// One address changed state.
    pub fn transition(
        &mut self,
        addr: std::net::IpAddr,
        from: StateName,
        to: StateName,
        holder: Option<Holder>,
    ) {
        let shown = holder.as_ref().map(|h| h.to_string()).unwrap_or_default();
        // Per address: the event feed has every one; the log only when asked.
        debug!(target: "ipq::transition", "{addr}: {from} -> {to} {shown}");
        let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
        self.feed.publish(
            at,
            EventBody::Transition {
                address: addr,
                from,
                to,
                holder,
            },
        );
    }

    /// A quarantine ended after `quarantined_for_ns`.
    pub fn released(&self, addr: std::net::IpAddr, quarantined_for_ns: u64) {
        let seconds = quarantined_for_ns as f64 / 1e9;
        self.metrics.quarantine_duration_seconds.observe(seconds);
        debug!("{addr}: released after {seconds:.1}s of quarantine");
    }

    /// Logs (rate-limited) and publishes one kernel sample, seen on `seen_on`, of the address
    /// `holder` holds (or held, for a quarantine).
    pub fn sample(&mut self, sample: &ConflictSample, seen_on: String, holder: Option<Holder>) {
        let time = TimeBase::now();
        let body = sample_body(sample, seen_on, holder);
        if self.feed.may_log() {
            let mut line = serde_json::json!({ "event": "conflict_sample" });
            if let (Some(map), Ok(serde_json::Value::Object(fields))) =
                (line.as_object_mut(), serde_json::to_value(&body))
            {
                map.extend(fields);
                map.insert("at".into(), time.rfc3339(sample.ts_ns).into());
            }
            info!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.feed.publish(time.rfc3339(sample.ts_ns), body);
    }
}
