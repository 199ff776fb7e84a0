//! The NodeQuarantine publisher (#30) against an API server that does not answer: the node
//! enforces exactly as without Kubernetes, and the failure is counted and shown.

use std::{fs, path::PathBuf, time::Duration};

use anyhow::ensure;
use ipq_tests::{
    api::request,
    lab::{
        ifindex, map_entry, pod_a_and_peer, pod_a_traffic, poll, wait_for_entry, Lab, POD_B_LLADDR,
    },
};
use serde_json::Value;

/// Datagrams per burst.
pub(crate) const N: usize = 20;
const SETTLE: Duration = Duration::from_secs(10);
const NODE: &str = "lab-node";

/// A kubeconfig naming an API server on a port nobody listens on (bound, then closed).
pub fn kubeconfig_to_a_closed_port(lab: &Lab) -> anyhow::Result<PathBuf> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let path = lab.work_dir().join("kubeconfig");
    fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  \
             user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n"
        ),
    )?;
    Ok(path)
}

/// Injected: the agent told to publish its NodeQuarantine (a node name, a kubeconfig) to an
/// API server on a closed port, then an early reuse of pod a's addresses under `fence-old` /
/// Holds: ready as without Kubernetes; the old holder fenced (0/20 both ways); every failed
/// write counted as `unreachable` and retried with backoff (a few attempts, not one per
/// change); `ipq status` says failing, since when and why; no write counted as done.
#[test]
fn an_unreachable_api_server_changes_nothing_on_the_node() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let kubeconfig = kubeconfig_to_a_closed_port(&lab)?;
    let agent = lab.start_publishing_agent(NODE, &kubeconfig, &[])?;
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    lab.routes().route_by_oif(
        "vethpa",
        101,
        &[pod_a_and_peer()[0].0, pod_a_and_peer()[1].0],
    )?;
    for (addr, _) in pod_a_and_peer() {
        wait_for_entry(&lab, addr, &map_entry("active", vethpa, 0), SETTLE);
        // Pod a terminates (its route withdrawn, its process still running) and its address
        // is handed to pod b at once.
        lab.routes().del_host_route("vethpa", addr)?;
        wait_for_entry(&lab, addr, &map_entry("draining", vethpa, 0), SETTLE);
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
        lab.routes().add_host_route("vethpb", addr, None)?;
        wait_for_entry(&lab, addr, &map_entry("active", vethpb, vethpa), SETTLE);
    }
    for (addr, peer) in pod_a_and_peer() {
        ensure!(
            pod_a_traffic(&lab, addr, peer, N) == (0, 0),
            "{addr}: the fenced old holder's traffic passed while the API server was down"
        );
    }

    let failures = poll("two failed writes counted", SETTLE, || {
        let n = agent.metric("ipq_publish_failures_total", &[("reason", "unreachable")])?;
        Ok((n >= 2.0).then_some(n))
    })?;
    let status: Value = request(&agent.api_socket(), "GET", "/v1/status", None)?.json()?;
    let publish = &status["publish"];
    ensure!(
        publish["node"] == NODE && publish["state"] == "failing",
        "ipq status: {publish}"
    );
    ensure!(
        publish["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("unreachable") && e.contains(NODE)),
        "ipq status names why: {publish}"
    );
    ensure!(publish["failing_since"].is_string(), "{publish}");
    ensure!(status["ready"] == true, "ipq status: {status}");
    ensure!(
        agent.metric("ipq_publish_writes_total", &[])? == 0.0,
        "a write counted as done"
    );
    // Backoff: the early reuses were several changes, the attempts stay a handful.
    ensure!(
        failures <= 8.0,
        "{failures} attempts in a few seconds: no backoff"
    );
    ensure!(
        agent
            .log()
            .contains("NodeQuarantine lab-node: write failed (unreachable)"),
        "the failure is logged:\n{}",
        agent.log()
    );
    Ok(())
}
