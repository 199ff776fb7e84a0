use super::*;

fn release_held_at(ms: u64) -> HeldRelease {
    HeldRelease {
        network: None,
        cni_version: "1.0.0".into(),
        delegate_type: "host-local".into(),
        delegate_conf: serde_json::json!({}),
        container_id: "c".into(),
        ifname: "eth0".into(),
        cni_args: None,
        cni_path: "/opt/cni/bin".into(),
        netns: None,
        addresses: Vec::new(),
        held_at_unix_ms: ms,
    }
}

#[test]
fn a_release_the_registry_cannot_vouch_for_waits_max_cooldown_from_its_hand_over() {
    let max = Duration::from_secs(60);
    // The journal was there: the registry decides alone.
    assert_eq!(
        unvouched_wait(&release_held_at(1_000), None, max, 2_000),
        Duration::ZERO
    );
    // Lost at 10 s: one held at 1 s waits until 61 s, one held after the loss not at all.
    let lost = Some(10_000);
    assert_eq!(
        unvouched_wait(&release_held_at(1_000), lost, max, 20_000),
        Duration::from_secs(41)
    );
    assert_eq!(
        unvouched_wait(&release_held_at(1_000), lost, max, 61_000),
        Duration::ZERO
    );
    assert_eq!(
        unvouched_wait(&release_held_at(12_000), lost, max, 12_001),
        Duration::ZERO
    );
    // An older release without its time waits from the loss.
    assert_eq!(
        unvouched_wait(&release_held_at(0), lost, max, 20_000),
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
