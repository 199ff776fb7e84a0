//! Local abuse cannot stop pod networking or get the agent restarted (issue #39): a member of
//! `api_group` holding every shared slot of the API socket with event followers does not make
//! root's claims wait (root has slots of its own); a follower whose peer is killed gives its
//! slot back at once, with no event to write to it; and another user holding the metrics
//! port's connections does not starve the kubelet's probes, which ask over the API socket
//! (`ipq-agent probe healthz|readyz`).
//!
//! The followers are held by a child process (`sleep`) that connected as nobody in
//! `api_group` between its fork and its exec, so that killing it is a peer going away.
//!
//! Needs root, bpffs and `target/debug/{ipq,ipq-agent}`; `cargo xtask test` provides them.

use std::{
    ffi::CString,
    fs, io,
    net::TcpStream,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ipq_tests::{
    api::{ipq_as, request},
    lab::{poll, Agent, Lab, METRICS_ADDR},
    netns::workspace_binary,
};
use serde_json::json;

/// An unused gid for `--api-group`.
const GID: u32 = 54341;
/// The API's shared connection slots (`listen::API_MAX_CONNECTIONS`).
const SHARED_SLOTS: usize = 256;
/// Followers asked for beyond the shared slots: each is refused at accept, which proves the
/// slots full.
const OVER: usize = 8;
/// How soon a dead follower's slot must be free again.
const REAP_BOUND: Duration = Duration::from_secs(3);
const SETTLE: Duration = Duration::from_secs(10);

fn socket(lab: &Lab) -> PathBuf {
    lab.work_dir().join("ipq.sock")
}

fn start(lab: &Lab) -> Agent<'_> {
    let groups = fs::read_to_string("/etc/group").unwrap_or_default();
    assert!(
        !groups.lines().any(|l| l.contains(&format!(":{GID}:"))),
        "gid {GID} must be unused for this test"
    );
    fs::set_permissions(lab.work_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    let gid = GID.to_string();
    lab.start_agent(&[
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--api-group",
        &gid,
    ])
    .expect("starting ipq-agent")
}

fn member() -> [String; 3] {
    [
        "--reuid=65534".into(),
        "--regid=65534".into(),
        format!("--groups={GID}"),
    ]
}

/// `sleep 600` holding `n` connections to `sock`, each following `/v1/events`, made as uid
/// 65534 in `GID` between fork and exec (the connections are the child's alone).
fn hold_followers(sock: &Path, n: usize) -> Child {
    let path = CString::new(sock.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain C struct; zero is its empty value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes_with_nul();
    assert!(bytes.len() <= addr.sun_path.len(), "socket path too long");
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let request: &'static [u8] = b"GET /v1/events?follow=true HTTP/1.1\r\nHost: ipq\r\n\r\n";
    let mut child = Command::new("sleep");
    child.arg("600").stdin(Stdio::null()).stdout(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe system calls run, on memory made
    // before the fork; the sockets are made without CLOEXEC so that `sleep` keeps them.
    unsafe {
        child.pre_exec(move || {
            let groups = [GID as libc::gid_t];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for _ in 0..n {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, std::ptr::from_ref(&addr).cast(), len) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // A refused connection may be closed before this: its write fails, and
                // that is what a refusal is.
                libc::send(
                    fd,
                    request.as_ptr().cast(),
                    request.len(),
                    libc::MSG_NOSIGNAL,
                );
            }
            Ok(())
        });
    }
    child.spawn().expect("sleep holding the followers")
}

fn refused_full(agent: &Agent) -> f64 {
    agent
        .metric(
            "ipq_connections_refused_total",
            &[("listener", "api"), ("reason", "full")],
        )
        .unwrap_or(0.0)
}

/// Waits until `over` more connections were refused for want of a shared slot than `before`.
fn wait_full(agent: &Agent, before: f64, over: usize) {
    poll("the shared slots full (refusals counted)", SETTLE, || {
        Ok((refused_full(agent) >= before + over as f64).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
}

fn claim(addr: &str, container: &str) -> String {
    json!({
        "addresses": [addr],
        "holder": {"interface": "vethpa", "container_id": container, "cni_ifname": "eth0"},
        "source": "cni",
    })
    .to_string()
}

/// The kubelet's exec probe, as the DaemonSet runs it.
fn exec_probe(sock: &Path, probe: &str) -> std::process::Output {
    Command::new(workspace_binary("ipq-agent"))
        .args(["probe", probe, "--api-socket"])
        .arg(sock)
        .output()
        .expect("running ipq-agent probe")
}

/// A member of `api_group` holds every shared slot with followers (and is refused more):
/// root's CNI-style claims are each answered, at once, through root's reserved slots, and so
/// are `ipq status` and the exec probes.
#[test]
fn root_claims_are_answered_while_another_user_holds_every_shared_slot() {
    let lab = Lab::new().expect("building the lab");
    let agent = start(&lab);
    let sock = socket(&lab);
    let before = refused_full(&agent);
    let mut holder = hold_followers(&sock, SHARED_SLOTS + OVER);
    wait_full(&agent, before, OVER);
    // The member's own next call is refused: the cap is really held.
    let member = member();
    let member: Vec<&str> = member.iter().map(String::as_str).collect();
    assert_ne!(
        ipq_as(&member, &sock, &["status"]).unwrap().code,
        0,
        "a member's call while its followers hold every shared slot"
    );
    for i in 0..5 {
        let began = Instant::now();
        let answer = request(
            &sock,
            "POST",
            "/v1/claims",
            Some(&claim(&format!("10.77.0.{}", 80 + i), &format!("c-{i}"))),
        )
        .unwrap_or_else(|e| panic!("root's claim {i}: {e:#}"));
        assert_eq!(answer.status, 200, "root's claim {i}: {}", answer.body);
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "root's claim {i} waited {:?}",
            began.elapsed()
        );
    }
    ipq_as(&[], &sock, &["status"]).unwrap().ok();
    for probe in ["healthz", "readyz"] {
        let out = exec_probe(&sock, probe);
        assert!(out.status.success(), "{probe}: {out:?}");
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// The highest event sequence number the agent has written.
fn last_seq(sock: &Path) -> u64 {
    let answer = request(sock, "GET", "/v1/events", None).expect("GET /v1/events");
    answer
        .body
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|event| event["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The followers' process is killed while nothing happens: their slots are free again within
/// [`REAP_BOUND`], and no event was written meanwhile (none could have ended them).
#[test]
fn a_follower_whose_peer_is_killed_frees_its_slot_without_an_event() {
    let lab = Lab::new().expect("building the lab");
    let agent = start(&lab);
    let sock = socket(&lab);
    let member = member();
    let member: Vec<&str> = member.iter().map(String::as_str).collect();
    // Settled: the lab's start-up events are written before the count is taken.
    poll("the lab's addresses claimed", SETTLE, || {
        let list = request(&sock, "GET", "/v1/addresses", None)?.json()?;
        Ok((list["addresses"].as_array().map_or(0, Vec::len) >= 4).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let seq = last_seq(&sock);
    let before = refused_full(&agent);
    let mut holder = hold_followers(&sock, SHARED_SLOTS + OVER);
    wait_full(&agent, before, OVER);
    assert_ne!(
        ipq_as(&member, &sock, &["status"]).unwrap().code,
        0,
        "the shared slots are held"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let killed = Instant::now();
    poll("a member's call answered again", REAP_BOUND, || {
        Ok((ipq_as(&member, &sock, &["status"])?.code == 0).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}: the dead followers still hold their slots {:?} after their peer was killed",
            killed.elapsed()
        )
    });
    assert_eq!(
        last_seq(&sock),
        seq,
        "no event was written: none could have ended the followers"
    );
}

/// Another user (nobody, in no group) holds more connections to the metrics port than one
/// peer may open: the metrics port's own probe is refused (the starvation is real), and the
/// exec probes answer every time.
#[test]
fn the_probes_answer_while_another_user_holds_the_metrics_port() {
    let lab = Lab::new().expect("building the lab");
    let agent = start(&lab);
    let sock = socket(&lab);
    let held: Vec<TcpStream> = lab.node.run(|| {
        // SAFETY: raw syscalls change only this thread's credentials.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        (0..12)
            .map(|_| TcpStream::connect(METRICS_ADDR).expect("connecting as nobody"))
            .collect()
    });
    // At once (they time out after 10 s without a request): the kubelet's httpGet from the
    // same address is refused, which is what the exec probes are for.
    assert!(
        agent.readyz().is_err(),
        "the metrics port's /readyz while another user holds its allowance"
    );
    for round in 0..5 {
        let out = exec_probe(&sock, "healthz");
        assert!(out.status.success(), "healthz round {round}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
        let out = exec_probe(&sock, "readyz");
        assert!(out.status.success(), "readyz round {round}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\n");
    }
    drop(held);
}
