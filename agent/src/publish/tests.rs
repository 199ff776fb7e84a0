//! The writer's pacing, failures and catching up, against a recording sink on paused time.

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{json, Value};
use tokio::time::Instant;

use super::*;
use crate::registry::Holder;

/// Records every write; fails while `failing` says so.
#[derive(Clone, Default)]
struct Recorder {
    writes: Arc<Mutex<Vec<(Instant, Value)>>>,
    failing: Arc<Mutex<Option<FailureReason>>>,
    attempts: Arc<Mutex<Vec<Instant>>>,
    /// Refuses a status with an orphaned entry, as the API server does with a CRD older than
    /// the state.
    old_crd: Arc<Mutex<bool>>,
}

impl Sink for Recorder {
    async fn write(&mut self, status: &Value) -> Result<(), WriteError> {
        self.attempts.lock().unwrap().push(Instant::now());
        if let Some(reason) = *self.failing.lock().unwrap() {
            return Err(WriteError {
                reason,
                message: "connection refused".into(),
            });
        }
        let orphaned = status["entries"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["state"] == "orphaned"));
        if orphaned && *self.old_crd.lock().unwrap() {
            return Err(WriteError {
                reason: FailureReason::Refused,
                message: "writing NodeQuarantine node-a status: ApiError: NodeQuarantine.ipq.dev \
                          \"node-a\" is invalid: status.entries[0].state: Unsupported value: \
                          \"orphaned\": supported values: \"quarantined\", \"fenced\": Invalid \
                          (ErrorResponse { status: \"Failure\", code: 422 })"
                    .into(),
            });
        }
        self.writes
            .lock()
            .unwrap()
            .push((Instant::now(), status.clone()));
        Ok(())
    }
}

fn quarantined(i: u32) -> PublishedEntry {
    PublishedEntry {
        state: EntryState::Quarantined,
        since: 0,
        until: Some(1),
        holder: Holder::new(i, format!("veth{i}")),
    }
}

fn addr(i: u32) -> IpAddr {
    IpAddr::from([10, 1, (i >> 8) as u8, i as u8])
}

fn listed(status: &Value) -> usize {
    status["entries"].as_array().map_or(0, Vec::len)
}

/// The writer's metrics, in a registry of their own.
fn test_metrics() -> Arc<PublishMetrics> {
    Arc::new(PublishMetrics::register(&prometheus::Registry::new()).expect("metrics register"))
}

/// Lets the writer task run until it waits on time again.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_is_a_few_writes_and_each_change_is_written_within_the_interval() {
    let sink = Recorder::default();
    let (mut feed, metrics, timing) = writer_on(&sink);
    feed.launch();
    settle().await;
    // The first write at once: the object as this agent has it (empty).
    assert_eq!(sink.writes.lock().unwrap().len(), 1);

    // 2000 changes over 2 s (one a millisecond).
    let began = Instant::now();
    for i in 0..2000 {
        feed.send(addr(i), Some(quarantined(i)));
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
    }
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    let writes = sink.writes.lock().unwrap().clone();
    let during: Vec<&(Instant, Value)> = writes.iter().filter(|(at, _)| *at >= began).collect();
    let bound = (2000 / timing.min_interval.as_millis() + 2) as usize;
    assert!(
        during.len() <= bound,
        "{} writes for 2 s of churn; at most {bound}",
        during.len()
    );
    for pair in during.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= timing.min_interval,
            "writes closer than the interval"
        );
    }
    let (last_at, last) = during.last().expect("writes");
    assert_eq!(listed(last), 2000, "the last write carries every change");
    assert_eq!(last["quarantined"], 2000);
    // The last change (at began + 2 s) is in a write no later than one interval after it.
    assert!(*last_at <= began + Duration::from_secs(2) + timing.min_interval);
    assert!(metrics.writes.get() as usize == writes.len());

    // An entry that goes leaves the object at the next write.
    feed.send(addr(7), None);
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    let writes = sink.writes.lock().unwrap();
    let last = &writes.last().unwrap().1;
    assert_eq!(listed(last), 1999);
    assert!(!last["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["address"] == addr(7).to_string()));
    assert_eq!(feed.view().state, PublishState::Published);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_is_retried_with_backoff_counted_shown_and_caught_up() {
    let metrics = test_metrics();
    let sink = Recorder::default();
    *sink.failing.lock().unwrap() = Some(FailureReason::Unreachable);
    let timing = Timing::default();
    let mut feed = start_with(
        "node-a".into(),
        sink.clone(),
        timing,
        metrics.clone(),
        ApiHealth::new(),
    );
    for i in 0..10 {
        feed.send(addr(i), Some(quarantined(i)));
    }
    feed.launch();
    // 20 s of outage, with changes arriving.
    for step in 0..200 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        if step % 20 == 0 {
            feed.send(addr(100 + step), Some(quarantined(100 + step)));
        }
    }
    let attempts = sink.attempts.lock().unwrap().clone();
    // 0.5, 1, 2, 4, 8 s apart: a handful of attempts, not one per change or per interval.
    assert!(
        (4..=7).contains(&attempts.len()),
        "{} attempts in 20 s: {attempts:?}",
        attempts.len()
    );
    for pair in attempts.windows(3) {
        assert!(
            pair[2] - pair[1] >= pair[1] - pair[0],
            "the retries do not back off: {attempts:?}"
        );
    }
    let failures = metrics.failures.with_label_values(&["unreachable"]).get();
    assert_eq!(failures as usize, attempts.len());
    assert_eq!(metrics.writes.get(), 0);
    assert!(metrics.pending_seconds.get() >= 19.0);
    let view = feed.view();
    assert_eq!(view.state, PublishState::Failing);
    assert_eq!(view.failures_total as usize, attempts.len());
    assert!(
        view.last_error
            .as_deref()
            .is_some_and(|e| e.contains("unreachable") && e.contains("connection refused")),
        "{view:?}"
    );
    assert!(view.failing_since.is_some());

    // The API server is back: the next retry carries everything.
    *sink.failing.lock().unwrap() = None;
    tokio::time::advance(timing.max_retry).await;
    settle().await;
    let writes = sink.writes.lock().unwrap();
    assert_eq!(writes.len(), 1, "one write catches up");
    assert_eq!(listed(&writes[0].1), 20);
    let view = feed.view();
    assert_eq!(view.state, PublishState::Published);
    assert_eq!(view.last_error, None);
    assert_eq!(metrics.pending_seconds.get(), 0.0);
}

/// After a minute of outage the backoff is at tens of seconds; the API server's return (seen
/// by the prober or by the projection's calls) ends it: the write follows within
/// `RETURN_SPREAD`, not on the backoff.
#[tokio::test(start_paused = true)]
async fn the_api_servers_return_is_caught_up_at_once_not_on_the_backoff() {
    let metrics = test_metrics();
    let sink = Recorder::default();
    *sink.failing.lock().unwrap() = Some(FailureReason::Unreachable);
    let health = ApiHealth::new();
    let mut feed = start_with(
        "node-a".into(),
        sink.clone(),
        Timing::default(),
        metrics.clone(),
        health.clone(),
    );
    feed.send(addr(1), Some(quarantined(1)));
    feed.launch();
    for _ in 0..600 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert!(health.is_down(), "the writer's failures marked it down");
    let attempts = sink.attempts.lock().unwrap().clone();
    let last = *attempts.last().unwrap();
    assert!(
        attempts.len() <= 9,
        "{} attempts in 60 s: it backs off",
        attempts.len()
    );
    *sink.failing.lock().unwrap() = None;
    let back = Instant::now();
    health.answered();
    while sink.writes.lock().unwrap().is_empty() {
        assert!(
            Instant::now() - back < api_health::RETURN_SPREAD,
            "no write within {:?} of the return (last failed attempt {:?} before it)",
            api_health::RETURN_SPREAD,
            back - last
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        settle().await;
    }
    assert_eq!(listed(&sink.writes.lock().unwrap()[0].1), 1);
    assert!(!health.is_down());
}

/// A kubeconfig naming `server`, with a token (nothing checks it: nothing answers).
fn kubeconfig_for(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
             insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn the_real_client_against_a_closed_port_fails_as_unreachable_naming_the_object() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = kubeconfig_for(dir.path(), &format!("https://127.0.0.1:{port}"));
    let mut sink = KubeSink::new("node-a".into(), Some(path));
    let error = sink
        .write(&serde_json::json!({}))
        .await
        .expect_err("nothing listens");
    assert_eq!(error.reason, FailureReason::Unreachable, "{error}");
    assert!(error.message.contains("Node node-a"), "{error}");

    let mut missing = KubeSink::new("node-a".into(), Some(dir.path().join("absent")));
    let error = missing
        .write(&serde_json::json!({}))
        .await
        .expect_err("no kubeconfig");
    assert_eq!(error.reason, FailureReason::Config, "{error}");
    assert!(error.message.contains("absent"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_quarantine_ending_later_waits_for_a_lazy_write_but_any_other_change_does_not() {
    let metrics = test_metrics();
    let sink = Recorder::default();
    let mut feed = start_with(
        "node-a".into(),
        sink.clone(),
        Timing::default(),
        metrics,
        ApiHealth::new(),
    );
    feed.launch();
    feed.send(addr(1), Some(quarantined(1)));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    let writes = || sink.writes.lock().unwrap().len();
    let before = writes();

    // Stale traffic moves the end later, every 100 ms for 4 s: no write until LAZY_DELAY.
    let moved_at = Instant::now();
    for step in 1..=40u64 {
        let mut later = quarantined(1);
        later.until = Some(1 + step);
        feed.send(addr(1), Some(later));
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(writes(), before, "an end moved later is written lazily");
    while writes() == before && moved_at.elapsed() < writer::LAZY_DELAY * 2 {
        tokio::time::advance(Duration::from_millis(50)).await;
        settle().await;
    }
    let all = sink.writes.lock().unwrap().clone();
    assert_eq!(all.len(), before + 1, "one write for all the moves");
    let (at, last) = all.last().unwrap();
    assert!(*at <= moved_at + writer::LAZY_DELAY + Timing::default().min_interval);
    assert_eq!(listed(last), 1);

    // A new entry is written at once (within the interval).
    feed.send(addr(2), Some(quarantined(2)));
    tokio::time::advance(Timing::default().min_interval).await;
    settle().await;
    assert_eq!(sink.writes.lock().unwrap().len(), before + 2);
}

#[tokio::test(start_paused = true)]
async fn the_first_write_after_a_start_is_the_whole_state_never_an_empty_list() {
    let metrics = test_metrics();
    let sink = Recorder::default();
    let mut feed = start_with(
        "node-a".into(),
        sink.clone(),
        Timing::default(),
        metrics,
        ApiHealth::new(),
    );
    // What the registry holds at start, sent before the writer runs (Publishing::start).
    for i in 0..3 {
        feed.send(addr(i), Some(quarantined(i)));
    }
    settle().await;
    assert!(
        sink.attempts.lock().unwrap().is_empty(),
        "no write before launch"
    );
    feed.launch();
    settle().await;
    let writes = sink.writes.lock().unwrap();
    assert_eq!(writes.len(), 1);
    assert_eq!(
        listed(&writes[0].1),
        3,
        "the first write lists what the node has"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_feed_refuses_a_batch_without_taking_it_counts_it_and_takes_it_once_drained() {
    let sink = Recorder::default();
    let (mut feed, metrics, timing) = writer_on(&sink);
    // The writer is not running: nothing takes the batches.
    for i in 0..FEED_BATCHES as u32 {
        assert!(
            feed.send(addr(i), Some(quarantined(i))),
            "batch {i} refused"
        );
    }
    let refused = feed.send_with(|| panic!("a full feed must not take the caller's changes"));
    assert!(!refused, "a full feed took one more batch: the queue grows");
    assert_eq!(metrics.feed_full.get(), 1);

    // The writer takes every waiting batch at once; the kept change goes on the next offer.
    feed.launch();
    settle().await;
    let extra = FEED_BATCHES as u32;
    assert!(feed.send(addr(extra), Some(quarantined(extra))));
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    let writes = sink.writes.lock().unwrap();
    assert_eq!(listed(&writes.last().unwrap().1), FEED_BATCHES + 1);
    assert_eq!(metrics.feed_full.get(), 1);
}

fn orphan(i: u32) -> PublishedEntry {
    PublishedEntry {
        state: EntryState::Orphaned,
        since: 0,
        until: None,
        holder: Holder::new(i, format!("veth{i}")),
    }
}

fn states(status: &Value) -> Vec<(String, String)> {
    status["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap().to_owned(),
                e["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A writer of node-a's object on `sink` at the default pace, not launched yet; its metrics
/// and pace.
fn writer_on(sink: &Recorder) -> (Feed, Arc<PublishMetrics>, Timing) {
    let metrics = test_metrics();
    let timing = Timing::default();
    let feed = start_with(
        "node-a".into(),
        sink.clone(),
        timing,
        metrics.clone(),
        ApiHealth::new(),
    );
    (feed, metrics, timing)
}

/// What the writer has written once one interval has passed: the last status.
async fn written_after_an_interval(sink: &Recorder, timing: Timing) -> Value {
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    sink.writes.lock().unwrap().last().unwrap().1.clone()
}

/// A writer on `sink` with 10.1.0.2 quarantined, launched and written once; its metrics and
/// pace.
async fn launched_with_one_quarantine(sink: &Recorder) -> (Feed, Arc<PublishMetrics>, Timing) {
    let (mut feed, metrics, timing) = writer_on(sink);
    feed.send(addr(2), Some(quarantined(2)));
    feed.launch();
    settle().await;
    (feed, metrics, timing)
}

#[tokio::test(start_paused = true)]
async fn the_projections_orphans_are_written_beside_the_registrys_entries_and_leave_with_them() {
    let sink = Recorder::default();
    let (feed, _, timing) = launched_with_one_quarantine(&sink).await;
    let orphans = feed.orphans();
    orphans.send_replace(Orphans::new(
        [(addr(1), orphan(1)), (addr(2), orphan(2))].into(),
    ));
    let last = written_after_an_interval(&sink, timing).await;
    assert_eq!(
        states(&last),
        [
            ("10.1.0.1".to_owned(), "orphaned".to_owned()),
            ("10.1.0.2".to_owned(), "quarantined".to_owned())
        ],
        "the registry's entry wins on its address"
    );
    assert_eq!(
        (&last["orphaned"], &last["quarantined"]),
        (&json!(1), &json!(1))
    );
    assert_eq!((feed.view().entries, feed.view().orphaned), (2, 1));

    orphans.send_replace(Orphans::default());
    let last = written_after_an_interval(&sink, timing).await;
    assert_eq!(
        states(&last),
        [("10.1.0.2".to_owned(), "quarantined".to_owned())]
    );
    assert_eq!(feed.view().orphaned, 0);
}

#[tokio::test(start_paused = true)]
async fn a_crd_without_the_orphaned_state_costs_the_orphans_only_shown_and_tried_again_later() {
    let sink = Recorder::default();
    *sink.old_crd.lock().unwrap() = true;
    let (feed, metrics, timing) = launched_with_one_quarantine(&sink).await;
    feed.orphans()
        .send_replace(Orphans::new([(addr(1), orphan(1))].into()));
    tokio::time::advance(timing.min_interval).await;
    settle().await;
    // Refused once, then written without the orphan one interval later, not on a backoff.
    let last = written_after_an_interval(&sink, timing).await;
    assert_eq!(
        states(&last),
        [("10.1.0.2".to_owned(), "quarantined".to_owned())]
    );
    let view = feed.view();
    assert_eq!(view.state, PublishState::Published);
    assert_eq!(view.orphans_withheld, Some(1));
    assert_eq!(view.failures_total, 1);
    assert_eq!(metrics.orphans_withheld.get(), 1);
    assert_eq!(
        metrics.failures.with_label_values(&["refused"]).get(),
        1,
        "the refusal is counted"
    );

    // Other changes go on being written meanwhile, without the orphan.
    feed.send(addr(3), Some(quarantined(3)));
    let last = written_after_an_interval(&sink, timing).await;
    assert_eq!(listed(&last), 2);
    let attempts_before = sink.attempts.lock().unwrap().len();

    // The operator applies the new CRD: the orphan is written within `orphans_retry`.
    *sink.old_crd.lock().unwrap() = false;
    tokio::time::advance(timing.orphans_retry).await;
    settle().await;
    let last = sink.writes.lock().unwrap().last().unwrap().1.clone();
    assert_eq!(
        states(&last)[0],
        ("10.1.0.1".to_owned(), "orphaned".to_owned())
    );
    assert_eq!(feed.view().orphans_withheld, None);
    assert_eq!(metrics.orphans_withheld.get(), 0);
    assert_eq!(
        sink.attempts.lock().unwrap().len(),
        attempts_before + 1,
        "one write tried the orphans again, not one per interval"
    );
}
