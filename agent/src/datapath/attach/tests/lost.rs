//! TC notices and repairs, without a kernel: which notices queue a repair, and what a repair's
//! report makes of a hook found without ipq's program.

use super::{report_by, without_workers, *};
use crate::datapath::attach::tc_watch::{TcChange, TcNotice};

const VETH: u32 = 7;

/// A netlink-mode attacher with one workload interface protected by ipq's filters.
fn protected() -> (Attacher, Arc<JobQueue>) {
    protected_in(TcMode::Netlink)
}

/// VETH protected by ipq's netlink filters under `mode`.
fn protected_in(mode: TcMode) -> (Attacher, Arc<JobQueue>) {
    let (mut attacher, queue) = without_workers(mode);
    attacher.want(VETH, "veth7", Role::Workload);
    let job = queue.try_take().expect("the first attach");
    queue.done(&job);
    attacher.on_report(report_by(&job, true, Mechanism::Netlink));
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Protected)
    );
    (attacher, queue)
}

/// VETH is protected and nothing keeps the agent from being ready.
fn assert_protected_and_ready(attacher: &Attacher) {
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Protected)
    );
    assert!(attacher
        .ledger()
        .readiness_blocker(Instant::now())
        .is_none());
}

fn clsact_deleted(ifindex: u32) -> TcNotice {
    TcNotice::Change {
        ifindex,
        change: TcChange::ClsactDeleted,
    }
}

/// The repair job's report: `missing` hooks had no ipq program; each attached again or not.
fn repair_report(job: &Job, missing: &[AttachPoint], attached_again: bool) -> JobReport {
    let hooks = job
        .role
        .points()
        .iter()
        .map(|p| {
            let result = if missing.contains(p) && !attached_again {
                Err(AttachError::ForeignFilter {
                    filter: "bpf filter pref 2 handle 0x4951".into(),
                    direction: "ingress",
                })
            } else {
                Ok(Hooked {
                    how: Attached::Reused,
                    by: Mechanism::Netlink,
                })
            };
            (*p, result)
        })
        .collect();
    JobReport {
        job: job.clone(),
        hooks,
        found_missing: missing.to_vec(),
        ahead: Vec::new(),
    }
}

#[test]
fn a_deleted_clsact_queues_one_repair_however_many_notices_arrive_before_it_runs() {
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(clsact_deleted(VETH));
    attacher.on_tc_notice(TcNotice::Change {
        ifindex: VETH,
        change: TcChange::FilterDeleted(AttachPoint::TcxIngress),
    });
    let job = queue.try_take().expect("a repair");
    assert_eq!(job.kind, JobKind::Repair(Lost::Qdisc));
    assert!(queue.try_take().is_none(), "one repair looks after both");
}

#[test]
fn notices_that_cannot_concern_ipq_queue_nothing() {
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(clsact_deleted(VETH + 1));
    assert!(queue.try_take().is_none(), "not an interface ipq protects");

    let (mut tcx, queue) = without_workers(TcMode::Tcx);
    tcx.want(VETH, "veth7", Role::Workload);
    let job = queue.try_take().expect("the first attach");
    queue.done(&job);
    tcx.on_report(report_by(&job, true, Mechanism::Tcx));
    tcx.on_tc_notice(clsact_deleted(VETH));
    assert!(queue.try_take().is_none(), "TCX links hang on no qdisc");
}

#[test]
fn a_repair_that_attached_again_reports_the_loss_and_stays_protected() {
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(clsact_deleted(VETH));
    let job = queue.try_take().expect("a repair");
    queue.done(&job);
    let all = [AttachPoint::TcxIngress, AttachPoint::TcxEgress];
    attacher.on_report(repair_report(&job, &all, true));
    let lost = attacher.findings_mut().take_lost();
    assert_eq!(
        lost.iter()
            .map(|l| (l.point, l.what, l.error.is_none()))
            .collect::<Vec<_>>(),
        vec![
            (AttachPoint::TcxIngress, Lost::Qdisc, true),
            (AttachPoint::TcxEgress, Lost::Qdisc, true)
        ]
    );
    assert!(attacher.findings_mut().take_lost().is_empty(), "taken once");
    assert_protected_and_ready(&attacher);
}

#[test]
fn a_repair_that_found_everything_in_place_reports_nothing() {
    // The notice of ipq's own change (an upgrade removing its filter behind a TCX link).
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(clsact_deleted(VETH));
    let job = queue.try_take().expect("a repair");
    queue.done(&job);
    attacher.on_report(repair_report(&job, &[], true));
    assert!(attacher.findings_mut().take_lost().is_empty());
}

#[test]
fn a_repair_that_cannot_attach_again_leaves_the_interface_unprotected_and_not_ready() {
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(TcNotice::Change {
        ifindex: VETH,
        change: TcChange::ForeignFilter(AttachPoint::TcxIngress),
    });
    let job = queue.try_take().expect("a repair");
    assert_eq!(job.kind, JobKind::Repair(Lost::Filter));
    queue.done(&job);
    attacher.on_report(repair_report(&job, &[AttachPoint::TcxIngress], false));
    let lost = attacher.findings_mut().take_lost();
    assert_eq!(lost.len(), 1);
    assert!(lost[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("foreign")));
    let target = attacher.ledger().target(VETH).expect("still wanted");
    assert_eq!(target.protection, Protection::Failed);
    assert!(!target.attached.contains_key(&AttachPoint::TcxIngress));
    assert!(attacher
        .ledger()
        .readiness_blocker(Instant::now())
        .is_some_and(|why| why.contains("veth7")));
    assert!(
        attacher.workers().next_retry().is_some(),
        "retried with backoff"
    );
}

#[test]
fn a_hook_that_never_had_ipqs_program_is_not_counted_lost() {
    let (mut attacher, queue) = without_workers(TcMode::Netlink);
    attacher.want(VETH, "veth7", Role::Workload);
    let first = queue.try_take().expect("the first attach");
    queue.done(&first);
    attacher.on_report(report_by(&first, false, Mechanism::Netlink));
    attacher.on_tc_notice(TcNotice::Overrun);
    let job = queue
        .try_take()
        .expect("an overrun looks at every workload interface");
    queue.done(&job);
    let all = [AttachPoint::TcxIngress, AttachPoint::TcxEgress];
    attacher.on_report(repair_report(&job, &all, false));
    assert!(
        attacher.findings_mut().take_lost().is_empty(),
        "a failed attach, not a lost one"
    );
}

#[test]
fn the_hooks_held_by_netlink_filters_are_shared_with_the_verification_as_they_change() {
    let (mut attacher, queue) = protected();
    let hooks = attacher.ledger().netlink_hooks();
    let shared = || hooks.lock().unwrap().get(&VETH).cloned();
    assert_eq!(
        shared(),
        Some(vec![AttachPoint::TcxIngress, AttachPoint::TcxEgress])
    );
    // The verification found the ingress filter gone without a notice: one repair.
    attacher.on_filter_missing(VETH, AttachPoint::TcxIngress);
    let job = queue.try_take().expect("a repair");
    assert_eq!(job.kind, JobKind::Repair(Lost::Filter));
    attacher.forget(VETH);
    assert_eq!(shared(), None, "a forgotten interface is not looked at");
}

#[test]
fn a_known_loss_is_unprotected_and_not_ready_until_its_repair_reports() {
    let (mut attacher, queue) = protected();
    attacher.on_tc_notice(clsact_deleted(VETH));
    let target = attacher.ledger().target(VETH).expect("still wanted");
    assert_eq!(target.protection, Protection::Repairing);
    assert_eq!(
        attacher.ledger().unprotected_points().count(),
        2,
        "both hooks hung on the deleted clsact"
    );
    assert!(attacher
        .ledger()
        .readiness_blocker(Instant::now())
        .is_some_and(|why| why.contains("veth7") && why.contains("repairing")));

    let job = queue.try_take().expect("a repair");
    queue.done(&job);
    let all = [AttachPoint::TcxIngress, AttachPoint::TcxEgress];
    attacher.on_report(repair_report(&job, &all, true));
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Protected)
    );
    assert_eq!(attacher.ledger().unprotected_points().count(), 0);
    assert!(attacher
        .ledger()
        .readiness_blocker(Instant::now())
        .is_none());
}

#[test]
fn a_filter_missing_at_verification_is_unprotected_until_repaired() {
    let (mut attacher, queue) = protected();
    attacher.on_filter_missing(VETH, AttachPoint::TcxEgress);
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Repairing)
    );
    assert_eq!(
        attacher
            .ledger()
            .unprotected_points()
            .map(|(_, _, p)| p)
            .collect::<Vec<_>>(),
        vec![AttachPoint::TcxEgress]
    );
    let job = queue.try_take().expect("a repair");
    queue.done(&job);
    attacher.on_report(repair_report(&job, &[AttachPoint::TcxEgress], false));
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Failed),
        "still lost: failed, and retried"
    );
    assert_eq!(attacher.ledger().unprotected_points().count(), 1);
}

#[test]
fn a_deleted_filter_under_auto_waits_for_the_repairs_look_before_saying_lost() {
    // Under `tc_attach = auto` an upgrade deletes ipq's own filter once the TCX link holds
    // the hook: the notice alone proves nothing.
    let (mut attacher, queue) = protected_in(TcMode::NetlinkThenTcx);
    attacher.on_tc_notice(TcNotice::Change {
        ifindex: VETH,
        change: TcChange::FilterDeleted(AttachPoint::TcxIngress),
    });
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Protected)
    );
    let repair =
        std::iter::from_fn(|| queue.try_take()).find(|j| matches!(j.kind, JobKind::Repair(_)));
    assert!(repair.is_some(), "the repair still looks");
    // A deleted clsact is never ipq's doing, in any mode.
    attacher.on_tc_notice(clsact_deleted(VETH));
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Repairing)
    );
}

#[test]
fn a_filter_missing_at_verification_under_auto_waits_for_the_repairs_look_too() {
    // The pass may have looked while ipq's own upgrade had deleted the filter and not yet
    // reported: the interface stays protected (and the agent ready) until the repair says.
    let (mut attacher, queue) = protected_in(TcMode::NetlinkThenTcx);
    assert!(!attacher.on_filter_missing(VETH, AttachPoint::TcxIngress));
    assert_protected_and_ready(&attacher);
    let repair = std::iter::from_fn(|| queue.try_take())
        .find(|j| j.kind == JobKind::Repair(Lost::Filter))
        .expect("the repair still looks");
    // What it finds decides: the filter really gone (no TCX link either) is a lost hook.
    queue.done(&repair);
    attacher.on_report(repair_report(&repair, &[AttachPoint::TcxIngress], false));
    assert_eq!(
        attacher.ledger().target(VETH).map(|t| t.protection),
        Some(Protection::Failed)
    );
}

/// TC notices through a queue too small for them: the notice of the second interface is
/// dropped, and the overrun that takes its place still has that interface repaired. A full
/// notice queue costs a look at every hook, never a lost repair.
#[tokio::test]
async fn a_notice_dropped_by_a_full_queue_is_repaired_through_the_overrun() {
    let (mut attacher, queue) = protected();
    const OTHER: u32 = 8;
    attacher.want(OTHER, "veth8", Role::Workload);
    let job = queue.try_take().expect("the first attach");
    queue.done(&job);
    attacher.on_report(report_by(&job, true, Mechanism::Netlink));

    let (input, notices) = futures::channel::mpsc::unbounded();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let overflows = crate::queues::Overflows::new()
        .unwrap()
        .of(crate::queues::Queue::TcNotices);
    let forwarder = tokio::spawn(crate::queues::forward_or_resync(
        notices,
        tx,
        || TcNotice::Overrun,
        overflows.clone(),
    ));
    input.unbounded_send(clsact_deleted(VETH)).unwrap();
    input.unbounded_send(clsact_deleted(OTHER)).unwrap();
    drop(input);
    // The loop reads only once the second notice has met the full queue.
    for _ in 0..100_000 {
        if overflows.get() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(overflows.get(), 1, "the second notice did not fit");
    let mut received = Vec::new();
    while let Some(notice) = rx.recv().await {
        received.push(notice);
        attacher.on_tc_notice(notice);
    }
    forwarder.await.unwrap();
    assert_eq!(received, [clsact_deleted(VETH), TcNotice::Overrun]);
    let mut repaired = Vec::new();
    while let Some(job) = queue.try_take() {
        queue.done(&job);
        assert!(matches!(job.kind, JobKind::Repair(_)), "{job:?}");
        repaired.push(job.ifindex);
    }
    repaired.sort_unstable();
    assert_eq!(repaired, [VETH, OTHER], "both interfaces are looked at");
}
