//! The installer against real-world conflists (`tests/fixtures/conflists/`), each in a conf dir
//! of its own.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/conflists");

/// The conflists the CNIs people run write; each must take the entry and give it back.
const REAL_WORLD: [&str; 6] = [
    "10-containerd-net.conflist",
    "20-ptp.conflist",
    "10-calico.conflist",
    "05-cilium.conflist",
    "05-cilium-aws-chaining.conflist",
    "30-compact.conflist",
];

fn fixture(name: &str) -> String {
    fs::read_to_string(Path::new(FIXTURES).join(name))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// A conf dir, a bin dir and a plugin binary in a temp dir.
struct Node {
    _dir: tempfile::TempDir,
    conf: PathBuf,
    bin: PathBuf,
    binary: PathBuf,
}

impl Node {
    fn with(files: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&conf).unwrap();
        fs::create_dir_all(&bin).unwrap();
        for (name, text) in files {
            fs::write(conf.join(name), text).unwrap();
        }
        let binary = dir.path().join("ipq-cni-build");
        fs::write(&binary, b"\x7fELF pretend plugin").unwrap();
        Node {
            _dir: dir,
            conf,
            bin,
            binary,
        }
    }

    fn fixture(name: &str) -> Node {
        Node::with(&[(name, &fixture(name))])
    }

    fn locations(&self) -> Locations {
        Locations {
            conf_dir: self.conf.clone(),
            bin_dir: self.bin.clone(),
            conflist: None,
        }
    }

    fn install(&self) -> Result<Report, FilesError> {
        install(&self.locations(), &self.binaries(false), &entry())
    }

    fn binaries(&self, hold_ipam: bool) -> Binaries<'_> {
        Binaries {
            cni: &self.binary,
            ipam: hold_ipam.then_some(self.binary.as_path()),
        }
    }

    fn uninstall(&self) -> Result<Report, FilesError> {
        uninstall(&self.locations(), false)
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.conf.join(name)).unwrap()
    }

    fn conf_names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.conf)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn entry() -> Entry {
    Entry {
        socket: "/run/ipq/ipq.sock".into(),
        on_unavailable: OnUnavailable::Fail,
        state_dir: None,
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn plugins(doc: &Value) -> &Vec<Value> {
    doc["plugins"].as_array().expect("a plugins array")
}

#[test]
fn real_world_conflists_take_the_entry_once_last_and_give_it_back_byte_for_byte() {
    for name in REAL_WORLD {
        let original = fixture(name);
        let node = Node::fixture(name);

        let first = node.install().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            first.config_changed && first.binary_changed,
            "{name}: {first}"
        );
        let installed = node.read(name);
        let mut doc = json(&installed);
        let list = plugins(&doc);
        assert_eq!(list.len(), plugins(&json(&original)).len() + 1, "{name}");
        assert_eq!(list.last(), Some(&entry().to_value()), "{name}: not last");
        doc["plugins"].as_array_mut().unwrap().pop();
        assert_eq!(
            doc,
            json(&original),
            "{name}: anything besides the entry changed"
        );
        assert_eq!(
            fs::read(node.bin.join("ipq-cni")).unwrap(),
            fs::read(&node.binary).unwrap()
        );
        assert_eq!(node.read(&format!("{name}{BACKUP_SUFFIX}")), original);

        let second = node.install().unwrap();
        assert!(
            !second.config_changed && !second.binary_changed,
            "{name}: {second}"
        );
        assert!(second.to_string().contains("nothing changed"), "{second}");
        assert_eq!(node.read(name), installed, "{name}: second install wrote");

        let removed = node.uninstall().unwrap();
        assert!(removed.config_changed, "{name}: {removed}");
        assert_eq!(
            node.read(name),
            original,
            "{name}: not restored byte for byte"
        );
        assert_eq!(
            node.conf_names(),
            [name],
            "{name}: backup or temp file left behind"
        );

        let again = node.uninstall().unwrap();
        assert!(!again.config_changed, "{name}: {again}");
        assert_eq!(node.read(name), original);
    }
}

#[test]
fn the_entry_is_laid_out_like_its_neighbours() {
    let node = Node::fixture("10-calico.conflist");
    node.install().unwrap();
    let text = node.read("10-calico.conflist");
    let want = "      \"capabilities\": {\"portMappings\": true}\n    },\n    {\n      \
                \"type\": \"ipq-cni\",\n      \"socket\": \"/run/ipq/ipq.sock\",\n      \
                \"onUnavailable\": \"fail\"\n    }\n  ]\n}\n";
    assert!(text.ends_with(want), "{text}");

    let node = Node::fixture("30-compact.conflist");
    node.install().unwrap();
    assert!(node.read("30-compact.conflist").ends_with(
        r#"{"type":"firewall"}, {"type": "ipq-cni", "socket": "/run/ipq/ipq.sock", "onUnavailable": "fail"}]}"#
    ));
}

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

#[test]
fn changed_settings_or_a_misplaced_entry_are_updated_not_duplicated() {
    let name = "10-containerd-net.conflist";
    let node = Node::fixture(name);
    node.install().unwrap();
    let other = Entry {
        socket: "/var/run/ipq/agent.sock".into(),
        on_unavailable: OnUnavailable::Allow,
        state_dir: None,
    };
    let report = install(&node.locations(), &node.binaries(false), &other).unwrap();
    assert!(report.config_changed && report.to_string().contains("updated"));
    let doc = json(&node.read(name));
    let ours: Vec<&Value> = plugins(&doc)
        .iter()
        .filter(|p| p["type"] == PLUGIN_TYPE)
        .collect();
    assert_eq!(ours, [&other.to_value()]);
    assert_eq!(plugins(&doc).last(), Some(&other.to_value()));

    // Someone put the entry first: it moves last.
    let first = fixture(name).replacen(
        "\"plugins\": [",
        "\"plugins\": [{\"type\": \"ipq-cni\", \"socket\": \"/run/ipq/ipq.sock\"},",
        1,
    );
    let node = Node::with(&[(name, &first)]);
    node.install().unwrap();
    let doc = json(&node.read(name));
    assert_eq!(plugins(&doc)[0]["type"], "bridge");
    assert_eq!(plugins(&doc).last(), Some(&entry().to_value()));
    node.uninstall().unwrap();
    assert_eq!(json(&node.read(name)), json(&fixture(name)));
}

#[test]
fn mode_and_symlinks_are_kept() {
    let name = "10-calico.conflist";
    let node = Node::with(&[("real-calico.json.target", &fixture(name))]);
    let target = node.conf.join("real-calico.json.target");
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, node.conf.join(name)).unwrap();
    node.install().unwrap();
    assert!(fs::symlink_metadata(node.conf.join(name))
        .unwrap()
        .is_symlink());
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        plugins(&json(&node.read(name))).last(),
        Some(&entry().to_value())
    );
    let mode = fs::metadata(node.bin.join("ipq-cni"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[test]
fn uninstall_after_an_edit_since_install_keeps_the_backup() {
    let name = "05-cilium.conflist";
    let node = Node::fixture(name);
    node.install().unwrap();
    // Someone turned debugging on after install.
    let edited = node
        .read(name)
        .replace("\"enable-debug\": false", "\"enable-debug\": true");
    fs::write(node.conf.join(name), &edited).unwrap();
    let report = node.uninstall().unwrap();
    assert!(
        report.to_string().contains("pre-install copy stays"),
        "{report}"
    );
    assert!(node.conf.join(format!("{name}{BACKUP_SUFFIX}")).exists());
    assert!(!node.read(name).contains("ipq-cni"));
    assert!(node.read(name).contains("\"enable-debug\": true"));

    // Cilium rewrote its file without the entry: install again, and the backup follows.
    let node = Node::fixture(name);
    node.install().unwrap();
    let rewritten = fixture(name).replace("false", "true");
    fs::write(node.conf.join(name), &rewritten).unwrap();
    node.install().unwrap();
    node.uninstall().unwrap();
    assert_eq!(node.read(name), rewritten);
    assert_eq!(node.conf_names(), [name]);
}

#[test]
fn uninstall_keeps_the_binary_unless_asked() {
    let node = Node::fixture("20-ptp.conflist");
    node.install().unwrap();
    node.uninstall().unwrap();
    assert!(node.bin.join("ipq-cni").exists());
    node.install().unwrap();
    let report = uninstall(&node.locations(), true).unwrap();
    assert!(report.binary_changed);
    assert!(!node.bin.join("ipq-cni").exists());
}

#[test]
fn the_command_line_installs_and_reports_refusals_with_a_failure() {
    let node = Node::fixture("10-calico.conflist");
    let args = |verb: &str| -> Vec<String> {
        let mut args = vec![
            verb.to_owned(),
            "--cni-conf-dir".into(),
            node.conf.display().to_string(),
            "--cni-bin-dir".into(),
            node.bin.display().to_string(),
        ];
        if verb == "install" {
            args.extend(["--binary".into(), node.binary.display().to_string()]);
            args.extend(["--on-unavailable".into(), "allow".into()]);
        }
        args
    };
    assert_eq!(main(args("install")), std::process::ExitCode::SUCCESS);
    let doc = json(&node.read("10-calico.conflist"));
    assert_eq!(plugins(&doc).last().unwrap()["onUnavailable"], "allow");
    assert_eq!(main(args("uninstall")), std::process::ExitCode::SUCCESS);
    assert_eq!(
        node.read("10-calico.conflist"),
        fixture("10-calico.conflist")
    );

    fs::write(node.conf.join("10-calico.conflist"), "{ // no").unwrap();
    assert_eq!(main(args("install")), std::process::ExitCode::FAILURE);
    assert_eq!(node.read("10-calico.conflist"), "{ // no");
}

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
