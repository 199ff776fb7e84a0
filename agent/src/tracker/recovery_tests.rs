//! The journal's answer at start read into what to recover, without a journal on disk.

use std::path::{Path, PathBuf};

use super::{read_journal, Recovery};
use crate::{
    journal::{JournalError, Loaded, NewerJournal, TornTail},
    registry::{AddrRecord, AddrStatus, Holder},
};

const PATH: &str = "/var/lib/ipq/registry.journal";
const SECOND: u64 = 1_000_000_000;

fn active_since(since: u64) -> AddrRecord {
    AddrRecord::new(
        "10.0.0.5".parse().unwrap(),
        AddrStatus::Active {
            holder: Holder::new(11, "vethA".to_owned()),
            since,
        },
    )
}

fn loaded(same_boot: bool, torn_tail: Option<TornTail>) -> Loaded<AddrRecord> {
    Loaded {
        records: vec![active_since(100 * SECOND)],
        same_boot,
        written_mono_ns: 100 * SECOND,
        written_unix_ms: 1_000_000,
        version: crate::journal::VERSION,
        torn_tail,
    }
}

fn since(record: &AddrRecord) -> u64 {
    match record.status {
        AddrStatus::Active { since, .. } => since,
        ref other => panic!("active, not {other:?}"),
    }
}

#[test]
fn a_journal_of_this_boot_is_taken_as_it_is() {
    let read = read_journal(
        Ok(Some(loaded(true, None))),
        Path::new(PATH),
        None,
        500 * SECOND,
    );
    assert_eq!(read.from, Recovery::Journal);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    assert_eq!(since(&read.records[0]), 100 * SECOND);
}

#[test]
fn a_journal_of_another_boot_keeps_the_time_it_had_left_from_this_start() {
    // This boot's monotonic clock reads 50 s now. However far the wall clock moved since the
    // write (a +2 h step across the reboot included), the write is taken as now: the record
    // is as old as it was then, and no deadline ends earlier than it had left.
    let read = read_journal(
        Ok(Some(loaded(false, None))),
        Path::new(PATH),
        None,
        50 * SECOND,
    );
    assert_eq!(read.from, Recovery::Journal);
    assert_eq!(since(&read.records[0]), 50 * SECOND);
}

#[test]
fn a_torn_tail_is_a_problem_naming_the_file_and_the_bytes_dropped() {
    let read = read_journal(
        Ok(Some(loaded(
            true,
            Some(TornTail {
                at: 4096,
                dropped: 17,
            }),
        ))),
        Path::new(PATH),
        None,
        500 * SECOND,
    );
    assert_eq!(read.from, Recovery::Journal);
    assert_eq!(read.records.len(), 1, "what came before the tear is kept");
    assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
    for part in [PATH, "17 bytes", "byte 4096"] {
        assert!(read.problems[0].contains(part), "{:?}", read.problems);
    }
}

#[test]
fn no_journal_or_a_corrupt_one_rebuilds_from_the_pinned_maps() {
    let none = read_journal(Ok(None), Path::new(PATH), None, 0);
    assert_eq!(none.from, Recovery::PinnedMaps);
    assert!(none.problems.is_empty(), "a first start is no problem");

    let corrupt = read_journal(
        Err(JournalError::Corrupt {
            path: PathBuf::from(PATH),
            reason: "line 3: not JSON".to_owned(),
            moved_to: PathBuf::from("/var/lib/ipq/registry.journal.corrupt-1"),
        }),
        Path::new(PATH),
        None,
        0,
    );
    assert_eq!(corrupt.from, Recovery::PinnedMaps);
    assert!(corrupt.records.is_empty());
    assert!(
        corrupt.problems[0].contains("line 3: not JSON")
            && corrupt.problems[0].contains("registry.journal.corrupt-1"),
        "{:?}",
        corrupt.problems
    );
}

#[test]
fn a_newer_agents_journal_is_a_problem_that_says_where_this_one_writes() {
    let newer = NewerJournal {
        path: PathBuf::from(PATH),
        version: crate::journal::VERSION + 1,
        beside: PathBuf::from("/var/lib/ipq/registry.journal.v3"),
        stale_set_aside: None,
    };
    let read = read_journal(Ok(None), Path::new(PATH), Some(&newer), 0);
    assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
    assert!(
        read.problems[0].contains("newer ipq") && read.problems[0].contains("registry.journal.v3"),
        "{:?}",
        read.problems
    );
}
