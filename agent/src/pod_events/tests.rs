//! The writer as a whole: what the agent's loop hands over, through the aggregation, to a
//! recording sink; and the bodies the API server gets.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use prometheus::Registry;

use super::*;
use crate::{
    config::EarlyReusePolicy,
    registry::{ConflictKind, PodRef},
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Recorded {
    Created {
        namespace: String,
        pod: String,
        reason: EventReason,
        note: String,
    },
    Patched {
        event: String,
        count: u32,
    },
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Recorded>>>);

impl Recorder {
    fn writes(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().clone()
    }
}

impl EventSink for Recorder {
    async fn create(&mut self, notice: &Notice) -> Result<String, SinkError> {
        self.0.lock().unwrap().push(Recorded::Created {
            namespace: notice.pod.namespace.clone(),
            pod: notice.pod.name.clone(),
            reason: notice.reason,
            note: notice.note.clone(),
        });
        Ok(format!("{}.{}", notice.pod.name, notice.reason))
    }

    async fn patch(
        &mut self,
        _namespace: &str,
        event: &str,
        count: u32,
        _last_observed: SystemTime,
    ) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(Recorded::Patched {
            event: event.to_owned(),
            count,
        });
        Ok(())
    }
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
    }
}

fn early_reuse() -> Conflict {
    Conflict {
        kind: ConflictKind::EarlyReuse,
        addr: "10.0.3.7".parse().unwrap(),
        old: Some(Holder::new(7, "veth-old").with_pod(pod("web-1"))),
        new: Some(Holder::new(8, "veth-new").with_pod(pod("web-2"))),
        policy: EarlyReusePolicy::FenceOld,
        at: 1,
    }
}

fn metrics() -> (Registry, Arc<EventMetrics>) {
    let registry = Registry::new();
    let metrics = Arc::new(EventMetrics::register(&registry).unwrap());
    (registry, metrics)
}

fn counter(metrics: &prometheus::IntCounterVec, label: &str) -> u64 {
    metrics.with_label_values(&[label]).get()
}

async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_early_reuses_are_two_events_and_their_series() {
    let (_registry, metrics) = metrics();
    let recorder = Recorder::default();
    let pacing = Pacing {
        interval: Duration::from_secs(60),
        max_series: MAX_SERIES,
        forget_after: FORGET_AFTER,
    };
    let mut feed = start_with("node-a".into(), recorder.clone(), pacing, metrics.clone());
    feed.launch();
    for _ in 0..1000 {
        feed.conflict(&early_reuse(), Outcome::FencedOld);
        // The loop hands over faster than a real API server answers, but within the queue.
        if feed.happenings.capacity() < 8 {
            settle().await;
        }
    }
    settle().await;
    let writes = recorder.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(writes.contains(&Recorded::Created {
        namespace: "default".into(),
        pod: "web-1".into(),
        reason: EventReason::IpqFenced,
        note: "traffic from 10.0.3.7 dropped: the address was reused by default/web-2 on node-a \
               while this pod still runs"
            .into(),
    }));
    assert!(writes.iter().any(|w| matches!(
        w,
        Recorded::Created { pod, reason: EventReason::IpqEarlyReuse, note, .. }
            if pod == "web-2" && note.contains("default/web-1 on node-a still runs")
    )));
    assert_eq!(counter(&metrics.aggregated, "IpqFenced"), 999);
    assert_eq!(counter(&metrics.aggregated, "IpqEarlyReuse"), 999);
    assert_eq!(counter(&metrics.dropped, "queue_full"), 0);

    tokio::time::sleep(Duration::from_secs(61)).await;
    settle().await;
    let patches: Vec<_> = recorder.writes().into_iter().skip(2).collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    for patch in &patches {
        assert!(
            matches!(patch, Recorded::Patched { count: 1000, .. }),
            "{patch:?}"
        );
    }
    assert_eq!(counter(&metrics.emitted, "IpqFenced"), 2);
    assert_eq!(counter(&metrics.emitted, "IpqEarlyReuse"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_and_counts() {
    let (_registry, metrics) = metrics();
    let pacing = Pacing {
        interval: Duration::from_secs(60),
        max_series: MAX_SERIES,
        forget_after: FORGET_AFTER,
    };
    // Not launched: nothing takes from the queue.
    let feed = start_with(
        "node-a".into(),
        Recorder::default(),
        pacing,
        metrics.clone(),
    );
    for _ in 0..QUEUE + 10 {
        feed.conflict(&early_reuse(), Outcome::FencedOld);
    }
    assert_eq!(counter(&metrics.dropped, "queue_full"), 10);
}

#[test]
fn what_names_no_pod_takes_no_place_in_the_queue() {
    let (_registry, metrics) = metrics();
    let pacing = Pacing {
        interval: Duration::from_secs(60),
        max_series: MAX_SERIES,
        forget_after: FORGET_AFTER,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let feed = start_with("node-a".into(), Recorder::default(), pacing, metrics);
    let mut bare = early_reuse();
    bare.old = Some(Holder::new(7, "veth-old"));
    bare.new = Some(Holder::new(8, "veth-new"));
    feed.conflict(&bare, Outcome::FencedOld);
    assert_eq!(feed.happenings.capacity(), QUEUE);
}

#[test]
fn the_event_regards_the_pod_and_names_ipq_and_the_node() {
    let notice = Notice {
        pod: pod("web-1"),
        reason: EventReason::IpqFenced,
        note: "x".repeat(2000),
        observed_at: SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
    };
    let name = event_name(&notice);
    assert_eq!(name, "web-1.17979cfe3d85ca00");
    let body = event_body(&notice, "node-a", &name);
    assert_eq!(body["apiVersion"], "events.k8s.io/v1");
    assert_eq!(body["metadata"]["namespace"], "default");
    assert_eq!(body["regarding"]["kind"], "Pod");
    assert_eq!(body["regarding"]["name"], "web-1");
    assert_eq!(body["regarding"]["uid"], "uid-web-1");
    assert_eq!(body["reportingController"], "ipq.dev/agent");
    assert_eq!(body["reportingInstance"], "node-a");
    assert_eq!(body["reason"], "IpqFenced");
    assert_eq!(body["action"], "Fence");
    assert_eq!(body["type"], "Warning");
    assert_eq!(body["eventTime"], "2023-11-14T22:13:20.123456Z");
    assert_eq!(body["note"].as_str().unwrap().len(), 1024);
    let patch = series_patch(
        1000,
        SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
    );
    assert_eq!(patch["series"]["count"], 1000);
    assert_eq!(
        patch["series"]["lastObservedTime"],
        "2023-11-14T22:13:20.123456Z"
    );
}

/// A sink whose every write fails as an API server that refuses (RBAC) would.
#[derive(Clone, Default)]
struct Refusing(Arc<Mutex<u32>>);

impl EventSink for Refusing {
    async fn create(&mut self, _notice: &Notice) -> Result<String, SinkError> {
        *self.0.lock().unwrap() += 1;
        Err(SinkError::Failed(crate::publish::WriteError {
            reason: crate::publish::FailureReason::Refused,
            message: "forbidden".into(),
        }))
    }

    async fn patch(&mut self, _: &str, _: &str, _: u32, _: SystemTime) -> Result<(), SinkError> {
        unreachable!("nothing was created")
    }
}

#[tokio::test(start_paused = true)]
async fn a_refusing_api_server_is_counted_and_waited_out_not_hammered() {
    let (_registry, metrics) = metrics();
    let refusing = Refusing::default();
    let pacing = Pacing {
        interval: Duration::from_secs(60),
        max_series: MAX_SERIES,
        forget_after: FORGET_AFTER,
    };
    let mut feed = start_with("node-a".into(), refusing.clone(), pacing, metrics.clone());
    feed.launch();
    // Each conflict is two notices (the fenced pod, the new holder).
    for _ in 0..10 {
        feed.conflict(&early_reuse(), Outcome::FencedOld);
    }
    settle().await;
    assert_eq!(
        *refusing.0.lock().unwrap(),
        1,
        "one attempt, then the backoff: what follows within it is not written"
    );
    assert_eq!(counter(&metrics.failed, "refused"), 1);
    assert_eq!(counter(&metrics.dropped, "backoff"), 19);
    assert_eq!(counter(&metrics.emitted, "IpqFenced"), 0);
    // After the backoff the next occurrence is tried again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    feed.conflict(&early_reuse(), Outcome::FencedOld);
    settle().await;
    assert_eq!(*refusing.0.lock().unwrap(), 2);
    assert_eq!(counter(&metrics.failed, "refused"), 2);
}
