use super::*;

#[test]
fn monotonic_stamps_become_wall_clock_times() {
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let time = TimeBase::at(5_000_000_000, wall);
    assert_eq!(time.rfc3339(5_000_000_000), "2027-01-15T08:00:00.000Z");
    assert_eq!(time.rfc3339(6_500_000_000), "2027-01-15T08:00:01.500Z");
    assert_eq!(time.rfc3339(4_000_000_000), "2027-01-15T07:59:59.000Z");
}

#[test]
fn an_outcome_keeps_the_spelling_the_api_has_always_used() {
    for (outcome, spelling) in [
        (Outcome::FencedOld, "fenced_old"),
        (Outcome::Claimed, "claimed"),
        (Outcome::RefusedNew, "refused_new"),
        (Outcome::BlockedNew, "blocked_new"),
        (Outcome::Observed, "observed"),
        (Outcome::Dropped, "dropped"),
        (Outcome::Reported, "reported"),
    ] {
        assert_eq!(outcome.to_string(), spelling);
    }
}
