//! The pins' filesystem taken from under the agent: `bpffs_dir` on a bpf mount of its own
//! under /tmp (on a shared tmpfs of the test's, so that the unmount reaches the agent's own
//! mount namespace, a slave copy of the test's, as a host's unmount reaches a pod's
//! `HostToContainer` volume), lazily unmounted while the agent runs. The pins cannot be restored there any
//! more and enforcement would end with the agent: `/readyz` fails and says why at the next
//! verification; at TERM the agent says enforcement ends (and it does: the fenced pod's
//! packets flow once it is gone); a new agent mounts a bpf filesystem at `bpffs_dir` itself
//! and enforces again.
//!
//! Needs root (mount), bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides them.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipq_tests::lab::{poll, udp_burst, Lab, PEER_V4};

/// A directory of the test's own under /tmp; whatever is mounted there is lazily unmounted
/// and the directory removed on drop, also when the test fails.
struct TmpMount(PathBuf);

impl TmpMount {
    /// Where the bpf filesystem is mounted: under the shared tmpfs at the root, since an
    /// unmount propagates from the mount it is made on (the parent), not from the mount
    /// that goes.
    fn bpf(&self) -> PathBuf {
        self.0.join("bpf")
    }
}

impl Drop for TmpMount {
    fn drop(&mut self) {
        for dir in [self.bpf().join("ipq"), self.bpf(), self.0.clone()] {
            while Command::new("umount")
                .arg("-l")
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success())
            {}
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn args(bpffs_dir: &Path) -> Vec<String> {
    [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--verify-interval",
        "200ms",
        "--bpffs-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([bpffs_dir.display().to_string()])
    .collect()
}

#[test]
fn a_bpffs_dir_unmounted_from_under_the_agent_fails_readyz_and_term_says_enforcement_ends() {
    let lab = Lab::new().expect("building the lab");
    let mount = TmpMount(PathBuf::from(format!(
        "/tmp/ipq-bpffs-lost-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&mount.0).expect("mkdir");
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0700", "ipq-bpffs-lost"])
        .arg(&mount.0));
    run(Command::new("mount").arg("--make-shared").arg(&mount.0));
    std::fs::create_dir(mount.bpf()).expect("mkdir");
    run(Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(mount.bpf()));
    let bpffs_dir = mount.bpf().join("ipq");
    let args = args(&bpffs_dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");

    run(Command::new("umount").arg("-l").arg(mount.bpf()));
    poll(
        "/readyz failing on the lost pins",
        Duration::from_secs(10),
        || {
            let (code, body) = agent.readyz()?;
            Ok((code == 503 && body.contains("no longer on a bpf filesystem")).then_some(body))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));

    agent.terminate().expect("TERM");
    let log = agent.log();
    assert!(log.contains("ENFORCEMENT ENDS"), "{log}");
    assert!(!log.contains("enforcement continues"), "{log}");
    // What it said is what the kernel does: nothing holds the pins any more.
    poll(
        "the fence gone with the agent",
        Duration::from_secs(10),
        || Ok((udp_burst(&lab.pod_a, &lab.peer, peer, 10) > 0).then_some(())),
    )
    .expect("the fenced pod's packets flow once the agent is gone");

    // A new agent: bpffs_dir is on the test's tmpfs now; it mounts a bpf filesystem there.
    // In the test's mount namespace: the test writes the pins through that mount below, and
    // a mount made in the agent's own namespace would reach neither the test nor anything
    // that outlives the agent (which it would say at TERM). The DaemonSet's agent cannot
    // mount at all (no CAP_SYS_ADMIN); its init step mounts the host's /sys/fs/bpf.
    let agent = lab
        .start_agent_in_host_namespaces(&args)
        .expect("restarting ipq-agent");
    assert!(agent.log().contains("mounted one at"), "{}", agent.log());
    lab.maps().fence_pod_a().expect("fencing pod a again");
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    drop(agent);
}
