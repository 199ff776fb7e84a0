//! A node lost while one of its pods holds a whereabouts address (#37 item 2), the last phase
//! of the seeds' cross-node race: the pod the race left on node C (`race-c-third`, on the
//! range's first address, its reservation whereabouts') when node C is lost as the three-node
//! test loses it (kubelet and ipq's agent killed, the Node deleted), whereabouts' control loop
//! on C killed with them (a lost node's processes reach no API server; left running, it could
//! free the address only in the moments before the pod GC deleted its own pod, whose deletion
//! invalidates its pod-bound token: a race, not a rule; in the one run with it left running it
//! freed nothing within 60 s of the pod's deletion).
//!
//! Then nothing of ipq's may free or rewrite that address: the pod GC deletes the pods of a
//! Node that is gone (after its 40 s quarantine of the node), but whereabouts' control loops on
//! A and B watch only their own nodes' pods, so whereabouts' rule that frees it is its
//! reconciler's (pods gone, reservations left: a daily cron the tier does not run). Asserted
//! from a recorded watch of the reservations, from before the loss until node B's agent has
//! made its own reservation for the address of B's pod deleted after the loss (its projection
//! at work since): every version of C's pod's reservation is the one from before, none deleted,
//! and whereabouts' IPPool still allocates the address to C's pod. A and B go on enforcing and
//! publishing.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    watch::{Recorded, Watch},
    whereabouts::{self, allocations, reservation, RANGE_END, RANGE_START},
    Cluster, NODE_NAMES,
};

use super::many_nodes::{kill_container, lose_the_last_node, the_others_go_on};

/// The pod the race leaves on node C, and the one on node B.
const ON_C: &str = "race-c-third";
const ON_B: &str = "race-b-second";

/// The reservations' resource, as kubectl names it.
const RESERVATIONS: &str = "overlappingrangeipreservations.whereabouts.cni.cncf.io";

pub fn a_lost_nodes_address_is_left_to_whereabouts(cluster: &mut Cluster) -> anyhow::Result<()> {
    let (b, c) = (NODE_NAMES[1], NODE_NAMES[2]);
    let pod = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pod", ON_C])?;
    ensure!(
        pod["spec"]["nodeName"] == c && pod["status"]["podIP"] == RANGE_START,
        "{ON_C} is not on {c} with {RANGE_START}: {}",
        pod["status"]
    );
    let pod_ref = format!("default/{ON_C}");
    let before = reservation(cluster, RANGE_START)
        .with_context(|| format!("{ON_C}'s address {RANGE_START} has no reservation"))?;
    ensure!(
        before["spec"]["podref"] == pod_ref.as_str(),
        "the reservation of {RANGE_START} is not {ON_C}'s: {}",
        before["spec"]
    );
    let version = before["metadata"]["resourceVersion"].clone();
    let reservations = Watch::start(
        cluster,
        "reservations-watch",
        &["-n", whereabouts::NAMESPACE, "get", RESERVATIONS],
    )?;

    kill_container(cluster, c, whereabouts::NAMESPACE, "control-loop")?;
    lose_the_last_node(cluster)?;
    cluster.wait_for(
        &format!("the pod GC to delete {ON_C}, its Node gone"),
        Duration::from_secs(150),
        &["-n", "default", "get", "pods"],
        |list| {
            list["items"]
                .as_array()
                .is_some_and(|items| !items.iter().any(|p| p["metadata"]["name"] == ON_C))
        },
    )?;
    the_others_go_on(cluster, ON_B)?;
    let ours = format!("ipq.dev:quarantine/{b}");
    reservations.wait_for(
        &format!("{b}'s agent to reserve {RANGE_END}, its pod deleted"),
        Duration::from_secs(30),
        |events| {
            events
                .iter()
                .any(|e| e.name() == RANGE_END && e.object["spec"]["podref"] == ours.as_str())
        },
    )?;

    let recorded: Vec<Recorded> = reservations
        .events()
        .into_iter()
        .filter(|e| e.name() == RANGE_START)
        .collect();
    for event in &recorded {
        ensure!(
            event.kind != "DELETED" && event.object["metadata"]["resourceVersion"] == version,
            "the reservation of {ON_C}'s {RANGE_START} was {} after {c} was lost: {}",
            event.kind.to_lowercase(),
            event.object
        );
    }
    ensure!(
        allocations(cluster)?.iter().any(|(_, p)| *p == pod_ref),
        "whereabouts' IPPool no longer allocates {RANGE_START} to {pod_ref}"
    );
    reservations.check_running()?;
    eprintln!(
        "cluster tier: {c} lost: {ON_C} deleted by the pod GC; its reservation of {RANGE_START} \
         untouched ({} versions recorded), left to whereabouts' reconciler",
        recorded.len()
    );
    Ok(())
}
