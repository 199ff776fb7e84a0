use std::{os::unix::fs::PermissionsExt as _, path::Path};

use super::*;

fn release(cni_path: &str, kind: &str) -> HeldRelease {
    HeldRelease {
        network: Some("net".into()),
        cni_version: "1.0.0".into(),
        delegate_type: kind.into(),
        delegate_conf: serde_json::json!({}),
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
        cni_args: None,
        cni_path: cni_path.into(),
        netns: None,
        addresses: Vec::new(),
        held_at_unix_ms: 0,
        held_at_boot: None,
    }
}

fn plugin(dir: &Path, name: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn only_trusted_cni_path_directories_count() {
    let trusted = TrustedBins::new(vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()]);
    let dirs = trusted
        .dirs_of(&release(
            "/tmp/evil:/usr/lib/cni/:/opt/cni/bin",
            "host-local",
        ))
        .unwrap();
    assert_eq!(
        dirs,
        [
            PathBuf::from("/usr/lib/cni/"),
            PathBuf::from("/opt/cni/bin")
        ]
    );
    for untrusted in [
        "/tmp/evil",
        "/opt/cni/bin/../../tmp",
        "/opt/cni",
        "/opt/cni/bin/x",
    ] {
        let err = trusted
            .dirs_of(&release(untrusted, "host-local"))
            .expect_err(untrusted);
        assert!(
            err.to_string().contains("ipam_cni_bin_dirs"),
            "{untrusted}: {err}"
        );
    }
    let err = trusted
        .check(&release("/opt/cni/bin", "../../bin/sh"))
        .expect_err("a path");
    assert!(matches!(err, TrustError::NotAPluginName(_)), "{err}");
}

#[test]
fn the_first_trusted_directory_holding_the_plugin_wins() {
    let (a, b, other) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    plugin(other.path(), "host-local", 0o755);
    let wanted = plugin(b.path(), "host-local", 0o755);
    let trusted = TrustedBins::new(vec![a.path().into(), b.path().into()]);
    let cni_path = format!(
        "{}:{}:{}",
        other.path().display(),
        a.path().display(),
        b.path().display()
    );
    assert_eq!(
        trusted
            .open(&release(&cni_path, "host-local"))
            .unwrap()
            .path,
        wanted
    );
    let err = trusted
        .open(&release(&cni_path, "static"))
        .expect_err("absent");
    assert!(matches!(err, TrustError::NotFound { .. }), "{err}");
}

#[test]
fn a_binary_others_could_replace_is_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = TrustedBins::new(vec![dir.path().into()]);
    let cni_path = dir.path().display().to_string();
    for (name, mode) in [("group-writable", 0o775), ("world-writable", 0o757)] {
        plugin(dir.path(), name, mode);
        let err = trusted
            .open(&release(&cni_path, name))
            .expect_err("writable");
        assert!(err.to_string().contains("group or others"), "{err}");
    }
    plugin(dir.path(), "not-executable", 0o644);
    let err = trusted
        .open(&release(&cni_path, "not-executable"))
        .expect_err("not executable");
    assert!(err.to_string().contains("not executable"), "{err}");
    std::fs::create_dir(dir.path().join("a-dir")).unwrap();
    let err = trusted
        .open(&release(&cni_path, "a-dir"))
        .expect_err("a directory");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // A directory on the way that others may write: they could swap the file.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    plugin(open.path(), "in-an-open-dir", 0o755);
    let open_trusted = TrustedBins::new(vec![open.path().into()]);
    let err = open_trusted
        .open(&release(
            &open.path().display().to_string(),
            "in-an-open-dir",
        ))
        .expect_err("an open directory");
    assert!(err.to_string().contains("replace what is in it"), "{err}");
    // A link in a trusted directory is followed, and its target is what is checked.
    let target = tempfile::tempdir().unwrap();
    let real = plugin(target.path(), "real", 0o755);
    std::os::unix::fs::symlink(&real, dir.path().join("linked")).unwrap();
    let opened = trusted.open(&release(&cni_path, "linked")).unwrap();
    assert_eq!(opened.path, real);
}
