//! The node's NodeQuarantine (#30): the agent publishes what it has in quarantine as a
//! cluster-scoped object named after the node and owned by it, which `kubectl` (or any cluster
//! IPAM) reads. Each wait polls the object for the state that proves the point, bounded.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::ipq,
    node::{NODE_NAME, POD_ADDRESS},
    tasks, Cluster,
};
use serde_json::Value;

use super::{metric, Rollout};

/// How long a change may take to show in the object before the test fails (the agent writes
/// within about 250 ms; the bound leaves room for a loaded machine, the time is printed).
const VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// `kubectl get nodequarantines <node> -o json`; `None` while it does not exist.
fn object(cluster: &Cluster) -> Option<Value> {
    cluster
        .kubectl()
        .json(&["get", "nodequarantines", NODE_NAME])
        .ok()
}

/// The entry of `address` in `object`.
fn entry<'a>(object: &'a Value, address: &str) -> Option<&'a Value> {
    object["status"]["entries"]
        .as_array()?
        .iter()
        .find(|e| e["address"] == address)
}

/// Polls the object until `done` holds; the object, and how long it took.
fn wait_object(
    cluster: &Cluster,
    what: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<(Value, Duration)> {
    let began = Instant::now();
    let mut last = Value::Null;
    let found = ipq_tests::lab::poll(what, timeout, || {
        last = object(cluster).unwrap_or(Value::Null);
        Ok(done(&last).then(|| last.clone()))
    })
    .with_context(|| format!("kubectl get nodequarantines {NODE_NAME}: {last}"))?;
    let took = began.elapsed();
    eprintln!("cluster tier: NodeQuarantine: {what}: {took:.1?}");
    Ok((found, took))
}

/// Right after the install: the object exists, owned by the Node (collected with it), the
/// printer columns show it, and `ipq status` says it is published.
pub fn published_and_owned_by_its_node(cluster: &mut Cluster) -> anyhow::Result<()> {
    let (object, _) = wait_object(
        cluster,
        "the object written once",
        Duration::from_secs(60),
        |o| o["status"]["publishedAt"].is_string(),
    )?;
    let node = cluster.kubectl().json(&["get", "node", NODE_NAME])?;
    let owner = &object["metadata"]["ownerReferences"][0];
    ensure!(
        owner["kind"] == "Node"
            && owner["name"] == NODE_NAME
            && owner["uid"] == node["metadata"]["uid"],
        "the NodeQuarantine is not owned by its Node: {}",
        object["metadata"]
    );
    ensure!(
        object["status"]["nodeName"] == NODE_NAME,
        "{}",
        object["status"]
    );
    let table = cluster.kubectl().run(&["get", "nodequarantines"])?;
    let header = table.lines().next().unwrap_or_default();
    ensure!(
        ["NAME", "QUARANTINED", "FENCED", "PUBLISHED"]
            .iter()
            .all(|column| header.contains(column))
            && table.contains(NODE_NAME),
        "kubectl get nodequarantines:\n{table}"
    );
    let status: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "status"])?)?;
    ensure!(
        status["publish"]["node"] == NODE_NAME && status["publish"]["state"] == "published",
        "ipq status: {}",
        status["publish"]
    );
    let writes = metric(cluster, "ipq_publish_writes_total")?;
    ensure!(writes >= 1.0, "ipq_publish_writes_total is {writes}");
    Ok(())
}

/// After the force delete of the rollout's old pod, whose container ignores SIGTERM and still
/// runs: the object lists the address with the force-deleted pod as its fenced holder, with
/// no end (the holder lives), though the API has no Pod of that name any more.
pub fn lists_the_force_deleted_pod_as_fenced(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let (object, _) = wait_object(
        cluster,
        "the force-deleted pod listed as fenced",
        VISIBLE_WITHIN,
        |o| {
            entry(o, POD_ADDRESS).is_some_and(|e| {
                e["state"] == "fenced" && e["holder"]["pod"] == rollout.old_name.as_str()
            })
        },
    )?;
    let listed = entry(&object, POD_ADDRESS).context("listed")?;
    ensure!(
        listed.get("until").is_none(),
        "a fenced holder lives: its entry must not end on a timer: {listed}"
    );
    ensure!(
        listed["holder"]["namespace"] == "default" && listed["holder"]["uid"].is_string(),
        "the holder as the CNI told ipq: {listed}"
    );
    Ok(())
}

/// After the drain: the address is quarantined (its holder, the new pod, evicted), and listed
/// so within the bound; with no end, since the force-deleted old pod still lives on it.
pub fn drained_address_listed_as_quarantined(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let (object, _) = wait_object(
        cluster,
        "the drained address listed as quarantined",
        VISIBLE_WITHIN,
        |o| {
            entry(o, POD_ADDRESS).is_some_and(|e| {
                e["state"] == "quarantined" && e["holder"]["pod"] == rollout.new_name.as_str()
            })
        },
    )?;
    let listed = entry(&object, POD_ADDRESS).context("listed")?;
    ensure!(
        listed.get("until").is_none(),
        "the force-deleted pod still lives on the address: no end while it does: {listed}"
    );
    ensure!(
        object["status"]["quarantined"].as_u64() >= Some(1),
        "{}",
        object["status"]
    );
    Ok(())
}

/// The force-deleted old pod's container is killed (as its node would at the end of its
/// grace); its sandbox goes, the quarantine then runs out, and the entry leaves the object.
pub fn entry_goes_when_the_quarantine_ends(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    // It has run all along (asserted here, before the kill): else the quarantine below would
    // have begun long ago, and its end would prove nothing about the kill.
    tasks::kill_running(&cluster.host, &rollout.old_name)?;
    // The quarantine lasts cooldown at least, max_cooldown at most (the ConfigMap's 5m).
    let (object, _) = wait_object(
        cluster,
        "the entry gone once the quarantine ended",
        Duration::from_secs(400),
        |o| o["status"]["publishedAt"].is_string() && entry(o, POD_ADDRESS).is_none(),
    )?;
    ensure!(
        object["status"]["quarantined"] == 0 && object["status"]["fenced"] == 0,
        "{}",
        object["status"]
    );
    Ok(())
}
