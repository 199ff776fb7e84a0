//! The whereabouts projection (#30, `kubernetes.whereabouts = true`) against an API server
//! that does not answer: the node enforces exactly as without Kubernetes, and the failure is
//! counted, backed off and shown.

use std::time::Duration;

use anyhow::ensure;
use ipq_tests::{
    api::request,
    lab::{
        ifindex, map_entry, pod_a_and_peer, pod_a_traffic, poll, wait_for_entry, Lab, POD_B_LLADDR,
    },
};
use serde_json::Value;

use super::publish::{kubeconfig_to_a_closed_port, N};

const SETTLE: Duration = Duration::from_secs(10);

/// Injected: the agent told to project its quarantine into whereabouts' reservations through
/// an API server on a closed port, then an early reuse of pod a's address under `fence-old` /
/// Holds: ready as without Kubernetes; the old holder fenced (0/20 both ways); the
/// projection's failures counted as `unreachable`, a handful (backoff), nothing counted as
/// written; `ipq status` says why and since when; the failure logged.
#[test]
fn an_unreachable_api_server_leaves_the_node_enforcing_and_the_projection_retrying(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let kubeconfig = kubeconfig_to_a_closed_port(&lab)?;
    let agent = lab.start_publishing_agent(
        "lab-node",
        &kubeconfig,
        &["--kubernetes-whereabouts", "true"],
    )?;
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    let (addr, peer) = pod_a_and_peer()[0];
    lab.routes().route_by_oif("vethpa", 101, &[addr])?;
    wait_for_entry(&lab, addr, &map_entry("active", vethpa, 0), SETTLE);
    lab.routes().del_host_route("vethpa", addr)?;
    wait_for_entry(&lab, addr, &map_entry("draining", vethpa, 0), SETTLE);
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
    lab.routes().add_host_route("vethpb", addr, None)?;
    wait_for_entry(&lab, addr, &map_entry("active", vethpb, vethpa), SETTLE);
    ensure!(
        pod_a_traffic(&lab, addr, peer, N) == (0, 0),
        "{addr}: the fenced old holder's traffic passed while the API server was down"
    );

    let failures = poll("two failed watch attempts counted", SETTLE, || {
        let n = agent.metric(
            "ipq_publish_whereabouts_failures_total",
            &[("reason", "unreachable")],
        )?;
        Ok((n >= 2.0).then_some(n))
    })?;
    let status: Value = request(&agent.api_socket(), "GET", "/v1/status", None)?.json()?;
    let view = &status["whereabouts"];
    ensure!(
        view["namespace"] == "kube-system"
            && view["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("unreachable"))
            && view["failing_since"].is_string(),
        "ipq status names why: {view}"
    );
    ensure!(status["ready"] == true, "ipq status: {status}");
    ensure!(
        agent.metric("ipq_publish_whereabouts_writes_total", &[])? == 0.0,
        "a write counted as done"
    );
    ensure!(
        failures <= 8.0,
        "{failures} attempts in a few seconds: no backoff"
    );
    ensure!(
        agent
            .log()
            // No write before the watch's first list: it is the watch that fails.
            .contains("whereabouts reservations: watch failed (unreachable)"),
        "the failure is logged:\n{}",
        agent.log()
    );
    Ok(())
}
