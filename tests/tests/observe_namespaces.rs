//! Observe by namespace (#39 item 5) with real packets: an early reuse fences the old pod, and
//! whether the fenced pod's packets are dropped is decided by its namespace. In a namespace
//! only observed (`observe_namespaces`, or any other than `enforce_namespaces` lists) they
//! are delivered both ways and counted as observed ("would drop"); in an enforced one they are
//! dropped and counted as dropped. The pods are named by API claims carrying the identity
//! ipq-cni sends (`K8S_POD_NAMESPACE` among it).
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use ipq_common::names;

use ipq_tests::{
    api::request,
    lab::{
        ifindex, map_entry as entry, pod_a_and_peer, poll, wait_claimed_at_start, wait_for_entry,
        Lab, POD_A_V4, POD_B_LLADDR,
    },
    raw_bpf::{attach_tcx_first, obj_get},
};
use serde_json::{json, Value};

/// Datagrams per burst.
const N: usize = 20;
const SETTLE: Duration = Duration::from_secs(5);
/// Routing table of the node's sockets bound to vethpa.
const TABLE_VIA_A: u32 = 101;

fn claim(
    socket: &std::path::Path,
    interface: &str,
    container: &str,
    namespace: &str,
    pod: &str,
) -> Value {
    let body = json!({
        "addresses": [POD_A_V4.to_string()],
        "holder": {
            "interface": interface,
            "container_id": container,
            "cni_ifname": "eth0",
            "netns": format!("/var/run/netns/{pod}"),
            "pod": {"namespace": namespace, "name": pod, "uid": format!("uid-{pod}")},
        },
        "source": "cni",
    });
    let answer = request(socket, "POST", "/v1/claims", Some(&body.to_string()))
        .unwrap_or_else(|e| panic!("POST /v1/claims: {e:#}"));
    assert_eq!(
        answer.status, 200,
        "claim for {namespace}/{pod}: {}",
        answer.body
    );
    answer.json().expect("the claim's answer")
}

fn fenced(hook_count: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("hook=tc_egress,reason=fenced".to_owned(), hook_count),
        ("hook=tc_ingress,reason=fenced".to_owned(), hook_count),
    ])
}

/// Pod a (namespace `namespace`) holds 10.77.0.2; pod b of the same namespace is given it
/// while pod a still runs (fence-old). Pod a's traffic with it gets through iff `observed`.
fn fenced_pod_in(scope: &[&str], namespace: &str, observed: bool) {
    fenced_pod_judged(scope, namespace, observed, Programs::AsAttached);
}

/// How many of ipq's programs judge each of vethpa's hooks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Programs {
    /// Whatever the agent attached.
    AsAttached,
    /// The agent's netlink filter, and ahead of it ipq's own program again on a TCX link: what
    /// every interface has for a moment when it moves to TCX, or ahead of a co-tenant.
    Twice,
}

fn fenced_pod_judged(scope: &[&str], namespace: &str, observed: bool, programs: Programs) {
    let lab = Lab::new().expect("building the lab");
    let mut args = vec!["--workload", "vethp*", "--uplink", "up0"];
    if programs == Programs::Twice {
        args.extend_from_slice(&["--tc-attach", "netlink"]);
    }
    args.extend_from_slice(scope);
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    let socket = agent.api_socket();
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);
    let (addr, peer) = pod_a_and_peer()
        .into_iter()
        .find(|(a, _)| *a == IpAddr::from(POD_A_V4))
        .expect("pod a's IPv4 address and its peer");
    lab.routes()
        .route_by_oif("vethpa", TABLE_VIA_A, &[addr])
        .expect("policy routes through vethpa");

    // ipq-cni's ADD for pod a names it; then pod b is given the same address.
    let first = claim(&socket, "vethpa", &"a".repeat(32), namespace, "web-1");
    assert_eq!(first["conflicts"], json!([]), "{first}");
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
        .expect("giving pod b the address");
    let second = claim(&socket, "vethpb", &"b".repeat(32), namespace, "web-2");
    assert_eq!(
        second["conflicts"][0]["kind"], "early_reuse",
        "pod b's claim is an early reuse: {second}"
    );
    wait_for_entry(&lab, addr, &entry("active", vethpb, vethpa), SETTLE);
    let _second_programs = (programs == Programs::Twice).then(|| twice_on_vethpa(&lab));

    let view = request(&socket, "GET", &format!("/v1/addresses/{addr}"), None)
        .and_then(|a| a.json())
        .expect("GET the address");
    assert_eq!(
        view["namespace_observed"].as_bool().unwrap_or(false),
        observed,
        "the address's view says whether its namespace is observed: {view}"
    );

    let before = agent.scrape().expect("scrape");
    let (out, back) = ipq_tests::lab::pod_traffic(&lab, &lab.pod_a, "vethpa", addr, peer, N);
    let after = agent.scrape().expect("scrape");
    let (want, counted, not_counted) = if observed {
        (
            (N, N),
            "ipq_observed_packets_total",
            "ipq_dropped_packets_total",
        )
    } else {
        (
            (0, 0),
            "ipq_dropped_packets_total",
            "ipq_observed_packets_total",
        )
    };
    assert_eq!(
        (out, back),
        want,
        "fenced pod a in namespace {namespace} ({scope:?}): (to the peer, from the node)"
    );
    assert_eq!(
        after.changes_since(&before, counted),
        fenced(N as f64),
        "{counted}: pod a's {N} packets each way"
    );
    assert_eq!(
        after.changes_since(&before, not_counted),
        BTreeMap::new(),
        "{not_counted}: nothing"
    );
    let mode = if observed { "observe" } else { "enforce" };
    poll("the address counted under its mode", SETTLE, || {
        let got = agent
            .scrape()?
            .get("ipq_addresses_by_mode", &[("mode", mode)])?;
        Ok((got >= 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let status = request(&socket, "GET", "/v1/status", None)
        .and_then(|a| a.json())
        .expect("GET /v1/status");
    assert_eq!(
        status["namespace_observed"].as_u64(),
        Some(u64::from(observed)),
        "{status}"
    );
}

/// ipq's pinned TC programs attached again to vethpa, on TCX links ahead of the agent's
/// netlink filters: the links' descriptors (closing them detaches the programs).
fn twice_on_vethpa(lab: &Lab) -> Vec<OwnedFd> {
    let index = ifindex(&lab.node, "vethpa").expect("vethpa's ifindex");
    [
        (names::PROG_TC_INGRESS, true),
        (names::PROG_TC_EGRESS, false),
    ]
    .into_iter()
    .map(|(name, ingress)| {
        let pin = lab.bpffs.path().join("progs").join(name);
        let prog = obj_get(&pin).unwrap_or_else(|e| panic!("opening {}: {e}", pin.display()));
        // SAFETY: a fresh descriptor nobody else owns.
        let prog = unsafe { OwnedFd::from_raw_fd(prog) };
        let link = lab
            .node
            .run(|| attach_tcx_first(prog.as_raw_fd(), index, ingress))
            .unwrap_or_else(|e| panic!("attaching {name} to vethpa by TCX: {e}"));
        // SAFETY: likewise.
        unsafe { OwnedFd::from_raw_fd(link) }
    })
    .collect()
}

#[test]
fn observe_namespaces_a_fenced_pod_of_a_listed_namespace_delivers_and_counts_would_drop() {
    fenced_pod_in(&["--observe-namespaces", "audit"], "audit", true);
}

/// Two of ipq's programs on each hook (the moment of a move to TCX, where CI once counted
/// pod a's packets twice on egress): each packet is still counted once.
#[test]
fn observe_namespaces_a_packet_two_of_ipqs_programs_pass_is_counted_once() {
    fenced_pod_judged(
        &["--observe-namespaces", "audit"],
        "audit",
        true,
        Programs::Twice,
    );
}

#[test]
fn observe_namespaces_a_fenced_pod_of_another_namespace_is_dropped() {
    fenced_pod_in(&["--observe-namespaces", "audit"], "prod", false);
}

#[test]
fn enforce_namespaces_a_fenced_pod_of_a_listed_namespace_is_dropped() {
    fenced_pod_in(&["--enforce-namespaces", "prod"], "prod", false);
}

#[test]
fn enforce_namespaces_a_fenced_pod_of_another_namespace_delivers_and_counts_would_drop() {
    fenced_pod_in(&["--enforce-namespaces", "prod"], "audit", true);
}
