//! CHECK: each address of the previous result is still held by this attachment.

use super::{fake_agent::FakeAgent, *};

fn view(state: &str, holder: Value, fenced: Option<Value>) -> Value {
    let mut v = json!({"address": "10.89.0.7", "state": state, "holder": holder, "since": "2030-01-01T00:00:00Z", "conflicts": 0});
    if let Some(f) = fenced {
        v["fenced"] = f;
    }
    v
}

#[test]
fn check_verifies_each_address_is_still_held() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = json!({"ifindex": 9, "ifname": "vethipqtest0", "container_id": "c0ffee", "cni_ifname": "eth0"});
    let theirs = json!({"ifindex": 10, "ifname": "vethnew", "container_id": "new"});
    let cases = [
        (
            vec![
                (200, view("active", ours.clone(), None)),
                (200, view("active", ours.clone(), None)),
            ],
            None,
        ),
        (
            vec![
                (200, view("active", ours.clone(), None)),
                (200, view("active", theirs.clone(), Some(ours.clone()))),
            ],
            Some("fenced: container new on vethnew took it"),
        ),
        (
            vec![
                (200, view("draining", theirs.clone(), None)),
                (200, view("active", ours.clone(), None)),
            ],
            Some("10.89.0.7 is held by container new"),
        ),
        (
            vec![
                (200, view("active", ours.clone(), None)),
                (
                    404,
                    json!({"error": {"code": "not_found", "message": "free"}}),
                ),
            ],
            Some("fd89::7 is not registered"),
        ),
    ];
    for (responses, lost) in cases {
        let agent = FakeAgent::start(tmp.path(), responses);
        let stdin = with_prev(
            conf("1.0.0", &agent.socket, tmp.path()),
            ptp_result("1.0.0"),
        );
        let outcome = invoke(&environment("CHECK"), &stdin);
        match lost {
            None => assert!(outcome.success, "{outcome:?}"),
            Some(needle) => {
                assert_error(&outcome, 100, needle);
            }
        }
        let requests = agent.finish();
        assert_eq!(requests[0].0, "GET /v1/addresses/10.89.0.7 HTTP/1.1");
        std::fs::remove_file(tmp.path().join("fake.sock")).unwrap();
    }
    let away = with_prev(
        conf("1.0.0", &tmp.path().join("none.sock"), tmp.path()),
        ptp_result("1.0.0"),
    );
    assert_error(&invoke(&environment("CHECK"), &away), 11, "unavailable");
    let mut allow = away.clone();
    allow["onUnavailable"] = json!("allow");
    assert!(invoke(&environment("CHECK"), &allow).success);
    let bare = conf("1.0.0", &tmp.path().join("none.sock"), tmp.path());
    assert_error(&invoke(&environment("CHECK"), &bare), 7, "prevResult");
}
