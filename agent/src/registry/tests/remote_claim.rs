//! A remote claim of an Active pod's address, asked about before it is fenced.

use super::*;

const ADDR: &str = "10.0.0.1";

fn pod_holder(ifindex: u32) -> Holder {
    h(ifindex).with_container_id("c0ffee").with_pod(PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: Some("uid-1".into()),
    })
}

#[test]
fn a_remote_claim_of_an_active_pods_address_asks_first_and_decides_nothing() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim(ADDR, pod_holder(5), Source::Cni);
    let before = t.record(ADDR).clone();
    let effects = t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
    assert_eq!(
        effects,
        vec![Effect::AskAboutHolder {
            addr: ip(ADDR),
            holder: pod_holder(5)
        }]
    );
    assert_eq!(t.record(ADDR), before, "nothing fenced or counted yet");
}

#[test]
fn the_pod_gone_or_no_answer_fences_the_holder() {
    for standing in [PodStanding::Gone, PodStanding::Unknown] {
        let mut t = Harness::new(EarlyReusePolicy::FenceOld);
        t.claim(ADDR, pod_holder(5), Source::Cni);
        t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
        let effects = t.ok(|r| {
            r.lifecycle_mut()
                .remote_claim_answered(ip(ADDR), &pod_holder(5), standing)
        });
        let c = conflicts(&effects)[0];
        assert_eq!(
            (c.kind, c.old.clone()),
            (ConflictKind::RemoteClaim, Some(pod_holder(5))),
            "{standing:?}"
        );
        assert_eq!(t.record(ADDR).fenced().cloned(), Some(pod_holder(5)));
        assert_eq!(t.entry(ADDR).fenced_ifindex, 5, "{standing:?}");
        // Fenced: a further claim is settled at once, not asked about again.
        let again = t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
        assert!(
            !again
                .iter()
                .any(|e| matches!(e, Effect::AskAboutHolder { .. })),
            "{again:?}"
        );
        assert_eq!(t.record(ADDR).conflicts, 2);
    }
}

#[test]
fn the_pod_still_there_is_reported_not_fenced() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim(ADDR, pod_holder(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
    let effects = t.ok(|r| {
        r.lifecycle_mut()
            .remote_claim_answered(ip(ADDR), &pod_holder(5), PodStanding::Present)
    });
    assert_eq!(conflicts(&effects)[0].kind, ConflictKind::RemoteClaim);
    assert_eq!(t.record(ADDR).fenced(), None);
    assert_eq!(t.record(ADDR).conflicts, 1);
    assert_eq!(t.entry(ADDR).fenced_ifindex, NO_IFINDEX);
}

#[test]
fn an_answer_about_a_holder_that_has_left_or_changed_does_nothing() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim(ADDR, pod_holder(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
    t.ok(|r| r.lifecycle_mut().holder_gone(5));
    let quarantined = t.record(ADDR).clone();
    let effects = t.ok(|r| {
        r.lifecycle_mut()
            .remote_claim_answered(ip(ADDR), &pod_holder(5), PodStanding::Gone)
    });
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(t.record(ADDR), quarantined);
    // Released and gone from the registry: still nothing, and no error.
    t.ok(|r| r.lifecycle_mut().release(ip(ADDR), true));
    let effects = t.ok(|r| {
        r.lifecycle_mut()
            .remote_claim_answered(ip(ADDR), &pod_holder(5), PodStanding::Gone)
    });
    assert!(effects.is_empty(), "{effects:?}");
    // Another holder now: the answer was about someone else.
    t.claim(ADDR, pod_holder(6), Source::Cni);
    let effects = t.ok(|r| {
        r.lifecycle_mut()
            .remote_claim_answered(ip(ADDR), &pod_holder(5), PodStanding::Gone)
    });
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(t.record(ADDR).fenced(), None);
}

#[test]
fn a_holder_that_drained_while_asked_about_is_fenced_whatever_the_answer() {
    let mut t = Harness::new(EarlyReusePolicy::FenceOld);
    t.claim(ADDR, pod_holder(5), Source::Cni);
    t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), true));
    t.ok(|r| r.lifecycle_mut().drain(ip(ADDR), None));
    t.ok(|r| {
        r.lifecycle_mut()
            .remote_claim_answered(ip(ADDR), &pod_holder(5), PodStanding::Present)
    });
    assert_eq!(t.record(ADDR).fenced().cloned(), Some(pod_holder(5)));
}

#[test]
fn what_is_not_asked_about() {
    // A Draining holder is fenced at once; a holder naming no pod cannot be asked about; under
    // refuse-new and observe an Active one is only reported; without the cluster, fenced.
    let cases = [
        (EarlyReusePolicy::FenceOld, true, pod_holder(5), true, true),
        (EarlyReusePolicy::FenceOld, false, h(5), true, true),
        (
            EarlyReusePolicy::RefuseNew,
            false,
            pod_holder(5),
            true,
            false,
        ),
        (EarlyReusePolicy::Observe, false, pod_holder(5), true, false),
        (
            EarlyReusePolicy::FenceOld,
            false,
            pod_holder(5),
            false,
            true,
        ),
    ];
    for (policy, drained, holder, ask, fenced) in cases {
        let mut t = Harness::new(policy);
        t.claim(ADDR, holder.clone(), Source::Cni);
        if drained {
            t.ok(|r| r.lifecycle_mut().drain(ip(ADDR), None));
        }
        let effects = t.ok(|r| r.lifecycle_mut().remote_claim(ip(ADDR), ask));
        let case = format!("{policy:?} drained {drained} {holder:?} ask {ask}");
        assert_eq!(conflicts(&effects).len(), 1, "{case}");
        assert_eq!(t.record(ADDR).fenced().is_some(), fenced, "{case}");
    }
}
