//! The registry's conflicts reach the pod Events' writer from where the tracker hands out its
//! effects, with the outcome the datapath has: a fence in an enforced namespace is `IpqFenced`
//! on the old pod, in a namespace only observed it is not (the early reuse is still reported).

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use super::tests::{config, ip, tracker_with};
use crate::{
    config::{EarlyReusePolicy, NamespaceScope},
    datapath::MemTable,
    pod_events::{
        start_with, EventMetrics, EventReason, EventSink, Notice, Pacing, SinkError, MAX_SERIES,
    },
    registry::{Holder, PodRef, Source},
};

#[derive(Clone, Default)]
struct Created(Arc<Mutex<Vec<(String, EventReason, String)>>>);

impl EventSink for Created {
    async fn create(&mut self, notice: &Notice) -> Result<String, SinkError> {
        self.0
            .lock()
            .unwrap()
            .push((notice.pod.name.clone(), notice.reason, notice.note.clone()));
        Ok(notice.pod.name.clone())
    }

    async fn patch(&mut self, _: &str, _: &str, _: u32, _: SystemTime) -> Result<(), SinkError> {
        Ok(())
    }
}

fn holder(ifindex: u32, namespace: &str, pod: &str) -> Holder {
    Holder::new(ifindex, format!("veth{ifindex}")).with_pod(PodRef {
        namespace: namespace.into(),
        name: pod.into(),
        uid: Some(format!("uid-{pod}")),
    })
}

/// An early reuse of 10.0.3.7 in `namespace` under `fence-old`: the Events written.
async fn events_of_an_early_reuse(namespace: &str) -> Vec<(String, EventReason, String)> {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(EarlyReusePolicy::FenceOld);
    config.namespaces = NamespaceScope::Observe(BTreeSet::from(["audit".to_owned()]));
    let mut t = tracker_with(config, dir.path(), MemTable::default());
    let created = Created::default();
    let metrics = Arc::new(EventMetrics::register(&prometheus::Registry::new()).unwrap());
    let pacing = Pacing {
        interval: Duration::from_secs(60),
        max_series: MAX_SERIES,
        forget_after: Duration::from_secs(3600),
    };
    let mut feed = start_with("node-a".into(), created.clone(), pacing, metrics);
    feed.launch();
    t.sinks.observer.set_pod_events(feed);

    let addr = ip("10.0.3.7");
    for (ifindex, pod) in [(11, "web-1"), (12, "web-2")] {
        let effects = t
            .core
            .registry
            .claim(addr, holder(ifindex, namespace, pod), Source::Cni)
            .unwrap();
        t.sinks.apply(&mut t.core, effects);
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let mut events = created.0.lock().unwrap().clone();
    events.sort_by(|a, b| a.0.cmp(&b.0));
    events
}

#[tokio::test(start_paused = true)]
async fn an_early_reuse_in_an_enforced_namespace_is_a_fence_on_the_old_pod() {
    let events = events_of_an_early_reuse("prod").await;
    let reasons: Vec<(&str, EventReason)> =
        events.iter().map(|(p, r, _)| (p.as_str(), *r)).collect();
    assert_eq!(
        reasons,
        [
            ("web-1", EventReason::IpqFenced),
            ("web-2", EventReason::IpqEarlyReuse)
        ],
        "{events:?}"
    );
    assert_eq!(
        events[0].2,
        "traffic from 10.0.3.7 dropped: the address was reused by prod/web-2 on node-a while \
         this pod still runs"
    );
}

#[tokio::test(start_paused = true)]
async fn an_early_reuse_in_an_observed_namespace_is_reported_not_a_fence() {
    let events = events_of_an_early_reuse("audit").await;
    assert_eq!(events.len(), 1, "{events:?}");
    let (pod, reason, note) = &events[0];
    assert_eq!(
        (pod.as_str(), *reason),
        ("web-2", EventReason::IpqEarlyReuse)
    );
    assert!(
        note.ends_with("observed only: nothing is dropped"),
        "{note}"
    );
}
