//! ADD: the previous result it needs, passing through, and the claim it sends the agent.

use super::{fake_agent::FakeAgent, *};

#[test]
fn add_needs_a_prev_result_with_one_host_interface() {
    let tmp = tempfile::tempdir().unwrap();
    let base = conf("1.0.0", &tmp.path().join("none.sock"), tmp.path());
    assert_error(&invoke(&environment("ADD"), &base), 7, "prevResult");
    let mut two = ptp_result("1.0.0");
    two["interfaces"] = json!([{"name": "vethipqtest0"}, {"name": "vethipqtest1"}, {"name": "eth0", "sandbox": "/x"}]);
    assert_error(
        &invoke(&environment("ADD"), &with_prev(base.clone(), two)),
        101,
        "vethipqtest0, vethipqtest1",
    );
    let mut none = ptp_result("1.0.0");
    none["interfaces"] = json!([{"name": "eth0", "sandbox": "/x"}]);
    assert_error(
        &invoke(&environment("ADD"), &with_prev(base.clone(), none)),
        101,
        "no host-side interface",
    );
    let mut bad = ptp_result("1.0.0");
    bad["ips"][1]["address"] = json!("fd89::zz/64");
    assert_error(
        &invoke(&environment("ADD"), &with_prev(base, bad)),
        6,
        "fd89::zz",
    );
}

#[test]
fn add_without_addresses_passes_through_without_the_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let mut prev = ptp_result("1.0.0");
    prev["ips"] = json!([]);
    let stdin = with_prev(
        conf("1.0.0", &tmp.path().join("none.sock"), tmp.path()),
        prev.clone(),
    );
    let outcome = invoke(&environment("ADD"), &stdin);
    assert!(outcome.success, "{outcome:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&outcome.stdout).unwrap(),
        prev
    );
}

#[test]
fn add_with_the_agent_away_fails_or_passes_through_as_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("none.sock");
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let prev = ptp_result(if version == "0.4.0" { "0.4.0" } else { "1.0.0" });
        let stdin = with_prev(conf(version, &socket, tmp.path()), prev.clone());
        let err = assert_error(&invoke(&environment("ADD"), &stdin), 11, "unavailable");
        assert!(
            err["msg"]
                .as_str()
                .unwrap()
                .contains(&socket.display().to_string()),
            "{err}"
        );
        let mut allow = stdin.clone();
        allow["onUnavailable"] = json!("allow");
        let outcome = invoke(&environment("ADD"), &allow);
        assert!(outcome.success, "{outcome:?}");
        let printed: Value = serde_json::from_str(&outcome.stdout).unwrap();
        let mut expected = prev;
        expected["cniVersion"] = json!(version);
        assert_eq!(printed, expected, "the result passes through unchanged");
    }
}

#[test]
fn add_claims_every_address_for_the_host_interface() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = FakeAgent::start(
        tmp.path(),
        vec![(200, json!({"addresses": [], "conflicts": []}))],
    );
    let prev = ptp_result("1.0.0");
    let stdin = with_prev(conf("1.0.0", &agent.socket, tmp.path()), prev.clone());
    let outcome = invoke(&environment("ADD"), &stdin);
    assert!(outcome.success, "{outcome:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&outcome.stdout).unwrap(),
        prev
    );
    let requests = agent.finish();
    assert_eq!(requests[0].0, "POST /v1/claims HTTP/1.1");
    let body: Value = serde_json::from_str(&requests[0].1).unwrap();
    assert_eq!(
        body,
        json!({
            "addresses": ["10.89.0.7", "fd89::7"],
            "holder": {
                "interface": "vethipqtest0",
                "container_id": "c0ffee",
                "cni_ifname": "eth0",
                "network": "ipq-unit",
                "netns": "/var/run/netns/blue",
                "pod": {"namespace": "default", "name": "web-0", "uid": "u-1"},
                // The sandbox interface's MAC, for reuse hygiene to announce.
                "mac": "0a:58:0a:58:00:05"
            },
            "source": "cni"
        })
    );
}

#[test]
fn a_refused_add_is_try_again_later_naming_address_holder_and_until() {
    let tmp = tempfile::tempdir().unwrap();
    let refusal = json!({"error": {
        "code": "refused",
        "message": "10.89.0.7 is held by a live holder",
        "address": "10.89.0.7",
        "holder": {"ifindex": 9, "ifname": "veth0ld", "container_id": "0ldc0ffee"},
        "until": "2030-01-01T00:00:30Z"
    }});
    let agent = FakeAgent::start(
        tmp.path(),
        vec![
            (409, refusal),
            (
                400,
                json!({"error": {"code": "invalid_argument", "message": "interface vethipqtest0 is not a workload"}}),
            ),
        ],
    );
    let stdin = with_prev(
        conf("1.0.0", &agent.socket, tmp.path()),
        ptp_result("1.0.0"),
    );
    let err = assert_error(&invoke(&environment("ADD"), &stdin), 11, "10.89.0.7");
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains("container 0ldc0ffee on veth0ld") && msg.contains("2030-01-01T00:00:30Z"),
        "{err}"
    );
    assert_error(&invoke(&environment("ADD"), &stdin), 102, "not a workload");
    agent.finish();
}
