//! The log on its own: what a commit writes, what a load makes of torn, corrupt, compacted and
//! old-format files.

use std::{collections::BTreeMap, fs, io::Write as _, os::unix::fs::PermissionsExt as _};

use serde::{Deserialize, Serialize};

use super::{format::frame, *};

mod deferred;
mod format_errors;
mod newer;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Rec {
    id: u32,
    payload: String,
}

impl Entry for Rec {
    type Key = u32;
    fn key(&self) -> u32 {
        self.id
    }
}

/// A registry stand-in: records and the keys changed since the journal last took them.
#[derive(Default)]
struct Mem {
    records: BTreeMap<u32, Rec>,
    changed: Vec<u32>,
}

impl Mem {
    fn put(&mut self, id: u32, payload: &str) {
        let payload = payload.to_owned();
        self.records.insert(id, Rec { id, payload });
        self.changed.push(id);
    }

    fn remove(&mut self, id: u32) {
        self.records.remove(&id);
        self.changed.push(id);
    }

    fn values(&self) -> Vec<Rec> {
        self.records.values().cloned().collect()
    }
}

impl Contents<Rec> for Mem {
    fn take_changed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.changed)
    }
    fn get(&self, key: &u32) -> Option<&Rec> {
        self.records.get(key)
    }
    fn all(&self) -> Vec<Rec> {
        self.values()
    }
}

fn reopen(dir: &Path) -> (Journal<Rec>, Option<Loaded<Rec>>) {
    let mut journal = Journal::open(dir).unwrap();
    let loaded = journal.load().unwrap();
    (journal, loaded)
}

/// A journal in `dir` holding ids 1..=3, then 2 changed and 3 removed in a second commit.
fn written(dir: &Path) -> (Journal<Rec>, Mem) {
    let mut journal = Journal::open(dir).unwrap();
    assert!(journal.load().unwrap().is_none());
    let mut mem = Mem::default();
    for id in 1..=3 {
        mem.put(id, "first");
    }
    journal.commit(&mut mem).unwrap();
    mem.put(2, "second");
    mem.remove(3);
    journal.commit(&mut mem).unwrap();
    (journal, mem)
}

#[test]
fn commits_replay_in_the_same_boot() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, mem) = written(dir.path());
    let mode = fs::metadata(journal.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let (_, loaded) = reopen(dir.path());
    let loaded = loaded.unwrap();
    assert_eq!(loaded.records, mem.values());
    assert!(loaded.same_boot);
    assert_eq!(loaded.version, 2);
    assert!(loaded.written_mono_ns > 0 && loaded.written_unix_ms > 0);
    assert_eq!(loaded.torn_tail, None);
}

#[test]
fn a_commit_appends_only_what_changed_and_nothing_when_nothing_did() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = Journal::<Rec>::open(dir.path()).unwrap();
    journal.load().unwrap();
    let mut mem = Mem::default();
    let big = "x".repeat(1000);
    for id in 0..100 {
        mem.put(id, &big);
    }
    journal.commit(&mut mem).unwrap();
    let before = fs::metadata(journal.path()).unwrap().len();
    assert!(before > 100_000, "{before}");
    mem.put(7, "small");
    journal.commit(&mut mem).unwrap();
    let grown = fs::metadata(journal.path()).unwrap().len() - before;
    assert!(grown < 200, "one small record appended {grown} bytes");
    journal.commit(&mut mem).unwrap();
    assert_eq!(
        fs::metadata(journal.path()).unwrap().len() - before,
        grown,
        "an empty commit writes nothing"
    );
    // Carries on across a reopen: appends to the same file.
    let (mut journal, loaded) = reopen(dir.path());
    assert_eq!(loaded.unwrap().records, mem.values());
    mem.put(8, "again");
    journal.commit(&mut mem).unwrap();
    assert_eq!(reopen(dir.path()).1.unwrap().records, mem.values());
}

#[test]
fn a_torn_tail_is_dropped_reported_and_appended_over() {
    for tail in [
        &b"0123456789abcdef {\"put\":[{\"id\":9"[..],
        &[0u8; 300][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (journal, mut mem) = written(dir.path());
        let path = journal.path();
        drop(journal);
        let whole = fs::read(&path).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(tail)
            .unwrap();

        let (mut journal, loaded) = reopen(dir.path());
        let loaded = loaded.unwrap();
        assert_eq!(
            loaded.records,
            mem.values(),
            "what was committed is all there"
        );
        assert_eq!(
            loaded.torn_tail,
            Some(TornTail {
                at: whole.len() as u64,
                dropped: tail.len() as u64
            })
        );
        assert_eq!(
            fs::read(&path).unwrap(),
            whole,
            "truncated at the last line"
        );
        mem.put(4, "after");
        journal.commit(&mut mem).unwrap();
        let (_, again) = reopen(dir.path());
        let again = again.unwrap();
        assert_eq!(again.records, mem.values());
        assert_eq!(again.torn_tail, None);
    }
}

/// Damages a written journal with `edit`; expects it set aside, byte for byte, and reported.
fn corrupt_with(edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = written(dir.path());
    let path = journal.path();
    drop(journal);
    let mut bytes = fs::read(&path).unwrap();
    edit(&mut bytes);
    fs::write(&path, &bytes).unwrap();
    let mut journal = Journal::<Rec>::open(dir.path()).unwrap();
    let err = journal.load().unwrap_err();
    let JournalError::Corrupt { moved_to, .. } = &err else {
        panic!("expected Corrupt, got {err}");
    };
    assert_eq!(fs::read(moved_to).unwrap(), bytes, "kept aside as evidence");
    assert!(
        journal.load().unwrap().is_none(),
        "the next load starts afresh"
    );
    // And the next commit writes a whole new journal.
    let mut mem = Mem::default();
    mem.put(1, "fresh");
    journal.commit(&mut mem).unwrap();
    assert_eq!(reopen(dir.path()).1.unwrap().records, mem.values());
    err.to_string()
}

#[test]
fn a_damaged_line_is_corruption_not_a_torn_tail() {
    // A flipped byte in the middle line and in the last (complete) line.
    let e = corrupt_with(|b| {
        let second_line = b.iter().position(|&c| c == b'\n').unwrap() + 40;
        b[second_line] ^= 0x01;
    });
    assert!(e.contains("checksum mismatch"), "{e}");
    let e = corrupt_with(|b| {
        let at = b.len() - 3;
        b[at] ^= 0x01;
    });
    assert!(e.contains("checksum mismatch"), "{e}");
    // A line that checks out but is not a record.
    let e = corrupt_with(|b| {
        let json = br#"{"put":"nonsense"}"#;
        frame(json, b);
    });
    assert!(e.contains("line at byte"), "{e}");
}

#[test]
fn garbage_empty_files_and_other_versions_are_refused() {
    let e = corrupt_with(|b| *b = b"\x00\x01garbage".to_vec());
    assert!(e.contains("header"), "{e}");
    let e = corrupt_with(Vec::clear);
    assert!(e.contains("empty"), "{e}");
    let e = corrupt_with(|b| {
        let mut other = Vec::new();
        // Older than any this agent reads (a newer one is not refused: see `newer`).
        let header = br#"{"format":"ipq-journal","version":0,"boot_id":null,"written_mono_ns":1,"written_unix_ms":1}"#;
        frame(header, &mut other);
        *b = other;
    });
    assert!(e.contains("version 0"), "{e}");
}

/// The earlier agents' format: a header line with the body's length and checksum, then the
/// whole snapshot on one line.
fn v1_file(records: &[Rec], boot: Option<String>) -> Vec<u8> {
    let body = serde_json::to_vec(&serde_json::json!({
        "version": 1,
        "taken_at": 5,
        "records": records,
    }))
    .unwrap();
    let header = serde_json::json!({
        "format": "ipq-journal",
        "version": 1,
        "boot_id": boot,
        "written_mono_ns": 1_000,
        "written_unix_ms": 2_000,
        "body_len": body.len(),
        "body_fnv64": format::fnv64(&body),
    });
    let mut bytes = serde_json::to_vec(&header).unwrap();
    bytes.push(b'\n');
    bytes.extend_from_slice(&body);
    bytes.push(b'\n');
    bytes
}

#[test]
fn an_old_full_snapshot_journal_is_read_and_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let mut mem = Mem::default();
    mem.put(1, "old");
    mem.put(2, "old");
    let path = dir.path().join(JOURNAL_FILE);
    fs::write(&path, v1_file(&mem.values(), boot_id())).unwrap();

    let (mut journal, loaded) = reopen(dir.path());
    let loaded = loaded.unwrap();
    assert_eq!(loaded.version, 1);
    assert_eq!(loaded.records, mem.values());
    assert!(loaded.same_boot);
    assert_eq!(
        (loaded.written_mono_ns, loaded.written_unix_ms),
        (1_000, 2_000)
    );

    // The first commit rewrites it whole in the current format, even with nothing changed.
    mem.take_changed();
    journal.commit(&mut mem).unwrap();
    let bytes = fs::read(&path).unwrap();
    assert!(bytes[0].is_ascii_hexdigit(), "rewritten in version 2");
    let again = reopen(dir.path()).1.unwrap();
    assert_eq!((again.version, again.records), (2, mem.values()));

    // Its damage is still caught.
    let mut bad = v1_file(&mem.values(), None);
    let at = bad.len() - 4;
    bad[at] ^= 1;
    fs::write(&path, &bad).unwrap();
    let err = Journal::<Rec>::open(dir.path())
        .unwrap()
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
}

#[test]
fn another_boots_journal_is_rewritten_for_this_one() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, mut mem) = written(dir.path());
    let path = journal.path();
    drop(journal);
    // Replace the header's boot id by another boot's.
    let text = String::from_utf8(fs::read(&path).unwrap()).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let mut header: serde_json::Value = serde_json::from_str(&header[17..]).unwrap();
    header["boot_id"] = "another-boot".into();
    let mut bytes = Vec::new();
    frame(&serde_json::to_vec(&header).unwrap(), &mut bytes);
    bytes.extend_from_slice(rest.as_bytes());
    fs::write(&path, &bytes).unwrap();

    let (mut journal, loaded) = reopen(dir.path());
    let loaded = loaded.unwrap();
    assert!(!loaded.same_boot);
    assert_eq!(loaded.records, mem.values());
    mem.put(9, "this boot");
    journal.commit(&mut mem).unwrap();
    let again = reopen(dir.path()).1.unwrap();
    assert!(again.same_boot, "rewritten with this boot's id");
    assert_eq!(again.records, mem.values());
}

#[test]
fn compaction_keeps_exactly_the_state_and_what_was_committed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = Journal::<Rec>::open(dir.path()).unwrap();
    journal.load().unwrap();
    let mut mem = Mem::default();
    let big = "y".repeat(4000);
    // The same 50 records rewritten over and over: the log grows, the state does not.
    let mut round = 0;
    while !journal.rewrites.compacting() {
        round += 1;
        assert!(round < 1000, "no compaction started");
        for id in 0..50 {
            mem.put(id, &format!("{round} {big}"));
        }
        mem.remove(round % 50);
        journal.commit(&mut mem).unwrap();
    }
    let grown = journal.log.len();
    // Committed while it runs: must be in the compacted file too.
    mem.put(1000, "during");
    mem.remove(3);
    journal.commit(&mut mem).unwrap();
    journal.settle();
    assert!(!journal.rewrites.compacting());
    let compacted = fs::metadata(journal.path()).unwrap().len();
    assert_eq!(compacted, journal.log.len());
    assert!(
        compacted * 3 < grown,
        "compacted {compacted} bytes from {grown}"
    );
    assert!(!dir.path().join(COMPACT_FILE).exists());
    // Appends go on in the compacted file.
    mem.put(1001, "after");
    journal.commit(&mut mem).unwrap();
    let loaded = reopen(dir.path()).1.unwrap();
    assert_eq!(loaded.records, mem.values());
    assert_eq!(loaded.torn_tail, None);
}

#[test]
fn only_regular_files_are_opened_and_symlinks_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    // A FIFO would block a plain open for good.
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let err = Journal::<Rec>::open(dir.path())
        .unwrap()
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("FIFO"), "{err}");
    // Set aside as no journal, so the agent starts and writes a real one.
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
    assert!(!path.exists(), "the FIFO was moved aside");

    let target = dir.path().join("elsewhere");
    fs::write(&target, b"precious").unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let mut journal = Journal::<Rec>::open(dir.path()).unwrap();
    let err = journal.load().unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(
        !path.exists(),
        "the link itself was moved aside, not followed"
    );
    assert_eq!(fs::read(&target).unwrap(), b"precious");
    // A planted symlink at the temporary file's name is replaced, never written through.
    std::os::unix::fs::symlink(&target, dir.path().join(REWRITE_FILE)).unwrap();
    let mut mem = Mem::default();
    mem.put(1, "safe");
    journal.commit(&mut mem).unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"precious");
    assert_eq!(reopen(dir.path()).1.unwrap().records, mem.values());
}

/// The registry side: every record change is journaled, including those that emit no effect
/// (an identity merge, a stale-traffic extension), and a removed record goes.
#[test]
fn every_registry_change_reaches_the_journal_even_without_an_effect() {
    use crate::registry::{FakeClock, Holder, RegistrySettings, Source};

    let settings = RegistrySettings {
        policy: crate::config::EarlyReusePolicy::FenceOld,
        cooldown: Duration::from_secs(30),
        quiet_period: Duration::from_secs(10),
        max_cooldown: Duration::from_secs(300),
        capacity: 8,
    };
    let clock = FakeClock::new(1_000_000_000_000);
    let mut registry = Registry::new(settings, clock.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut journal = Journal::<AddrRecord>::open(dir.path()).unwrap();
    journal.load().unwrap();
    let reload = || {
        let mut journal = Journal::<AddrRecord>::open(dir.path()).unwrap();
        journal.load().unwrap().unwrap().records
    };
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let b: IpAddr = "10.0.0.2".parse().unwrap();
    let veth = Holder::new(7, "veth7");
    registry.claim(a, veth.clone(), Source::Netlink).unwrap();
    registry
        .claim(b, Holder::new(8, "veth8"), Source::Netlink)
        .unwrap();
    journal.commit(&mut registry).unwrap();

    let effects = registry
        .claim(a, veth.with_container_id("c1"), Source::Cni)
        .unwrap();
    assert!(effects.is_empty(), "an identity merge emits no effect");
    journal.commit(&mut registry).unwrap();
    let records = reload();
    let record = records.iter().find(|r| r.addr == a).unwrap();
    assert_eq!(record.status.holder().unwrap().container_id(), Some("c1"));

    registry.lifecycle_mut().holder_gone(8).unwrap();
    clock.advance(Duration::from_secs(5));
    registry.lifecycle_mut().stale_seen(b, clock.now()).unwrap();
    journal.commit(&mut registry).unwrap();
    let records = reload();
    assert_eq!(
        records,
        registry.records().iter().cloned().collect::<Vec<_>>()
    );

    registry.lifecycle_mut().release(b, true).unwrap();
    journal.commit(&mut registry).unwrap();
    let records = reload();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records,
        registry.records().iter().cloned().collect::<Vec<_>>()
    );
}
