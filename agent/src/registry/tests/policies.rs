//! Conflicts: early reuse and reuse in cooldown under each `on_early_reuse` policy, remote
//! claims and duplicate sources.

use super::*;

// ---- early reuse: fence-old --------------------------------------------------------------

#[test]
fn fence_old_early_reuse_of_a_draining_address_fences_the_old_holder() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    t.advance(2);
    let effects = t.claim("10.0.0.1", h(6), Source::Cni);
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Draining, StateName::Active)]
    );
    assert_eq!(
        conflicts(&effects),
        vec![&Conflict {
            kind: ConflictKind::EarlyReuse,
            addr: ip("10.0.0.1"),
            old: Some(h(5)),
            new: Some(h(6)),
            policy: EarlyReusePolicy::FenceOld,
            at: START + 2 * SEC,
        }]
    );
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(6)));
    assert_eq!(record.fenced().cloned(), Some(h(5)));
    assert_eq!(record.conflicts, 1);
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Active, 6, START + 2 * SEC).with_fenced(5)
    );
}

#[test]
fn fence_old_double_allocation_of_an_active_address_fences_the_first() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Netlink);
    let effects = t.claim("10.0.0.1", h(6), Source::Netlink);
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Active, StateName::Active)]
    );
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::EarlyReuse);
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 5);
    assert_eq!(t.entry("10.0.0.1").holder_ifindex, 6);
}

#[test]
fn fenced_holder_gone_clears_the_fence_and_the_new_holder_keeps_the_address() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    t.claim("10.0.0.1", h(6), Source::Cni);
    let effects = t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert!(transitions(&effects).is_empty());
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.state(), record.fenced().cloned()),
        (StateName::Active, None)
    );
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, NO_IFINDEX);
}

#[test]
fn fenced_holder_seen_again_on_netlink_stays_fenced() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.1", h(6), Source::Cni);
    // A netlink resync sees the old pod's route again: no flip-flop.
    assert!(t.claim("10.0.0.1", h(5), Source::Netlink).is_empty());
    assert_eq!(t.record("10.0.0.1").status.holder(), Some(&h(6)));
    // A late CNI DEL of the old pod is accepted and changes nothing.
    assert!(t
        .ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), Some(&h(5))))
        .is_empty());
    // An explicit claim by it is a new early reuse: it wins, the other is fenced.
    let effects = t.claim("10.0.0.1", h(5), Source::Api);
    assert_eq!(conflicts(&effects).len(), 1);
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.status.holder(), record.fenced()),
        (Some(&h(5)), Some(&h(6)))
    );
    assert_eq!(record.conflicts, 2);
}

#[test]
fn new_holder_gone_while_old_fenced_quarantines_and_then_keeps_the_old_one_fenced() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    t.claim("10.0.0.1", h(6), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(6));
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.state(), record.fenced().cloned()),
        (StateName::Quarantined, Some(h(5)))
    );
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 5);
    // The stuck old holder is still alive when the quarantine ends: it is neither reconnected
    // nor forgotten.
    t.advance(30);
    let effects = t.ok(|r| r.lifecycle_mut().tick());
    assert_eq!(released(&effects), vec![30 * SEC]);
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(5)));
    assert_eq!(record.state(), StateName::Draining);
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 5);
    assert_eq!(t.entry("10.0.0.1").holder_ifindex, 5);
    // When it is finally gone, the address cools down and is free.
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(30);
    t.ok(|r| r.lifecycle_mut().tick());
    assert!(t.reg.records().is_empty());
}

#[test]
fn another_container_on_the_holders_interface_replaces_it_without_fencing() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5).with_container_id("a"), Source::Cni);
    let effects = t.claim("10.0.0.1", h(5).with_container_id("b"), Source::Cni);
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::EarlyReuse);
    assert_eq!(
        t.entry("10.0.0.1").fenced_ifindex,
        NO_IFINDEX,
        "would drop the new holder"
    );
    assert_eq!(
        t.record("10.0.0.1").status.holder().unwrap().container_id(),
        Some("b")
    );
}

// ---- reuse in cooldown ------------------------------------------------------------------

#[test]
fn fence_old_claim_during_quarantine_is_reuse_in_cooldown() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(10);
    let effects = t.claim("10.0.0.1", h(6), Source::Cni);
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Quarantined, StateName::Active)]
    );
    let c = conflicts(&effects);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].kind, ConflictKind::ReuseInCooldown);
    assert_eq!(
        (c[0].old.clone(), c[0].new.clone()),
        (Some(h(5)), Some(h(6)))
    );
    assert_eq!(
        t.reg.records().indexes().next_deadline(),
        None,
        "no quarantine left to end"
    );
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Active, 6, START + 10 * SEC)
    );
}

#[test]
fn observe_claim_during_quarantine_is_claimed_and_reported() {
    let mut t = Harness::new(EarlyReusePolicy::Observe);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let effects = t.claim("10.0.0.1", h(6), Source::Cni);
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::ReuseInCooldown);
    assert_eq!(conflicts(&effects)[0].policy, EarlyReusePolicy::Observe);
    assert_eq!(t.record("10.0.0.1").state(), StateName::Active);
}

// ---- observe ----------------------------------------------------------------------------

#[test]
fn observe_early_reuse_reports_and_fences_nothing() {
    let mut t = Harness::new(EarlyReusePolicy::Observe);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    let effects = t.claim("10.0.0.1", h(6), Source::Cni);
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::EarlyReuse);
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(6)));
    assert_eq!(
        (
            record.fenced().cloned(),
            record.blocked_claimant().cloned(),
            record.conflicts
        ),
        (None, None, 1)
    );
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, NO_IFINDEX);
}

// ---- refuse-new -------------------------------------------------------------------------

#[test]
fn refuse_new_refuses_an_explicit_claim_and_changes_nothing() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    let before = t.reg.lifecycle().snapshot();
    for source in [Source::Cni, Source::Api] {
        let err = t
            .run(|r| r.claim(ip("10.0.0.1"), h(6), source))
            .unwrap_err();
        assert_eq!(
            err,
            RegistryError::Refused {
                addr: ip("10.0.0.1"),
                holder: Box::new(h(5)),
                until: None
            }
        );
        assert_eq!(err.conflict_kind(), Some(ConflictKind::EarlyReuse));
        assert!(err.to_string().contains("try again later"), "{err}");
    }
    assert_eq!(t.reg.lifecycle().snapshot(), before);
    assert_eq!(t.reg.refusals().refused_claims(), 2);
}

#[test]
fn refuse_new_refuses_an_explicit_claim_in_cooldown_until_it_ends() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let until = t.now() + 30 * SEC;
    let err = t
        .run(|r| r.claim(ip("10.0.0.1"), h(6), Source::Cni))
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::Refused {
            addr: ip("10.0.0.1"),
            holder: Box::new(h(5)),
            until: Some(until)
        }
    );
    assert_eq!(err.conflict_kind(), Some(ConflictKind::ReuseInCooldown));
    t.advance(30);
    t.ok(|r| r.lifecycle_mut().tick());
    t.claim("10.0.0.1", h(6), Source::Cni);
    assert_eq!(t.record("10.0.0.1").status.holder(), Some(&h(6)));
    assert_eq!(t.reg.refusals().refused_claims(), 1);
}

#[test]
fn refuse_new_netlink_claim_is_blocked_then_promoted_when_the_old_holder_is_gone() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    let drained_at = t.now();
    t.advance(1);
    let effects = t.claim("10.0.0.1", h(6), Source::Netlink);
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::EarlyReuse);
    assert!(
        transitions(&effects).is_empty(),
        "the old holder keeps the address"
    );
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(5)));
    assert_eq!(record.blocked_claimant().cloned(), Some(h(6)));
    assert_eq!(record.fenced().cloned(), None);
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Draining, 5, drained_at).with_fenced(6),
        "the new holder's traffic is dropped"
    );
    assert!(
        t.claim("10.0.0.1", h(6), Source::Netlink).is_empty(),
        "seen again: no-op"
    );
    assert_eq!(t.reg.refusals().refused_claims(), 0);
    // The old holder goes: the claimant has the address, no quarantine, no action needed.
    t.advance(1);
    let effects = t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Draining, StateName::Active)]
    );
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(6)));
    assert_eq!(record.blocked_claimant().cloned(), None);
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Active, 6, t.now())
    );
    assert_eq!(t.reg.records().indexes().next_deadline(), None);
}

#[test]
fn refuse_new_netlink_claim_in_cooldown_is_promoted_when_the_quarantine_ends() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let effects = t.claim("10.0.0.1", h(6), Source::Netlink);
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::ReuseInCooldown);
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 6);
    assert_eq!(t.entry("10.0.0.1").state(), Some(AddrState::Quarantined));
    t.advance(29);
    assert!(t.ok(|r| r.lifecycle_mut().tick()).is_empty());
    t.advance(1);
    let effects = t.ok(|r| r.lifecycle_mut().tick());
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Quarantined, StateName::Active)]
    );
    assert_eq!(released(&effects), vec![30 * SEC]);
    assert_eq!(
        t.entry("10.0.0.1"),
        AddrEntry::new(AddrState::Active, 6, t.now())
    );
}

#[test]
fn refuse_new_blocked_claimant_gone_first_is_forgotten() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.1", h(6), Source::Netlink);
    t.ok(|r| r.lifecycle_mut().holder_gone(6));
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.state(), record.blocked_claimant().cloned()),
        (StateName::Active, None)
    );
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, NO_IFINDEX);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert_eq!(t.record("10.0.0.1").state(), StateName::Quarantined);
}

// ---- release ------------------------------------------------------------------------------

#[test]
fn release_needs_force_before_the_quarantine_is_over() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert_eq!(
        t.run(|r| r.lifecycle_mut().release(ip("10.0.0.1"), false)),
        Err(RegistryError::NotReleasable {
            addr: ip("10.0.0.1"),
            state: StateName::Quarantined
        })
    );
    t.advance(5);
    let effects = t.ok(|r| r.lifecycle_mut().release(ip("10.0.0.1"), true));
    assert_eq!(
        transitions(&effects),
        vec![(StateName::Quarantined, StateName::Free)]
    );
    assert_eq!(released(&effects), vec![5 * SEC]);
    assert!(t.reg.records().is_empty());
}

#[test]
fn release_of_an_expired_quarantine_needs_no_force() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(31);
    t.ok(|r| r.lifecycle_mut().release(ip("10.0.0.1"), false));
    assert!(t.reg.records().is_empty());
}

#[test]
fn release_of_a_live_address_needs_force() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.2", h(6), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.2"), None));
    for (addr, state) in [
        ("10.0.0.1", StateName::Active),
        ("10.0.0.2", StateName::Draining),
    ] {
        let a = ip(addr);
        assert_eq!(
            t.run(|r| r.lifecycle_mut().release(a, false)),
            Err(RegistryError::NotReleasable { addr: a, state })
        );
        let effects = t.ok(|r| r.lifecycle_mut().release(a, true));
        assert!(effects.contains(&Effect::Remove { addr: a }));
        assert_eq!(transitions(&effects), vec![(state, StateName::Free)]);
        assert!(released(&effects).is_empty(), "no quarantine ended");
    }
    assert!(t.reg.records().is_empty());
    assert!(matches!(
        t.run(|r| r.lifecycle_mut().release(ip("10.0.0.1"), true)),
        Err(RegistryError::NotFound { .. })
    ));
}

#[test]
fn forced_release_of_a_quarantine_hands_it_to_the_blocked_claimant() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.claim("10.0.0.1", h(6), Source::Netlink);
    t.ok(|r| r.lifecycle_mut().release(ip("10.0.0.1"), true));
    assert_eq!(t.record("10.0.0.1").status.holder(), Some(&h(6)));
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, NO_IFINDEX);
}

// ---- capacity -----------------------------------------------------------------------------

#[test]
fn a_full_registry_refuses_new_addresses_and_keeps_every_old_one() {
    let mut t = Harness::with(RegistrySettings {
        capacity: 3,
        ..settings(EarlyReusePolicy::FenceOld)
    });
    t.claim("10.0.0.1", h(1), Source::Cni);
    t.claim("10.0.0.2", h(2), Source::Cni);
    t.claim("10.0.0.3", h(3), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(3)); // a quarantined entry counts too
    let before = t.reg.lifecycle().snapshot();
    let err = t
        .run(|r| r.claim(ip("10.0.0.4"), h(4), Source::Cni))
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::Full {
            addr: ip("10.0.0.4"),
            capacity: 3
        }
    );
    assert!(err.to_string().contains("existing entries are kept"));
    assert_eq!(t.reg.lifecycle().snapshot().records, before.records);
    assert_eq!(t.reg.refusals().full_rejections(), 1);
    assert_eq!((t.reg.records().len(), t.reg.records().capacity()), (3, 3));
    // Addresses already registered can still change hands.
    t.claim("10.0.0.1", h(9), Source::Cni);
    t.claim("10.0.0.3", h(8), Source::Cni);
    // Room again once one is free.
    t.ok(|r| r.lifecycle_mut().release(ip("10.0.0.2"), true));
    t.claim("10.0.0.4", h(4), Source::Cni);
    assert_eq!(t.reg.records().len(), 3);
}

// ---- remote claim and duplicate source ---------------------------------------------------

#[test]
fn remote_claim_of_an_active_or_draining_address_fences_it_under_fence_old() {
    for drained in [false, true] {
        let mut t = Harness::new(EarlyReusePolicy::FenceOld);
        t.claim("10.0.0.1", h(5), Source::Cni);
        if drained {
            t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
        }
        let effects = t.ok(|r| r.lifecycle_mut().remote_claim(ip("10.0.0.1"), false));
        let c = conflicts(&effects)[0];
        assert_eq!(
            (c.kind, c.old.clone(), c.new.clone()),
            (ConflictKind::RemoteClaim, Some(h(5)), None),
            "drained: {drained}"
        );
        assert_eq!(t.record("10.0.0.1").fenced().cloned(), Some(h(5)));
        assert_eq!(t.record("10.0.0.1").conflicts, 1);
        let entry = t.entry("10.0.0.1");
        assert_eq!((entry.holder_ifindex, entry.fenced_ifindex), (5, 5));
        // Gone later: quarantined as usual, fence cleared.
        t.ok(|r| r.lifecycle_mut().holder_gone(5));
        let record = t.record("10.0.0.1");
        assert_eq!(
            (record.state(), record.fenced().cloned()),
            (StateName::Quarantined, None),
            "drained: {drained}"
        );
    }
}

#[test]
fn remote_claim_of_an_active_address_is_only_reported_under_refuse_new_and_observe() {
    for policy in [EarlyReusePolicy::RefuseNew, EarlyReusePolicy::Observe] {
        let mut t = Harness::new(policy);
        t.claim("10.0.0.1", h(5), Source::Cni);
        let effects = t.ok(|r| r.lifecycle_mut().remote_claim(ip("10.0.0.1"), false));
        assert_eq!(conflicts(&effects)[0].kind, ConflictKind::RemoteClaim);
        assert_eq!(t.record("10.0.0.1").fenced().cloned(), None, "{policy:?}");
        assert_eq!(t.record("10.0.0.1").conflicts, 1);
    }
}

#[test]
fn remote_claim_of_a_quarantined_or_unknown_address() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    assert!(t
        .ok(|r| r.lifecycle_mut().remote_claim(ip("10.0.0.1"), false))
        .is_empty());
    assert!(matches!(
        t.run(|r| r.lifecycle_mut().remote_claim(ip("10.0.0.2"), false)),
        Err(RegistryError::NotFound { .. })
    ));
}

#[test]
fn duplicate_source_is_reported_only() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    let b = h(6).with_container_id("bbb");
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.2", b.clone(), Source::Cni);
    let before = t.entry("10.0.0.1");
    let effects = t.ok(|r| r.lifecycle_mut().duplicate_source(ip("10.0.0.1"), 6));
    assert_eq!(
        effects,
        vec![Effect::Conflict(Box::new(Conflict {
            kind: ConflictKind::DuplicateSource,
            addr: ip("10.0.0.1"),
            old: Some(h(5)),
            new: Some(b),
            policy: EarlyReusePolicy::FenceOld,
            at: START,
        }))]
    );
    assert_eq!(t.entry("10.0.0.1"), before);
    assert_eq!(t.record("10.0.0.1").conflicts, 1);
    // An interface the registry does not know is named by its index alone.
    let effects = t.ok(|r| r.lifecycle_mut().duplicate_source(ip("10.0.0.1"), 42));
    assert_eq!(conflicts(&effects)[0].new, Some(Holder::new(42, "")));
    // The holder's own interface is no duplicate.
    assert!(t
        .ok(|r| r.lifecycle_mut().duplicate_source(ip("10.0.0.1"), 5))
        .is_empty());
    assert!(matches!(
        t.run(|r| r.lifecycle_mut().duplicate_source(ip("10.0.0.9"), 5)),
        Err(RegistryError::NotFound { .. })
    ));
}

// ---- more than two claimants ----------------------------------------------------------------

#[test]
fn three_claimants_keep_every_old_holder_tracked_and_cut_off() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.1", h(6), Source::Cni);
    t.claim("10.0.0.1", h(7), Source::Cni);
    let record = t.record("10.0.0.1");
    assert_eq!(record.status.holder(), Some(&h(7)));
    assert_eq!(
        record.fenced().cloned(),
        Some(h(6)),
        "the last displaced holder takes the slot"
    );
    assert_eq!(record.displaced().to_vec(), vec![h(5)]);
    assert_eq!(record.conflicts, 2);
    // The slot frees when its holder goes; the next displaced holder takes it.
    t.ok(|r| r.lifecycle_mut().holder_gone(6));
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.fenced().cloned(), record.displaced().to_vec()),
        (Some(h(5)), vec![])
    );
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 5);
    // The holder goes; the quarantine ends; the still-living old holder keeps the address,
    // cut off, rather than the address falling Free and reconnecting it.
    t.ok(|r| r.lifecycle_mut().holder_gone(7));
    t.advance(30);
    t.ok(|r| r.lifecycle_mut().tick());
    let entry = t.entry("10.0.0.1");
    assert_eq!(entry.state(), Some(AddrState::Draining));
    assert_eq!((entry.holder_ifindex, entry.fenced_ifindex), (5, 5));
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    t.advance(30);
    t.ok(|r| r.lifecycle_mut().tick());
    assert!(t.reg.records().is_empty());
}

#[test]
fn remote_claim_fencing_a_draining_holder_keeps_the_earlier_fenced_one() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.1", h(6), Source::Cni);
    t.ok(|r| r.lifecycle_mut().drain(ip("10.0.0.1"), None));
    t.ok(|r| r.lifecycle_mut().remote_claim(ip("10.0.0.1"), false));
    let record = t.record("10.0.0.1");
    assert_eq!(
        (record.fenced().cloned(), record.displaced().to_vec()),
        (Some(h(6)), vec![h(5)])
    );
}

#[test]
fn refuse_new_newest_netlink_claimant_takes_the_slot_and_the_earlier_one_is_kept() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("10.0.0.1", h(5), Source::Cni);
    t.claim("10.0.0.1", h(6), Source::Netlink);
    t.claim("10.0.0.1", h(7), Source::Netlink);
    let record = t.record("10.0.0.1");
    assert_eq!(record.blocked_claimant().cloned(), Some(h(7)));
    assert_eq!(record.fenced().cloned(), Some(h(6)));
    assert_eq!(t.entry("10.0.0.1").fenced_ifindex, 7);
    assert_eq!(t.entry("10.0.0.1").holder_ifindex, 5);
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let entry = t.entry("10.0.0.1");
    assert_eq!(entry.state(), Some(AddrState::Active));
    assert_eq!((entry.holder_ifindex, entry.fenced_ifindex), (7, 6));
}
