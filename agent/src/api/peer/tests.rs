use super::*;

#[test]
fn cap_eff_is_read_from_the_status_line() {
    let status = "Name:\tcat\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
    assert_eq!(cap_eff(status), Some(1 << CAP_NET_ADMIN));
    assert_eq!(cap_eff("Name:\tcat\n"), None);
}

#[test]
fn a_process_without_net_admin_or_of_another_user_namespace_is_not_root() {
    let full = Process {
        cap_eff: u64::MAX,
        same_user_ns: true,
    };
    assert_eq!(full.not_root(), None);
    let no_net_admin = Process {
        cap_eff: !(1 << CAP_NET_ADMIN),
        same_user_ns: true,
    };
    assert_eq!(no_net_admin.not_root(), Some(NotRoot::NoNetAdmin));
    let elsewhere = Process {
        cap_eff: u64::MAX,
        same_user_ns: false,
    };
    assert_eq!(elsewhere.not_root(), Some(NotRoot::OtherUserNamespace));
}

#[test]
fn a_refusal_names_the_role_needed_and_why_the_peer_lacks_it() {
    let reader = Peer {
        uid: 0,
        role: Role::Read,
        not_root: Some(NotRoot::NoNetAdmin),
    };
    assert_eq!(reader.needs(Role::Read, "GET /v1/status"), Ok(()));
    let refusal = reader.needs(Role::Admin, "POST /v1/claims").unwrap_err();
    for needle in ["POST /v1/claims", "without CAP_NET_ADMIN", "admin role"] {
        assert!(refusal.contains(needle), "{needle:?} in {refusal}");
    }
    let admin = Peer {
        uid: 1000,
        role: Role::Admin,
        not_root: None,
    };
    assert_eq!(admin.needs(Role::Admin, "POST /v1/gc"), Ok(()));
    let refusal = admin
        .needs(Role::Root, "POST /v1/ipam/releases")
        .unwrap_err();
    assert!(
        refusal.contains("uid 1000 (admin role)") && refusal.contains("root role"),
        "{refusal}"
    );
    assert_eq!(Peer::root().needs(Role::Root, "x"), Ok(()));
}

/// The test runs as root with every capability (it is a privileged test binary): its own
/// connection is root's, read through the pidfd and /proc.
#[tokio::test]
async fn this_process_is_seen_as_root_through_its_pidfd() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let ours = UnixStream::from_std(ours).unwrap();
    let cred = ours.peer_cred().unwrap();
    assert_eq!(cred.uid(), 0, "this test needs root");
    let pidfd = peer_pidfd(&ours).expect("SO_PEERPIDFD (Linux 6.5)");
    let fdinfo = Path::new("/proc/self/fdinfo").join(pidfd.as_raw_fd().to_string());
    assert_eq!(pidfd_pid(&fdinfo), Ok(std::process::id() as i32));
    assert_eq!(root_privilege(Path::new("/proc"), &ours, cred.pid()), None);
    drop(theirs);
}

/// A procfs in which no process is found: the peer is not visible, so it is not root.
#[tokio::test]
async fn a_peer_the_procfs_does_not_show_is_not_root() {
    let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let ours = UnixStream::from_std(ours).unwrap();
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        root_privilege(empty.path(), &ours, Some(1)),
        Some(NotRoot::Unreadable)
    );
    let dir = empty.path().join("self/fdinfo");
    fs::create_dir_all(&dir).unwrap();
    let pidfd = peer_pidfd(&ours).unwrap();
    // The fdinfo of a pidfd whose process lives in a PID namespace this procfs does not show.
    fs::write(
        dir.join(pidfd.as_raw_fd().to_string()),
        "Pid:\t0\nNSpid:\t0\n",
    )
    .unwrap();
    assert_eq!(
        Process::by_pidfd(empty.path(), pidfd).err(),
        Some(NotRoot::NotVisible)
    );
}
