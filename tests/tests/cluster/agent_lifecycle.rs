//! The agent's own life on the node, as an operator drives it through the Kubernetes API, while
//! the rollout's old pod is still fenced: `kubectl rollout restart daemonset/ipq-agent`, and the
//! README's quick start of `mode = "observe"` first, then `enforce`, by editing the ConfigMap.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{self, ipq, NAMESPACE},
    node::POD_ADDRESS,
    Cluster,
};
use serde_json::Value;

use super::{address_view, fenced_drops, metric, Rollout, OLD};

/// `kubectl -n ipq-system rollout restart daemonset/ipq-agent`, waited for with `kubectl
/// rollout status`; the agent pod that replaced `previous`.
pub fn restart_agent(cluster: &mut Cluster, previous: &str) -> anyhow::Result<Value> {
    let kubectl = cluster.kubectl();
    kubectl.run(&["-n", NAMESPACE, "rollout", "restart", "daemonset/ipq-agent"])?;
    kubectl.run(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "daemonset/ipq-agent",
        "--timeout=100s",
    ])?;
    let pod = deploy::wait_daemonset_ready(cluster)?;
    ensure!(
        pod["metadata"]["name"] != previous,
        "the DaemonSet's pod is still {previous} after the rollout restart"
    );
    Ok(pod)
}

fn pod_name(pod: &Value) -> anyhow::Result<String> {
    Ok(pod["metadata"]["name"]
        .as_str()
        .context("a pod has a name")?
        .to_owned())
}

/// Across `kubectl rollout restart daemonset/ipq-agent` the pinned datapath keeps enforcing:
/// not one of the fenced pod's pings reaches the peer while no agent runs or while the new one
/// starts, and the new agent finds the address held by the new pod with the old one fenced (its
/// journal is on the node) and goes on dropping the old pod's pings.
pub fn agent_restart_keeps_the_fence(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    let before = pod_name(&deploy::agent_pod(cluster)?)?;
    restart_agent(cluster, &before)?;
    let view = address_view(cluster)?;
    ensure!(
        view["holder"].to_string().contains(&rollout.new_name)
            && view["fenced"].to_string().contains(&rollout.old_name),
        "after the agent's restart, ipq get {address}: {view}"
    );
    let fenced_before = fenced_drops(cluster)?;
    ipq_tests::lab::poll(
        "the restarted agent to drop the fenced pod's pings",
        Duration::from_secs(60),
        || Ok((fenced_drops(cluster)? >= fenced_before + 3.0).then_some(())),
    )?;
    let leaked = rollout.witness.count(address, OLD, rollout.claimed);
    ensure!(
        leaked == 0,
        "{leaked} of the fenced pod's pings reached the peer across the agent's restart"
    );
    Ok(())
}

/// Sets `mode` in the ConfigMap's agent.toml (an edit, as the README says) and restarts the
/// agent so it takes effect.
fn set_mode(cluster: &mut Cluster, mode: &str) -> anyhow::Result<()> {
    let config =
        cluster
            .kubectl()
            .json(&["-n", NAMESPACE, "get", "configmap", "ipq-agent-config"])?;
    let toml = config["data"]["agent.toml"]
        .as_str()
        .context("the ConfigMap has agent.toml")?;
    let edited: String = toml
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("mode = ") {
                format!("mode = \"{mode}\"")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    ensure!(edited != toml || toml.contains(&format!("mode = \"{mode}\"")));
    let patch = serde_json::json!({"data": {"agent.toml": edited + "\n"}}).to_string();
    cluster.kubectl().run(&[
        "-n",
        NAMESPACE,
        "patch",
        "configmap",
        "ipq-agent-config",
        "--type=merge",
        "-p",
        &patch,
    ])?;
    let before = pod_name(&deploy::agent_pod(cluster)?)?;
    restart_agent(cluster, &before)?;
    let status: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "status"])?)?;
    ensure!(
        status["mode"] == mode,
        "after setting mode = {mode}: {status}"
    );
    Ok(())
}

/// The README's quick start: `mode = "observe"` first: nothing is dropped, what enforce would
/// drop is counted (the fenced pod's pings now reach the peer, and are counted as observed);
/// then `enforce`: they stop reaching it.
pub fn observe_then_enforce(cluster: &mut Cluster, rollout: &Rollout) -> anyhow::Result<()> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    set_mode(cluster, "observe")?;
    let observing = Instant::now();
    ipq_tests::lab::poll(
        "the fenced pod's pings at the peer in observe mode",
        Duration::from_secs(60),
        || Ok((rollout.witness.count(address, OLD, observing) >= 3).then_some(())),
    )?;
    let observed = metric(cluster, "ipq_observed_packets_total{reason=\"fenced\"}")?;
    ensure!(
        observed >= 3.0,
        "ipq_observed_packets_total{{reason=\"fenced\"}} is {observed} in observe mode"
    );

    set_mode(cluster, "enforce")?;
    // Drops are back once the enforcing agent is ready; from then on nothing of the old pod's.
    let enforcing = Instant::now();
    let fenced_before = fenced_drops(cluster)?;
    ipq_tests::lab::poll(
        "the enforcing agent to drop the fenced pod's pings",
        Duration::from_secs(60),
        || Ok((fenced_drops(cluster)? >= fenced_before + 3.0).then_some(())),
    )?;
    let leaked = rollout.witness.count(address, OLD, enforcing);
    ensure!(
        leaked == 0,
        "{leaked} of the fenced pod's pings reached the peer after mode = enforce was back"
    );
    Ok(())
}
