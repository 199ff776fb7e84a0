//! `--hold-ipam`: the main plugin's ipam wrapped by ipq-ipam, the state dir in both plugins,
//! and the file given back on uninstall.

use super::*;

#[test]
fn hold_ipam_wraps_the_main_plugins_ipam_and_uninstall_gives_the_file_back_byte_for_byte() {
    let mut wrapped = 0;
    for name in REAL_WORLD {
        let node = Node::fixture(name);
        let original = node.read(name);
        let has_ipam = json(&original)["plugins"][0]
            .get("ipam")
            .and_then(|i| i.get("type"))
            .is_some();
        let result = install(&node.locations(), &node.binaries(true), &entry());
        if !has_ipam {
            let e = result.expect_err("a main plugin without ipam cannot be wrapped");
            assert!(
                e.to_string().contains("has no `ipam` object"),
                "{name}: {e}"
            );
            assert_eq!(node.read(name), original, "{name}: left alone");
            continue;
        }
        result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let doc = json(&node.read(name));
        let ipam = &plugins(&doc)[0]["ipam"];
        assert_eq!(ipam["type"], "ipq-ipam", "{name}");
        assert_eq!(
            ipam["delegate"],
            json(&original)["plugins"][0]["ipam"],
            "{name}: the delegate is the original section"
        );
        assert!(
            node.bin.join("ipq-ipam").is_file(),
            "{name}: binary installed"
        );
        // Idempotent; then without the flag the section is unwrapped again.
        let again = install(&node.locations(), &node.binaries(true), &entry()).unwrap();
        assert!(!again.config_changed, "{name}: {again}");
        node.install().unwrap();
        assert_eq!(
            plugins(&json(&node.read(name)))[0]["ipam"],
            json(&original)["plugins"][0]["ipam"],
            "{name}"
        );
        install(&node.locations(), &node.binaries(true), &entry()).unwrap();
        let report = node.uninstall().unwrap();
        assert_eq!(node.read(name), original, "{name}: {report}");
        wrapped += 1;
    }
    assert!(
        wrapped >= 2,
        "only {wrapped} of the real-world conflists have an ipam to wrap"
    );
}

#[test]
fn a_state_dir_other_than_the_default_is_written_into_both_plugins() {
    let name = "10-containerd-net.conflist";
    let node = Node::fixture(name);
    let elsewhere = Entry {
        state_dir: Some("/srv/ipq".into()),
        ..entry()
    };
    install(&node.locations(), &node.binaries(true), &elsewhere).unwrap();
    let doc = json(&node.read(name));
    assert_eq!(plugins(&doc).last().unwrap()["stateDir"], "/srv/ipq");
    assert_eq!(plugins(&doc)[0]["ipam"]["stateDir"], "/srv/ipq");
    node.uninstall().unwrap();
    assert_eq!(json(&node.read(name)), json(&fixture(name)));
}
