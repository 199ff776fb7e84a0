use super::*;
use crate::queues::{Overflows, Queue};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A hygiene handle whose jobs land in the returned receiver instead of a worker.
fn hygiene() -> (Hygiene, mpsc::Receiver<Job>) {
    with_queue(1024, dropped_counter())
}

fn dropped_counter() -> IntCounter {
    Overflows::new().unwrap().of(Queue::HygieneJobs)
}

/// The same, with a job queue of `capacity` whose drops `dropped` counts.
fn with_queue(capacity: usize, dropped: IntCounter) -> (Hygiene, mpsc::Receiver<Job>) {
    let (tx, rx) = JobSender::new(capacity, dropped);
    let mut h = Hygiene::disabled();
    h.jobs = Some(tx);
    (h, rx)
}

fn queued(rx: &mut mpsc::Receiver<Job>) -> Vec<Job> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn triggers(rx: &mut mpsc::Receiver<Job>) -> Vec<(IpAddr, Trigger, Option<u32>)> {
    queued(rx)
        .into_iter()
        .map(|j| (j.addr, j.trigger, j.holder_ifindex))
        .collect()
}

#[test]
fn a_new_holder_and_a_gone_one_are_cleaned_the_same_one_coming_back_is_not() {
    let (mut h, mut rx) = hygiene();
    let a = ip("10.0.0.5");
    h.on_transition(a, false, Some(5), true); // Free -> Active(5)
    h.on_transition(a, false, Some(5), true); // Active(5) -> Draining(5)
    h.on_transition(a, false, Some(5), true); // Draining(5) -> Active(5): the same holder
    h.on_transition(a, false, Some(6), true); // early reuse: Active(6)
    h.on_transition(a, true, None, true); // holder gone: quarantined
    h.on_transition(a, false, Some(7), true); // claimed during the quarantine
    assert_eq!(
        triggers(&mut rx),
        [
            (a, Trigger::NewHolder, Some(5)),
            (a, Trigger::NewHolder, Some(6)),
            (a, Trigger::HolderGone, None),
            (a, Trigger::NewHolder, Some(7)),
        ]
    );
}

#[test]
fn under_observe_and_before_start_nothing_is_cleaned() {
    let (mut h, mut rx) = hygiene();
    h.on_transition(ip("10.0.0.5"), false, Some(5), false);
    h.on_transition(ip("10.0.0.5"), true, None, false);
    assert!(triggers(&mut rx).is_empty());
    // Disabled (recovery at start): remembered, not cleaned.
    let mut idle = Hygiene::disabled();
    idle.on_transition(ip("10.0.0.6"), false, Some(5), true);
    assert_eq!(
        idle.addresses
            .get_mut(&ip("10.0.0.6"))
            .and_then(|entry| entry.set_holder(Some(5))),
        Some(5)
    );
}

#[test]
fn an_address_with_no_holder_and_no_report_is_forgotten() {
    let mut h = Hygiene::disabled();
    let addr = ip("10.0.0.7");
    h.on_transition(addr, false, Some(5), true);
    h.on_transition(addr, true, None, true);
    assert!(h.addresses.is_empty(), "nothing left to keep of it");
    h.on_transition(addr, false, Some(5), true);
    h.forget(addr);
    assert!(h.addresses.is_empty());
}

#[test]
fn a_claim_waits_for_its_own_holders_jobs_only() {
    let (mut h, mut rx) = hygiene();
    h.begin_claim(6, Some([2, 0, 0, 0, 0, 6]));
    h.on_transition(ip("10.0.0.5"), false, Some(6), true);
    h.on_transition(ip("fd00::5"), false, Some(6), true);
    // Another address's holder went away meanwhile: not the claim's business.
    h.on_transition(ip("10.0.0.9"), true, None, true);
    let waits = h.end_claim();
    assert_eq!(
        waits.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        [ip("10.0.0.5"), ip("fd00::5")]
    );
    let jobs: Vec<Job> = queued(&mut rx);
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].holder_mac, Some([2, 0, 0, 0, 0, 6]));
    assert!(jobs[0].done.is_some() && jobs[1].done.is_some());
    assert!(jobs[2].done.is_none() && jobs[2].holder_mac.is_none());
    assert!(h.end_claim().is_empty(), "a claim's waits are taken once");
}

#[test]
fn reports_are_kept_while_the_address_is_in_the_registry() {
    let (mut h, _rx) = hygiene();
    let job = Job {
        addr: ip("10.0.0.5"),
        trigger: Trigger::NewHolder,
        holder_ifindex: Some(5),
        holder_mac: None,
        done: None,
    };
    h.record(Report::new(&job), true);
    assert!(h.last(ip("10.0.0.5")).is_some());
    h.forget(ip("10.0.0.5"));
    assert!(h.last(ip("10.0.0.5")).is_none());
    h.record(Report::new(&job), false);
    assert!(
        h.last(ip("10.0.0.5")).is_none(),
        "a freed address keeps no report"
    );
}

#[test]
fn a_kept_report_reads_back_whole() {
    let (mut h, _rx) = hygiene();
    let job = Job {
        addr: ip("10.0.0.6"),
        trigger: Trigger::HolderGone,
        holder_ifindex: None,
        holder_mac: None,
        done: None,
    };
    let plain = Report {
        finished_ns: 42,
        conntrack_entries: 3,
        conntrack_flush: super::FlushMethod::Kernel,
        neighbours: 2,
        announcements: 1,
        ..Report::new(&job)
    };
    h.record(plain.clone(), true);
    assert_eq!(h.last(ip("10.0.0.6")), Some(plain));
    let noted = Report {
        skipped: Some("the node's own address".into()),
        permanent_neighbours: vec!["10.0.0.6 lladdr 02:00:00:00:00:01".into()],
        errors: vec!["conntrack: EPERM".into()],
        ..Report::new(&job)
    };
    h.record(noted.clone(), true);
    assert_eq!(h.last(ip("10.0.0.6")), Some(noted));
    let rate_limited = Report {
        announce_skipped: Some("rate-limited (announce_per_second = 50)".into()),
        ..Report::new(&job)
    };
    h.record(rate_limited.clone(), true);
    assert_eq!(h.last(ip("10.0.0.6")), Some(rate_limited));
}

fn job(addr: &str, trigger: Trigger, claimed: bool) -> Job {
    Job {
        addr: ip(addr),
        trigger,
        holder_ifindex: None,
        holder_mac: None,
        done: claimed.then(|| oneshot::channel().0),
    }
}

fn addrs(group: &[Job]) -> Vec<IpAddr> {
    group.iter().map(|j| j.addr).collect()
}

#[test]
fn claims_are_cleaned_before_holder_gone_jobs_unless_they_share_an_address() {
    let groups = super::worker::claims_first(vec![
        job("10.0.0.9", Trigger::HolderGone, false),
        job("10.0.0.5", Trigger::NewHolder, true),
        job("10.0.0.7", Trigger::NewHolder, false),
        job("fd00::5", Trigger::NewHolder, true),
    ]);
    assert_eq!(groups.len(), 2);
    assert_eq!(addrs(&groups[0]), [ip("10.0.0.5"), ip("fd00::5")]);
    assert_eq!(addrs(&groups[1]), [ip("10.0.0.9"), ip("10.0.0.7")]);

    // The old holder of 10.0.0.5 went, then a claim took it: one group, in arrival order.
    let groups = super::worker::claims_first(vec![
        job("10.0.0.5", Trigger::HolderGone, false),
        job("10.0.0.5", Trigger::NewHolder, true),
    ]);
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0].iter().map(|j| j.trigger).collect::<Vec<_>>(),
        [Trigger::HolderGone, Trigger::NewHolder]
    );
}

/// The job queue is bounded: a job that finds it full is dropped and counted, `ipq get` shows
/// the address was not cleaned, and a claim waiting for it is answered with that report
/// instead of waiting out its bound; the next job that fits is queued again.
#[test]
fn a_full_job_queue_drops_counts_and_tells_whoever_waits() {
    let dropped = dropped_counter();
    let (mut h, mut rx) = with_queue(2, dropped.clone());
    h.on_transition(ip("10.0.0.1"), true, None, true);
    h.on_transition(ip("10.0.0.2"), true, None, true);
    assert_eq!(dropped.get(), 0);
    // Full: the next holder-gone job is dropped.
    h.on_transition(ip("10.0.0.3"), true, None, true);
    assert_eq!(dropped.get(), 1);
    let shown = h
        .last(ip("10.0.0.3"))
        .expect("the dropped job's report is kept");
    assert_eq!(shown.trigger, Trigger::HolderGone);
    assert!(
        shown.errors[0].contains("queue was full"),
        "{:?}",
        shown.errors
    );
    // A claim's job dropped: its wait is answered at once with the same report.
    h.begin_claim(7, None);
    h.on_transition(ip("10.0.0.4"), false, Some(7), true);
    let mut waits = h.end_claim();
    assert_eq!(dropped.get(), 2);
    assert_eq!(waits.len(), 1, "the claim still hears about its address");
    let (addr, wait) = waits.pop().unwrap();
    assert_eq!(addr, ip("10.0.0.4"));
    let told = wait
        .blocking_recv()
        .expect("answered, not left to time out");
    assert_eq!(told.trigger, Trigger::NewHolder);
    assert!(told.errors[0].contains("queue was full"));
    // Only what fitted was queued; with room again, jobs are queued again.
    assert_eq!(
        queued(&mut rx).iter().map(|j| j.addr).collect::<Vec<_>>(),
        [ip("10.0.0.1"), ip("10.0.0.2")]
    );
    h.on_transition(ip("10.0.0.5"), true, None, true);
    assert_eq!(
        triggers(&mut rx),
        [(ip("10.0.0.5"), Trigger::HolderGone, None)]
    );
    assert_eq!(dropped.get(), 2);
}

#[test]
fn the_job_queue_holds_two_per_address_and_one_batch_at_least() {
    assert_eq!(queue::job_queue(65_536), 131_072);
    assert_eq!(
        queue::job_queue(4),
        1024,
        "a small registry still gets a whole batch"
    );
}
