//! The agent's own life on the node, as an operator drives it through the Kubernetes API, while
//! the rollout's old pod is still fenced: `kubectl rollout restart daemonset/ipq-agent`. (Mode
//! switches go through Helm: `helm_modes.rs`.)

use std::{net::IpAddr, time::Duration};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{self, NAMESPACE},
    node::POD_ADDRESS,
    Cluster,
};
use serde_json::Value;

use super::{address_view, fenced_drops, Rollout, OLD};

/// `kubectl -n ipq-system rollout restart daemonset/ipq-agent`, waited for with `kubectl
/// rollout status`; the agent pod that replaced `previous`.
pub fn restart_agent(cluster: &mut Cluster, previous: &str) -> anyhow::Result<Value> {
    let kubectl = cluster.kubectl();
    kubectl.run(&["-n", NAMESPACE, "rollout", "restart", "daemonset/ipq-agent"])?;
    wait_rolled(cluster, previous)
}

/// Waits for the DaemonSet's rollout (`kubectl rollout status`) and its ready pod, which must
/// have replaced `previous`; that pod.
pub fn wait_rolled(cluster: &mut Cluster, previous: &str) -> anyhow::Result<Value> {
    cluster.kubectl().run(&[
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
        "the DaemonSet's pod is still {previous} after the rollout"
    );
    Ok(pod)
}

pub fn pod_name(pod: &Value) -> anyhow::Result<String> {
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
