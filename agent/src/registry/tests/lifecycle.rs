//! Free → Active → Draining → Quarantined → Free, adaptive release, release and capacity.

use super::*;

// ---- Free → Active ----------------------------------------------------------------------

#[test]
fn claim_of_a_free_address_makes_it_active() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    let effects = t.claim("10.0.0.1", h(5), Source::Cni);
    let entry = AddrEntry::new(AddrState::Active, 5, START);
    assert_eq!(
        effects,
        vec![
            Effect::Upsert {
                addr: ip("10.0.0.1"),
                entry
            },
            Effect::Transition {
                addr: ip("10.0.0.1"),
                from: StateName::Free,
                to: StateName::Active,
                holder: Some(h(5)),
            },
        ]
    );
    let record = t.record("10.0.0.1");
    assert_eq!(
        record.status,
        AddrStatus::Active {
            holder: h(5),
            since: START
        }
    );
    assert_eq!(
        (
            record.fenced().cloned(),
            record.blocked_claimant().cloned(),
            record.conflicts
        ),
        (None, None, 0)
    );
    assert_eq!(t.reg.records().len(), 1);
    assert_eq!(t.reg.records().state(ip("10.0.0.2")), StateName::Free);
}

#[test]
fn claim_by_the_same_holder_is_idempotent_and_fills_in_identity() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Netlink);
    t.advance(1);
    assert!(t.claim("10.0.0.1", h(5), Source::Netlink).is_empty());
    let richer = h(5).with_container_id("c0ffee").with_pod(PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: Some("u-1".into()),
    });
    assert!(t.claim("10.0.0.1", richer.clone(), Source::Cni).is_empty());
    let record = t.record("10.0.0.1");
    assert_eq!(
        record.status,
        AddrStatus::Active {
            holder: richer,
            since: START
        },
        "identity merged, since unchanged"
    );
    // Known identity is never overwritten by a poorer observation.
    assert!(t.claim("10.0.0.1", h(5), Source::Netlink).is_empty());
    assert_eq!(
        t.record("10.0.0.1").status.holder().unwrap().container_id(),
        Some("c0ffee")
    );
}

#[test]
fn holders_are_the_same_by_ifindex_and_container_id() {
    assert!(h(5).same_as(&h(5).with_container_id("a")));
    assert!(h(5)
        .with_container_id("a")
        .same_as(&h(5).with_container_id("a")));
    assert!(!h(5)
        .with_container_id("a")
        .same_as(&h(5).with_container_id("b")));
    assert!(!h(5).same_as(&h(6)));
}

#[test]
fn ipv4_mapped_ipv6_is_the_same_address_as_ipv4() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    assert!(t.claim("::ffff:10.0.0.1", h(5), Source::Netlink).is_empty());
    assert_eq!(t.reg.records().len(), 1);
    assert!(t.reg.records().get(ip("::ffff:10.0.0.1")).is_some());
}

#[test]
fn ipv6_addresses_are_tracked_like_ipv4() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("fd00::1", h(5), Source::Netlink);
    t.claim("10.0.0.1", h(5), Source::Netlink);
    let effects = t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert_eq!(transitions(&effects).len(), 2);
    assert_eq!(t.reg.records().indexes().count(StateName::Quarantined), 2);
}

#[test]
fn claims_of_unusable_addresses_or_holders_are_refused() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    let unspecified = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    assert!(matches!(
        t.run(|r| r.claim(unspecified, h(5), Source::Cni)),
        Err(RegistryError::InvalidAddress { .. })
    ));
    assert!(matches!(
        t.run(|r| r.claim(ip("0.0.0.0"), h(5), Source::Cni)),
        Err(RegistryError::InvalidAddress { .. })
    ));
    assert!(matches!(
        t.run(|r| r.claim(ip("10.0.0.1"), h(NO_IFINDEX), Source::Cni)),
        Err(RegistryError::InvalidHolder { .. })
    ));
    assert!(t.reg.records().is_empty());
}

// ---- Active → Draining ------------------------------------------------------------------

#[test]
fn drain_makes_an_active_address_draining_and_keeps_its_traffic() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.advance(3);
    let effects = t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), Some(&h(5))));
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Active, StateName::Draining)]
    );
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Draining, 5, START + 3 * SEC),
        "holder's traffic flows: holder set, nothing fenced"
    );
    // Idempotent, with or without a holder.
    t.advance(1);
    assert!(t
        .ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None))
        .is_empty());
    assert!(t
        .ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), Some(&h(5))))
        .is_empty());
    assert_eq!(t.record("10.0.0.1").status.since(), START + 3 * SEC);
}

#[test]
fn drain_of_an_unknown_address_is_not_found() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    assert_eq!(
        t.run(|r| r.lifecycle_mut().drain(ip("10.0.0.9"), None)),
        Err(RegistryError::NotFound {
            addr: ip("10.0.0.9")
        })
    );
}

#[test]
fn drain_by_someone_else_is_not_holder() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    let err = t
        .run(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), Some(&h(6))))
        .unwrap_err();
    assert!(matches!(err, RegistryError::NotHolder { .. }), "{err}");
    assert!(err.to_string().contains("is not its holder"), "{err}");
    let other_container = h(5).with_container_id("x");
    t.claim("10.0.0.2", h(7).with_container_id("y"), Source::Cni);
    assert!(matches!(
        t.run(|r| r
            .lifecycle_mut()
            .drain(ip("10.0.0.2"), Some(&other_container))),
        Err(RegistryError::NotHolder { .. })
    ));
    assert_eq!(t.record("10.0.0.1").state(), StateName::Active);
}

#[test]
fn drain_of_a_quarantined_address_is_a_no_op() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert!(t
        .ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), Some(&h(5))))
        .is_empty());
    assert_eq!(t.record("10.0.0.1").state(), StateName::Quarantined);
}

#[test]
fn draining_holder_claiming_again_explicitly_is_active_but_not_on_netlink() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    // A netlink resync still listing its route changes nothing.
    assert!(t.claim("10.0.0.1", h(5), Source::Netlink).is_empty());
    assert_eq!(t.record("10.0.0.1").state(), StateName::Draining);
    t.advance(2);
    let effects = t.claim("10.0.0.1", h(5), Source::Api);
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Draining, StateName::Active)]
    );
    assert_eq!(t.record("10.0.0.1").status.since(), START + 2 * SEC);
}

// ---- holder gone → Quarantined → Free -----------------------------------------------------

#[test]
fn holder_gone_quarantines_every_address_it_held() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("fd00::1", h(5), Source::Cni);
    t.claim("10.0.0.2", h(6), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("fd00::1"), None));
    t.advance(4);
    let gone_at = t.now();
    let effects = t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let mut moves = transitions(&effects);
    moves.sort();
    assert_eq!(
        moves,
        vec![
            (StateName::Active, StateName::Quarantined),
            (StateName::Draining, StateName::Quarantined)
        ]
    );
    for addr in ["10.0.0.1", "fd00::1"] {
        assert_eq!(
            t.record(addr).status,
            AddrStatus::Quarantined {
                since: gone_at,
                until: gone_at + 30 * SEC,
                last_stale: None,
                previous: h(5)
            }
        );
        assert_eq!(
            t.entry(addr),
            AddrEntry::new(AddrState::Quarantined, NO_IFINDEX, gone_at)
        );
    }
    assert_eq!(t.record("10.0.0.2").state(), StateName::Active);
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(gone_at + 30 * SEC)
    );
    // Unknown and zero interfaces touch nothing.
    assert!(t.ok(|r| r.lifecycle_mut().holder_gone(99)).is_empty());
    assert!(t
        .ok(|r| r.lifecycle_mut().holder_gone(NO_IFINDEX))
        .is_empty());
    assert!(
        t.ok(|r| r.lifecycle_mut().holder_gone(5)).is_empty(),
        "gone twice"
    );
}

#[test]
fn quarantine_ends_after_the_cooldown() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(START + 30 * SEC)
    );
    t.advance(29);
    assert!(t.ok(|r| r.lifecycle_mut().tick()).is_empty());
    t.advance(1);
    let effects = t.ok(|r| r.lifecycle_mut().tick());
    assert!(effects.contains(&Effect::Remove {
        addr: ip("10.0.0.1")
    }));
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Quarantined, StateName::Free)]
    );
    assert_eq!(released(&effects), vec![30 * SEC]);
    assert!(t.reg.records().is_empty());
    assert_eq!(t.reg.records().indexes().next_deadline(), None);
    assert!(t.ok(|r| r.lifecycle_mut().tick()).is_empty());
}

#[test]
fn late_tick_reports_the_real_quarantine_duration() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(45);
    assert_eq!(
        released(&t.ok(|r| r.lifecycle_mut().tick())),
        vec![45 * SEC]
    );
}

// ---- adaptive release -------------------------------------------------------------------

#[test]
fn stale_traffic_extends_the_quarantine_to_quiet_period_after_the_last_packet() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let since = t.now();
    // Stale traffic early in the cooldown does not move its end.
    assert!(t
        .ok(|r| r
            .lifecycle_mut()
            .stale_seen(ip("10.0.0.1"), since + 5 * SEC))
        .is_empty());
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(since + 30 * SEC)
    );
    // Stale traffic at 25 s: the quarantine ends 10 s (quiet_period) later.
    t.ok(|r| {
        r.lifecycle_mut()
            .stale_seen(ip("10.0.0.1"), since + 25 * SEC)
    });
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(since + 35 * SEC)
    );
    let AddrStatus::Quarantined { last_stale, .. } = t.record("10.0.0.1").status else {
        panic!("not quarantined");
    };
    assert_eq!(last_stale, Some(since + 25 * SEC));
    // An older report (out of order) does not pull it back.
    t.ok(|r| {
        r.lifecycle_mut()
            .stale_seen(ip("10.0.0.1"), since + 20 * SEC)
    });
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(since + 35 * SEC)
    );
    t.advance(30);
    assert!(
        t.ok(|r| r.lifecycle_mut().tick()).is_empty(),
        "not before last stale + quiet_period"
    );
    t.advance(4);
    assert!(t.ok(|r| r.lifecycle_mut().tick()).is_empty());
    t.advance(1);
    assert_eq!(
        released(&t.ok(|r| r.lifecycle_mut().tick())),
        vec![35 * SEC]
    );
}

#[test]
fn stale_traffic_never_holds_an_address_past_max_cooldown() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let since = t.now();
    // Stale traffic every 9 s (< quiet_period), for ever: released at the first tick past
    // max_cooldown.
    let mut released_after = None;
    for _ in 0..40 {
        t.advance(9);
        let now = t.now();
        t.ok(|r| r.lifecycle_mut().stale_seen(ip("10.0.0.1"), now));
        if let Some(d) = released(&t.ok(|r| r.lifecycle_mut().tick())).first() {
            released_after = Some(*d);
            break;
        }
    }
    assert_eq!(released_after, Some(306 * SEC));
    assert_eq!(t.reg.records().state(ip("10.0.0.1")), StateName::Free);
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.ok(|r| {
        r.lifecycle_mut()
            .stale_seen(ip("10.0.0.1"), since + 299 * SEC)
    });
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        Some(since + 300 * SEC)
    );
    t.advance(299);
    assert!(t.ok(|r| r.lifecycle_mut().tick()).is_empty());
    t.advance(1);
    assert_eq!(
        released(&t.ok(|r| r.lifecycle_mut().tick())),
        vec![300 * SEC]
    );
}

#[test]
fn release_time_is_max_of_cooldown_and_quiet_capped_by_max_cooldown() {
    let s = settings(EarlyReusePolicy::FenceOld);
    assert_eq!(s.release_at(100, None), 100 + 30 * SEC);
    assert_eq!(s.release_at(100, Some(100 + 5 * SEC)), 100 + 30 * SEC);
    assert_eq!(s.release_at(100, Some(100 + 50 * SEC)), 100 + 60 * SEC);
    assert_eq!(s.release_at(100, Some(100 + 1000 * SEC)), 100 + 300 * SEC);
    assert_eq!(s.release_at(u64::MAX - 1, Some(u64::MAX)), u64::MAX);
    // Settings that were never validated still keep the cooldown.
    let odd = RegistrySettings {
        max_cooldown: Duration::from_secs(1),
        ..s
    };
    assert_eq!(odd.release_at(0, Some(1000 * SEC)), 30 * SEC);
}

#[test]
fn stale_seen_on_a_live_or_unknown_address() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    let now = t.now();
    assert!(t
        .ok(|r| r.lifecycle_mut().stale_seen(ip("10.0.0.1"), now))
        .is_empty());
    assert!(matches!(
        t.run(|r| r.lifecycle_mut().stale_seen(ip("10.0.0.2"), now)),
        Err(RegistryError::NotFound { .. })
    ));
}
