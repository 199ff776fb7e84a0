//! The attacher's bookkeeping, without a kernel: jobs are read off the queue and answered with
//! made-up reports.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use ipq_api::Attachment;

use super::*;
use crate::datapath::attach::queue::JobQueue;

mod lost;

fn report(job: &Job, ok: bool) -> JobReport {
    let by = match job.role {
        Role::Uplink => Mechanism::Xdp,
        Role::Workload => Mechanism::Tcx,
    };
    report_by(job, ok, by)
}

fn report_by(job: &Job, ok: bool, by: Mechanism) -> JobReport {
    JobReport {
        job: job.clone(),
        hooks: job
            .role
            .points()
            .iter()
            .map(|p| {
                let result = if ok && *p == AttachPoint::TcxIngress {
                    Ok(Hooked {
                        how: Attached::Created,
                        by,
                    })
                } else if ok {
                    Ok(Hooked {
                        how: Attached::Reused,
                        by,
                    })
                } else {
                    Err(AttachError::kernel(
                        None,
                        &std::io::Error::from_raw_os_error(libc::EMFILE),
                    ))
                };
                (*p, result)
            })
            .collect(),
        found_missing: Vec::new(),
        ahead: Vec::new(),
    }
}

/// An attacher whose pool has no workers: the test takes the jobs, and makes up their reports.
fn without_workers(mode: TcMode) -> (Attacher, Arc<JobQueue>) {
    let (pool, queue) = WorkerPool::without_workers(mode);
    (Attacher::new(pool), queue)
}

/// The next job a worker would take, handed back as done at once.
fn take(queue: &JobQueue) -> Option<Job> {
    let job = queue.try_take()?;
    queue.done(&job);
    Some(job)
}

#[test]
fn a_wanted_interface_is_attaching_until_its_report_and_queued_once() {
    let (mut attacher, queue) = without_workers(TcMode::Netlink);
    attacher.want(7, "vethpa", Role::Workload);
    attacher.want(7, "vethpa", Role::Workload);
    let job = take(&queue).expect("one job");
    assert!(take(&queue).is_none(), "the same want queues nothing more");
    assert!(attacher.ledger().attaching());
    assert_eq!(attacher.ledger().unprotected_points().count(), 2);
    // Attaching is not a readiness blocker until the grace is over.
    let t0 = attacher.ledger().target(7).unwrap().since;
    assert_eq!(attacher.ledger().readiness_blocker(t0), None);
    let late = attacher
        .ledger()
        .readiness_blocker(t0 + ATTACHING_GRACE + Duration::from_millis(1))
        .expect("blocked after the grace");
    assert!(late.contains("vethpa (if7) attaching"), "{late}");

    assert!(attacher.on_report(report(&job, true)));
    let target = attacher.ledger().target(7).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert!(!attacher.ledger().attaching());
    assert_eq!(attacher.ledger().unprotected_points().count(), 0);
    assert_eq!(attacher.ledger().attached_points().count(), 2);
    assert_eq!(attacher.ledger().readiness_blocker(Instant::now()), None);
}

#[test]
fn a_failure_is_counted_blocks_readiness_and_is_retried_with_backoff_until_protected() {
    let (mut attacher, queue) = without_workers(TcMode::Tcx);
    attacher.want(3, "up0", Role::Uplink);
    let job = take(&queue).unwrap();
    assert!(attacher.on_report(report(&job, false)));
    let target = attacher.ledger().target(3).unwrap();
    assert_eq!(target.protection, Protection::Failed);
    assert_eq!(target.failures, 1);
    assert!(target
        .last_error
        .as_deref()
        .unwrap()
        .contains("os error 24"));
    assert_eq!(
        attacher.findings().failures().get(&AttachPoint::Xdp),
        Some(&1)
    );
    let blocker = attacher.ledger().readiness_blocker(Instant::now()).unwrap();
    assert!(
        blocker.contains("up0 (if3) failed: xdp: Too many open files"),
        "{blocker}"
    );

    // Not before its time; then once, under a new generation.
    let now = Instant::now();
    assert_eq!(attacher.retry_due(now), 0);
    let due = attacher.workers().next_retry().unwrap();
    assert!(due > now && due <= now + retry::FIRST_RETRY);
    assert_eq!(attacher.retry_due(due), 1);
    let retry = take(&queue).expect("the retry's job");
    assert!(retry.generation > job.generation);
    assert_eq!(attacher.retry_due(due), 0, "queued once");

    // The first attempt's late report changes nothing; the retry's success protects.
    assert!(!attacher.on_report(report(&job, true)));
    assert_eq!(
        attacher.ledger().target(3).unwrap().protection,
        Protection::Failed
    );
    assert!(attacher.on_report(report(&retry, true)));
    let target = attacher.ledger().target(3).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert_eq!((target.failures, target.last_error.as_deref()), (0, None));
    assert_eq!(attacher.workers().next_retry(), None);
    assert_eq!(
        attacher.findings().failures().get(&AttachPoint::Xdp),
        Some(&1),
        "still counted"
    );
}

#[test]
fn a_forgotten_interface_ignores_its_report_and_a_new_role_queues_again() {
    let (mut attacher, queue) = without_workers(TcMode::Tcx);
    attacher.want(9, "vethpb", Role::Workload);
    let job = take(&queue).unwrap();
    attacher.forget(9);
    assert!(!attacher.on_report(report(&job, true)));
    assert!(attacher.ledger().targets().is_empty());

    attacher.want(9, "vethpb", Role::Workload);
    attacher.want(9, "up9", Role::Uplink);
    let queued: Vec<Job> = std::iter::from_fn(|| take(&queue)).collect();
    assert_eq!(
        queued
            .iter()
            .map(|j| (j.name.as_str(), j.role))
            .collect::<Vec<_>>(),
        [("up9", Role::Uplink)],
        "a rename or new role is a new attach, in place of the one still waiting"
    );
    assert_eq!(attacher.ledger().target(9).unwrap().role, Role::Uplink);
}

#[test]
fn netlink_first_protects_at_once_then_upgrades_to_tcx_after_start_up() {
    let (mut attacher, queue) = without_workers(TcMode::NetlinkThenTcx);
    attacher.want(4, "vethpc", Role::Workload);
    let job = take(&queue).expect("the protect job");
    assert_eq!(job.kind, JobKind::Protect);
    assert!(attacher.on_report(report_by(&job, true, Mechanism::Netlink)));
    let target = attacher.ledger().target(4).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert_eq!(target.attachment(), Some(Attachment::Netlink));
    assert_eq!(attacher.ledger().readiness_blocker(Instant::now()), None);
    assert_eq!(attacher.ledger().unprotected_points().count(), 0);
    assert_eq!(attacher.ledger().pending_upgrades(), 1);
    assert!(take(&queue).is_none(), "no upgrade before start-up is done");

    attacher.workers().start_upgrades();
    let upgrade = take(&queue).expect("the upgrade");
    assert_eq!((upgrade.kind, upgrade.ifindex), (JobKind::Upgrade, 4));
    // Half done (the egress link failed): still protected, never counted as a failure, and
    // retried after a backoff.
    let mut half = report_by(&upgrade, true, Mechanism::Tcx);
    half.hooks[1].1 = Err(AttachError::io(
        "creating the TCX link",
        &std::io::Error::from_raw_os_error(libc::EMFILE),
    ));
    assert!(attacher.on_report(half));
    let target = attacher.ledger().target(4).unwrap();
    assert_eq!(target.protection, Protection::Protected);
    assert_eq!(target.attachment(), Some(Attachment::TcxAndNetlink));
    assert_eq!(attacher.ledger().unprotected_points().count(), 0);
    assert!(
        attacher.findings().failures().is_empty(),
        "{:?}",
        attacher.findings().failures()
    );
    assert_eq!(attacher.ledger().readiness_blocker(Instant::now()), None);
    assert_eq!(attacher.ledger().pending_upgrades(), 1);
    let now = Instant::now();
    assert_eq!(attacher.retry_due(now), 0);
    let due = attacher
        .workers()
        .next_retry()
        .expect("the upgrade's retry");
    assert_eq!(attacher.retry_due(due), 1);
    let again = take(&queue).expect("the upgrade again");
    assert_eq!(again.kind, JobKind::Upgrade);
    assert!(attacher.on_report(report_by(&again, true, Mechanism::Tcx)));
    let target = attacher.ledger().target(4).unwrap();
    assert_eq!(target.attachment(), Some(Attachment::Tcx));
    assert_eq!(attacher.ledger().pending_upgrades(), 0);
    assert_eq!(attacher.workers().next_retry(), None);
    assert!(take(&queue).is_none());
}

#[test]
fn an_adopted_tcx_link_needs_no_upgrade_and_explicit_modes_never_upgrade() {
    let (mut attacher, queue) = without_workers(TcMode::NetlinkThenTcx);
    attacher.workers().start_upgrades();
    attacher.want(5, "vethpd", Role::Workload);
    attacher.want(6, "up6", Role::Uplink);
    for job in std::iter::from_fn(|| take(&queue)).collect::<Vec<_>>() {
        assert!(attacher.on_report(report(&job, true)));
    }
    assert_eq!(attacher.ledger().pending_upgrades(), 0);
    assert!(
        take(&queue).is_none(),
        "pinned TCX links and XDP: nothing to move"
    );

    for mode in [TcMode::Tcx, TcMode::Netlink] {
        let (mut attacher, queue) = without_workers(mode);
        attacher.workers().start_upgrades();
        attacher.want(7, "vethpe", Role::Workload);
        let job = take(&queue).unwrap();
        assert!(attacher.on_report(report_by(&job, true, Mechanism::Netlink)));
        assert_eq!(attacher.ledger().pending_upgrades(), 0, "{mode:?}");
        assert!(take(&queue).is_none(), "{mode:?}: never an upgrade");
    }
}

#[test]
fn a_queued_upgrade_of_a_forgotten_interface_never_runs_and_a_rename_outdates_a_running_one() {
    let (mut attacher, queue) = without_workers(TcMode::NetlinkThenTcx);
    attacher.want(8, "vethpf", Role::Workload);
    attacher.want(9, "vethpg", Role::Workload);
    for job in std::iter::from_fn(|| take(&queue)).collect::<Vec<_>>() {
        assert!(attacher.on_report(report_by(&job, true, Mechanism::Netlink)));
    }
    attacher.forget(8);
    attacher.workers().start_upgrades();
    let upgrade = queue.try_take().expect("if9's upgrade");
    assert_eq!(upgrade.ifindex, 9);
    assert!(take(&queue).is_none(), "if8's upgrade was dropped");
    // Renamed while its upgrade runs: the rename's attach waits for it, and the upgrade's
    // report is outdated.
    attacher.want(9, "vethph", Role::Workload);
    assert!(
        queue.try_take().is_none(),
        "one job per interface at a time"
    );
    queue.done(&upgrade);
    assert!(!attacher.on_report(report_by(&upgrade, true, Mechanism::Tcx)));
    let protect = take(&queue).expect("the rename's attach");
    assert_eq!(
        (protect.kind, protect.name.as_str()),
        (JobKind::Protect, "vethph")
    );
}

/// The loop asks for the next retry after every event: it comes from an index, which follows
/// every failure, retry, rename and forgotten interface.
#[test]
fn the_retry_index_follows_failures_renames_and_forgotten_interfaces() {
    let (mut attacher, queue) = without_workers(TcMode::Tcx);
    for ifindex in 1..=50 {
        attacher.want(ifindex, &format!("veth{ifindex}"), Role::Workload);
    }
    while let Some(job) = take(&queue) {
        // Every third one fails and waits for a retry.
        assert!(attacher.on_report(report(&job, job.ifindex % 3 != 0)));
    }
    assert!(attacher
        .workers()
        .retries()
        .is_consistent_with(attacher.ledger().targets()));
    let waiting = || {
        attacher
            .ledger()
            .targets()
            .iter()
            .filter(|(_, t)| t.retry_at.is_some())
            .count()
    };
    assert_eq!(waiting(), 16);
    let earliest = attacher
        .ledger()
        .targets()
        .values()
        .filter_map(|t| t.retry_at)
        .min();
    assert_eq!(attacher.workers().next_retry(), earliest);

    // A forgotten and a renamed interface wait for nothing any more.
    attacher.forget(3);
    attacher.want(6, "renamed6", Role::Workload);
    assert!(attacher
        .workers()
        .retries()
        .is_consistent_with(attacher.ledger().targets()));
    let renamed = take(&queue).expect("the renamed interface's attach");
    assert_eq!(renamed.ifindex, 6);

    // All that is due is queued once, and the index is empty after.
    let far = Instant::now() + Duration::from_secs(3600);
    assert_eq!(attacher.retry_due(far), 14);
    assert_eq!(attacher.workers().next_retry(), None);
    assert!(attacher
        .workers()
        .retries()
        .is_consistent_with(attacher.ledger().targets()));
    assert_eq!(std::iter::from_fn(|| take(&queue)).count(), 14);
}
