//! The seeds' cross-node race (#37 item 2): whereabouts allocates from one range shared by the
//! three nodes (a bridge network on each node's second uplink `eth1`, one L2 across them,
//! whose gateway is the peer, where the witness counts each pod's pings by payload size). A pod
//! on the first node (A) whose container ignores SIGTERM is deleted, then force-deleted while
//! its kubelet waits out its grace: whereabouts frees its address on the Pod's DELETE, and the
//! container lives on (asserted from containerd's tasks).
//!
//! - Without ipq's projection, a pod on node B is given the address at once. Node A's agent
//!   sees B's announcement of it on its uplink `eth1` (the remote-claim path) and fences its
//!   stale holder, which was never drained (`Lifecycle::remote_claim`: an Active holder is
//!   fenced under `fence-old`): counted (`ipq_conflicts_total{kind="remote_claim"}`), shown in
//!   A's NodeQuarantine as fenced, and none of the stale holder's pings reaches the witness
//!   from 1 s after B's pod's first one on.
//! - With the projection, no pod on node B or C is given the address while that container
//!   lives, and the address is handed out again once ipq's quarantine of it has ended.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::ipq_on,
    peer::Witness,
    tasks,
    whereabouts::{self, RANGE_END, RANGE_START},
    Cluster, NODE_NAMES,
};
use serde_json::Value;

use super::{
    metric,
    whereabouts::{
        running_pod, terminate_then_force_delete_and_wait_freed, wait_no_address,
        wait_no_quarantine_on,
    },
};

/// The payload sizes that tell the stale and the new holder's pings apart at the witness.
const STALE: usize = 111;
const NEW: usize = 222;

/// The values ipq is installed with for the race: the shared range's uplink is each node's
/// `eth1`, where the XDP program sees other nodes' announcements.
pub const UPLINK_VALUES: &str = "interfaces:\n  uplink: [eth1]\n";

/// `victim`, a pod on `node` that ignores SIGTERM and pings the witness, takes the range's
/// first address; once `sending` has seen it send, it is made terminating and force-deleted
/// until whereabouts frees its address, and its container is checked to run on (the race's
/// premise). Its address.
fn force_deleted_holder_on(
    cluster: &mut Cluster,
    node: &str,
    victim: &str,
    sending: impl FnOnce(IpAddr) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let address = running_pod(
        cluster,
        victim,
        &whereabouts::pod_pinging_on(victim, node, true, STALE),
    )?;
    ensure!(address == RANGE_START, "the first pod's address: {address}");
    sending(address.parse()?)?;
    terminate_then_force_delete_and_wait_freed(cluster, victim)?;
    tasks::ensure_running(&cluster.host, victim, "once its address was freed")?;
    Ok(address)
}

/// Without the projection: node B's pod gets the address at once, node A fences its stale
/// holder on B's announcement.
pub fn without_the_projection_a_remote_claim_fences_the_stale_holder(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let (a, b) = (NODE_NAMES[0], NODE_NAMES[1]);
    let witness = Witness::start(&cluster.host.peer)?;
    let victim = "race-a-stale";
    let began = Instant::now();
    let address = force_deleted_holder_on(cluster, a, victim, |ip| {
        ipq_tests::lab::poll(
            "the stale-to-be holder's pings at the witness",
            Duration::from_secs(60),
            || Ok((witness.count(ip, STALE, began) >= 2).then_some(())),
        )
    })?;
    let ip: IpAddr = address.parse()?;
    // Nothing on node A drained it (no CNI DEL while the container runs): the holder node A
    // fences on B's claim is an Active one.
    let before: Value =
        serde_json::from_str(&ipq_on(cluster, a, &["-o", "json", "get", &address])?)?;
    ensure!(
        before["state"] == "active" && before["holder"].to_string().contains(victim),
        "ipq get {address} on {a} before node B's claim: {before}"
    );
    let claims_before = metric(cluster, "ipq_conflicts_total{kind=\"remote_claim\"}")?;
    let fenced_before = metric(
        cluster,
        "ipq_dropped_packets_total{hook=\"tc_ingress\",reason=\"fenced\"}",
    )?;

    let new = "race-b-new";
    let asked = Instant::now();
    let got = running_pod(
        cluster,
        new,
        &whereabouts::pod_pinging_on(new, b, false, NEW),
    )?;
    ensure!(
        got == address,
        "without ipq's projection whereabouts gave {new} on {b} {got}, not the freed {address}"
    );
    let first_new = ipq_tests::lab::poll(
        "the new holder's pings at the witness",
        Duration::from_secs(60),
        || Ok(witness.first(ip, NEW, asked)),
    )?;
    ipq_tests::lab::poll(
        "node A's agent to count the remote claim",
        Duration::from_secs(30),
        || {
            let now = metric(cluster, "ipq_conflicts_total{kind=\"remote_claim\"}")?;
            Ok((now > claims_before).then_some(()))
        },
    )?;
    // The stale holder still runs and still sends (every 200 ms): node A's datapath drops
    // what it sends. The window of evidence is counted in its drops, not in seconds: 15 of
    // its pings dropped (~3 s of them), and none of them may have reached the witness.
    ipq_tests::lab::poll(
        "node A to drop 15 of the stale holder's pings",
        Duration::from_secs(30),
        || {
            let now = metric(
                cluster,
                "ipq_dropped_packets_total{hook=\"tc_ingress\",reason=\"fenced\"}",
            )?;
            Ok((now >= fenced_before + 15.0).then_some(()))
        },
    )?;
    tasks::ensure_running(&cluster.host, victim, "while its address is node B's")?;
    let leaked = witness.count(ip, STALE, first_new + Duration::from_secs(1));
    ensure!(
        leaked == 0,
        "{leaked} of the stale holder's pings reached the witness from {address} later than 1 s \
         after {new}'s first"
    );
    let still_new = witness.count(ip, NEW, first_new);
    ensure!(still_new >= 3, "{new}'s pings at the witness: {still_new}");
    let view: Value = serde_json::from_str(&ipq_on(cluster, a, &["-o", "json", "get", &address])?)?;
    ensure!(
        view["fenced"].to_string().contains(victim),
        "ipq get {address} on {a}: {view}"
    );
    cluster.wait_for(
        "node A's NodeQuarantine to list the stale holder as fenced",
        Duration::from_secs(10),
        &["get", "nodequarantines", a],
        |o| {
            o["status"]["entries"].as_array().is_some_and(|entries| {
                entries
                    .iter()
                    .any(|e| e["address"] == address.as_str() && e["state"] == "fenced")
            })
        },
    )?;
    eprintln!(
        "cluster tier: the stale holder's last ping at the witness {:?} after {new}'s first",
        witness
            .last(ip, STALE, began)
            .map(|last| last.saturating_duration_since(first_new))
    );

    tasks::kill_running(&cluster.host, victim)?;
    cluster
        .kubectl()
        .run(&["-n", "default", "delete", "pod", new, "--wait"])?;
    wait_no_quarantine_on(cluster, a)?;
    wait_no_quarantine_on(cluster, b)
}

/// With the projection: the same force delete on node A; pods created on nodes B and C get
/// the range's other address or none while the stale holder lives and its quarantine lasts;
/// then the address is handed out again.
pub fn with_the_projection_no_other_node_gets_the_address(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let (a, b, c) = (NODE_NAMES[0], NODE_NAMES[1], NODE_NAMES[2]);
    let victim = "race-a-kept";
    let address = force_deleted_holder_on(cluster, a, victim, |_| Ok(()))?;
    // Every reader of node A's NodeQuarantine sees the address held by a pod that is gone.
    super::whereabouts::wait_listed_on(cluster, a, &address, "orphaned", victim)?;

    let second = "race-b-second";
    let got = running_pod(
        cluster,
        second,
        &whereabouts::pod_pinging_on(second, b, false, NEW),
    )?;
    ensure!(
        got == RANGE_END,
        "with ipq's projection {second} on {b} got {got}, not the range's other address"
    );
    let third = "race-c-third";
    cluster
        .kubectl()
        .apply(&whereabouts::pod_pinging_on(third, c, false, NEW))?;
    wait_no_address(
        cluster,
        third,
        &format!("on {c} while the stale holder lives"),
    )?;
    tasks::ensure_running(&cluster.host, victim, "while the third pod waits")?;

    // The stale holder goes; ipq's quarantine of the address runs and ends; node C's pod is
    // given it.
    tasks::kill_running(&cluster.host, victim)?;
    let pod = cluster.wait_for(
        "the third pod to run on the address once the quarantine ended",
        Duration::from_secs(480),
        &["-n", "default", "get", "pod", third],
        ipq_tests::cluster::kubectl::pod_ready,
    )?;
    ensure!(
        pod["status"]["podIP"] == address.as_str(),
        "{third}'s address: {}",
        pod["status"]
    );
    Ok(())
}

/// `helm upgrade --reuse-values --set whereabouts.enabled=true`, and the agents rolled on
/// every node.
pub fn enable_the_projection(cluster: &mut Cluster) -> anyhow::Result<()> {
    let before: Vec<String> = agent_pods(cluster)?;
    cluster.helm()?.upgrade(&["whereabouts.enabled=true"])?;
    ipq_tests::cluster::deploy::wait_daemonset_ready(cluster)?;
    let after = agent_pods(cluster)?;
    ensure!(
        after.iter().all(|p| !before.contains(p)),
        "the agents did not roll: before {before:?}, after {after:?}"
    );
    Ok(())
}

fn agent_pods(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for node in cluster.node_names() {
        let pod = ipq_tests::cluster::deploy::agent_pod_on(cluster, node)?;
        names.push(
            pod["metadata"]["name"]
                .as_str()
                .context("the pod's name")?
                .to_owned(),
        );
    }
    Ok(names)
}
