//! The datapath writer's refused writes, through the tracker: kept pending, retried on every
//! tick, counted, shown, blocking readiness, and a claim whose own entry was refused answered
//! `unavailable`. The refusal is the in-memory map's own: full, as the kernel's hash map is
//! full at its `max_entries` (the privileged test `tests/tests/write_retry.rs` fills the real
//! one from another process).

use tokio::sync::oneshot;

use super::{
    tests::{claim, config, ip, tracker_with},
    Observed, Tracker,
};
use crate::{
    api::{command::Command, model::ErrorCode},
    config::EarlyReusePolicy,
    datapath::MemTable,
    readiness::NotReady,
    registry::StateName,
};
use ipq_api::MapWrite;
use ipq_common::addr::AddrKey;

/// A tracker over a map with room for `size` entries, started (ready once nothing blocks).
fn tracker_over_a_map_of(size: usize, dir: &std::path::Path) -> Tracker {
    let table = MemTable {
        capacity: Some(size),
        ..MemTable::default()
    };
    let t = tracker_with(config(EarlyReusePolicy::FenceOld), dir, table);
    t.metrics.readiness.set_started(true);
    t
}

fn release(t: &mut Tracker, addr: &str) {
    let (reply, mut answer) = oneshot::channel();
    let answer_fn = t.handle(Command::Release {
        addr: ip(addr),
        force: true,
        reply,
    });
    // Saved, as far as this test goes: what it looks at is the datapath writer.
    answer_fn(Ok(()));
    answer
        .try_recv()
        .expect("answered")
        .expect("the release is done");
}

fn failures(t: &Tracker, op: MapWrite) -> u64 {
    t.metrics
        .writes
        .failures
        .with_label_values(&[op.as_ref()])
        .get()
}

fn in_map(t: &Tracker, addr: &str) -> bool {
    t.sinks
        .enforcer
        .port()
        .table()
        .get(&AddrKey::from(ip(addr)))
        .is_some()
}

#[test]
fn a_refused_write_is_retried_every_tick_and_blocks_readiness_and_its_claim_until_through() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker_over_a_map_of(1, dir.path());
    claim(&mut t, "10.0.0.1").expect("the first address fits");
    assert!(t.metrics.readiness.is_ready());

    // The map is full: the second claim is in the registry, its entry is not in the map, and
    // the claim says so instead of `ok`.
    let error = claim(&mut t, "10.0.0.2").unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unavailable, "{}", error.0.message);
    assert!(
        error.0.message.contains("refused its datapath entry") && error.0.message.contains("full"),
        "{}",
        error.0.message
    );
    assert_eq!(error.0.address, Some(ip("10.0.0.2")));
    assert_eq!(
        t.core.registry.records().state(ip("10.0.0.2")),
        StateName::Active
    );
    assert!(!in_map(&t, "10.0.0.2"));
    assert_eq!(failures(&t, MapWrite::Update), 1);
    assert_eq!(t.metrics.writes.pending.get(), 1);
    match t.metrics.readiness.check() {
        Err(NotReady::DatapathWrites(why)) => {
            assert!(why.contains("10.0.0.2") && why.contains("update"), "{why}")
        }
        other => panic!("readiness with a pending write: {other:?}"),
    }
    let status = t.api().status();
    assert!(!status.ready);
    assert_eq!(status.datapath_writes_pending, 1);
    assert_eq!(status.pending_writes[0].address, ip("10.0.0.2"));
    assert_eq!(status.pending_writes[0].op, MapWrite::Update);
    let view = t.api().get(ip("10.0.0.2")).unwrap();
    let pending = view
        .pending_write
        .expect("the view says the write is pending");
    assert_eq!((pending.op, pending.failures), (MapWrite::Update, 1));
    assert!(t.api().get(ip("10.0.0.1")).unwrap().pending_write.is_none());

    // Every tick retries it; each refusal is counted; the same claim is still unavailable.
    t.on_input(Observed::Tick);
    t.on_input(Observed::Tick);
    assert_eq!(failures(&t, MapWrite::Update), 3);
    assert!(!in_map(&t, "10.0.0.2"));
    let error = claim(&mut t, "10.0.0.2").unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unavailable);

    // Room again: the next tick writes it, and everything says so.
    release(&mut t, "10.0.0.1");
    assert!(!in_map(&t, "10.0.0.1"));
    t.on_input(Observed::Tick);
    assert!(in_map(&t, "10.0.0.2"));
    assert_eq!(t.metrics.writes.pending.get(), 0);
    assert!(t.metrics.readiness.is_ready());
    assert_eq!(t.api().status().datapath_writes_pending, 0);
    assert!(t.api().get(ip("10.0.0.2")).unwrap().pending_write.is_none());
    let answered = claim(&mut t, "10.0.0.2").expect("the claim, now enforced");
    assert_eq!(answered.addresses[0].state, StateName::Active);
    // Nothing left to retry: a tick counts nothing more.
    t.on_input(Observed::Tick);
    assert_eq!(failures(&t, MapWrite::Update), 3);
}

#[test]
fn a_pending_write_the_registry_no_longer_wants_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker_over_a_map_of(1, dir.path());
    claim(&mut t, "10.0.0.1").unwrap();
    claim(&mut t, "10.0.0.2").unwrap_err();
    assert_eq!(t.metrics.writes.pending.get(), 1);
    // The refused address is released: its delete finds nothing to delete, and nothing of it
    // pends any more (a free address is what the map already says of it).
    release(&mut t, "10.0.0.2");
    assert_eq!(
        t.core.registry.records().state(ip("10.0.0.2")),
        StateName::Free
    );
    assert_eq!(t.metrics.writes.pending.get(), 0);
    assert!(t.metrics.readiness.is_ready());
    assert!(
        t.api().get(ip("10.0.0.2")).is_err(),
        "free, and nothing pending"
    );
    t.on_input(Observed::Tick);
    assert_eq!(failures(&t, MapWrite::Update), 1);
    assert_eq!(failures(&t, MapWrite::Delete), 0);
}
