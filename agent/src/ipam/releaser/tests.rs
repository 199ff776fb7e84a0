use super::*;

fn release_held_at(ms: u64) -> HeldRelease {
    HeldRelease {
        network: None,
        cni_version: "1.0.0".into(),
        delegate_type: "host-local".into(),
        delegate_conf: serde_json::json!({"ipam": {"type": "host-local"}}),
        container_id: "c".into(),
        ifname: "eth0".into(),
        cni_args: None,
        cni_path: "/opt/cni/bin".into(),
        netns: None,
        addresses: Vec::new(),
        held_at_unix_ms: ms,
        held_at_boot: None,
    }
}

const BOOT: &str = "this-boot";

/// A release stamped at `secs` of this boot's CLOCK_BOOTTIME, and at a wall-clock time that
/// says nothing of it.
fn release_held_at_boot(boot: &str, secs: u64) -> HeldRelease {
    HeldRelease {
        held_at_boot: Some(ipq_api::model::BootStamp {
            boot_id: boot.to_owned(),
            boottime_ns: secs * 1_000_000_000,
        }),
        ..release_held_at(1)
    }
}

/// Now, at `secs` of this boot's CLOCK_BOOTTIME.
fn at(secs: u64) -> (u64, Option<&'static str>) {
    (secs * 1_000_000_000, Some(BOOT))
}

#[test]
fn a_release_the_registry_cannot_vouch_for_waits_max_cooldown_from_its_hand_over() {
    let max = Duration::from_secs(60);
    let s = 1_000_000_000;
    // The journal was there: the registry decides alone.
    assert_eq!(
        unvouched_wait(&release_held_at_boot(BOOT, 1), None, max, at(2)),
        Duration::ZERO
    );
    // Lost at 10 s: one held at 1 s waits until 61 s, one held after the loss not at all.
    let lost = Some(10 * s);
    assert_eq!(
        unvouched_wait(&release_held_at_boot(BOOT, 1), lost, max, at(20)),
        Duration::from_secs(41)
    );
    assert_eq!(
        unvouched_wait(&release_held_at_boot(BOOT, 1), lost, max, at(61)),
        Duration::ZERO
    );
    assert_eq!(
        unvouched_wait(&release_held_at_boot(BOOT, 12), lost, max, at(13)),
        Duration::ZERO
    );
    // An older release without its boot stamp waits from the loss, whatever its wall clock
    // stamp says.
    assert_eq!(
        unvouched_wait(&release_held_at(0), lost, max, at(20)),
        Duration::from_secs(50)
    );
    assert_eq!(
        unvouched_wait(&release_held_at(u64::MAX / 2), lost, max, at(20)),
        Duration::from_secs(50)
    );
    // One stamped in another boot (a reboot; the wall clock stepped two hours meanwhile)
    // waits from the loss too: its boottime is another clock's.
    assert_eq!(
        unvouched_wait(
            &release_held_at_boot("boot-before", 9_000),
            lost,
            max,
            at(20)
        ),
        Duration::from_secs(50)
    );
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    assert_eq!(backoff(1), FIRST_RETRY);
    assert_eq!(backoff(2), FIRST_RETRY * 2);
    assert_eq!(backoff(4), FIRST_RETRY * 8);
    assert_eq!(backoff(40), MAX_RETRY);
}

/// The delegate's trust check and its exec must be about the same file. A trusted directory's
/// plugin is a link to a good binary; another one, "evil", sits in a directory others may
/// write (which the check refuses when it sees it). The race is made to happen, not hoped for:
/// the link is swapped to the evil one right after the check held the good one and before the
/// exec, and the good one runs; swapped before the check, nothing runs.
#[test]
fn a_delegate_swapped_between_the_check_and_the_exec_never_runs() {
    use std::os::unix::fs::PermissionsExt as _;

    let root = tempfile::tempdir().unwrap();
    let script = |dir: &Path, marker: &Path| {
        std::fs::create_dir(dir).unwrap();
        let path = dir.join("swapped");
        std::fs::write(&path, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let good_ran = root.path().join("good-ran");
    let evil_ran = root.path().join("evil-ran");
    let good = script(&root.path().join("good"), &good_ran);
    let evil_dir = root.path().join("evil");
    let evil = script(&evil_dir, &evil_ran);
    std::fs::set_permissions(&evil_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let trusted = root.path().join("trusted");
    std::fs::create_dir(&trusted).unwrap();
    let link = trusted.join("swapped");
    // As an attacker swaps it: a new link renamed over the old one, atomically.
    let point_at = |target: &Path| {
        let next = trusted.join(".next");
        let _ = std::fs::remove_file(&next);
        std::os::unix::fs::symlink(target, &next).unwrap();
        std::fs::rename(&next, &link).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), target);
    };
    let bins = TrustedBins::new(vec![trusted.clone()]);
    let release = HeldRelease {
        delegate_type: "swapped".into(),
        delegate_conf: serde_json::json!({"ipam": {"type": "swapped"}}),
        cni_path: trusted.display().to_string(),
        ..release_held_at(1)
    };

    // Swapped before the check: the check sees the evil one and refuses; nothing runs.
    point_at(&evil);
    let refused = run_del(&release, &bins).expect_err("the evil delegate is refused");
    assert!(
        refused.to_string().contains("lets group or others replace"),
        "refused for its writable directory: {refused}"
    );
    assert!(!evil_ran.exists() && !good_ran.exists());

    // Swapped between the check and the exec: the path names the evil one when the exec
    // comes, and the good one, which the check held, is what runs.
    point_at(&good);
    let opened = bins
        .open(&release)
        .expect("the good delegate passes the check");
    point_at(&evil);
    exec_opened(&release, &opened).expect("the held delegate runs");
    assert!(good_ran.exists(), "the delegate the check held ran");
    assert!(
        !evil_ran.exists(),
        "the evil script ran as the delegate: the exec followed the swapped path"
    );
}
