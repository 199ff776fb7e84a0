//! What every command refuses before it does anything (undecodable stdin, a missing
//! environment variable, an unknown version or key), and VERSION.

use super::*;

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
        for version in ["0.2.0", "1.2.0", "banana"] {
            let stdin = conf(version, &tmp.path().join("none.sock"), tmp.path());
            let err = assert_error(
                &invoke(&environment(command), &stdin),
                1,
                "supports 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0",
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
            json!({"cniVersion": echoed, "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
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
