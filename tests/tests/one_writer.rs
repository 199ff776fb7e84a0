//! One writer of the maps: an agent holds its `bpffs_dir` for its whole life. A second agent on
//! the same directory, and `ipq-agent datapath set` beside a running agent, are refused naming
//! it; `ipq-agent datapath show` only reads, so a tight loop of it while the agent writes
//! thousands of changes and a fenced pod sends changes nothing: no fenced datagram gets
//! through and every listing is whole.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides them.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
};

use ipq_tests::{api::request, flows::Flows, lab::Lab, netns::agent_binary};
use serde_json::json;

const ARGS: [&str; 4] = ["--workload", "vethp*", "--uplink", "up0"];
/// Changes the agent writes while `datapath show` loops: claims, then releases.
const CHANGES: u32 = 10_000;

#[test]
fn a_second_agent_and_a_break_glass_write_beside_a_running_agent_are_refused_naming_it() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&ARGS).expect("starting ipq-agent");
    let pid = agent.pid();

    let second = lab.work_dir().join("second");
    std::fs::create_dir(&second).expect("a work dir for the second agent");
    let out = lab
        .node
        .command(agent_binary())
        .arg("--bpffs-dir")
        .arg(lab.bpffs.path())
        .arg("--state-dir")
        .arg(second.join("state"))
        .arg("--api-socket")
        .arg(second.join("ipq.sock"))
        .args(["--metrics-addr", "127.0.0.1:9799"])
        .args(ARGS)
        .output()
        .expect("running a second agent");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second agent started:\n{said}");
    assert!(
        said.contains(&format!("pid {pid}")) && said.contains("one ipq-agent per bpffs_dir"),
        "the refusal must name the running agent:\n{said}"
    );

    let refused = lab
        .maps()
        .tool(&["set", "10.99.9.9", "--state", "quarantined"]);
    let e = format!(
        "{:#}",
        refused.expect_err("datapath set beside a running agent")
    );
    assert!(
        e.contains(&format!("pid {pid}")) && e.contains("/v1/datapath/10.99.9.9"),
        "the refusal must name the agent and the way through it: {e}"
    );
    let refused = lab.maps().tool(&["delete", "10.99.9.9"]);
    assert!(refused.is_err(), "datapath delete beside a running agent");
    // Nothing was written: the address is in neither the maps nor the registry.
    assert!(!lab
        .maps()
        .tool(&["show"])
        .expect("show")
        .contains("10.99.9.9"));

    // Once the agent is gone the break-glass tool writes (and holds the lock while it does).
    drop(agent);
    lab.maps()
        .tool(&["set", "10.99.9.9", "--state", "quarantined"])
        .expect("datapath set with no agent running");
    assert!(lab
        .maps()
        .tool(&["show"])
        .expect("show")
        .contains("10.99.9.9"));
}

/// Parses one `datapath show` listing: address → state. Every line must be whole.
fn listing(text: &str) -> BTreeMap<String, String> {
    let mut lines = text.lines();
    assert!(
        lines.next().is_some_and(|h| h.starts_with("ADDRESS")),
        "no header in {text:?}"
    );
    lines
        .take_while(|l| !l.contains(" packets, "))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 4, "a torn line: {line:?}");
            assert!(
                ["active", "draining", "quarantined"].contains(&fields[1]),
                "a state no agent writes: {line:?}"
            );
            (fields[0].to_owned(), fields[1].to_owned())
        })
        .collect()
}

#[test]
fn datapath_show_in_a_tight_loop_beside_10000_writes_changes_no_verdict() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&ARGS).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let socket = agent.api_socket();
    let flows = Flows::start(&lab);
    let writing = Arc::new(AtomicBool::new(true));
    let shows = thread::scope(|scope| {
        let reader = {
            let (lab, writing) = (&lab, writing.clone());
            scope.spawn(move || {
                let mut shows = 0u32;
                while writing.load(Ordering::Relaxed) {
                    let text = lab.maps().tool(&["show"]).expect("datapath show");
                    listing(&text);
                    shows += 1;
                }
                shows
            })
        };
        let addr = |n: u32| IpAddr::V4(Ipv4Addr::new(10, 98, (n >> 8) as u8, n as u8));
        let mut changes = 0;
        for n in 0..CHANGES / 2 {
            let body = json!({
                "addresses": [addr(n)],
                "holder": { "interface": "vethpb", "container_id": format!("c{n}") },
            });
            let answer =
                request(&socket, "POST", "/v1/claims", Some(&body.to_string())).expect("claim");
            assert_eq!(answer.status, 200, "{}", answer.body);
            changes += 1;
        }
        for n in 0..CHANGES / 2 {
            let answer = request(
                &socket,
                "POST",
                &format!("/v1/addresses/{}/release", addr(n)),
                Some(r#"{"force": true}"#),
            )
            .expect("release");
            assert_eq!(answer.status, 200, "{}", answer.body);
            changes += 1;
        }
        writing.store(false, Ordering::Relaxed);
        assert_eq!(changes, CHANGES);
        reader.join().expect("the show loop")
    });
    assert!(shows > 10, "only {shows} listings raced the writes");
    // Not one fenced datagram through, pod b's flowing: every verdict the old or the new one.
    flows.stop_and_check(100, "while datapath show looped beside 10000 writes");
    // The agent's own view and the maps agree at the end: pod a fenced, pod b active.
    let last = listing(&lab.maps().tool(&["show"]).expect("show"));
    assert_eq!(last.get("10.77.0.2").map(String::as_str), Some("draining"));
    assert_eq!(last.get("10.77.0.3").map(String::as_str), Some("active"));
    assert!(
        !last.keys().any(|a| a.starts_with("10.98.")),
        "every claim was released: {last:?}"
    );
    drop(agent);
}
