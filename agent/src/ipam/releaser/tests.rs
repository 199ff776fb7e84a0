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
/// plugin is a link that another thread swaps, thousands of times, between a good binary and
/// an "evil" script in a directory others may write (which the check refuses when it sees it):
/// the evil one must never run, whatever the interleaving.
#[test]
fn a_delegate_swapped_between_the_check_and_the_exec_never_runs() {
    use std::{
        os::unix::fs::PermissionsExt as _,
        sync::atomic::{AtomicBool, Ordering},
    };

    let root = tempfile::tempdir().unwrap();
    let script = |dir: &Path, body: &str| {
        std::fs::create_dir(dir).unwrap();
        let path = dir.join("swapped");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let good = script(&root.path().join("good"), "exit 0");
    let marker = root.path().join("evil-ran");
    let evil_dir = root.path().join("evil");
    let evil = script(&evil_dir, &format!("touch '{}'", marker.display()));
    std::fs::set_permissions(&evil_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let trusted = root.path().join("trusted");
    std::fs::create_dir(&trusted).unwrap();
    let link = trusted.join("swapped");
    std::os::unix::fs::symlink(&good, &link).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, trusted, link) = (Arc::clone(&stop), trusted.clone(), link.clone());
        std::thread::spawn(move || {
            let next = trusted.join(".next");
            while !stop.load(Ordering::Relaxed) {
                for target in [&evil, &good] {
                    let _ = std::fs::remove_file(&next);
                    std::os::unix::fs::symlink(target, &next).unwrap();
                    std::fs::rename(&next, &link).unwrap();
                }
            }
        })
    };
    let bins = TrustedBins::new(vec![trusted.clone()]);
    let release = HeldRelease {
        delegate_type: "swapped".into(),
        delegate_conf: serde_json::json!({"ipam": {"type": "swapped"}}),
        cni_path: trusted.display().to_string(),
        ..release_held_at(1)
    };
    let (mut ran, mut refused) = (0, 0);
    for _ in 0..3000 {
        match run_del(&release, &bins) {
            Ok(()) => ran += 1,
            Err(_) => refused += 1,
        }
        if marker.exists() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(
        !marker.exists(),
        "the evil script ran as the delegate ({ran} runs, {refused} refusals before it)"
    );
    assert!(ran > 0, "the good delegate ran too: {refused} refusals");
}
