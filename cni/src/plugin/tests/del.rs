//! DEL: a drain sent to the agent, or spooled when the agent is away; never a failure the
//! runtime could not recover from.

use ipq_api::model::DrainAttachmentRequest;

use super::{fake_agent::FakeAgent, *};
use ipq_fs::{paths, spool};

#[test]
fn del_drains_and_spools_when_the_agent_is_away() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let agent = FakeAgent::start(
        tmp.path(),
        vec![
            (200, json!({"addresses": []})),
            (
                503,
                json!({"error": {"code": "not_ready", "message": "starting"}}),
            ),
        ],
    );
    let stdin = with_prev(conf("1.0.0", &agent.socket, &state), ptp_result("1.0.0"));
    assert!(invoke(&environment("DEL"), &stdin).success);
    let expected = DrainAttachmentRequest {
        container_id: "c0ffee".into(),
        cni_ifname: Some("eth0".into()),
        addresses: vec!["10.89.0.7".parse().unwrap(), "fd89::7".parse().unwrap()],
    };
    // Not ready: spooled, not lost.
    assert!(invoke(&environment("DEL"), &stdin).success);
    let requests = agent.finish();
    assert_eq!(requests[0].0, "POST /v1/drains HTTP/1.1");
    assert_eq!(
        serde_json::from_str::<DrainAttachmentRequest>(&requests[0].1).unwrap(),
        expected
    );
    let spooled = spool::pending(&paths::cni_spool_dir(&state)).unwrap();
    assert_eq!(spooled.len(), 1);
    assert_eq!(spooled[0].request, expected);
}

#[test]
fn del_never_fails_for_a_missing_prev_result_or_netns() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut vars = environment("DEL");
    vars.remove("CNI_NETNS");
    let base = conf("0.4.0", &tmp.path().join("none.sock"), &state);
    assert!(invoke(&vars, &base).success);
    let mut garbled = ptp_result("0.4.0");
    garbled["ips"] = json!([{"address": "nonsense"}]);
    assert!(invoke(&vars, &with_prev(base, garbled)).success);
    let spooled = spool::pending(&paths::cni_spool_dir(&state)).unwrap();
    assert_eq!(spooled.len(), 2);
    for s in spooled {
        assert_eq!(s.request.container_id, "c0ffee");
        assert!(s.request.addresses.is_empty());
    }
}

#[test]
fn del_that_cannot_be_spooled_is_an_io_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let stdin = conf("1.0.0", &tmp.path().join("none.sock"), &file);
    assert_error(
        &invoke(&environment("DEL"), &stdin),
        5,
        "could not be spooled",
    );
}
