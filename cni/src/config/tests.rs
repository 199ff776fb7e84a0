use serde_json::json;

use super::*;

fn parse(value: Value, command: Command) -> Result<NetConf, CniError> {
    NetConf::parse(value.to_string().as_bytes(), command)
}

fn assert_code(result: Result<NetConf, CniError>, code: u32, needle: &str) {
    let err = result.expect_err("must fail");
    assert_eq!(err.code, code, "{err}");
    assert!(err.msg.contains(needle), "{needle:?} not in {err}");
}

#[test]
fn defaults_and_every_key() {
    let conf = parse(
        json!({"cniVersion": "1.0.0", "name": "net", "type": "ipq-cni"}),
        Command::Add,
    )
    .unwrap();
    assert_eq!(conf.settings, Settings::default());
    assert_eq!(conf.name.as_deref(), Some("net"));
    let conf = parse(
        json!({
            "cniVersion": "0.4.0", "name": "net", "type": "ipq-cni",
            "socket": "/tmp/s.sock", "stateDir": "/tmp/state",
            "onUnavailable": "allow", "timeoutMs": 150,
            "args": {"labels": {}}, "runtimeConfig": {}, "capabilities": {},
            "prevResult": {"cniVersion": "0.4.0", "ips": []},
        }),
        Command::Del,
    )
    .unwrap();
    assert_eq!(
        conf.settings,
        Settings {
            socket: "/tmp/s.sock".into(),
            state_dir: "/tmp/state".into(),
            on_unavailable: OnUnavailable::Allow,
            timeout: Duration::from_millis(150),
        }
    );
    assert!(conf.prev_result.is_some());
}

#[test]
fn malformed_stdin_is_a_decoding_failure() {
    for command in [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Gc,
        Command::Status,
    ] {
        for stdin in [
            &b""[..],
            b"{",
            b"[1,2]",
            b"\"x\"",
            b"\xff\xfe",
            b"{\"cniVersion\": \"1.0.0\",}",
        ] {
            let err = NetConf::parse(stdin, command).expect_err("must fail");
            assert_eq!(
                err.code,
                code::DECODING_FAILURE,
                "{command:?} {stdin:?}: {err}"
            );
        }
    }
}

#[test]
fn versions_are_checked() {
    assert_code(
        parse(json!({"name": "n"}), Command::Add),
        1,
        "no cniVersion",
    );
    for bad in ["0.2.0", "2.0.0", "1.0", ""] {
        assert_code(
            parse(json!({"cniVersion": bad}), Command::Add),
            1,
            "not supported",
        );
    }
    assert_code(
        parse(json!({"cniVersion": 1}), Command::Add),
        7,
        "cniVersion",
    );
    for command in [Command::Gc, Command::Status] {
        for old in ["0.4.0", "1.0.0"] {
            assert_code(
                parse(json!({"cniVersion": old}), command),
                1,
                "needs cniVersion 1.1.0",
            );
        }
        parse(
            json!({"cniVersion": "1.1.0", "cni.dev/valid-attachments": []}),
            command,
        )
        .unwrap();
    }
    for old in ["0.3.0", "0.3.1"] {
        assert_code(
            parse(json!({"cniVersion": old}), Command::Check),
            1,
            "needs cniVersion 0.4.0",
        );
        assert_eq!(
            parse(json!({"cniVersion": old}), Command::Add)
                .unwrap()
                .cni_version,
            old
        );
    }
    for version in &SUPPORTED_VERSIONS[2..] {
        assert_eq!(
            parse(json!({"cniVersion": version}), Command::Check)
                .unwrap()
                .cni_version,
            *version
        );
    }
}

#[test]
fn unknown_and_ill_typed_keys_are_named() {
    let base = |key: &str, value: Value| {
        let mut v = json!({"cniVersion": "1.0.0", "type": "ipq-cni"});
        v[key] = value;
        parse(v, Command::Add)
    };
    assert_code(base("sockett", json!("/x")), 7, "\"sockett\"");
    assert_code(base("socket", json!(3)), 7, "\"socket\"");
    assert_code(base("socket", json!("")), 7, "\"socket\"");
    assert_code(base("stateDir", json!(null)), 7, "\"stateDir\"");
    assert_code(
        base("onUnavailable", json!("ignore")),
        7,
        "\"onUnavailable\"",
    );
    assert_code(base("timeoutMs", json!(0)), 7, "\"timeoutMs\"");
    assert_code(base("timeoutMs", json!(-5)), 7, "\"timeoutMs\"");
    assert_code(base("timeoutMs", json!(1.5)), 7, "\"timeoutMs\"");
    assert_code(base("timeoutMs", json!("100")), 7, "\"timeoutMs\"");
    assert_code(base("name", json!(["x"])), 7, "\"name\"");
    assert_code(base("prevResult", json!([])), 6, "prevResult");
    assert_code(
        base("cni.dev/valid-attachments", json!([{"containerID": "a"}])),
        7,
        "cni.dev/valid-attachments",
    );
    assert_code(base("cni.dev/valid-attachments", json!({})), 7, "list");
}

#[test]
fn valid_attachments_prefer_the_spec_name() {
    let conf = parse(
        json!({
            "cniVersion": "1.1.0",
            "cni.dev/attachments": [{"containerID": "old", "ifname": "eth0"}],
            "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "net1"}],
        }),
        Command::Gc,
    )
    .unwrap();
    let ids: Vec<_> = conf
        .valid_attachments
        .unwrap()
        .into_iter()
        .map(|a| (a.container_id, a.ifname))
        .collect();
    assert_eq!(
        ids,
        [
            ("a".to_owned(), "eth0".to_owned()),
            ("b".to_owned(), "net1".to_owned())
        ]
    );
}

#[test]
fn version_hint_reads_only_supported_versions() {
    assert_eq!(
        version_hint(br#"{"cniVersion":"0.4.0"}"#).as_deref(),
        Some("0.4.0")
    );
    assert_eq!(version_hint(br#"{"cniVersion":"9.9.9"}"#), None);
    assert_eq!(version_hint(b"nonsense"), None);
}
