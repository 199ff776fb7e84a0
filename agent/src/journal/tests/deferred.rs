//! Commits whose flush runs on the pool: when they are called durable, and what a failed flush
//! does to the file.

use super::*;

/// A journal in `dir` whose commits leave their flush to the pool, and the pool's reports.
fn deferred(dir: &Path) -> (Journal<Rec>, tokio::sync::mpsc::Receiver<Synced>) {
    let mut journal = Journal::open(dir).unwrap();
    assert!(journal.load().unwrap().is_none());
    let (reports, receiver) = tokio::sync::mpsc::channel(REPORT_QUEUE);
    journal.defer_syncs(reports);
    (journal, receiver)
}

#[test]
fn a_deferred_commit_is_durable_once_a_flush_after_it_reports() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, mut reports) = deferred(dir.path());
    let mut mem = Mem::default();
    // The first commit creates the file: a rewrite, flushed on the caller.
    mem.put(1, "first");
    assert_eq!(journal.commit_deferred(&mut mem).unwrap(), Commit::Durable);
    mem.put(2, "second");
    let Commit::Syncing(first) = journal.commit_deferred(&mut mem).unwrap() else {
        panic!("an appended commit waits for its flush");
    };
    mem.put(3, "third");
    let Commit::Syncing(second) = journal.commit_deferred(&mut mem).unwrap() else {
        panic!("an appended commit waits for its flush");
    };
    assert!(second > first);
    assert_eq!(journal.unflushed(), 2);
    // Nothing new, but commits still unflushed: not durable yet.
    assert_eq!(
        journal.commit_deferred(&mut mem).unwrap(),
        Commit::Syncing(second)
    );
    let mut through = 0;
    while through < second {
        let synced = reports
            .blocking_recv()
            .expect("the pool reports every flush");
        match journal.on_synced(synced) {
            SyncOutcome::DurableThrough(t) => through = t,
            other => panic!("a flush of a healthy file: {other:?}"),
        }
    }
    assert_eq!(journal.unflushed(), 0);
    assert_eq!(journal.commit_deferred(&mut mem).unwrap(), Commit::Durable);
    let (_, loaded) = reopen(dir.path());
    assert_eq!(loaded.unwrap().records, mem.values());
}

#[test]
fn a_later_flush_covers_the_commits_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _reports) = deferred(dir.path());
    let mut mem = Mem::default();
    mem.put(1, "first");
    journal.commit_deferred(&mut mem).unwrap();
    let file_id = journal.log.file_id().unwrap();
    let mut tickets = Vec::new();
    for id in 2..=4 {
        mem.put(id, "more");
        match journal.commit_deferred(&mut mem).unwrap() {
            Commit::Syncing(ticket) => tickets.push(ticket),
            Commit::Durable => panic!("an appended commit waits for its flush"),
        }
    }
    // The last one's flush reports first (flushes run side by side): it covers all three.
    let report = |ticket| Synced {
        ticket,
        file_id,
        result: Ok(()),
    };
    assert!(matches!(
        journal.on_synced(report(tickets[2])),
        SyncOutcome::DurableThrough(t) if t == tickets[2]
    ));
    // An earlier flush reporting late takes nothing back.
    assert!(matches!(
        journal.on_synced(report(tickets[0])),
        SyncOutcome::DurableThrough(t) if t == tickets[2]
    ));
    assert_eq!(journal.unflushed(), 0);
}

#[test]
fn a_failed_flush_is_never_appended_over_and_its_files_later_reports_do_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _reports) = deferred(dir.path());
    let mut mem = Mem::default();
    mem.put(1, "first");
    journal.commit_deferred(&mut mem).unwrap();
    let failed_file = journal.log.file_id().unwrap();
    mem.put(2, "second");
    let Commit::Syncing(ticket) = journal.commit_deferred(&mut mem).unwrap() else {
        panic!("an appended commit waits for its flush");
    };
    let failed = journal.on_synced(Synced {
        ticket,
        file_id: failed_file,
        result: Err(io::Error::from_raw_os_error(libc::EIO)),
    });
    match failed {
        SyncOutcome::Failed(e) => assert!(e.to_string().contains("Input/output error"), "{e}"),
        other => panic!("a failed flush: {other:?}"),
    }
    // A success on the same file afterwards proves nothing: its pages' fate is unknown.
    assert!(matches!(
        journal.on_synced(Synced {
            ticket,
            file_id: failed_file,
            result: Ok(()),
        }),
        SyncOutcome::Stale
    ));
    // The next commit writes the whole state to a new file, flushed before it answers.
    mem.put(3, "third");
    assert_eq!(journal.commit_deferred(&mut mem).unwrap(), Commit::Durable);
    assert_ne!(journal.log.file_id().unwrap(), failed_file);
    assert_eq!(journal.unflushed(), 0);
    let (_, loaded) = reopen(dir.path());
    assert_eq!(loaded.unwrap().records, mem.values());
}

#[test]
fn a_commit_flushed_on_the_caller_covers_the_deferred_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _reports) = deferred(dir.path());
    let mut mem = Mem::default();
    mem.put(1, "first");
    journal.commit_deferred(&mut mem).unwrap();
    mem.put(2, "second");
    assert!(matches!(
        journal.commit_deferred(&mut mem).unwrap(),
        Commit::Syncing(_)
    ));
    // Shutdown's save: flushed here, whatever the pool has still to report.
    journal.commit(&mut mem).unwrap();
    assert_eq!(journal.unflushed(), 0);
    assert_eq!(journal.commit_deferred(&mut mem).unwrap(), Commit::Durable);
}

/// A loop that does not read the reports for a while costs no memory: the pool holds one
/// untaken flush, one per thread, and [`REPORT_QUEUE`] reports, and the newest flush asked for
/// covers every commit before it.
#[test]
fn flushes_asked_for_while_the_reports_wait_are_coalesced_into_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, mut reports) = deferred(dir.path());
    let mut mem = Mem::default();
    mem.put(0, "created");
    assert_eq!(journal.commit_deferred(&mut mem).unwrap(), Commit::Durable);
    const COMMITS: u32 = 200;
    let mut last = 0;
    for key in 1..=COMMITS {
        mem.put(key, "appended");
        let Commit::Syncing(ticket) = journal.commit_deferred(&mut mem).unwrap() else {
            panic!("an appended commit waits for its flush");
        };
        last = ticket;
    }
    let mut through = 0;
    let mut received = 0;
    while through < last {
        let synced = reports
            .blocking_recv()
            .expect("the pool reports the newest flush");
        received += 1;
        if let SyncOutcome::DurableThrough(t) = journal.on_synced(synced) {
            through = t;
        }
    }
    assert_eq!(through, last);
    let bound = REPORT_QUEUE + super::super::syncer::SYNC_THREADS + 1;
    assert!(
        received <= bound,
        "{received} reports for {COMMITS} commits made while none was read: more than {bound} \
         were queued"
    );
}
