use super::*;

const BOOT: &str = "this-boot";
/// One second of CLOCK_BOOTTIME.
const S: u64 = 1_000_000_000;

fn known() -> Known {
    Known::new(
        Records::new(PathBuf::from("/nonexistent/ipam-allocations"), 16),
        Some(BOOT.to_owned()),
    )
}

/// A release stamped at `boottime_ns` of `boot`, with a wall-clock stamp that says nothing
/// of it.
fn release_in(boot: &str, boottime_ns: u64, wall_ms: u64) -> HeldRelease {
    HeldRelease {
        held_at_boot: Some(ipq_api::model::BootStamp {
            boot_id: boot.to_owned(),
            boottime_ns,
        }),
        ..release(wall_ms)
    }
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
    let now = 3_600 * S;
    known.reconcile(
        vec![Spooled {
            path: path.clone(),
            request: release_in(BOOT, now, 1_700_000_000_000),
        }],
        now,
        &metrics,
    );
    assert!(!known.quiet_long_enough(&path, false, now + S, MAX));
    assert!(!known.quiet_long_enough(&path, false, now + 60 * S - 1, MAX));
    assert!(known.quiet_long_enough(&path, false, now + 60 * S, MAX));
    // Seen busy later: counted again from then.
    assert!(!known.quiet_long_enough(&path, true, now + 70 * S, MAX));
    assert!(!known.quiet_long_enough(&path, false, now + 130 * S - 1, MAX));
    assert!(known.quiet_long_enough(&path, false, now + 130 * S, MAX));
}

/// Within one boot the wait counts in CLOCK_BOOTTIME from the release's own stamp: the
/// wall-clock stamp, stepped two hours back or ahead, moves nothing.
#[test]
fn a_wall_clock_step_within_a_boot_releases_nothing_early() {
    let metrics = Metrics::for_tests();
    let wall_now: u64 = 1_700_000_000_000;
    for (name, wall_stamp) in [
        ("stamped 2 h in the wall clock's past", wall_now - 7_200_000),
        (
            "stamped 2 h in the wall clock's future",
            wall_now + 7_200_000,
        ),
    ] {
        let mut known = known();
        let path = PathBuf::from("/x/del-w.json");
        // Handed over at 100 s of this boot; the agent restarted and first saw it at 130 s.
        known.reconcile(
            vec![Spooled {
                path: path.clone(),
                request: release_in(BOOT, 100 * S, wall_stamp),
            }],
            130 * S,
            &metrics,
        );
        assert!(
            !known.quiet_long_enough(&path, false, 160 * S - 1, MAX),
            "{name}: released early"
        );
        assert!(
            known.quiet_long_enough(&path, false, 160 * S, MAX),
            "{name}: max_cooldown from its own stamp, not from the restart"
        );
    }
}

/// Across a reboot (a release stamped in another boot) the boottime stamp belongs to another
/// clock, and the wall clock may have stepped by hours: the whole wait counts from when this
/// releaser first saw the release.
#[test]
fn across_a_reboot_the_whole_wait_counts_from_the_restart() {
    let metrics = Metrics::for_tests();
    let mut known = known();
    let path = PathBuf::from("/x/del-r.json");
    // Stamped at 5000 s of a boot before, whose clock ran far ahead of this one's; a +2 h
    // wall step across the reboot would have made it look long past.
    known.reconcile(
        vec![Spooled {
            path: path.clone(),
            request: release_in("boot-before", 5_000 * S, 1),
        }],
        20 * S,
        &metrics,
    );
    assert!(!known.quiet_long_enough(&path, false, 80 * S - 1, MAX));
    assert!(known.quiet_long_enough(&path, false, 80 * S, MAX));
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
        5 * S,
        &metrics,
    );
    assert!(!known.quiet_long_enough(&path, false, 65 * S - 1, MAX));
    assert!(known.quiet_long_enough(&path, false, 65 * S, MAX));
}

/// A release answered as stored whose file is removed before any scan saw it (the directory
/// removed 0.1 s after a held DEL) is remembered all the same, and written back.
#[test]
fn a_release_removed_before_any_scan_is_written_back_from_its_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state/ipam-releases");
    let metrics = Metrics::for_tests();
    let path = spool::spool(&dir, &release(7)).unwrap();
    let mut known = known();
    known.remember(
        vec![Spooled {
            path: path.clone(),
            request: release(7),
        }],
        S,
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let scanned = spool::pending_of::<HeldRelease>(&dir).unwrap();
    let pending = known.reconcile(scanned, 2 * S, &metrics);
    assert_eq!(pending.len(), 1);
    assert_eq!(metrics.ipam.spool_restored.get(), 1);
    let back = spool::pending_of::<HeldRelease>(&dir).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!((&back[0].path, &back[0].request), (&path, &release(7)));
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
