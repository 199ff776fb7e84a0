//! Installs and uninstalls after the first: changed settings, a misplaced entry, a file
//! edited since, a symlink and its mode, the binary.

use super::*;

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
