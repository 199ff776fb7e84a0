//! The attacher's bookkeeping, without a kernel: jobs are read off the queue and answered with
//! made-up reports.

use std::time::{Duration, Instant};

use super::*;

fn report(job: &Job, ok: bool) -> JobReport {
    JobReport {
        job: job.clone(),
        hooks: job
            .role
            .points()
            .iter()
            .map(|p| {
                let result = if ok && *p == AttachPoint::TcxIngress {
                    Ok(Attached::Created)
                } else if ok {
                    Ok(Attached::Reused)
                } else {
                    Err("Too many open files (os error 24)".to_owned())
                };
                (*p, result)
            })
            .collect(),
    }
}

#[test]
fn a_wanted_interface_is_attaching_until_its_report_and_queued_once() {
    let (mut attacher, queue) = Attacher::without_workers(TcMode::Netlink);
    attacher.want(7, "vethpa", Role::Workload);
    attacher.want(7, "vethpa", Role::Workload);
    let job = queue.try_recv().expect("one job");
    assert!(
        queue.try_recv().is_err(),
        "the same want queues nothing more"
    );
    assert!(attacher.attaching());
    assert_eq!(attacher.unprotected_points().count(), 2);
    // Attaching is not a readiness blocker until the grace is over.
    let t0 = attacher.target(7).unwrap().since;
    assert_eq!(attacher.readiness_blocker(t0), None);
    let late = attacher
        .readiness_blocker(t0 + ATTACHING_GRACE + Duration::from_millis(1))
        .expect("blocked after the grace");
    assert!(late.contains("vethpa (if7) attaching"), "{late}");

    assert!(attacher.on_report(report(&job, true)));
    let target = attacher.target(7).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert!(!attacher.attaching());
    assert_eq!(attacher.unprotected_points().count(), 0);
    assert_eq!(attacher.attached_points().count(), 2);
    assert_eq!(attacher.readiness_blocker(Instant::now()), None);
}

#[test]
fn a_failure_is_counted_blocks_readiness_and_is_retried_with_backoff_until_protected() {
    let (mut attacher, queue) = Attacher::without_workers(TcMode::Tcx);
    attacher.want(3, "up0", Role::Uplink);
    let job = queue.try_recv().unwrap();
    assert!(attacher.on_report(report(&job, false)));
    let target = attacher.target(3).unwrap();
    assert_eq!(target.protection, Protection::Failed);
    assert_eq!(target.failures, 1);
    assert!(target
        .last_error
        .as_deref()
        .unwrap()
        .contains("os error 24"));
    assert_eq!(attacher.failures().get(&AttachPoint::Xdp), Some(&1));
    let blocker = attacher.readiness_blocker(Instant::now()).unwrap();
    assert!(
        blocker.contains("up0 (if3) failed: xdp: Too many open files"),
        "{blocker}"
    );

    // Not before its time; then once, under a new generation.
    let now = Instant::now();
    assert_eq!(attacher.retry_due(now), 0);
    let due = attacher.next_retry().unwrap();
    assert!(due > now && due <= now + retry::FIRST_RETRY);
    assert_eq!(attacher.retry_due(due), 1);
    let retry = queue.try_recv().expect("the retry's job");
    assert!(retry.generation > job.generation);
    assert_eq!(attacher.retry_due(due), 0, "queued once");

    // The first attempt's late report changes nothing; the retry's success protects.
    assert!(!attacher.on_report(report(&job, true)));
    assert_eq!(attacher.target(3).unwrap().protection, Protection::Failed);
    assert!(attacher.on_report(report(&retry, true)));
    let target = attacher.target(3).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert_eq!((target.failures, target.last_error.as_deref()), (0, None));
    assert_eq!(attacher.next_retry(), None);
    assert_eq!(
        attacher.failures().get(&AttachPoint::Xdp),
        Some(&1),
        "still counted"
    );
}

#[test]
fn a_forgotten_interface_ignores_its_report_and_a_new_role_queues_again() {
    let (mut attacher, queue) = Attacher::without_workers(TcMode::Tcx);
    attacher.want(9, "vethpb", Role::Workload);
    let job = queue.try_recv().unwrap();
    attacher.forget(9);
    assert!(!attacher.on_report(report(&job, true)));
    assert!(attacher.targets().is_empty());

    attacher.want(9, "vethpb", Role::Workload);
    attacher.want(9, "up9", Role::Uplink);
    assert_eq!(
        queue.try_iter().count(),
        2,
        "a rename or new role is a new attach"
    );
    assert_eq!(attacher.target(9).unwrap().role, Role::Uplink);
}
