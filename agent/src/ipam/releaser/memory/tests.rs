use super::*;

fn known() -> Known {
    Known::new(Records::new(
        PathBuf::from("/nonexistent/ipam-allocations"),
        16,
    ))
}

fn release(held_at: u64) -> HeldRelease {
    serde_json::from_value(serde_json::json!({
        "network": "net",
        "cniVersion": "1.0.0",
        "delegateType": "host-local",
        "delegateConf": {"ipam": {"type": "host-local"}},
        "containerId": "c1",
        "ifname": "eth0",
        "cniPath": "/opt/cni/bin",
        "addresses": [],
        "heldAtUnixMs": held_at,
    }))
    .expect("a release as ipq-ipam writes it")
}

const MAX: Duration = Duration::from_secs(60);

/// The bug this replaces: a release without addresses waited `max_cooldown` from the
/// releaser's start, so one handed over to an agent that had run longer than that was freed
/// at once, mid-quarantine.
#[test]
fn an_address_less_release_waits_max_cooldown_from_its_own_time_never_the_tasks_start() {
    let mut known = known();
    let path = PathBuf::from("/x/del-1.json");
    let metrics = Metrics::for_tests();
    // The agent has run for an hour: that counts for nothing.
    let now = 3_600_000;
    known.reconcile(
        vec![Spooled {
            path: path.clone(),
            request: release(now),
        }],
        now,
        &metrics,
    );
    assert!(!known.quiet_long_enough(&path, false, now + 1_000, MAX));
    assert!(!known.quiet_long_enough(&path, false, now + 59_999, MAX));
    assert!(known.quiet_long_enough(&path, false, now + 60_000, MAX));
    // Seen busy later: counted again from then.
    assert!(!known.quiet_long_enough(&path, true, now + 70_000, MAX));
    assert!(!known.quiet_long_enough(&path, false, now + 129_999, MAX));
    assert!(known.quiet_long_enough(&path, false, now + 130_000, MAX));
}

#[test]
fn a_release_without_its_time_waits_from_when_it_was_first_seen() {
    let mut known = known();
    let path = PathBuf::from("/x/del-2.json");
    let metrics = Metrics::for_tests();
    known.reconcile(
        vec![Spooled {
            path: path.clone(),
            request: release(0),
        }],
        5_000,
        &metrics,
    );
    assert!(!known.quiet_long_enough(&path, false, 64_999, MAX));
    assert!(known.quiet_long_enough(&path, false, 65_000, MAX));
}

/// `rm -rf state_dir/ipam-releases` under a running agent: the next scan writes every pending
/// release back, counts and logs it.
#[test]
fn a_removed_spool_directory_is_rebuilt_from_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state/ipam-releases");
    let metrics = Metrics::for_tests();
    let paths: Vec<PathBuf> = (1..=3)
        .map(|n| spool::spool(&dir, &release(n)).unwrap())
        .collect();
    let mut known = known();
    let scanned = spool::pending_of::<HeldRelease>(&dir).unwrap();
    assert_eq!(known.reconcile(scanned, 10, &metrics).len(), 3);

    std::fs::remove_dir_all(&dir).unwrap();
    let scanned = spool::pending_of::<HeldRelease>(&dir).unwrap();
    assert!(scanned.is_empty());
    let pending = known.reconcile(scanned, 20, &metrics);
    assert_eq!(pending.len(), 3);
    assert_eq!(metrics.ipam.spool_restored.get(), 3);
    let back = spool::pending_of::<HeldRelease>(&dir).unwrap();
    let back_paths: Vec<&PathBuf> = back.iter().map(|s| &s.path).collect();
    assert_eq!(back_paths, paths.iter().collect::<Vec<_>>());
    assert_eq!(back[1].request, release(2));

    // One the releaser completed itself is not written back.
    let first = back.into_iter().next().unwrap();
    known.done(first).unwrap();
    let scanned = spool::pending_of::<HeldRelease>(&dir).unwrap();
    assert_eq!(known.reconcile(scanned, 30, &metrics).len(), 2);
    assert_eq!(metrics.ipam.spool_restored.get(), 3);
    assert!(!paths[0].exists());
}
