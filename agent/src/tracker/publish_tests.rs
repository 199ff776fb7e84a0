//! The registry's changes on their way to the NodeQuarantine writer when its feed is full: kept
//! in the registry, coalesced per address, and handed over once there is room.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;

use super::{
    tests::{ip, tracker},
    Observed,
};
use crate::{
    config::EarlyReusePolicy,
    netlink::NetEvent,
    publish::{start_with, Sink, Timing, WriteError, FEED_BATCHES},
};

/// Every status written.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<Value>>>);

impl Sink for Written {
    async fn write(&mut self, status: &Value) -> Result<(), WriteError> {
        self.0.lock().unwrap().push(status.clone());
        Ok(())
    }
}

fn fenced_addresses(status: &Value) -> Vec<String> {
    let mut listed: Vec<String> = status["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["state"] == "fenced")
        .filter_map(|e| e["address"].as_str().map(str::to_owned))
        .collect();
    listed.sort();
    listed
}

/// Lets the spawned writer run until it waits on time again.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Injected: more passes of the owner loop with changes than the feed holds batches, while the
/// writer does not run (a write hanging on the API server). Holds: every pass past the bound is
/// refused and counted, the queue stays at the bound, and once the writer runs again the kept
/// changes (including an address changed again meanwhile) reach the object, none lost.
#[tokio::test(start_paused = true)]
async fn changes_beyond_a_full_feed_stay_in_the_registry_and_are_published_later() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    let written = Written::default();
    let timing = Timing::default();
    let metrics = Arc::new(
        crate::publish::PublishMetrics::register(&prometheus::Registry::new())
            .expect("metrics register"),
    );
    for (ifindex, name) in [(11, "vetha"), (12, "vethb")] {
        t.on_input(Observed::Net(vec![NetEvent::Link {
            ifindex,
            name: name.into(),
        }]));
    }
    t.publishing.start(
        &mut t.core.registry,
        start_with(
            "node-a".into(),
            written.clone(),
            timing,
            metrics.clone(),
            crate::publish::ApiHealth::new(),
        ),
        None,
        None,
    );
    // The writer is spawned but has not run: this test's thread does not yield until below.
    let passes = FEED_BATCHES + 20;
    let mut expected = Vec::new();
    for i in 0..passes {
        let addr = format!("10.9.{}.{}", i / 200, i % 200 + 1);
        t.on_input(Observed::Net(vec![NetEvent::HostRoute {
            addr: ip(&addr),
            ifindex: 11,
        }]));
        // Pod b is given the address while pod a still holds it: a fence, a listed entry.
        t.on_input(Observed::Net(vec![NetEvent::HostRoute {
            addr: ip(&addr),
            ifindex: 12,
        }]));
        t.publish_changes();
        expected.push(addr);
    }
    // The registry held nothing at the start: no batch then.
    let refused = metrics.feed_full.get();
    assert_eq!(refused as usize, passes - FEED_BATCHES, "refused passes");
    assert!(
        t.core.registry.changes().has_published_changes(),
        "the kept changes are gone"
    );

    settle().await;
    t.publish_changes();
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    tokio::time::advance(Duration::from_millis(10)).await;
    settle().await;
    let last = written.0.lock().unwrap().last().cloned().expect("written");
    expected.sort();
    assert_eq!(fenced_addresses(&last), expected, "changes lost: {last}");
    assert!(!t.core.registry.changes().has_published_changes());
}
