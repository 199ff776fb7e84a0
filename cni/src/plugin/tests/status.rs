//! STATUS: ready, or code 50 with the reason.

use super::{fake_agent::FakeAgent, *};

#[test]
fn status_is_ready_or_code_50_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let status = |ready: bool| {
        json!({"ready": ready, "version": "0", "mode": "enforce", "on_early_reuse": "fence-old",
               "registry": {"entries": 0, "capacity": 1, "active": 0, "draining": 0, "quarantined": 0},
               "interfaces": [], "conflicts_total": 0, "refused_claims_total": 0, "started_at": "2030-01-01T00:00:00Z"})
    };
    let agent = FakeAgent::start(tmp.path(), vec![(200, status(true)), (200, status(false))]);
    let vars = HashMap::from([("CNI_COMMAND".to_owned(), OsString::from("STATUS"))]);
    let stdin = conf("1.1.0", &agent.socket, tmp.path());
    let ok = invoke(&vars, &stdin);
    assert!(ok.success && ok.stdout.is_empty(), "{ok:?}");
    assert_error(&invoke(&vars, &stdin), 50, "not ready");
    agent.finish();
    let away = conf("1.1.0", &tmp.path().join("none.sock"), tmp.path());
    assert_error(&invoke(&vars, &away), 50, "does not answer");
}
