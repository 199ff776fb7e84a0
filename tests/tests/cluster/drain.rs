//! `kubectl drain` of the node, as an operator takes a node out for maintenance: every pod is
//! evicted (the DaemonSet's left, as drains are run), each one's CNI DEL goes through ipq-cni,
//! and every address they held is quarantined in ipq, none freed early.

use std::{
    net::IpAddr,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    node::{NODE_NAME, POD_ADDRESS},
    Cluster,
};

use super::{address_view, metric, sender_pods, Rollout, OLD};

/// The drain evicts the pod holding the rollout's address (its grace cut to a second, as
/// `--grace-period` does for a pod that would ignore SIGTERM for long); the Deployment's
/// replacement cannot be scheduled on the cordoned node. The address is then quarantined in
/// ipq until a time still to come, so no pod can be given it early, and the force-deleted old
/// pod, still running, still reaches nobody with it.
pub fn drain_quarantines_every_pod_address(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    let draining = Instant::now();
    cluster.kubectl().run(&[
        "drain",
        NODE_NAME,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--grace-period=1",
        "--timeout=120s",
    ])?;
    let node = cluster.kubectl().json(&["get", "node", NODE_NAME])?;
    ensure!(
        node["spec"]["unschedulable"] == true,
        "the drained node is not cordoned: {}",
        node["spec"]
    );
    let left: Vec<String> = sender_pods(cluster)?
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        left.is_empty(),
        "pods still running on the drained node: {left:?}"
    );

    // Every address the evicted pods held is quarantined, until a time still to come.
    let view = cluster_poll_quarantined(cluster)?;
    let until = view["until"]
        .as_str()
        .with_context(|| format!("a quarantined address has an end: {view}"))?;
    let until = humantime::parse_rfc3339(until)
        .with_context(|| format!("the quarantine's end {until:?}"))?;
    ensure!(
        until > SystemTime::now(),
        "the quarantine of {address} is over already: {view}"
    );
    ensure!(
        view["previous_holder"]
            .to_string()
            .contains(&rollout.new_name),
        "ipq get {address} after the drain names another previous holder: {view}"
    );
    // The force-deleted old pod still runs and sends: ipq goes on dropping what it sends, and
    // none of it reaches the peer with the quarantined address.
    let dropped_before = metric(cluster, "ipq_dropped_packets_total")?;
    ipq_tests::lab::poll(
        "ipq to drop the old pod's pings after the drain",
        Duration::from_secs(60),
        || {
            Ok(
                (metric(cluster, "ipq_dropped_packets_total")? >= dropped_before + 3.0)
                    .then_some(()),
            )
        },
    )?;
    let leaked = rollout.witness.count(address, OLD, draining);
    ensure!(
        leaked == 0,
        "{leaked} of the old pod's pings reached the peer from {address} since the drain began \
         ({:.1?} ago)",
        draining.elapsed()
    );
    Ok(())
}

/// Waits for ipq to say the rollout's address is quarantined; its view.
fn cluster_poll_quarantined(cluster: &Cluster) -> anyhow::Result<serde_json::Value> {
    let mut last = serde_json::Value::Null;
    ipq_tests::lab::poll(
        "the drained pod's address to be quarantined",
        Duration::from_secs(60),
        || {
            last = address_view(cluster)?;
            Ok((last["state"] == "quarantined").then(|| last.clone()))
        },
    )
    .with_context(|| format!("ipq get {POD_ADDRESS}: {last}"))
}
