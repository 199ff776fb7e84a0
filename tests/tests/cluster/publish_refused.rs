//! The NodeQuarantine publisher (#30) against an API server that answers but refuses: the
//! agent's ClusterRoleBinding deleted, as an operator's mistake or a policy change would. The
//! node enforces exactly as before; every refused write is counted as `refused`, shown in
//! `ipq status` and retried with backoff; once the binding is back the object catches up.
//!
//! A control plane of the tier's own without its node ([`ApiServer`]): the agent runs in a lab,
//! with the ServiceAccount's token and RBAC of `deploy/kubernetes/`, and is driven by the lab's
//! routes (an early reuse fences the old holder, a listed change).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    api::request,
    cluster::api_server::{ApiServer, CLUSTER_ROLE_BINDING, RBAC_MANIFEST},
    lab::{
        ifindex, map_entry, pod_a_and_peer, pod_a_traffic, poll, wait_for_entry, Agent, Lab,
        POD_B_LLADDR,
    },
};
use serde_json::Value;

const NODE: &str = "ipq-lab-node";
/// Datagrams per burst.
const N: usize = 20;
const SETTLE: Duration = Duration::from_secs(10);
/// The agent's retries back off from 0.5 s, doubling up to 30 s: the retry after the binding is
/// back comes within 30 s, plus the write.
const CATCH_UP: Duration = Duration::from_secs(60);

fn status(agent: &Agent) -> anyhow::Result<Value> {
    request(&agent.api_socket(), "GET", "/v1/status", None)?.json()
}

fn fenced(object: &Value, addr: IpAddr) -> bool {
    object["status"]["entries"]
        .as_array()
        .is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e["address"] == addr.to_string() && e["state"] == "fenced")
        })
}

/// Injected: the agent's ClusterRoleBinding deleted while it publishes, then an early reuse of
/// pod a's addresses under `fence-old`, then the binding applied again from `deploy/`.
/// Holds: the old holder fenced all along (0/20 both ways); the refused writes counted as
/// `refused` (not `unreachable`), backed off (the fourth attempt ≥ 3 s after the change, where
/// the 250 ms pace would make it 0.75 s), and shown in `ipq status` (failing, since when, the
/// API server's answer); nothing lost: once the binding is back the object lists both fenced
/// addresses, `ipq status` says published again and the failures stop.
#[test]
fn a_refusing_api_server_is_counted_shown_backed_off_and_caught_up() -> anyhow::Result<()> {
    let mut api = ApiServer::start(NODE)?;
    let lab = Lab::new()?;
    api.reachable_from(&lab.node)?;
    let kubeconfig = lab.work_dir().join("kubeconfig");
    api.agent_kubeconfig(&kubeconfig, Duration::from_secs(3600))?;
    let mut watch = api.watch_node_quarantine()?;
    let agent = lab.start_publishing_agent(NODE, &kubeconfig, &[])?;
    watch
        .wait_for("the agent's first write", SETTLE, |o| {
            o["status"]["publishedAt"].is_string()
        })
        .with_context(|| format!("agent log:\n{}\n{}", agent.log(), api.logs()))?;
    let writes_before = agent.metric("ipq_publish_writes_total", &[])?;

    // The authorizer's answer is what the wait below trusts: with the binding it must allow
    // all of the agent's writes, or a refusal would prove nothing.
    let allowed = api.agent_writes_allowed()?;
    ensure!(
        allowed.len() == 3,
        "with its binding the agent may only {allowed:?}"
    );
    api.kubectl()
        .run(&["delete", "clusterrolebinding", CLUSTER_ROLE_BINDING])?;
    // The deletion is in force once the API server's RBAC cache has it; a change before that
    // would be written, and rightly.
    let deleted_at = Instant::now();
    api.wait_until_agent_writes_refused(SETTLE)?;
    eprintln!(
        "publish refused: the deletion in force {:.1?} after kubectl returned",
        deleted_at.elapsed()
    );
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    lab.routes().route_by_oif(
        "vethpa",
        101,
        &[pod_a_and_peer()[0].0, pod_a_and_peer()[1].0],
    )?;
    let mut changed_at = None;
    for (addr, _) in pod_a_and_peer() {
        wait_for_entry(&lab, addr, &map_entry("active", vethpa, 0), SETTLE);
        // Pod a terminates (its route withdrawn, its process still running) and its address
        // is handed to pod b at once.
        lab.routes().del_host_route("vethpa", addr)?;
        wait_for_entry(&lab, addr, &map_entry("draining", vethpa, 0), SETTLE);
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
        lab.routes().add_host_route("vethpb", addr, None)?;
        changed_at.get_or_insert_with(Instant::now);
        wait_for_entry(&lab, addr, &map_entry("active", vethpb, vethpa), SETTLE);
    }
    let changed_at = changed_at.context("a change")?;
    for (addr, peer) in pod_a_and_peer() {
        ensure!(
            pod_a_traffic(&lab, addr, peer, N) == (0, 0),
            "{addr}: the fenced old holder's traffic passed while the API server refused"
        );
    }

    let refused =
        |agent: &Agent| agent.metric("ipq_publish_failures_total", &[("reason", "refused")]);
    poll(
        "four refused writes counted",
        Duration::from_secs(30),
        || Ok((refused(&agent)? >= 4.0).then_some(())),
    )?;
    let fourth_after = changed_at.elapsed();
    ensure!(
        fourth_after >= Duration::from_secs(3),
        "four refused attempts within {fourth_after:?} of the change: no backoff"
    );
    ensure!(
        agent.metric("ipq_publish_failures_total", &[("reason", "unreachable")])? == 0.0,
        "a refusal counted as unreachable"
    );
    ensure!(
        agent.metric("ipq_publish_writes_total", &[])? == writes_before,
        "a refused write counted as done"
    );
    let publish = status(&agent)?["publish"].clone();
    ensure!(publish["state"] == "failing", "ipq status: {publish}");
    ensure!(
        publish["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("refused") && e.contains("forbidden")),
        "ipq status names the API server's answer: {publish}"
    );
    ensure!(publish["failing_since"].is_string(), "{publish}");
    ensure!(status(&agent)?["ready"] == true, "ready while refused");
    let object = api.kubectl().json(&["get", "nodequarantines", NODE])?;
    ensure!(
        !pod_a_and_peer()
            .iter()
            .any(|(addr, _)| fenced(&object, *addr)),
        "the object changed while every write was refused: {object}"
    );

    let back_at = Instant::now();
    api.apply_manifest(RBAC_MANIFEST)?;
    let (seen_at, _) = watch
        .wait_for("both fenced addresses listed", CATCH_UP, |o| {
            pod_a_and_peer().iter().all(|(addr, _)| fenced(o, *addr))
        })
        .with_context(|| format!("agent log:\n{}", agent.log()))?;
    eprintln!(
        "publish refused: caught up {:.1?} after the binding was back",
        seen_at - back_at
    );
    let publish = poll("ipq status says published", SETTLE, || {
        let publish = status(&agent)?["publish"].clone();
        Ok((publish["state"] == "published").then_some(publish))
    })?;
    ensure!(publish["last_error"].is_null(), "{publish}");
    let failures = refused(&agent)?;
    ensure!(
        agent.metric("ipq_publish_writes_total", &[])? > writes_before,
        "no write counted after the catch-up"
    );
    for (addr, peer) in pod_a_and_peer() {
        ensure!(
            pod_a_traffic(&lab, addr, peer, N) == (0, 0),
            "{addr}: the fence went with the catch-up"
        );
    }
    ensure!(
        refused(&agent)? == failures,
        "refusals still counted after the catch-up"
    );
    ensure!(
        agent
            .log()
            .contains(&format!("NodeQuarantine {NODE}: write failed (refused)")),
        "the refusal is logged:\n{}",
        agent.log()
    );
    api.check_running()?;
    Ok(())
}
