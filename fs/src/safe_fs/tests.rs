use std::os::unix::fs::{symlink, PermissionsExt as _};

use super::*;

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn mkfifo(path: &Path) {
    let c = c_path(path).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_or_a_link_is_reported_never_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    // Would block forever without O_NONBLOCK.
    let err = read_regular(&fifo).unwrap_err();
    assert!(
        matches!(err, OpenError::NotRegular { kind: "FIFO" }),
        "{err:?}"
    );
    let target = tmp.path().join("target");
    fs::write(&target, b"secret").unwrap();
    let link = tmp.path().join("link");
    symlink(&target, &link).unwrap();
    let err = read_regular(&link).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NotRegular {
                kind: "symbolic link"
            }
        ),
        "{err:?}"
    );
    let err = read_regular(tmp.path()).unwrap_err();
    assert!(
        matches!(err, OpenError::NotRegular { kind: "directory" }),
        "{err:?}"
    );
    assert!(matches!(
        read_regular(&tmp.path().join("none")),
        Err(OpenError::Missing)
    ));
    assert_eq!(read_regular(&target).unwrap(), b"secret");
}

#[test]
fn appending_never_goes_through_a_fifo_or_a_link() {
    use std::io::Write as _;

    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    open_append_regular(&log, 0o600)
        .unwrap()
        .write_all(b"a")
        .unwrap();
    open_append_regular(&log, 0o600)
        .unwrap()
        .write_all(b"b")
        .unwrap();
    assert_eq!(fs::read(&log).unwrap(), b"ab");
    assert_eq!(mode(&log), 0o600);
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    assert!(matches!(
        open_append_regular(&fifo, 0o600),
        Err(OpenError::NotRegular { .. })
    ));
    let link = tmp.path().join("link");
    symlink(&log, &link).unwrap();
    assert!(matches!(
        open_append_regular(&link, 0o600),
        Err(OpenError::NotRegular {
            kind: "symbolic link"
        })
    ));
    assert_eq!(fs::read(&log).unwrap(), b"ab");
}

#[test]
fn creation_is_exclusive_and_never_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    fs::write(&target, b"keep").unwrap();
    let link = tmp.path().join("tmp");
    symlink(&target, &link).unwrap();
    assert!(create_excl_nofollow(&link, 0o600).is_err());
    // The stale link goes, not its target; a FIFO left there goes too.
    create_fresh(&link, 0o600).unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(mode(&link), 0o600);
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    create_fresh(&fifo, 0o600).unwrap();
    assert!(fs::symlink_metadata(&fifo).unwrap().is_file());
}

#[test]
fn directories_are_created_checked_and_tightened() {
    let tmp = tempfile::tempdir().unwrap();
    let private = tmp.path().join("a/b/state");
    ensure_private_dir(&private).unwrap();
    assert_eq!(mode(&private), 0o700);
    fs::set_permissions(&private, fs::Permissions::from_mode(0o777)).unwrap();
    ensure_private_dir(&private).unwrap();
    assert_eq!(mode(&private), 0o700);

    let shared = tmp.path().join("run");
    ensure_dir(&shared, DirAccess::Traversable).unwrap();
    assert_eq!(mode(&shared), 0o755);
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    ensure_dir(&shared, DirAccess::Traversable).unwrap();
    assert_eq!(mode(&shared), 0o755);
    // A sticky shared directory (like /tmp) is left as it is.
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    ensure_dir(&shared, DirAccess::Traversable).unwrap();
    assert_eq!(mode(&shared), 0o1777);
    let err = ensure_private_dir(&shared).unwrap_err();
    assert!(matches!(err, DirError::SharedSticky { .. }), "{err}");

    let link = tmp.path().join("link");
    symlink(&private, &link).unwrap();
    let err = ensure_private_dir(&link).unwrap_err();
    assert!(matches!(err, DirError::Symlink { .. }), "{err}");
    let file = tmp.path().join("file");
    fs::write(&file, b"").unwrap();
    let err = ensure_private_dir(&file).unwrap_err();
    assert!(err.to_string().contains("regular file"), "{err}");
}
