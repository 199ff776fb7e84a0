//! GC: the runtime's valid attachments, sent to the agent.

use super::{fake_agent::FakeAgent, *};

#[test]
fn gc_sends_the_valid_attachments() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = FakeAgent::start(tmp.path(), vec![(200, json!({"addresses": []}))]);
    let mut stdin = conf("1.1.0", &agent.socket, tmp.path());
    stdin["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
    stdin["cni.dev/attachments"] = stdin["cni.dev/valid-attachments"].clone();
    let gc = HashMap::from([
        ("CNI_COMMAND".to_owned(), OsString::from("GC")),
        ("CNI_PATH".to_owned(), OsString::from("/usr/lib/cni")),
    ]);
    assert!(invoke(&gc, &stdin).success);
    let requests = agent.finish();
    assert_eq!(requests[0].0, "POST /v1/gc HTTP/1.1");
    assert_eq!(
        serde_json::from_str::<Value>(&requests[0].1).unwrap(),
        json!({
            "valid_attachments": [{"container_id": "c1", "ifname": "eth0"}],
            "network": "ipq-unit"
        })
    );
    let bare = conf("1.1.0", &tmp.path().join("none.sock"), tmp.path());
    assert_error(&invoke(&gc, &bare), 7, "cni.dev/valid-attachments");
    assert_error(&invoke(&gc, &stdin), 11, "unavailable");
}
