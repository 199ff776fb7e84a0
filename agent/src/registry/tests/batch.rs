//! `claim_all`: all or none.

use super::*;

#[test]
fn claims_every_address_of_a_dual_stack_pod() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    let addrs = [ip("10.0.0.5"), ip("fd00::5")];
    let holder = h(7).with_container_id("c1");
    t.ok(|r| r.claim_all(&addrs, &holder, Source::Cni));
    for addr in ["10.0.0.5", "fd00::5"] {
        assert_eq!(t.record(addr).status.holder(), Some(&holder));
    }
}

#[test]
fn a_refused_second_address_leaves_the_first_unclaimed() {
    let mut t = Harness::new(EarlyReusePolicy::RefuseNew);
    t.claim("fd00::5", h(3), Source::Cni);
    let addrs = [ip("10.0.0.5"), ip("fd00::5")];
    // Harness::run asserts that an error leaves the registry exactly as it was.
    let err = t
        .run(|r| r.claim_all(&addrs, &h(7), Source::Cni))
        .unwrap_err();
    assert!(matches!(err, RegistryError::Refused { .. }), "{err}");
    assert_eq!(t.reg.records().state(ip("10.0.0.5")), StateName::Free);
    assert_eq!(t.reg.refusals().refused_claims(), 1);
}

#[test]
fn a_full_registry_undoes_the_addresses_already_taken() {
    let mut t = Harness::with(RegistrySettings {
        capacity: 2,
        ..settings(EarlyReusePolicy::FenceOld)
    });
    t.claim("10.0.0.1", h(3), Source::Cni);
    // The first address over a live holder succeeds (fence-old), the third does not fit.
    let addrs = [ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")];
    let err = t
        .run(|r| r.claim_all(&addrs, &h(7), Source::Cni))
        .unwrap_err();
    assert!(matches!(err, RegistryError::Full { .. }), "{err}");
    let record = t.record("10.0.0.1");
    assert_eq!(
        record.status.holder(),
        Some(&h(3)),
        "the old holder is back"
    );
    assert_eq!(record.fenced().cloned(), None);
}

#[test]
fn the_same_address_twice_is_claimed_once() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    let addrs = [ip("10.0.0.5"), ip("::ffff:10.0.0.5")];
    let effects = t.ok(|r| r.claim_all(&addrs, &h(7), Source::Api));
    assert!(conflicts(&effects).is_empty());
    assert_eq!(t.reg.records().len(), 1);
}
