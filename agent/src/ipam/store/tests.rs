use std::time::Instant;

use tokio::sync::oneshot;

use super::*;
use crate::readiness::NotReady;

fn release(container: &str) -> HeldRelease {
    serde_json::from_value(serde_json::json!({
        "network": "net",
        "cniVersion": "1.0.0",
        "delegateType": "host-local",
        "delegateConf": {"ipam": {"type": "host-local"}},
        "containerId": container,
        "ifname": "eth0",
        "cniPath": "/opt/cni/bin",
        "addresses": ["10.96.0.9"],
    }))
    .expect("a release as ipq-ipam writes it")
}

fn started(dir: PathBuf) -> (ReleaseStore, Handed, Holds, Arc<Metrics>) {
    let (handed, holds) = (Handed::default(), Holds::default());
    let metrics = Metrics::for_tests();
    metrics.readiness.set_started(true);
    let store = ReleaseStore::start(dir, handed.clone(), holds.clone(), metrics.clone()).unwrap();
    (store, handed, holds, metrics)
}

fn stored(
    store: &ReleaseStore,
    release: HeldRelease,
    file: ReleaseFile,
) -> Result<HeldRelease, ApiError> {
    let (reply, answer) = oneshot::channel();
    store.store(StoreRequest {
        release,
        file,
        reply,
    });
    answer.blocking_recv().expect("answered")
}

/// The answer comes once the file is there, and the release is remembered (for the releaser)
/// and held (for `ipq get`) from that moment, with the boot it was stamped in.
#[test]
fn a_release_is_answered_once_written_and_remembered_from_its_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state/ipam-releases");
    let (store, handed, holds, _metrics) = started(dir.clone());
    let answered = stored(&store, release("c1"), ReleaseFile::New).unwrap();
    let stamp = answered
        .held_at_boot
        .clone()
        .expect("stamped with its boot");
    assert_eq!(Some(stamp.boot_id), kernel_clock::boot_id());
    assert!(stamp.boottime_ns > 0 && stamp.boottime_ns <= kernel_clock::boottime_ns());
    let on_disk = spool::pending_of::<HeldRelease>(&dir).unwrap();
    assert_eq!(on_disk.len(), 1);
    assert_eq!(on_disk[0].request, answered);
    let taken = handed.take();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        (&taken[0].path, &taken[0].request),
        (&on_disk[0].path, &answered)
    );
    assert!(handed.take().is_empty(), "taken once");
    assert!(holds.get("10.96.0.9".parse().unwrap()).is_some());
}

/// A runtime repeating its DEL gets the release stored first, with its first time.
#[test]
fn a_recorded_release_stored_twice_keeps_its_first_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state/ipam-releases");
    let (store, handed, _holds, _metrics) = started(dir.clone());
    let path = dir.join("del-net-c1-eth0.json");
    let first = stored(&store, release("c1"), ReleaseFile::Recorded(path.clone())).unwrap();
    let again = stored(&store, release("c1"), ReleaseFile::Recorded(path)).unwrap();
    assert_eq!(first, again);
    assert_eq!(handed.take().len(), 1);
}

/// A state directory that cannot be written: the DEL is answered `unavailable` naming why,
/// readiness says changes cannot be saved, and it clears by itself once a write goes through.
#[test]
fn a_release_that_cannot_be_written_is_unavailable_and_not_ready_until_writes_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    // A file where the state directory should be: every write under it fails.
    std::fs::write(&state, b"").unwrap();
    let (store, handed, _holds, metrics) = started(state.join("ipam-releases"));
    let err = stored(&store, release("c1"), ReleaseFile::New).unwrap_err();
    assert_eq!(err.0.code, ErrorCode::Unavailable);
    assert!(
        err.0.message.contains("storing the release"),
        "{}",
        err.0.message
    );
    assert!(
        handed.take().is_empty(),
        "nothing stored, nothing remembered"
    );
    match metrics.readiness.check() {
        Err(NotReady::Unsaved(why)) => assert!(why.starts_with("ipam releases:"), "{why}"),
        other => panic!("not ready, changes cannot be saved: {other:?}"),
    }
    std::fs::remove_file(&state).unwrap();
    let deadline = Instant::now() + PROBE_EVERY * 5;
    while !metrics.readiness.is_ready() {
        assert!(
            Instant::now() < deadline,
            "still not ready after writes can succeed: {:?}",
            metrics.readiness.check()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !state.join("ipam-releases").join(PROBE).exists(),
        "the probe is removed"
    );
    stored(&store, release("c2"), ReleaseFile::New).expect("stored again");
}
