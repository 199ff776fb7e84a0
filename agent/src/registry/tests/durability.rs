//! Snapshot and restore (the journal's view), and the vocabulary shared with metrics and API.

use super::*;
use strum::VariantArray as _;

// ---- snapshot / restore --------------------------------------------------------------------

fn busy_registry() -> Harness {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.2", h(6).with_netns("/var/run/netns/x"), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.2"), None));
    t.claim("10.0.0.2", h(7), Source::Cni);
    t.claim("fd00::3", h(8), Source::Netlink);
    t.ok(|r| r.lifecycle_mut().holder_gone(8));
    t.advance(20);
    let now = t.now();
    t.ok(|r| r.lifecycle_mut().stale_seen(ip("fd00::3"), now));
    t
}

#[test]
fn snapshot_round_trips_through_json_and_restore() {
    let t = busy_registry();
    let snapshot = t.reg.lifecycle().snapshot();
    assert_eq!(snapshot.version, SNAPSHOT_VERSION);
    let json = serde_json::to_string(&snapshot).unwrap();
    let parsed: Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed, snapshot);

    let mut u = Harness::new(EarlyReusePolicy::FenceOld);
    u.clock.set(t.now());
    let effects = u.ok(|r| r.lifecycle_mut().restore(parsed));
    assert!(effects
        .iter()
        .all(|e| matches!(e, Effect::Upsert { .. } | Effect::Remove { .. })));
    assert_eq!(u.reg.lifecycle().snapshot().records, snapshot.records);
    assert_eq!(
        u.reg.records().datapath_entries(),
        t.reg.records().datapath_entries()
    );
    assert_eq!(
        u.reg.records().indexes().next_deadline(),
        t.reg.records().indexes().next_deadline()
    );
}

#[test]
fn a_quarantine_outlives_a_restart_with_its_original_deadline() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let deadline = t.reg.records().indexes().next_deadline().unwrap();
    t.advance(10);
    let journal = serde_json::to_vec(&t.reg.lifecycle().snapshot()).unwrap();
    // The agent restarts 5 s later with a longer cooldown configured.
    let mut u = Harness::with(RegistrySettings {
        cooldown: Duration::from_secs(60),
        ..settings(EarlyReusePolicy::FenceOld)
    });
    u.clock.set(t.now() + 5 * SEC);
    u.ok(|r| {
        r.lifecycle_mut()
            .restore(serde_json::from_slice(&journal).unwrap())
    });
    assert_eq!(u.reg.records().indexes().next_deadline(), Some(deadline));
    u.clock.set(deadline - 1);
    assert!(u.ok(|r| r.lifecycle_mut().tick()).is_empty());
    u.clock.set(deadline);
    assert_eq!(
        released(&u.ok(|r| r.lifecycle_mut().tick())),
        vec![30 * SEC]
    );
}

#[test]
fn restore_replaces_what_was_there() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.2", h(6), Source::Cni);
    let mut snapshot = t.reg.lifecycle().snapshot();
    snapshot.records.retain(|r| r.addr == ip("10.0.0.2"));
    let effects = t.ok(|r| r.lifecycle_mut().restore(snapshot));
    assert!(effects.contains(&Effect::Remove {
        addr: ip("10.0.0.1")
    }));
    assert_eq!(t.reg.records().len(), 1);
}

fn restore_err(t: &mut Harness, snapshot: Snapshot) -> RegistryError {
    t.run(|r| r.lifecycle_mut().restore(snapshot)).unwrap_err()
}

#[test]
fn restore_refuses_bad_snapshots_and_keeps_the_registry() {
    let mut t = busy_registry();
    let good = t.reg.lifecycle().snapshot();
    let before = t.reg.records().datapath_entries();

    let mut s = good.clone();
    s.version = 99;
    assert_eq!(
        restore_err(&mut t, s),
        RegistryError::UnsupportedSnapshotVersion {
            found: 99,
            supported: SNAPSHOT_VERSION
        }
    );

    let mut s = good.clone();
    s.records.push(s.records[0].clone());
    assert!(matches!(
        restore_err(&mut t, s),
        RegistryError::DuplicateAddress { .. }
    ));

    // The same address spelled as IPv4 and as IPv4-mapped IPv6.
    let mut s = good.clone();
    let mut mapped = s.records[0].clone();
    mapped.addr = ip("::ffff:10.0.0.1");
    s.records.push(mapped);
    assert!(matches!(
        restore_err(&mut t, s),
        RegistryError::DuplicateAddress { .. }
    ));

    let mut s = good.clone();
    for i in 0..9u8 {
        let mut r = s.records[0].clone();
        r.addr = IpAddr::from([10, 1, 0, i]);
        s.records.push(r);
    }
    assert!(matches!(
        restore_err(&mut t, s),
        RegistryError::OverCapacity { capacity: 8, .. }
    ));

    type Spoil = fn(&mut AddrRecord);
    let problems: Vec<(Spoil, RecordProblem)> = vec![
        (|r| r.addr = ip("::"), RecordProblem::UnspecifiedAddress),
        (
            |r| r.contest.set_fenced(Some(h(0))),
            RecordProblem::ZeroIfindex,
        ),
        (
            |r| {
                if let AddrStatus::Active { holder, .. } = &mut r.status {
                    holder.ifindex = 0;
                }
            },
            RecordProblem::ZeroIfindex,
        ),
        (
            |r| {
                r.contest.replace_blocked_claimant(h(5));
            },
            RecordProblem::BlockedIsHolder,
        ),
        (
            |r| {
                r.status = AddrStatus::Quarantined {
                    since: 10,
                    until: 9,
                    last_stale: None,
                    previous: h(5),
                }
            },
            RecordProblem::UntilBeforeSince,
        ),
        (
            |r| {
                r.status = AddrStatus::Active {
                    holder: h(5),
                    since: u64::MAX,
                }
            },
            RecordProblem::SinceInFuture,
        ),
    ];
    for (spoil, problem) in problems {
        let mut s = good.clone();
        assert_eq!(s.records[0].addr, ip("10.0.0.1"));
        spoil(&mut s.records[0]);
        match restore_err(&mut t, s) {
            RegistryError::InvalidRecord { problem: p, .. } => assert_eq!(p, problem),
            other => panic!("{other:?} instead of {problem:?}"),
        }
    }
    assert_eq!(t.reg.records().datapath_entries(), before);
    assert_eq!(t.reg.lifecycle().snapshot().records, good.records);
}

#[test]
fn garbage_journals_do_not_parse() {
    for garbage in [
        "",
        "garbage",
        "{}",
        r#"{"version":1}"#,
        r#"{"version":1,"records":[{"addr":"10.0.0.1"}]}"#,
        r#"{"version":1,"records":[{"addr":"10.0.0.1","state":"bogus"}]}"#,
        r#"{"version":-1,"records":[]}"#,
        r#"{"version":1,"records":[{"addr":"nope","state":"active","holder":{"ifindex":1,"ifname":"a"},"since":1}]}"#,
    ] {
        assert!(
            serde_json::from_str::<Snapshot>(garbage).is_err(),
            "{garbage}"
        );
    }
    let ok = r#"{"version":1,"records":[{"addr":"10.0.0.1","state":"active","holder":{"ifindex":1,"ifname":"a"},"since":1}]}"#;
    let s: Snapshot = serde_json::from_str(ok).unwrap();
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.ok(|r| r.lifecycle_mut().restore(s));
    assert_eq!(t.reg.records().state(ip("10.0.0.1")), StateName::Active);
}

// ---- vocabulary ---------------------------------------------------------------------------

#[test]
fn names_match_the_metric_labels() {
    let kinds: Vec<_> = ConflictKind::VARIANTS.iter().map(|k| k.as_ref()).collect();
    assert_eq!(
        kinds,
        [
            "early_reuse",
            "reuse_in_cooldown",
            "duplicate_source",
            "remote_claim"
        ]
    );
    assert_eq!(StateName::Quarantined.as_ref(), "quarantined");
    assert_eq!(Source::Netlink.as_ref(), "netlink");
    assert_eq!(EarlyReusePolicy::RefuseNew.as_ref(), "refuse-new");
    let conflict = Conflict {
        kind: ConflictKind::EarlyReuse,
        addr: ip("10.0.0.1"),
        old: Some(h(5)),
        new: None,
        policy: EarlyReusePolicy::FenceOld,
        at: 7,
    };
    let json = serde_json::to_value(&conflict).unwrap();
    assert_eq!(json["kind"], "early_reuse");
    assert_eq!(json["policy"], "fence-old");
    assert_eq!(serde_json::from_value::<Conflict>(json).unwrap(), conflict);
}

#[test]
fn settings_come_from_the_config() {
    let config = Config {
        on_early_reuse: EarlyReusePolicy::RefuseNew,
        cooldown: Duration::from_secs(5),
        capacity: 12,
        ..Config::default()
    };
    let s = RegistrySettings::from(&config);
    assert_eq!(s.policy, EarlyReusePolicy::RefuseNew);
    assert_eq!(s.cooldown, Duration::from_secs(5));
    assert_eq!(s.quiet_period, config.quiet_period);
    assert_eq!(s.max_cooldown, config.max_cooldown);
    assert_eq!(s.capacity, 12);
}

#[test]
fn fake_clock_is_shared_and_monotonic() {
    let clock = FakeClock::new(10);
    let other = clock.clone();
    clock.advance(Duration::from_nanos(5));
    assert_eq!(other.now(), 15);
    other.set(3);
    assert_eq!(clock.now(), 15, "never backwards");
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), u64::MAX);
    let system = SystemClock;
    let a = system.now();
    assert!(system.now() >= a);
}

#[test]
fn rebase_carries_the_remaining_quarantine_to_another_clock() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(10);
    let written_at = t.now();
    let mut snapshot = t.reg.lifecycle().snapshot();
    // After a reboot the monotonic clock restarted; the journal was written at what now reads
    // 50 s (the caller works that out from wall-clock time); the agent starts at 52 s.
    let mut u = Harness::new(EarlyReusePolicy::FenceOld);
    u.clock = FakeClock::new(52 * SEC);
    u.reg = Registry::new(settings(EarlyReusePolicy::FenceOld), u.clock.clone());
    snapshot.rebase(written_at, 50 * SEC);
    assert_eq!(snapshot.taken_at, 50 * SEC);
    u.ok(|r| r.lifecycle_mut().restore(snapshot.clone()));
    // 30 s cooldown, 10 s served before the journal was written: ends 20 s after it.
    assert_eq!(u.reg.records().indexes().next_deadline(), Some(70 * SEC));
    // Rebasing back is exact; rebasing below zero clamps.
    snapshot.rebase(50 * SEC, written_at);
    assert_eq!(snapshot.records, t.reg.lifecycle().snapshot().records);
    snapshot.rebase(u64::MAX, 0);
    assert_eq!(snapshot.records[0].status.since(), 0);
}
