//! Which file is the active config, and what the installer refuses to touch (with the
//! reason), leaving it as it was.

use super::*;

#[test]
fn conflists_it_does_not_understand_are_left_untouched_with_the_reason() {
    type Expected = fn(&Refusal) -> bool;
    let cases: [(&str, Expected); 8] = [
        ("broken-comments.conflist", |r| {
            matches!(r, Refusal::NotJson(_))
        }),
        ("broken-trailing-comma.conflist", |r| {
            matches!(r, Refusal::NotJson(_))
        }),
        ("broken-yaml.conflist", |r| matches!(r, Refusal::NotJson(_))),
        ("unknown-no-plugins.conflist", |r| *r == Refusal::NoPlugins),
        ("unknown-plugins-object.conflist", |r| {
            *r == Refusal::PluginsNotArray
        }),
        ("unknown-untyped-plugin.conflist", |r| {
            *r == Refusal::UntypedPlugin(1)
        }),
        ("unknown-empty-plugins.conflist", |r| {
            *r == Refusal::NoMainPlugin
        }),
        ("unknown-top-level-array.conflist", |r| {
            *r == Refusal::NotAnObject
        }),
    ];
    for (name, expected) in cases {
        let original = fixture(name);
        let node = Node::fixture(name);
        // Uninstall needs no main plugin: an empty list is only refused for install.
        let uninstall = (*name != *"unknown-empty-plugins.conflist").then(|| node.uninstall());
        for result in std::iter::once(node.install()).chain(uninstall) {
            match result {
                Err(FilesError::Refused { path, reason }) => {
                    assert!(expected(&reason), "{name}: refused for {reason:?}");
                    assert_eq!(path, node.conf.join(name));
                    let message = FilesError::Refused { path, reason }.to_string();
                    assert!(
                        message.contains(name) && message.ends_with("left untouched"),
                        "{message}"
                    );
                }
                other => panic!("{name}: expected a refusal, got {other:?}"),
            }
            assert_eq!(node.read(name), original, "{name}: touched");
            assert_eq!(node.conf_names(), [name], "{name}: wrote beside it");
            assert!(
                !node.bin.join("ipq-cni").exists(),
                "{name}: binary installed"
            );
        }
    }
}

#[test]
fn a_single_plugin_conf_is_not_converted() {
    let node = Node::fixture("10-flannel.conf");
    let err = node.install().unwrap_err();
    assert!(
        matches!(
            &err,
            FilesError::Refused {
                reason: Refusal::SinglePluginFile,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("10-flannel.conf"), "{err}");
    assert_eq!(node.read("10-flannel.conf"), fixture("10-flannel.conf"));
    assert_eq!(node.conf_names(), ["10-flannel.conf"]);
}

#[test]
fn the_active_config_is_the_lexically_first_as_runtimes_choose() {
    let node = Node::with(&[
        ("10-calico.conflist", &fixture("10-calico.conflist")),
        ("05-cilium.conflist", &fixture("05-cilium.conflist")),
        ("00-notes.txt", "not a config"),
        ("calico-kubeconfig", "apiVersion: v1"),
    ]);
    let report = node.install().unwrap();
    assert_eq!(report.config, node.conf.join("05-cilium.conflist"));
    assert!(report.to_string().contains("Cilium rewrites"), "{report}");
    assert_eq!(
        node.read("10-calico.conflist"),
        fixture("10-calico.conflist")
    );

    // A .conf that sorts first is what the runtime uses: refused, the conflist behind untouched.
    let node = Node::with(&[
        ("00-flannel.conf", &fixture("10-flannel.conf")),
        ("10-calico.conflist", &fixture("10-calico.conflist")),
    ]);
    assert!(node.install().is_err());
    assert_eq!(
        node.read("10-calico.conflist"),
        fixture("10-calico.conflist")
    );

    // Unless the operator names the conflist; then a note says which one runtimes use.
    let mut locations = node.locations();
    locations.conflist = Some("10-calico.conflist".into());
    let report = install(&locations, &node.binaries(false), &entry()).unwrap();
    assert!(report.config_changed);
    assert!(
        report.to_string().contains("00-flannel.conf sorts first"),
        "{report}"
    );
}

#[test]
fn an_empty_conf_dir_is_an_error_naming_it() {
    let node = Node::with(&[]);
    let err = node.install().unwrap_err();
    assert!(matches!(err, FilesError::NoConfig { .. }), "{err:?}");
    assert!(err.to_string().contains(&node.conf.display().to_string()));
    assert!(!node.bin.join("ipq-cni").exists());
}
