use std::time::{Duration, Instant};

use futures::channel::mpsc as source;

use super::*;

/// The resync item of these tests (real items are 1 and up).
const RESYNC: u32 = 0;

fn counter() -> IntCounter {
    Overflows::new().expect("counter").of(Queue::TcNotices)
}

/// Waits (a bounded poll, never a fixed sleep) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_full_queue_drops_counts_and_owes_one_resync_that_takes_the_next_free_slot() {
    let (input, items) = source::unbounded();
    let (tx, mut rx) = mpsc::channel(2);
    let overflows = counter();
    let forwarder = tokio::spawn(forward_or_resync(items, tx, || RESYNC, overflows.clone()));
    for item in 1..=5 {
        input.unbounded_send(item).unwrap();
    }
    // 1 and 2 fill the queue; 3, 4 and 5 are read, dropped and counted while nobody reads.
    until("three overflows", || overflows.get() == 3).await;
    assert_eq!(rx.recv().await, Some(1));
    // The first free slot goes to the resync, before anything that comes after.
    assert_eq!(rx.recv().await, Some(2));
    assert_eq!(rx.recv().await, Some(RESYNC));
    input.unbounded_send(6).unwrap();
    assert_eq!(rx.recv().await, Some(6));
    assert!(rx.try_recv().is_err(), "one resync for the whole burst");
    assert_eq!(overflows.get(), 3);
    drop(input);
    assert_eq!(forwarder.await.unwrap(), Ended::Source);
    assert_eq!(
        rx.recv().await,
        None,
        "the source ended, so did the forwarder"
    );
}

#[tokio::test]
async fn a_resync_owed_when_the_source_ends_is_still_delivered() {
    let (tx, mut rx) = mpsc::channel(1);
    let overflows = counter();
    let forwarder = tokio::spawn(forward_or_resync(
        futures::stream::iter([1, 2, 3]),
        tx,
        || RESYNC,
        overflows.clone(),
    ));
    until("two overflows", || overflows.get() == 2).await;
    assert_eq!(rx.recv().await, Some(1));
    assert_eq!(rx.recv().await, Some(RESYNC));
    assert_eq!(rx.recv().await, None);
    assert_eq!(forwarder.await.unwrap(), Ended::Source);
}

#[tokio::test]
async fn the_forwarder_stops_when_the_loop_is_gone() {
    let (input, items) = source::unbounded();
    let (tx, rx) = mpsc::channel(1);
    let forwarder = tokio::spawn(forward_or_resync(items, tx, || RESYNC, counter()));
    drop(rx);
    input.unbounded_send(1).unwrap();
    assert_eq!(forwarder.await.unwrap(), Ended::Loop);
    assert!(input.is_closed(), "the forwarder dropped its source");
}

#[test]
fn a_worker_waits_for_room_counted_and_loses_nothing() {
    let (tx, mut rx) = mpsc::channel(1);
    let overflows = counter();
    send_or_wait(&tx, 1, &overflows).unwrap();
    let worker = {
        let (tx, overflows) = (tx.clone(), overflows.clone());
        std::thread::spawn(move || send_or_wait(&tx, 2, &overflows))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while overflows.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "the worker never found the queue full"
        );
        std::thread::yield_now();
    }
    assert!(
        !worker.is_finished(),
        "the worker waits while the queue is full"
    );
    assert_eq!(rx.blocking_recv(), Some(1));
    assert_eq!(rx.blocking_recv(), Some(2));
    assert_eq!(worker.join().unwrap(), Ok(()));
    assert_eq!(overflows.get(), 1);
    drop(rx);
    assert_eq!(send_or_wait(&tx, 3, &overflows), Err(Closed));
}

#[test]
fn every_queue_has_its_series_from_the_start() {
    let overflows = Overflows::new().unwrap();
    let registry = Registry::new();
    overflows.register(&registry).unwrap();
    let families = registry.gather();
    let labels: Vec<&str> = families[0]
        .get_metric()
        .iter()
        .map(|m| m.get_label()[0].value())
        .collect();
    assert_eq!(
        labels,
        [
            "attach_reports",
            "hygiene_jobs",
            "hygiene_reports",
            "journal_commits",
            "map_writes",
            "netlink_events",
            "reported_keys",
            "tc_notices"
        ]
    );
}
