use std::os::unix::fs::{symlink, PermissionsExt as _};

use super::*;

fn executable(path: &Path) -> PathBuf {
    std::fs::write(path, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_owned()
}

fn unsafe_reason(path: &Path) -> String {
    match open_trusted(path) {
        Err(ResolveError::Unsafe { reason, .. }) => reason,
        other => panic!("{}: must be unsafe: {other:?}", path.display()),
    }
}

#[test]
fn links_are_walked_by_the_resolver_and_their_targets_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let real_dir = tmp.path().join("real");
    std::fs::create_dir(&real_dir).unwrap();
    let real = executable(&real_dir.join("plugin"));
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // Absolute, relative with `..`, and a link to a link.
    symlink(&real, bin.join("absolute")).unwrap();
    symlink("../real/plugin", bin.join("relative")).unwrap();
    symlink("relative", bin.join("chained")).unwrap();
    for name in ["absolute", "relative", "chained"] {
        let opened = open_trusted(&bin.join(name)).unwrap();
        assert_eq!(opened.path, real, "{name}");
    }
    assert!(matches!(
        open_trusted(&bin.join("absent")),
        Err(ResolveError::Missing { .. })
    ));
}

#[test]
fn a_link_into_a_directory_others_may_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let open_dir = tmp.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    let target = executable(&open_dir.join("plugin"));
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    symlink(&target, tmp.path().join("linked")).unwrap();
    let reason = unsafe_reason(&tmp.path().join("linked"));
    assert!(reason.contains("replace what is in it"), "{reason}");
}

#[test]
fn a_link_loop_is_refused_after_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    symlink("b", tmp.path().join("a")).unwrap();
    symlink("a", tmp.path().join("b")).unwrap();
    let reason = unsafe_reason(&tmp.path().join("a"));
    assert!(reason.contains("symbolic links"), "{reason}");
}

/// Whoever owns a link or a directory on the way could point it elsewhere.
#[test]
fn foreign_links_and_directories_are_refused() {
    crate::needs_root::needs_root("give a link and a directory away to another user");
    let tmp = tempfile::tempdir().unwrap();
    let real = executable(&tmp.path().join("plugin"));
    let link = tmp.path().join("foreign-link");
    symlink(&real, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
    let reason = unsafe_reason(&link);
    assert!(reason.contains("uid 65534"), "{reason}");
    let foreign = tmp.path().join("foreign-dir");
    std::fs::create_dir(&foreign).unwrap();
    let inside = executable(&foreign.join("plugin"));
    std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
    let reason = unsafe_reason(&inside);
    assert!(reason.contains("uid 65534"), "{reason}");
}
