//! Least privilege on the local API (issue #39): `api_group` reads, `api_admin_group` also
//! changes, the IPAM routes are root's, and uid 0 without `CAP_NET_ADMIN` (a container running
//! as root with the socket mounted) only reads. Every mutating route is tried as a read-only
//! member (403, nothing changed), as an admin member (done), and as root without the
//! capability (403); the CLI's refusal names the role it needed.
//!
//! Each test builds its own lab and runs the real `ipq-agent`; peers of other uids, groups and
//! capabilities are `curl` and `ipq` run through `setpriv`.
//!
//! Needs root, bpffs, `setpriv` and `curl` (util-linux, curl) and `target/debug/{ipq,ipq-agent}`;
//! `cargo xtask test` provides all of them.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipq_tests::{
    api::{ipq_as, request},
    lab::{poll, Lab},
};
use serde_json::{json, Value};

/// An unused gid for `--api-group` (checked absent from /etc/group).
const READ_GID: u32 = 54331;
/// An unused gid for `--api-admin-group`.
const ADMIN_GID: u32 = 54332;

const SETTLE: Duration = Duration::from_secs(5);

/// Root without `CAP_NET_ADMIN`: out of the bounding set, so not in what `exec` gives uid 0.
const ROOT_WITHOUT_NET_ADMIN: [&str; 2] = ["--inh-caps=-all", "--bounding-set=-net_admin"];

fn socket(lab: &Lab) -> PathBuf {
    lab.work_dir().join("ipq.sock")
}

fn assert_gids_unused() {
    let groups = fs::read_to_string("/etc/group").unwrap_or_default();
    for gid in [READ_GID, ADMIN_GID] {
        assert!(
            !groups.lines().any(|l| l.contains(&format!(":{gid}:"))),
            "gid {gid} must be unused for this test"
        );
    }
}

/// `curl` through `setpriv setpriv_args`: the HTTP status and the JSON body.
fn curl_as(
    setpriv_args: &[&str],
    method: &str,
    sock: &Path,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut curl = Command::new("setpriv");
    curl.args(setpriv_args)
        .args(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}"])
        .args(["-X", method]);
    if let Some(body) = body {
        curl.args(["-H", "Content-Type: application/json", "--data"])
            .arg(body.to_string());
    }
    let out = curl
        .arg("--unix-socket")
        .arg(sock)
        .arg(format!("http://ipq{path}"))
        .output()
        .expect("running curl (package curl) through setpriv (package util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("curl's status line: {text:?} {out:?}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (code.parse().unwrap_or(0), body)
}

/// The address's state as root reads it, or "free".
fn state_of(sock: &Path, addr: &str) -> String {
    let answer = request(sock, "GET", &format!("/v1/addresses/{addr}"), None).unwrap();
    if answer.status == 404 {
        return "free".into();
    }
    answer.json().unwrap()["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// One change per mutating route, in an order in which each succeeds when allowed: claim,
/// drain, release, CNI DEL, GC, a break-glass datapath write and its removal.
fn changes() -> Vec<(&'static str, String, Option<Value>)> {
    let claim = json!({
        "addresses": ["10.77.0.60"],
        "holder": {"interface": "vethpa", "container_id": "c-roles", "cni_ifname": "eth0"},
        "source": "cni",
    });
    vec![
        ("POST", "/v1/claims".into(), Some(claim)),
        ("POST", "/v1/addresses/10.77.0.60/drain".into(), None),
        (
            "POST",
            "/v1/addresses/10.77.0.60/release".into(),
            Some(json!({"force": true})),
        ),
        (
            "POST",
            "/v1/drains".into(),
            Some(json!({"container_id": "c-roles", "cni_ifname": "eth0"})),
        ),
        (
            "POST",
            "/v1/gc".into(),
            Some(json!({"valid_attachments": [], "network": "roles-net"})),
        ),
        (
            "PUT",
            "/v1/datapath/10.77.0.61".into(),
            Some(json!({"state": "quarantined"})),
        ),
        ("DELETE", "/v1/datapath/10.77.0.61".into(), None),
    ]
}

fn start(lab: &Lab) -> ipq_tests::lab::Agent<'_> {
    // Members must reach the socket's directory to be judged by the socket itself.
    fs::set_permissions(lab.work_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    let (read, admin) = (READ_GID.to_string(), ADMIN_GID.to_string());
    let agent = lab
        .start_agent(&[
            "--workload",
            "vethp*",
            "--uplink",
            "up0",
            "--api-group",
            &read,
            "--api-admin-group",
            &admin,
        ])
        .expect("starting ipq-agent");
    let sock = socket(lab);
    poll("the agent answers", SETTLE, || {
        Ok((request(&sock, "GET", "/v1/status", None)?.status == 200).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    agent
}

/// Every mutating route: 403 for a member of `api_group` (naming the admin role, changing
/// nothing), done for a member of `api_admin_group`; the IPAM routes 403 for both (the root
/// role); reads open to both.
#[test]
fn every_change_needs_the_admin_role_and_the_ipam_routes_root() {
    assert_gids_unused();
    let lab = Lab::new().expect("building the lab");
    let _agent = start(&lab);
    let sock = socket(&lab);
    let reader_groups = format!("--groups={READ_GID}");
    // An admin reaches the socket (group api_group, mode 0660) as a member of that group too.
    let admin_groups = format!("--groups={READ_GID},{ADMIN_GID}");
    let reader = ["--reuid=65534", "--regid=65534", reader_groups.as_str()];
    let admin = ["--reuid=65534", "--regid=65534", admin_groups.as_str()];

    for who in [&reader, &admin] {
        for path in ["/v1/status", "/v1/addresses", "/v1/conflicts", "/v1/events"] {
            let (code, body) = if path == "/v1/events" {
                // NDJSON, not one JSON value: only the status matters here.
                let answer = Command::new("setpriv")
                    .args(who)
                    .args(["curl", "-sS", "--max-time", "5", "-o", "/dev/null"])
                    .args(["-w", "%{http_code}", "--unix-socket"])
                    .arg(&sock)
                    .arg("http://ipq/v1/events")
                    .output()
                    .unwrap();
                let code = String::from_utf8_lossy(&answer.stdout).parse().unwrap_or(0);
                (code, Value::Null)
            } else {
                curl_as(who, "GET", &sock, path, None)
            };
            assert_eq!(code, 200, "{who:?} GET {path}: {body}");
        }
    }

    for (method, path, body) in changes() {
        let before = (state_of(&sock, "10.77.0.60"), state_of(&sock, "10.77.0.61"));
        let (code, refusal) = curl_as(&reader, method, &sock, &path, body.as_ref());
        assert_eq!(code, 403, "reader {method} {path}: {refusal}");
        assert_eq!(refusal["error"]["code"], "forbidden", "{refusal}");
        assert_eq!(refusal["error"]["needs"], "admin", "{refusal}");
        let message = refusal["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("uid 65534") && message.contains("admin role"),
            "{method} {path}: the refusal says who and what was needed: {message}"
        );
        assert_eq!(
            (state_of(&sock, "10.77.0.60"), state_of(&sock, "10.77.0.61")),
            before,
            "a refused {method} {path} changed nothing"
        );
        let (code, answer) = curl_as(&admin, method, &sock, &path, body.as_ref());
        assert_eq!(code, 200, "admin {method} {path}: {answer}");
    }
    // What the admin's changes did, in order: claimed, drained, released (free), a datapath
    // entry written and removed.
    assert_eq!(state_of(&sock, "10.77.0.60"), "free");

    for path in [
        "/v1/ipam/releases",
        "/v1/ipam/allocations",
        "/v1/ipam/exhausted",
    ] {
        for who in [&reader, &admin] {
            let (code, refusal) = curl_as(who, "POST", &sock, path, Some(&json!({})));
            assert_eq!(code, 403, "{who:?} {path}: {refusal}");
            assert_eq!(refusal["error"]["needs"], "root", "{refusal}");
        }
    }

    // The CLI says which role a refusal needed, and exits 6 (forbidden).
    let run = ipq_as(&reader, &sock, &["drain", "10.77.0.2"]).unwrap();
    run.assert_fails(6, &["admin role", "api_admin_group"]);
    assert_eq!(state_of(&sock, "10.77.0.2"), "active");
    ipq_as(&admin, &sock, &["list"]).unwrap().ok();
}

/// uid 0 without `CAP_NET_ADMIN` (a container's root with the socket mounted) reads, and is
/// refused every change with a message naming the missing capability; the same root with the
/// capability (an operator's `sudo ipq`) changes things.
#[test]
fn root_without_net_admin_only_reads() {
    assert_gids_unused();
    let lab = Lab::new().expect("building the lab");
    let _agent = start(&lab);
    let sock = socket(&lab);

    let (code, status) = curl_as(&ROOT_WITHOUT_NET_ADMIN, "GET", &sock, "/v1/status", None);
    assert_eq!(code, 200, "{status}");
    for (method, path, body) in changes() {
        let (code, refusal) = curl_as(&ROOT_WITHOUT_NET_ADMIN, method, &sock, &path, body.as_ref());
        assert_eq!(code, 403, "{method} {path}: {refusal}");
        assert_eq!(refusal["error"]["needs"], "admin", "{refusal}");
        let message = refusal["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("CAP_NET_ADMIN"), "{message}");
    }
    let (code, refusal) = curl_as(
        &ROOT_WITHOUT_NET_ADMIN,
        "POST",
        &sock,
        "/v1/ipam/releases",
        Some(&json!({})),
    );
    assert_eq!(
        (code, &refusal["error"]["needs"]),
        (403, &json!("root")),
        "{refusal}"
    );
    assert_eq!(state_of(&sock, "10.77.0.60"), "free", "nothing was claimed");

    // The CLI as that root: refused, naming the role; then with the capability: done.
    ipq_as(&ROOT_WITHOUT_NET_ADMIN, &sock, &["drain", "10.77.0.2"])
        .unwrap()
        .assert_fails(6, &["CAP_NET_ADMIN", "admin role"]);
    assert_eq!(state_of(&sock, "10.77.0.2"), "active");
    ipq_as(&[], &sock, &["drain", "10.77.0.2"]).unwrap().ok();
    assert_eq!(state_of(&sock, "10.77.0.2"), "draining");
}
