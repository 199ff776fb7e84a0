//! The agent's API and the `ipq` CLI end to end (issue #4): every endpoint and every command,
//! in table and JSON form, the exit codes scripts rely on, malformed requests written by hand,
//! and who may use the socket.
//!
//! Each test builds its own lab (see `ipq_tests::lab`) and runs the real `ipq-agent` in its
//! node namespace with the API socket in the lab's scratch dir. The real `ipq` binary runs from
//! the root namespace: a unix socket is a file, reachable from any network namespace.
//! Claims name the lab's pod veths (`vethpa`, `vethpb`), which the agent's `vethp*` workload
//! glob covers; the pods' own addresses are claimed by the agent from their host routes at
//! start-up, so every test begins with those four addresses Active.
//!
//! Needs root, bpffs, `setpriv` and `curl` (util-linux, curl) and `target/debug/{ipq,ipq-agent}`;
//! `cargo xtask test` provides all of them.

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead as _, BufReader, Read as _},
    os::unix::{
        fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
        net::UnixListener,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use ipq::api::model::{AddressList, AddressView, ConflictList, Event, Status};
use ipq_tests::{
    api::{ipq, ipq_as, request, HttpResponse},
    lab::{ifindex, poll, Lab, POD_A_V4, POD_A_V6, POD_B_V4, POD_B_V6},
    netns::workspace_binary,
};
use serde_json::{json, Value};

/// How long the agent may take to act on something.
const SETTLE: Duration = Duration::from_secs(5);

/// An unused gid for `--api-group` (checked absent from /etc/group by the test using it).
const API_GID: u32 = 54321;
/// nobody / nogroup.
const NOBODY: &str = "--reuid=65534";
const NOGROUP: &str = "--regid=65534";

fn agent_args(policy: &str) -> Vec<&str> {
    vec![
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--on-early-reuse",
        policy,
    ]
}

fn socket(lab: &Lab) -> PathBuf {
    lab.work_dir().join("ipq.sock")
}

fn lab_addresses() -> [String; 4] {
    [
        POD_A_V4.to_string(),
        POD_A_V6.to_string(),
        POD_B_V4.to_string(),
        POD_B_V6.to_string(),
    ]
}

/// `GET path`, which must answer 200 with JSON.
fn get_json(socket: &Path, path: &str) -> Value {
    let answer = request(socket, "GET", path, None).unwrap_or_else(|e| panic!("GET {path}: {e:#}"));
    assert_eq!(answer.status, 200, "GET {path}: {}", answer.body);
    answer
        .json()
        .unwrap_or_else(|e| panic!("GET {path}: {e:#}"))
}

/// `POST path body`, which must answer 200 with JSON.
fn post_ok(socket: &Path, path: &str, body: &Value) -> Value {
    let answer = post(socket, path, body);
    assert_eq!(answer.status, 200, "POST {path} {body}: {}", answer.body);
    answer
        .json()
        .unwrap_or_else(|e| panic!("POST {path}: {e:#}"))
}

fn post(socket: &Path, path: &str, body: &Value) -> HttpResponse {
    request(socket, "POST", path, Some(&body.to_string()))
        .unwrap_or_else(|e| panic!("POST {path}: {e:#}"))
}

/// The view of `addr` in a JSON list of address views, if any.
fn find<'a>(views: &'a Value, addr: &str) -> Option<&'a Value> {
    views
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {views}"))
        .iter()
        .find(|v| v["address"] == addr)
}

/// Waits until the agent has claimed the pods' four addresses from their host routes, and
/// (under `tc_attach = "auto"` here, a TCX kernel) has moved the pods' interfaces from their
/// netlink filters to TCX links: the address views, which show the attachment, are stable.
fn wait_lab_claimed(socket: &Path) {
    poll("the lab's four addresses Active", SETTLE, || {
        let list = request(socket, "GET", "/v1/addresses", None)?.json()?;
        Ok(lab_addresses()
            .iter()
            .all(|a| find(&list["addresses"], a).is_some_and(|v| v["state"] == "active"))
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    poll("every interface moved to TCX", SETTLE, || {
        let status = request(socket, "GET", "/v1/status", None)?.json()?;
        let moving = status["tc_attach"] == "netlink-then-tcx"
            && status["interfaces"].as_array().is_some_and(|list| {
                list.iter().any(|i| {
                    i["attachment"]
                        .as_str()
                        .is_some_and(|a| a.contains("netlink"))
                })
            });
        Ok((!moving).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A claim body in the API's shape, as ipq-cni would send it.
fn claim(addresses: &[&str], interface: &str, container: &str) -> Value {
    json!({
        "addresses": addresses,
        "holder": {
            "interface": interface,
            "container_id": container,
            "cni_ifname": "eth0",
        },
        "source": "cni",
    })
}

/// Every command and the endpoints behind them: status, claim (and its idempotence), list,
/// get, drain, release with and without force, CNI DEL (`/v1/drains`) and GC; table and JSON
/// output, the JSON equal to the API's own answer.
#[test]
fn claims_drains_releases_and_gc_through_the_api_and_the_cli() {
    let lab = Lab::new().expect("building the lab");
    let _agent = lab
        .start_agent(&agent_args("fence-old"))
        .expect("starting ipq-agent");
    let sock = socket(&lab);
    wait_lab_claimed(&sock);
    let vethpa = ifindex(&lab.node, "vethpa").expect("vethpa");

    status_phase(&sock);
    claim_phase(&sock, vethpa);
    list_phase(&sock);
    get_phase(&sock, vethpa);
    drain_phase(&sock);
    release_phase(&sock);
    cni_del_phase(&sock);
    gc_phase(&sock);
    counts_phase(&sock);
}

/// `ipq status` against `/v1/status`, as JSON, typed and as a table.
fn status_phase(sock: &Path) {
    let status = ipq(sock, &["status", "-o", "json"]).unwrap().json();
    assert_eq!(status, get_json(sock, "/v1/status"), "ipq status -o json");
    let typed: Status = serde_json::from_value(status.clone()).expect("a Status");
    assert!(typed.ready);
    assert_eq!(typed.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(typed.mode, ipq_common::config::Mode::Enforce);
    assert_eq!(typed.on_early_reuse, ipq_api::EarlyReusePolicy::FenceOld);
    assert_eq!(typed.registry.active, 4, "{status}");
    assert!(typed.registry.capacity >= 4, "{status}");
    for name in ["vethpa", "vethpb"] {
        let iface = typed
            .interfaces
            .iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("{name} not among the attached interfaces: {status}"));
        assert!(!iface.hooks.is_empty(), "{name} has no hooks: {status}");
    }
    let table = ipq(sock, &["status"]).unwrap();
    let table = table.ok();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("Ready:") && l.ends_with(" yes")),
        "{table}"
    );
    assert!(table.contains("fence-old"), "{table}");
    let vethpa_row = typed
        .interfaces
        .iter()
        .find(|i| i.name == "vethpa")
        .unwrap();
    assert!(
        table.lines().any(|l| l.contains(" vethpa ")
            && l.contains(
                &vethpa_row
                    .hooks
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
            && l.contains(&vethpa_row.ifindex.to_string())),
        "the status table lists vethpa and its hooks:\n{table}"
    );
}

/// A claim of two addresses with the whole identity ipq-cni knows, and again (a no-op).
fn claim_phase(sock: &Path, vethpa: u32) {
    // claim: two addresses with the whole identity ipq-cni knows.
    let body = json!({
        "addresses": ["10.77.0.50", "fd77::50"],
        "holder": {
            "interface": "vethpa",
            "container_id": "c0ffee00000000000000000000000050",
            "cni_ifname": "eth1",
            "netns": "/var/run/netns/cni-test",
            "pod": {"namespace": "default", "name": "web-1", "uid": "u-1"},
        },
        "source": "cni",
    });
    let claimed = post_ok(sock, "/v1/claims", &body);
    assert_eq!(claimed["conflicts"], json!([]), "{claimed}");
    for addr in ["10.77.0.50", "fd77::50"] {
        let view = find(&claimed["addresses"], addr)
            .unwrap_or_else(|| panic!("{addr} not in the claim's answer {claimed}"));
        assert_eq!(view["state"], "active", "{view}");
        assert_eq!(view["holder"]["ifname"], "vethpa", "{view}");
        assert_eq!(view["holder"]["ifindex"], vethpa, "{view}");
        assert_eq!(view["holder"]["pod"]["name"], "web-1", "{view}");
    }
    // The same holder again is a no-op, not a conflict.
    let again = post_ok(sock, "/v1/claims", &body);
    assert_eq!(again["conflicts"], json!([]), "{again}");

    // A new holder's flush finishes after the claim is answered (the v6 one dumps conntrack):
    // the list is compared with the API once both flushes are on record, or the two reads
    // could straddle one.
    poll("both new holders' flushes on record", SETTLE, || {
        let list = request(sock, "GET", "/v1/addresses", None)?.json()?;
        Ok(["10.77.0.50", "fd77::50"]
            .iter()
            .all(|a| find(&list["addresses"], a).is_some_and(|v| v["last_flush"].is_object()))
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// `ipq list` against `/v1/addresses`, as JSON and as a table.
fn list_phase(sock: &Path) {
    let list = ipq(sock, &["list", "-o", "json"]).unwrap().json();
    assert_eq!(list, get_json(sock, "/v1/addresses"), "ipq list -o json");
    let typed: AddressList = serde_json::from_value(list.clone()).expect("an AddressList");
    assert_eq!(typed.addresses.len(), 6, "{list}");
    let active = ipq(sock, &["list", "--state", "active", "-o", "json"])
        .unwrap()
        .json();
    assert_eq!(active["addresses"].as_array().unwrap().len(), 6, "{active}");
    let table = ipq(sock, &["list"]).unwrap();
    let table = table.ok();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["ADDRESS", "STATE", "HOLDER", "SINCE", "UNTIL", "CONFLICTS"],
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("10.77.0.50 "))
        .unwrap_or_else(|| panic!("no row for 10.77.0.50:\n{table}"));
    for cell in ["active", "vethpa default/web-1", " ago", " -"] {
        assert!(row.contains(cell), "{cell:?} in {row:?}");
    }
    assert_eq!(table.lines().count(), 7, "a header and six rows:\n{table}");
}

/// `ipq get` of a claimed address, as JSON and as a table.
fn get_phase(sock: &Path, vethpa: u32) {
    let view = ipq(sock, &["get", "10.77.0.50", "-o", "json"])
        .unwrap()
        .json();
    assert_eq!(view, get_json(sock, "/v1/addresses/10.77.0.50"));
    let typed: AddressView = serde_json::from_value(view.clone()).expect("an AddressView");
    let holder = typed.holder.expect("a holder");
    assert_eq!(
        (holder.container_id(), holder.cni_ifname(), holder.netns()),
        (
            Some("c0ffee00000000000000000000000050"),
            Some("eth1"),
            Some("/var/run/netns/cni-test")
        )
    );
    assert_eq!(typed.conflicts, 0);
    let table = ipq(sock, &["get", "10.77.0.50"]).unwrap();
    let table = table.ok();
    for line in [
        "Address:",
        "State:",
        "Since:",
        "Holder:",
        "Container:",
        "Fenced:",
    ] {
        assert!(table.contains(line), "{line} in:\n{table}");
    }
    assert!(
        table.contains("c0ffee00000000000000000000000050"),
        "{table}"
    );
    assert!(table.contains("default/web-1 (uid u-1)"), "{table}");
    assert!(
        table.contains(&format!("vethpa (ifindex {vethpa})")),
        "{table}"
    );
}

/// `ipq drain`, as a table then as JSON; an unknown address fails.
fn drain_phase(sock: &Path) {
    // drain, table then JSON
    let table = ipq(sock, &["drain", "10.77.0.50"]).unwrap();
    let table = table.ok();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("10.77.0.50 ") && l.contains("draining")),
        "{table}"
    );
    let drained = ipq(sock, &["drain", "fd77::50", "-o", "json"])
        .unwrap()
        .json();
    assert_eq!(
        find(&drained["addresses"], "fd77::50").unwrap()["state"],
        "draining"
    );
    let draining = ipq(sock, &["list", "--state", "draining", "-o", "json"])
        .unwrap()
        .json();
    let names: BTreeSet<&str> = draining["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["address"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["10.77.0.50", "fd77::50"]));
    ipq(sock, &["drain", "10.77.0.51"])
        .unwrap()
        .assert_fails(3, &["10.77.0.51"]);
}

/// `ipq release`: a live (draining) holder needs `--force`.
fn release_phase(sock: &Path) {
    // release: a live (draining) holder needs --force.
    ipq(sock, &["release", "10.77.0.50"])
        .unwrap()
        .assert_fails(4, &["10.77.0.50"]);
    post(
        sock,
        "/v1/addresses/fd77::50/release",
        &json!({"force": false}),
    )
    .assert_error(
        "release without force",
        409,
        "not_releasable",
        &["fd77::50"],
    );
    // The body is optional: none means no force.
    request(sock, "POST", "/v1/addresses/fd77::50/release", None)
        .unwrap()
        .assert_error(
            "release without a body",
            409,
            "not_releasable",
            &["fd77::50"],
        );
    assert_eq!(
        find(&get_json(sock, "/v1/addresses")["addresses"], "10.77.0.50").unwrap()["state"],
        "draining",
        "a refused release changes nothing"
    );
    let released = ipq(sock, &["release", "10.77.0.50", "--force", "-o", "json"])
        .unwrap()
        .json();
    assert!(
        released["addresses"].is_array(),
        "a ChangedResponse: {released}"
    );
    ipq(sock, &["release", "fd77::50", "--force"]).unwrap().ok();
    for addr in ["10.77.0.50", "fd77::50"] {
        ipq(sock, &["get", addr]).unwrap().assert_fails(3, &[addr]);
        request(sock, "GET", &format!("/v1/addresses/{addr}"), None)
            .unwrap()
            .assert_error("get a released address", 404, "not_found", &[addr]);
    }
}

/// CNI DEL (`/v1/drains`): everything the attachment holds drains; again is still success.
fn cni_del_phase(sock: &Path) {
    // CNI DEL: everything the attachment holds drains; again is still success.
    post_ok(
        sock,
        "/v1/claims",
        &claim(&["10.77.0.60"], "vethpb", "c-drain"),
    );
    let drained = post_ok(
        sock,
        "/v1/drains",
        &json!({"container_id": "c-drain", "cni_ifname": "eth0"}),
    );
    assert_eq!(
        find(&drained["addresses"], "10.77.0.60").map(|v| &v["state"]),
        Some(&json!("draining")),
        "{drained}"
    );
    post_ok(
        sock,
        "/v1/drains",
        &json!({"container_id": "c-drain", "cni_ifname": "eth0"}),
    );
    let nothing = post_ok(sock, "/v1/drains", &json!({"container_id": "c-unknown"}));
    assert_eq!(nothing["addresses"], json!([]), "{nothing}");
}

/// CNI GC (`/v1/gc`): attachments not listed as valid are drained.
fn gc_phase(sock: &Path) {
    // GC: attachments not listed as valid are drained; holders without a container id (the
    // pods' own addresses, seen on netlink) are not the runtime's to collect.
    post_ok(
        sock,
        "/v1/claims",
        &claim(&["10.77.0.70"], "vethpa", "c-keep"),
    );
    post_ok(
        sock,
        "/v1/claims",
        &claim(&["10.77.0.71"], "vethpa", "c-stale"),
    );
    // The runtime lists every attachment of the node: 2000 with 64-character container IDs
    // make a body of ~230 KB, far over what a claim may send.
    let mut valid = vec![
        json!({"container_id": "c-keep", "ifname": "eth0"}),
        json!({"container_id": "c-drain", "ifname": "eth0"}),
    ];
    valid.extend((0..2000).map(|i| json!({"container_id": format!("{i:064x}"), "ifname": "eth0"})));
    let collected = post_ok(sock, "/v1/gc", &json!({ "valid_attachments": valid }));
    assert_eq!(
        find(&collected["addresses"], "10.77.0.71").map(|v| &v["state"]),
        Some(&json!("draining")),
        "{collected}"
    );
    assert!(
        find(&collected["addresses"], "10.77.0.70").is_none(),
        "{collected}"
    );
    let list = get_json(sock, "/v1/addresses");
    assert_eq!(
        find(&list["addresses"], "10.77.0.70").unwrap()["state"],
        "active"
    );
    for addr in lab_addresses() {
        assert_eq!(
            find(&list["addresses"], &addr).unwrap()["state"],
            "active",
            "{addr} after GC: {list}"
        );
    }
}

/// The counts in `/v1/status` agree with the list.
fn counts_phase(sock: &Path) {
    let list = get_json(sock, "/v1/addresses");
    let status: Status = serde_json::from_value(get_json(sock, "/v1/status")).expect("a Status");
    let list: AddressList = serde_json::from_value(list).expect("an AddressList");
    let count = |state: &str| {
        list.addresses
            .iter()
            .filter(|v| v.state.as_ref() == state)
            .count() as u64
    };
    assert_eq!(
        (
            status.registry.active,
            status.registry.draining,
            status.registry.quarantined,
            status.registry.entries
        ),
        (
            count("active"),
            count("draining"),
            count("quarantined"),
            list.addresses.len() as u64
        ),
        "status counts vs the list"
    );
}

/// A claim over a live holder under fence-old succeeds with a conflict; `ipq conflicts` and
/// `ipq events` show it and the drains the test causes, in table and JSON (NDJSON) form, and
/// `ipq events --follow` receives an event caused after it started.
#[test]
fn conflicts_and_events_in_table_json_and_live() {
    let lab = Lab::new().expect("building the lab");
    let _agent = lab
        .start_agent(&agent_args("fence-old"))
        .expect("starting ipq-agent");
    let sock = socket(&lab);
    wait_lab_claimed(&sock);

    // Pod a's container claims pod b's live address.
    let claimed = post_ok(
        &sock,
        "/v1/claims",
        &claim(&["10.77.0.3"], "vethpa", "c-new"),
    );
    let conflicts = claimed["conflicts"].as_array().expect("a list");
    assert_eq!(conflicts.len(), 1, "{claimed}");
    let conflict = &conflicts[0];
    for (field, want) in [
        ("kind", json!("early_reuse")),
        ("address", json!("10.77.0.3")),
        ("policy", json!("fence-old")),
        ("outcome", json!("fenced_old")),
    ] {
        assert_eq!(conflict[field], want, "{field} in {conflict}");
    }
    assert_eq!(conflict["old_holder"]["ifname"], "vethpb", "{conflict}");
    assert_eq!(conflict["new_holder"]["ifname"], "vethpa", "{conflict}");
    let view = find(&claimed["addresses"], "10.77.0.3").expect("the address");
    assert_eq!(view["holder"]["ifname"], "vethpa", "{view}");
    assert_eq!(view["fenced"]["ifname"], "vethpb", "{view}");

    // conflicts
    let list = ipq(&sock, &["conflicts", "-o", "json"]).unwrap().json();
    assert_eq!(list, get_json(&sock, "/v1/conflicts"));
    let typed: ConflictList = serde_json::from_value(list.clone()).expect("a ConflictList");
    assert_eq!(typed.conflicts.len(), 1, "{list}");
    assert_eq!(
        list["conflicts"][0], *conflict,
        "the recorded conflict is the claim's"
    );
    let limited = ipq(&sock, &["conflicts", "--limit", "1", "-o", "json"])
        .unwrap()
        .json();
    assert_eq!(limited, get_json(&sock, "/v1/conflicts?limit=1"));
    assert_eq!(limited["conflicts"].as_array().unwrap().len(), 1);
    let table = ipq(&sock, &["conflicts"]).unwrap();
    let table = table.ok();
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["AT", "KIND", "ADDRESS", "OLD", "HOLDER", "NEW", "HOLDER", "POLICY", "OUTCOME"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert!(row.contains(&"ago"), "{table}");
    assert_eq!(
        // The new holder is pod a's veth and the claim's container id.
        row[row.len() - 7..],
        [
            "early_reuse",
            "10.77.0.3",
            "vethpb",
            "vethpa",
            "c-new",
            "fence-old",
            "fenced_old"
        ],
        "{table}"
    );
    // The list grows a FENCED column, filled for the fenced address only.
    let table = ipq(&sock, &["list"]).unwrap();
    let table = table.ok();
    assert!(table.lines().next().unwrap().ends_with("FENCED"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("10.77.0.3 "))
        .expect("a row for 10.77.0.3");
    assert!(row.ends_with(" vethpb"), "{row}");

    // events: the conflict and a drain this test causes, NDJSON and one line each.
    ipq(&sock, &["drain", "10.77.0.2"]).unwrap().ok();
    let ndjson = ipq(&sock, &["events", "-o", "json"]).unwrap();
    let events = parse_events(ndjson.ok());
    assert!(
        events.iter().any(|e| e["type"] == "conflict"
            && e["kind"] == "early_reuse"
            && e["address"] == "10.77.0.3"),
        "no early_reuse conflict event in:\n{}",
        ndjson.stdout
    );
    assert!(
        events
            .iter()
            .any(|e| is_transition(e, "10.77.0.2", "active", "draining")),
        "no transition of 10.77.0.2 to draining in:\n{}",
        ndjson.stdout
    );
    let raw = request(&sock, "GET", "/v1/events", None).unwrap();
    assert_eq!(raw.status, 200, "{}", raw.body);
    assert!(
        raw.content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/x-ndjson")),
        "{:?}",
        raw.content_type
    );
    assert_eq!(
        parse_events(&raw.body),
        events,
        "the CLI prints the API's events"
    );
    let table = ipq(&sock, &["events"]).unwrap();
    let table = table.ok();
    assert_eq!(
        table.lines().count(),
        events.len(),
        "one line per event:\n{table}"
    );
    assert!(
        table.contains("transition 10.77.0.2 active -> draining"),
        "{table}"
    );
    assert!(table.contains("conflict early_reuse 10.77.0.3"), "{table}");

    // events --follow: first the backlog, then a drain caused after it is connected.
    let last_seq = events.last().expect("events")["seq"].as_u64().unwrap();
    let mut follower = Command::new(workspace_binary("ipq"))
        .arg("--socket")
        .arg(&sock)
        .args(["events", "--follow", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning ipq events --follow");
    let (tx, rx) = mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_event = |what: &str| -> Value {
        let line = rx
            .recv_timeout(SETTLE)
            .unwrap_or_else(|_| panic!("ipq events --follow printed nothing ({what})"))
            .expect("reading ipq's stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    while next_event("the backlog")["seq"].as_u64().unwrap() < last_seq {}
    ipq(&sock, &["drain", "fd77::2"]).unwrap().ok();
    let deadline = Instant::now() + SETTLE;
    loop {
        let event = next_event("the live drain of fd77::2");
        assert!(event["seq"].as_u64().unwrap() > last_seq, "{event}");
        serde_json::from_value::<Event>(event.clone()).expect("an Event");
        if is_transition(&event, "fd77::2", "active", "draining") {
            break;
        }
        assert!(Instant::now() < deadline, "no live drain event for fd77::2");
    }
    assert_eq!(
        follower.try_wait().expect("polling the follower"),
        None,
        "ipq events --follow keeps following"
    );
    follower.kill().expect("stopping ipq events --follow");
    follower.wait().expect("reaping ipq events --follow");

    // A follower whose reader goes away (`ipq events --follow | head -1`) stops at its next
    // event, successfully.
    let mut follower = Command::new(workspace_binary("ipq"))
        .arg("--socket")
        .arg(&sock)
        .args(["events", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning ipq events --follow");
    let mut first = String::new();
    BufReader::new(follower.stdout.take().unwrap())
        .read_line(&mut first)
        .expect("reading the first event line");
    assert!(
        first.contains(" #1 "),
        "the backlog starts at seq 1: {first:?}"
    );
    // The reader is dropped: the pipe has no reader left. A claim of a free address is
    // certain to publish an event (free -> active).
    post_ok(
        &sock,
        "/v1/claims",
        &claim(&["10.77.0.99"], "vethpb", "c-pipe"),
    );
    let status = poll("ipq events --follow to exit", SETTLE, || {
        Ok(follower.try_wait()?)
    })
    .unwrap_or_else(|e| {
        let _ = follower.kill();
        let events = request(&sock, "GET", "/v1/events", None).map(|r| r.body);
        panic!("{e:#}; the agent's events: {events:#?}")
    });
    let mut stderr = String::new();
    follower
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}; stderr: {stderr}");
    assert_eq!(stderr, "", "a closed pipe is no error");
}

fn is_transition(event: &Value, addr: &str, from: &str, to: &str) -> bool {
    event["type"] == "transition"
        && event["address"] == addr
        && event["from"] == from
        && event["to"] == to
}

/// One JSON object per line, each a well-formed `Event`, `seq` increasing.
fn parse_events(ndjson: &str) -> Vec<Value> {
    let events: Vec<Value> = ndjson
        .lines()
        .map(|line| {
            let event: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            serde_json::from_value::<Event>(event.clone())
                .unwrap_or_else(|e| panic!("not an Event ({e}): {line}"));
            assert!(event["at"].is_string(), "{line}");
            event
        })
        .collect();
    assert!(
        events
            .windows(2)
            .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64()),
        "seq must increase:\n{ndjson}"
    );
    events
}

/// Under `refuse-new` a claim over a live holder is refused with the holder in the way; a
/// claim of two addresses whose second is refused changes nothing, the first included.
#[test]
fn refuse_new_refuses_a_claim_over_a_live_holder_and_claims_are_all_or_none() {
    let lab = Lab::new().expect("building the lab");
    let _agent = lab
        .start_agent(&agent_args("refuse-new"))
        .expect("starting ipq-agent");
    let sock = socket(&lab);
    wait_lab_claimed(&sock);
    let before = get_json(&sock, "/v1/addresses");

    let refused = post(
        &sock,
        "/v1/claims",
        &claim(&["10.77.0.80", "10.77.0.3"], "vethpa", "c-late"),
    );
    let error = refused.assert_error("claim over pod b", 409, "refused", &["10.77.0.3"]);
    assert_eq!(error["address"], "10.77.0.3", "{error}");
    assert_eq!(error["holder"]["ifname"], "vethpb", "{error}");

    assert_eq!(
        get_json(&sock, "/v1/addresses"),
        before,
        "a refused claim changes nothing"
    );
    ipq(&sock, &["get", "10.77.0.80"])
        .unwrap()
        .assert_fails(3, &["10.77.0.80"]);
    let status = ipq(&sock, &["status", "-o", "json"]).unwrap().json();
    assert_eq!(status["on_early_reuse"], "refuse-new", "{status}");
    assert_eq!(status["refused_claims_total"], 1, "{status}");

    // The CLI's own refusal: releasing a live holder's address without --force.
    ipq(&sock, &["release", "10.77.0.3"])
        .unwrap()
        .assert_fails(4, &["10.77.0.3"]);
    assert_eq!(
        get_json(&sock, "/v1/addresses"),
        before,
        "nor does a refused release"
    );
}

/// One hand-written request and the error it must get.
struct BadRequest {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    body: Option<String>,
    status: u16,
    code: &'static str,
    /// What the message must mention (the input at fault).
    words: &'static [&'static str],
}

/// A bad `POST /v1/claims` body.
fn bad_claim(
    what: &'static str,
    body: &str,
    status: u16,
    code: &'static str,
    words: &'static [&'static str],
) -> BadRequest {
    BadRequest {
        what,
        method: "POST",
        path: "/v1/claims",
        body: Some(body.to_owned()),
        status,
        code,
        words,
    }
}

fn bad(
    what: &'static str,
    (method, path, body): (&'static str, &'static str, Option<&str>),
    status: u16,
    code: &'static str,
    words: &'static [&'static str],
) -> BadRequest {
    BadRequest {
        what,
        method,
        path,
        body: body.map(str::to_owned),
        status,
        code,
        words,
    }
}

/// Requests no client of ours would send, written by hand: each gets its status, JSON error
/// code and a message naming what was wrong, and the registry is unchanged afterwards.
#[test]
fn bad_requests_get_their_error_and_change_nothing() {
    let lab = Lab::new().expect("building the lab");
    let _agent = lab
        .start_agent(&agent_args("fence-old"))
        .expect("starting ipq-agent");
    let sock = socket(&lab);
    wait_lab_claimed(&sock);
    let before = get_json(&sock, "/v1/addresses");

    let holder = r#""holder":{"interface":"vethpa"}"#;
    let requests = [
        bad_claim(
            "malformed JSON",
            r#"{"addresses": ["10.77.0.90""#,
            400,
            "bad_request",
            &["column"],
        ),
        bad_claim(
            "addresses of the wrong type",
            &format!(r#"{{"addresses":"10.77.0.90",{holder}}}"#),
            400,
            "bad_request",
            &["invalid type", "10.77.0.90"],
        ),
        bad_claim(
            "an unknown field",
            &format!(r#"{{"addresses":["10.77.0.90"],{holder},"colour":"red"}}"#),
            400,
            "bad_request",
            &["colour"],
        ),
        bad_claim(
            "an unknown holder field",
            r#"{"addresses":["10.77.0.90"],"holder":{"interface":"vethpa","ifindex":3}}"#,
            400,
            "bad_request",
            &["ifindex"],
        ),
        bad_claim(
            "a bad address",
            &format!(r#"{{"addresses":["10.77.0.300"],{holder}}}"#),
            400,
            "bad_request",
            &["invalid IP address"],
        ),
        bad_claim(
            "a bad source",
            &format!(r#"{{"addresses":["10.77.0.90"],{holder},"source":"netlink"}}"#),
            400,
            "bad_request",
            &["netlink"],
        ),
        bad_claim(
            "an empty address list",
            &format!(r#"{{"addresses":[],{holder}}}"#),
            400,
            "invalid_argument",
            &["address"],
        ),
        bad_claim(
            "an interface outside the workload globs",
            r#"{"addresses":["10.77.0.90"],"holder":{"interface":"up0"}}"#,
            400,
            "invalid_argument",
            &["up0"],
        ),
        bad_claim(
            "an interface that does not exist",
            r#"{"addresses":["10.77.0.90"],"holder":{"interface":"vethpz"}}"#,
            404,
            "unknown_interface",
            &["vethpz"],
        ),
        bad(
            "a bad IP in the path",
            ("GET", "/v1/addresses/10.0.0.300", None),
            400,
            "invalid_argument",
            &["10.0.0.300"],
        ),
        bad(
            "a bad IP to drain",
            ("POST", "/v1/addresses/nope/drain", None),
            400,
            "invalid_argument",
            &["nope"],
        ),
        bad(
            "a bad state name",
            ("GET", "/v1/addresses?state=bogus", None),
            400,
            "invalid_argument",
            &["bogus"],
        ),
        bad(
            "a release body of the wrong type",
            (
                "POST",
                "/v1/addresses/10.77.0.2/release",
                Some(r#"{"force":"yes"}"#),
            ),
            400,
            "bad_request",
            &["invalid type"],
        ),
        bad(
            "a drain without a container",
            ("POST", "/v1/drains", Some(r#"{"cni_ifname":"eth0"}"#)),
            400,
            "bad_request",
            &["container_id"],
        ),
        bad(
            "a GC without its list",
            ("POST", "/v1/gc", Some("{}")),
            400,
            "bad_request",
            &["valid_attachments"],
        ),
        bad(
            "an unknown path",
            ("GET", "/v1/nothing", None),
            404,
            "not_found",
            &["/v1/nothing"],
        ),
        bad(
            "an unversioned path",
            ("GET", "/status", None),
            404,
            "not_found",
            &["/status"],
        ),
        bad(
            "GET on a POST endpoint",
            ("GET", "/v1/claims", None),
            405,
            "method_not_allowed",
            &["/v1/claims"],
        ),
        bad(
            "DELETE on an address",
            ("DELETE", "/v1/addresses/10.77.0.2", None),
            405,
            "method_not_allowed",
            &["/v1/addresses/10.77.0.2"],
        ),
    ];
    for r in &requests {
        request(&sock, r.method, r.path, r.body.as_deref())
            .unwrap_or_else(|e| panic!("{}: {e:#}", r.what))
            .assert_error(r.what, r.status, r.code, r.words);
    }

    assert_eq!(
        get_json(&sock, "/v1/addresses"),
        before,
        "the registry after every bad request"
    );
    // The agent still serves.
    ipq(&sock, &["status"]).unwrap().ok();
}

/// Exit codes that need no agent: a missing socket, one nobody answers on, bad arguments,
/// and the help that documents them.
#[test]
fn cli_exit_codes_without_an_agent() {
    let dir = std::env::temp_dir().join(format!("ipq-cli-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveDir(dir.clone());

    let missing = dir.join("missing.sock");
    ipq(&missing, &["status"])
        .unwrap()
        .assert_fails(5, &["missing.sock", "No such file"]);

    // A socket that accepts connections (the kernel's backlog) but never answers.
    let silent = dir.join("silent.sock");
    let _listener = UnixListener::bind(&silent).expect("binding a silent socket");
    let started = Instant::now();
    ipq(&silent, &["--timeout", "300ms", "list"])
        .unwrap()
        .assert_fails(5, &["silent.sock", "300ms"]);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the timeout was not applied"
    );

    let usage = ipq(&missing, &["get", "10.0.0.300"]).unwrap();
    assert_eq!(usage.code, 2, "{usage:?}");
    assert!(usage.stderr.contains("10.0.0.300"), "{usage:?}");
    let usage = ipq(&missing, &["list", "--state", "free"]).unwrap();
    assert_eq!(usage.code, 2, "{usage:?}");
    assert!(usage.stderr.contains("free"), "{usage:?}");

    // The socket from the environment, when --socket is not given.
    let from_env = Command::new(workspace_binary("ipq"))
        .arg("status")
        .env("IPQ_SOCKET", &missing)
        .output()
        .expect("running ipq");
    assert_eq!(from_env.status.code(), Some(5), "{from_env:?}");
    let stderr = String::from_utf8_lossy(&from_env.stderr);
    assert!(
        stderr.starts_with("ipq: ") && stderr.contains("missing.sock"),
        "{stderr}"
    );

    let help = ipq(&missing, &["--help"]).unwrap();
    let help = help.ok();
    assert!(help.contains("Exit codes:"), "{help}");
    for line in [
        "3  not found",
        "4  refused",
        "5  agent unavailable",
        "6  forbidden",
    ] {
        assert!(help.contains(line), "{line:?} in:\n{help}");
    }
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            eprintln!("cleanup: removing {}: {e}", self.0.display());
        }
    }
}

/// The socket is root's (0600) unless `api_group` is set (0660, that group); a peer that gets
/// past the file permissions but is neither root nor in the group is refused with 403; a
/// stopped agent is unavailable.
#[test]
fn only_root_and_the_api_group_may_use_the_socket() {
    let lab = Lab::new().expect("building the lab");
    // nobody must reach the socket's directory to be refused by the socket itself.
    fs::set_permissions(lab.work_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    let sock = socket(&lab);
    let group_line = format!(":{API_GID}:");
    let groups = fs::read_to_string("/etc/group").unwrap_or_default();
    assert!(
        !groups.lines().any(|l| l.contains(&group_line)),
        "gid {API_GID} must be unused for this test"
    );

    let mut agent = lab
        .start_agent(&agent_args("fence-old"))
        .expect("starting ipq-agent");
    assert_socket(&sock, 0o600, 0);
    ipq_as(&[NOBODY, NOGROUP, "--clear-groups"], &sock, &["status"])
        .unwrap()
        .assert_fails(5, &["Permission denied"]);
    agent.kill9();
    // The socket file outlives a killed agent: nothing listens on it.
    ipq(&sock, &["status"])
        .unwrap()
        .assert_fails(5, &["ipq.sock"]);
    drop(agent);

    let gid = API_GID.to_string();
    let mut args = agent_args("fence-old");
    args.extend(["--api-group", &gid]);
    let _agent = lab.start_agent(&args).expect("restarting ipq-agent");
    wait_lab_claimed(&sock);
    assert_socket(&sock, 0o660, API_GID);
    let in_group = format!("--groups={API_GID}");
    let primary = format!("--regid={API_GID}");
    for who in [
        &[NOBODY, NOGROUP, in_group.as_str()][..],
        &[NOBODY, primary.as_str(), "--clear-groups"],
    ] {
        let status = ipq_as(who, &sock, &["status", "-o", "json"])
            .unwrap()
            .json();
        assert_eq!(status["ready"], true, "{who:?}: {status}");
        ipq_as(who, &sock, &["list"]).unwrap().ok();
    }

    // api_group opens reading the API, never a delegate run as root: only root may hand the
    // agent a release or an allocation record (or an exhausted range, which may release one
    // at once). Every role is tested in api_roles.rs.
    let member = [NOBODY, NOGROUP, in_group.as_str()];
    for path in [
        "/v1/ipam/releases",
        "/v1/ipam/allocations",
        "/v1/ipam/exhausted",
    ] {
        let (code, body) = curl_post_as(&member, &sock, path, "{}");
        assert_eq!(code, "403", "{path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("root role") && message.contains("uid 65534"),
            "{path}: the refusal says why: {message}"
        );
    }
    // Root gets past that check to the body's (an empty object lacks every field).
    let answer = post(&sock, "/v1/ipam/releases", &json!({}));
    assert_eq!(answer.status, 400, "{}", answer.body);

    // Past the file permissions, the peer's credentials still decide.
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o666)).unwrap();
    let outsider = [NOBODY, NOGROUP, "--clear-groups"];
    ipq_as(&outsider, &sock, &["status"])
        .unwrap()
        .assert_fails(6, &[]);
    ipq_as(&outsider, &sock, &["drain", "10.77.0.2"])
        .unwrap()
        .assert_fails(6, &[]);
    let curl = Command::new("setpriv")
        .args(outsider)
        .args([
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            "\n%{http_code}",
            "--unix-socket",
        ])
        .arg(&sock)
        .arg("http://ipq/v1/status")
        .output()
        .expect("running curl (package curl) through setpriv");
    let text = String::from_utf8_lossy(&curl.stdout);
    let (body, code) = text.rsplit_once('\n').expect("curl's status line");
    assert_eq!(code, "403", "{text}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    assert_eq!(
        find(&get_json(&sock, "/v1/addresses")["addresses"], "10.77.0.2").unwrap()["state"],
        "active",
        "a forbidden drain changes nothing"
    );
}

/// `POST path body` with curl run through `setpriv setpriv_args` (a peer of another uid);
/// the HTTP status and the JSON body.
fn curl_post_as(setpriv_args: &[&str], sock: &Path, path: &str, body: &str) -> (String, Value) {
    let curl = Command::new("setpriv")
        .args(setpriv_args)
        .args(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}"])
        .args(["-H", "Content-Type: application/json", "--data", body])
        .arg("--unix-socket")
        .arg(sock)
        .arg(format!("http://ipq{path}"))
        .output()
        .expect("running curl (package curl) through setpriv");
    let text = String::from_utf8_lossy(&curl.stdout);
    let (body, code) = text.rsplit_once('\n').expect("curl's status line");
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (code.to_owned(), body)
}

fn assert_socket(path: &Path, mode: u32, gid: u32) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        path.display()
    );
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (mode, 0, gid),
        "mode, owner and group of {} (mode printed in decimal)",
        path.display()
    );
}
