//! Every command through [`run`], as the binary runs it: against no agent at all, and against
//! a fake agent that answers canned HTTP responses and records what it was asked.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
};

use ipq_api::model::DrainAttachmentRequest;
use serde_json::{json, Value};

use super::*;
use crate::{paths, spool};

/// A fake agent on a unix socket: answers `responses` in order, one per connection.
struct FakeAgent {
    socket: PathBuf,
    requests: Arc<Mutex<Vec<(String, String)>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    fn start(dir: &Path, responses: Vec<(u16, Value)>) -> FakeAgent {
        let socket = dir.join("fake.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let thread = std::thread::spawn(move || {
            for (status, body) in responses {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                }
                let mut request_body = vec![0; length];
                reader.read_exact(&mut request_body).unwrap();
                seen.lock().unwrap().push((
                    request_line.trim().to_owned(),
                    String::from_utf8(request_body).unwrap(),
                ));
                let body = body.to_string();
                let mut stream = reader.into_inner();
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        FakeAgent {
            socket,
            requests,
            thread: Some(thread),
        }
    }

    /// Every (request line, body) it was sent, once it answered them all.
    fn finish(mut self) -> Vec<(String, String)> {
        self.thread.take().unwrap().join().unwrap();
        self.requests.lock().unwrap().clone()
    }
}

fn environment(command: &str) -> HashMap<String, OsString> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", "/var/run/netns/blue"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), OsString::from(v)))
    .collect()
}

fn invoke(vars: &HashMap<String, OsString>, stdin: &Value) -> Outcome {
    run(|name| vars.get(name).cloned(), stdin.to_string().as_bytes())
}

/// The error object of a failed run, checked for shape.
fn error_of(outcome: &Outcome) -> Value {
    assert!(!outcome.success, "expected a failure, got {outcome:?}");
    let value: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert!(value["cniVersion"].is_string(), "{value}");
    assert!(value["msg"].is_string(), "{value}");
    value
}

fn assert_error(outcome: &Outcome, code: u64, needle: &str) -> Value {
    let err = error_of(outcome);
    assert_eq!(err["code"], code, "{err}");
    assert!(
        err["msg"].as_str().unwrap().contains(needle),
        "{needle:?} not in {err}"
    );
    err
}

/// A ptp-like result: one host-side veth (which does not exist here), v4 + v6.
fn ptp_result(version: &str) -> Value {
    let mut ips = json!([
        {"interface": 1, "address": "10.89.0.7/24", "gateway": "10.89.0.1"},
        {"interface": 1, "address": "fd89::7/64", "gateway": "fd89::1"}
    ]);
    if version == "0.4.0" {
        ips[0]["version"] = json!("4");
        ips[1]["version"] = json!("6");
    }
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "vethipqtest0", "mac": "4e:01:02:03:04:05"},
            {"name": "eth0", "mac": "0a:58:0a:58:00:05", "sandbox": "/var/run/netns/blue"}
        ],
        "ips": ips,
        "dns": {}
    })
}

fn conf(version: &str, socket: &Path, state: &Path) -> Value {
    json!({
        "cniVersion": version,
        "name": "ipq-unit",
        "type": "ipq-cni",
        "socket": socket,
        "stateDir": state,
        "timeoutMs": 500,
    })
}

fn with_prev(mut conf: Value, prev: Value) -> Value {
    conf["prevResult"] = prev;
    conf
}

const COMMANDS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];

#[test]
fn every_command_decodes_stdin_or_fails_with_code_6() {
    for command in COMMANDS.into_iter().chain(["VERSION"]) {
        let vars = environment(command);
        for stdin in [
            &b"{"[..],
            b"not json",
            b"\xff",
            b"{\"cniVersion\":\"1.1.0\",,}",
        ] {
            let outcome = run(|n| vars.get(n).cloned(), stdin);
            let err = error_of(&outcome);
            assert_eq!(err["code"], 6, "{command} {stdin:?}: {err}");
            assert_eq!(err["cniVersion"], LATEST_VERSION);
        }
        if command != "VERSION" {
            for stdin in [&b""[..], b"[]", b"42"] {
                let err = error_of(&run(|n| vars.get(n).cloned(), stdin));
                assert_eq!(err["code"], 6, "{command} {stdin:?}: {err}");
            }
        }
    }
}

#[test]
fn missing_environment_is_code_4_naming_the_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let stdin = conf("1.1.0", &tmp.path().join("none.sock"), tmp.path());
    for command in ["ADD", "CHECK", "DEL"] {
        for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"] {
            let mut vars = environment(command);
            vars.remove(var);
            assert_error(&invoke(&vars, &stdin), 4, var);
        }
    }
    let mut vars = environment("ADD");
    vars.remove("CNI_COMMAND");
    assert_error(&invoke(&vars, &stdin), 4, "CNI_COMMAND");
    vars.insert("CNI_COMMAND".into(), "PUT".into());
    assert_error(&invoke(&vars, &stdin), 4, "CNI_COMMAND");
    // The error object speaks the config's version when it has a supported one.
    let mut vars = environment("ADD");
    vars.remove("CNI_NETNS");
    let err = assert_error(
        &invoke(&vars, &conf("0.4.0", Path::new("/x"), Path::new("/y"))),
        4,
        "CNI_NETNS",
    );
    assert_eq!(err["cniVersion"], "0.4.0");
}

#[test]
fn unknown_versions_are_code_1() {
    let tmp = tempfile::tempdir().unwrap();
    for command in COMMANDS {
        for version in ["0.3.1", "1.2.0", "banana"] {
            let stdin = conf(version, &tmp.path().join("none.sock"), tmp.path());
            let err = assert_error(
                &invoke(&environment(command), &stdin),
                1,
                "supports 0.4.0, 1.0.0, 1.1.0",
            );
            assert_eq!(err["cniVersion"], LATEST_VERSION);
        }
        let mut stdin = conf("1.0.0", Path::new("/x"), Path::new("/y"));
        stdin.as_object_mut().unwrap().remove("cniVersion");
        assert_error(&invoke(&environment(command), &stdin), 1, "no cniVersion");
    }
    for command in ["GC", "STATUS"] {
        for version in ["0.4.0", "1.0.0"] {
            let stdin = conf(version, Path::new("/x"), Path::new("/y"));
            let err = assert_error(
                &invoke(&environment(command), &stdin),
                1,
                "needs cniVersion 1.1.0",
            );
            assert_eq!(err["cniVersion"], version);
        }
    }
}

#[test]
fn version_lists_what_ipq_cni_speaks() {
    let vars = environment("VERSION");
    for (stdin, echoed) in [
        (&br#"{"cniVersion":"1.0.0"}"#[..], "1.0.0"),
        (b"", LATEST_VERSION),
        (b"{}", LATEST_VERSION),
    ] {
        let outcome = run(|n| vars.get(n).cloned(), stdin);
        assert!(outcome.success, "{outcome:?}");
        let value: Value = serde_json::from_str(&outcome.stdout).unwrap();
        assert_eq!(
            value,
            json!({"cniVersion": echoed, "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        );
    }
}

#[test]
fn unknown_plugin_keys_are_code_7() {
    let tmp = tempfile::tempdir().unwrap();
    for command in COMMANDS {
        let mut stdin = conf("1.1.0", &tmp.path().join("none.sock"), tmp.path());
        stdin["onUnavaliable"] = json!("allow");
        assert_error(&invoke(&environment(command), &stdin), 7, "onUnavaliable");
    }
}

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
