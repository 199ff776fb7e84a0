//! The aggregation and rate limit, driven by instants of the tests' own.

use std::time::{Duration, Instant, SystemTime};

use super::*;
use crate::pod_events::notice::EventReason;
use crate::registry::PodRef;

const INTERVAL: Duration = Duration::from_secs(60);

fn pacing(max_series: usize) -> Pacing {
    Pacing {
        interval: INTERVAL,
        max_series,
        forget_after: Duration::from_secs(3600),
    }
}

fn notice(pod: &str, reason: EventReason, at: SystemTime) -> Notice {
    Notice {
        pod: PodRef {
            namespace: "default".into(),
            name: pod.into(),
            uid: Some(format!("uid-{pod}")),
        },
        reason,
        note: format!("{pod} {reason}"),
        observed_at: at,
    }
}

fn created(aggregator: &mut Aggregator, taken: Taken) -> SeriesKey {
    match taken {
        Taken::Write(Write::Create { key, .. }) => {
            aggregator.created(&key, format!("{}.event", key.name));
            key
        }
        other => panic!("expected a create, got {other:?}"),
    }
}

#[test]
fn a_storm_on_one_pod_is_one_create_then_one_patch_per_interval() {
    let t0 = Instant::now();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut a = Aggregator::new(pacing(16));
    let first = a.take(notice("web-1", EventReason::IpqFenced, wall), t0);
    let key = created(&mut a, first);
    // 999 more within the interval: each counted, none written.
    for i in 1..1000u64 {
        let at = t0 + Duration::from_millis(i * 10);
        let taken = a.take(
            notice(
                "web-1",
                EventReason::IpqFenced,
                wall + Duration::from_millis(i * 10),
            ),
            at,
        );
        assert_eq!(taken, Taken::Aggregated, "occurrence {i}");
        assert!(a.due(at).is_empty(), "nothing is due before the interval");
    }
    assert_eq!(a.next_due(), Some(t0 + INTERVAL));
    assert!(a.due(t0 + INTERVAL - Duration::from_millis(1)).is_empty());
    let due = a.due(t0 + INTERVAL);
    assert_eq!(
        due,
        vec![Write::Patch {
            key: key.clone(),
            event: "web-1.event".into(),
            count: 1000,
            last_observed: wall + Duration::from_millis(9990),
        }]
    );
    a.patched(&key, 1000, t0 + INTERVAL);
    // Written: nothing more is due until another occurrence, and then only an interval later.
    assert!(a.due(t0 + INTERVAL * 3).is_empty());
    assert_eq!(a.next_due(), None);
    let later = t0 + INTERVAL + Duration::from_secs(1);
    assert_eq!(
        a.take(notice("web-1", EventReason::IpqFenced, wall), later),
        Taken::Aggregated
    );
    assert!(a.due(later).is_empty());
    assert_eq!(a.next_due(), Some(t0 + INTERVAL * 2));
    match a.due(t0 + INTERVAL * 2).as_slice() {
        [Write::Patch { count: 1001, .. }] => {}
        other => panic!("expected one patch of 1001, got {other:?}"),
    }
}

#[test]
fn each_pod_and_reason_is_a_series_of_its_own() {
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let mut a = Aggregator::new(pacing(16));
    let fenced = a.take(notice("web-1", EventReason::IpqFenced, wall), t0);
    let reuse = a.take(notice("web-2", EventReason::IpqEarlyReuse, wall), t0);
    let other_reason = a.take(notice("web-1", EventReason::IpqQuarantineHeld, wall), t0);
    for taken in [fenced, reuse, other_reason] {
        assert!(
            matches!(taken, Taken::Write(Write::Create { .. })),
            "{taken:?}"
        );
    }
    assert_eq!(a.series_kept(), 3);
    // The same name with another uid is another pod.
    let mut again = notice("web-1", EventReason::IpqFenced, wall);
    again.pod.uid = Some("uid-web-1-recreated".into());
    assert!(matches!(a.take(again, t0), Taken::Write(_)));
}

#[test]
fn past_the_cap_a_new_series_is_refused_until_an_old_one_is_forgotten() {
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let mut a = Aggregator::new(pacing(2));
    for pod in ["a", "b"] {
        let taken = a.take(notice(pod, EventReason::IpqFenced, wall), t0);
        created(&mut a, taken);
    }
    assert_eq!(
        a.take(notice("c", EventReason::IpqFenced, wall), t0),
        Taken::SeriesFull
    );
    // An existing series still counts.
    assert_eq!(
        a.take(notice("a", EventReason::IpqFenced, wall), t0),
        Taken::Aggregated
    );
    // An hour on, "b" (nothing unwritten) is forgotten; "a" has an occurrence its Event lacks
    // and is kept until it is written.
    let hour = t0 + Duration::from_secs(3600);
    assert!(matches!(
        a.take(notice("c", EventReason::IpqFenced, wall), hour),
        Taken::Write(_)
    ));
    assert_eq!(a.series_kept(), 2);
    match a.due(hour).as_slice() {
        [Write::Patch { key, count: 2, .. }] => assert_eq!(key.name, "a"),
        other => panic!("expected a's patch, got {other:?}"),
    }
}

#[test]
fn a_lost_event_starts_a_new_series() {
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let mut a = Aggregator::new(pacing(4));
    let taken = a.take(notice("web-1", EventReason::IpqFenced, wall), t0);
    let key = created(&mut a, taken);
    a.lost(&key);
    assert!(matches!(
        a.take(notice("web-1", EventReason::IpqFenced, wall), t0),
        Taken::Write(Write::Create { .. })
    ));
}

#[test]
fn a_series_whose_create_is_pending_is_not_patched() {
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let mut a = Aggregator::new(pacing(4));
    assert!(matches!(
        a.take(notice("web-1", EventReason::IpqFenced, wall), t0),
        Taken::Write(_)
    ));
    a.take(notice("web-1", EventReason::IpqFenced, wall), t0);
    assert!(a.due(t0 + INTERVAL).is_empty());
    assert_eq!(a.next_due(), None);
}
