//! A journal of a newer format, as a rollback finds it: recognised, left untouched byte for
//! byte, and journaled beside; never called corrupt.

use std::{
    fs::{self, File},
    path::Path,
    time::{Duration, SystemTime},
};

use super::{reopen, Mem, Rec};
use crate::journal::{format, Journal, JournalError, NewerJournal, JOURNAL_FILE};

/// A synthetic version 3 file: a framed header that keeps the contract (`format`, `version`)
/// with fields this agent does not know, then lines of a shape it cannot read.
fn future_file() -> Vec<u8> {
    let mut bytes = Vec::new();
    format::frame(
        br#"{"format":"ipq-journal","version":3,"layout":"columnar","boot_id":null}"#,
        &mut bytes,
    );
    format::frame(
        br#"{"columns":["addr","state"],"rows":[["10.0.0.9",3]]}"#,
        &mut bytes,
    );
    bytes.extend_from_slice(b"\x00\x01 a block this agent cannot read\n");
    bytes
}

fn set_aside_files(dir: &Path, marker: &str) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(marker))
        .count()
}

#[test]
fn a_newer_agents_journal_is_left_untouched_and_this_agent_journals_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join(JOURNAL_FILE);
    let future = future_file();
    fs::write(&main, &future).unwrap();

    let (mut journal, loaded) = reopen(dir.path());
    assert!(loaded.is_none(), "nothing of its own yet: the maps tell");
    let beside = dir.path().join(format!("{JOURNAL_FILE}.v2"));
    assert_eq!(
        journal.newer(),
        Some(&NewerJournal {
            path: main.clone(),
            version: 3,
            beside: beside.clone(),
            stale_set_aside: None,
        })
    );
    assert_eq!(journal.path(), beside);

    // Its changes are durable beside the newer file, which stays as it was.
    let mut mem = Mem::default();
    mem.put(1, "after the rollback");
    mem.put(2, "after the rollback");
    journal.commit(&mut mem).unwrap();
    mem.remove(2);
    journal.commit(&mut mem).unwrap();
    assert_eq!(
        fs::read(&main).unwrap(),
        future,
        "untouched for the newer agent"
    );
    assert_eq!(
        set_aside_files(dir.path(), ".corrupt-"),
        0,
        "not called corrupt"
    );

    // The rolled-back agent's next start reads its own changes back.
    let (journal, loaded) = reopen(dir.path());
    assert_eq!(loaded.unwrap().records, mem.values());
    assert_eq!(journal.newer().map(|n| n.version), Some(3));
    assert_eq!(fs::read(&main).unwrap(), future);
}

#[test]
fn a_newer_version_is_recognised_by_the_contract_alone() {
    // Whatever the newer format does to its framing: the header's JSON alone, or a checksum
    // this agent's hash does not reproduce.
    for first_line in [
        r#"{"format":"ipq-journal","version":7,"body":"elsewhere"}"#.to_owned(),
        format!(
            "{} {}",
            "0123456789abcdef", r#"{"format":"ipq-journal","version":4}"#
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = first_line.into_bytes();
        bytes.extend_from_slice(b"\nwhatever follows\n");
        fs::write(dir.path().join(JOURNAL_FILE), &bytes).unwrap();
        let (journal, loaded) = reopen(dir.path());
        assert!(loaded.is_none());
        assert!(journal.newer().is_some_and(|n| n.version >= 4));
        assert_eq!(fs::read(dir.path().join(JOURNAL_FILE)).unwrap(), bytes);
    }
}

#[test]
fn what_is_not_a_newer_ipq_journal_is_still_corruption() {
    for header in [
        // Another program's file with a version number.
        r#"{"format":"other-journal","version":3}"#,
        // This agent's own version with a damaged frame.
        r#"0123456789abcdef {"format":"ipq-journal","version":2}"#,
        // An older version than any this agent reads.
        r#"0123456789abcdef {"format":"ipq-journal","version":0}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(JOURNAL_FILE), format!("{header}\n")).unwrap();
        let mut journal = Journal::<Rec>::open(dir.path()).unwrap();
        let err = journal.load().unwrap_err();
        assert!(
            matches!(err, JournalError::Corrupt { .. }),
            "{header}: {err}"
        );
        assert!(journal.newer().is_none());
    }
}

#[test]
fn a_file_kept_beside_before_the_newer_agent_wrote_again_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join(JOURNAL_FILE);
    fs::write(&main, future_file()).unwrap();
    // An earlier rollback's file, then a roll forward whose agent wrote its journal since.
    let (mut journal, _) = reopen(dir.path());
    let mut mem = Mem::default();
    mem.put(1, "during the first rollback");
    journal.commit(&mut mem).unwrap();
    let beside = journal.path();
    drop(journal);
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    File::options()
        .write(true)
        .open(&beside)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();

    let (journal, loaded) = reopen(dir.path());
    assert!(loaded.is_none(), "the stale copy is not trusted");
    let stale = journal.newer().unwrap().stale_set_aside.clone().unwrap();
    assert!(!beside.exists());
    assert!(stale.exists(), "kept as evidence");
    assert_eq!(set_aside_files(dir.path(), ".stale-"), 1);
}
