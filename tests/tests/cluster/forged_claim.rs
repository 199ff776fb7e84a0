//! Forged announcements of live pods' addresses (the seeds' race network: whereabouts' range
//! on one L2 across the three nodes, ipq on each node's `eth1` as its uplink, `fence-old`).
//! A gratuitous ARP for a running pod's address, sent by the test from the segment's bridge,
//! reaches node A's uplink as a remote claim, and the agent asks the API server whether the
//! pod is still there before fencing it (`agent/src/remote_claim/`):
//! - asked with its RBAC intact, the API server says the pod is there: the claim is counted
//!   and reported, the pod is not fenced, its pings keep reaching the witness and none of its
//!   packets is dropped as fenced;
//! - with the agent's `get` on pods taken away (an operator who rolled a new image without its
//!   ClusterRole), the API server answers 403 until the check's time is up: the answer is
//!   `unknown`, and the holder is fenced on the announcement's word, as before there was a
//!   check (fail closed, counted, warned).
//!
//! The cross-node race, `cross_node.rs`, is the third answer: the force-deleted pod is gone
//! from the API server and its holder is fenced.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{ipq_on, NAMESPACE},
    peer::Witness,
    whereabouts, Cluster, NODE_NAMES,
};
use serde_json::Value;

use super::{
    metric,
    whereabouts::{address_once_running, wait_no_quarantine_on},
};

/// The live pods' ping payload size at the witness (they are told apart by address).
const LIVE: usize = 133;
/// The segment's bridge in the peer's namespace that whereabouts' range is on.
const SHARED_SEGMENT_BRIDGE: &str = "br1";
/// The forger's MAC (locally administered, no interface's).
const FORGER_MAC: [u8; 6] = [0x02, 0x66, 0x6f, 0x72, 0x67, 0x64];
/// The agent's ClusterRole (the chart's `rbac.yaml`).
const AGENT_ROLE: &str = "ipq-agent";

const CLAIMS: &str = "ipq_conflicts_total{kind=\"remote_claim\"}";
const FENCED_DROPS: &str = "ipq_dropped_packets_total{hook=\"tc_ingress\",reason=\"fenced\"}";

/// A live pod on node A pinging the witness.
struct LivePod {
    name: &'static str,
    address: String,
    ip: IpAddr,
}

pub fn forged_announcements_of_live_pods_addresses(cluster: &mut Cluster) -> anyhow::Result<()> {
    let a = NODE_NAMES[0];
    let witness = Witness::start(&cluster.host.peer)?;
    let began = Instant::now();
    let names = ["forged-claim-asked", "forged-claim-unasked"];
    // Both applied first, so that they start together.
    for name in names {
        cluster
            .kubectl()
            .apply(&whereabouts::pod_pinging_on(name, a, false, LIVE))?;
    }
    let mut pods = Vec::new();
    for name in names {
        let address = address_once_running(cluster, name)?;
        let ip = IpAddr::V4(address.parse()?);
        ipq_tests::lab::poll(
            &format!("{name}'s pings at the witness"),
            Duration::from_secs(60),
            || Ok((witness.count(ip, LIVE, began) >= 2).then_some(())),
        )?;
        pods.push(LivePod { name, address, ip });
    }

    asked_the_pod_is_present_and_not_fenced(cluster, &witness, &pods[0])?;
    forbidden_to_ask_the_holder_is_fenced(cluster, &witness, &pods[1])?;

    for pod in &pods {
        cluster
            .kubectl()
            .run(&["-n", "default", "delete", "pod", pod.name, "--wait"])?;
    }
    wait_no_quarantine_on(cluster, a)
}

/// Three gratuitous ARPs claiming `address` from the segment's bridge.
fn forge_a_claim_of(cluster: &Cluster, address: &str) -> anyhow::Result<()> {
    let segment = cluster
        .segment
        .as_ref()
        .context("a cluster of several nodes has a segment")?;
    let v4: Ipv4Addr = address.parse()?;
    let frame = ipq_tests::packets::gratuitous_arp(FORGER_MAC, v4);
    ipq_tests::lab::send_frames(
        &segment.peer,
        SHARED_SEGMENT_BRIDGE,
        &[frame.clone(), frame.clone(), frame],
    )
}

/// `ipq get <address> -o json` on node A.
fn view_on_a(cluster: &mut Cluster, address: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&ipq_on(
        cluster,
        NODE_NAMES[0],
        &["-o", "json", "get", address],
    )?)?)
}

fn asked_the_pod_is_present_and_not_fenced(
    cluster: &mut Cluster,
    witness: &Witness,
    pod: &LivePod,
) -> anyhow::Result<()> {
    let present = "ipq_remote_claim_checks_total{answer=\"present\"}";
    let (present_before, claims_before, fenced_before) = (
        metric(cluster, present)?,
        metric(cluster, CLAIMS)?,
        metric(cluster, FENCED_DROPS)?,
    );
    forge_a_claim_of(cluster, &pod.address)?;
    // The conflict is recorded once the claim is decided (with the API server's answer).
    ipq_tests::lab::poll(
        "node A's agent to count the remote claim",
        Duration::from_secs(30),
        || Ok((metric(cluster, CLAIMS)? > claims_before).then_some(())),
    )?;
    let answered = Instant::now();
    ipq_tests::lab::poll(
        "10 of the live pod's pings at the witness after the answer",
        Duration::from_secs(30),
        || Ok((witness.count(pod.ip, LIVE, answered) >= 10).then_some(())),
    )?;
    let dropped = metric(cluster, FENCED_DROPS)? - fenced_before;
    ensure!(
        dropped == 0.0,
        "{dropped} packets dropped as fenced on node A after a forged announcement of {}",
        pod.address
    );
    let checked = metric(cluster, present)? - present_before;
    ensure!(
        checked >= 1.0,
        "node A's agent decided the claim without finding the pod in the API server ({checked})"
    );
    let view = view_on_a(cluster, &pod.address)?;
    ensure!(
        view["state"] == "active"
            && view["holder"].to_string().contains(pod.name)
            && !view["fenced"].to_string().contains(pod.name),
        "ipq get {} on node A after the forged announcement: {view}",
        pod.address
    );
    eprintln!(
        "cluster tier: a forged GARP for {}: reported, the live pod not fenced",
        pod.address
    );
    Ok(())
}

fn forbidden_to_ask_the_holder_is_fenced(
    cluster: &mut Cluster,
    witness: &Witness,
    pod: &LivePod,
) -> anyhow::Result<()> {
    let unknown = "ipq_remote_claim_checks_total{answer=\"unknown\"}";
    let (unknown_before, fenced_before) =
        (metric(cluster, unknown)?, metric(cluster, FENCED_DROPS)?);
    let role = cluster
        .kubectl()
        .json(&["get", "clusterrole", AGENT_ROLE])?;
    take_away_get_on_pods(cluster, &role)?;
    let forged = forge_a_claim_of(cluster, &pod.address).and_then(|()| {
        ipq_tests::lab::poll(
            "node A's agent to answer `unknown` and fence the holder",
            Duration::from_secs(30),
            || Ok((metric(cluster, unknown)? > unknown_before).then_some(())),
        )
    });
    // The role is given back whatever happened: the phases after this one ask again.
    let restored = restore(cluster, &role);
    forged?;
    restored?;
    ipq_tests::lab::poll(
        "3 of the holder's packets dropped as fenced",
        Duration::from_secs(30),
        || Ok((metric(cluster, FENCED_DROPS)? >= fenced_before + 3.0).then_some(())),
    )?;
    // Every ping sent from now on meets the fence, which was in the kernel before the
    // drops above were counted.
    let fenced_from = Instant::now();
    ipq_tests::lab::poll(
        "3 more of the holder's packets dropped as fenced",
        Duration::from_secs(30),
        || Ok((metric(cluster, FENCED_DROPS)? >= fenced_before + 6.0).then_some(())),
    )?;
    let delivered = witness.count(pod.ip, LIVE, fenced_from);
    ensure!(
        delivered == 0,
        "{delivered} of the fenced holder {}'s pings reached the witness",
        pod.address
    );
    let view = view_on_a(cluster, &pod.address)?;
    ensure!(
        view["fenced"].to_string().contains(pod.name),
        "ipq get {} on node A after a claim the API server would not answer about: {view}",
        pod.address
    );
    eprintln!(
        "cluster tier: a forged GARP for {} with the agent's get on pods forbidden: unknown, \
         fenced on the announcement's word",
        pod.address
    );
    Ok(())
}

/// The agent's ClusterRole without its rule on pods, applied; returns once the API server's
/// authorizer refuses the agent's service account a pod.
fn take_away_get_on_pods(cluster: &mut Cluster, role: &Value) -> anyhow::Result<()> {
    let mut without = applicable(role);
    let rules = without["rules"]
        .as_array_mut()
        .context("the agent's ClusterRole has rules")?;
    let before = rules.len();
    rules.retain(|rule| !rule["resources"].to_string().contains("\"pods\""));
    ensure!(
        rules.len() + 1 == before,
        "the agent's ClusterRole has one rule on pods: {role}"
    );
    cluster.kubectl().apply(&without.to_string())?;
    let agent = format!("system:serviceaccount:{NAMESPACE}:ipq-agent");
    ipq_tests::lab::poll(
        "the API server to refuse the agent a pod",
        Duration::from_secs(30),
        || {
            let out = cluster
                .kubectl()
                .command(&[
                    "auth", "can-i", "get", "pods", "-n", "default", "--as", &agent,
                ])
                .output()?;
            Ok((String::from_utf8_lossy(&out.stdout).trim() == "no").then_some(()))
        },
    )
}

fn restore(cluster: &mut Cluster, role: &Value) -> anyhow::Result<()> {
    cluster.kubectl().apply(&applicable(role).to_string())?;
    Ok(())
}

/// `object` as a manifest to apply: without what the API server keeps for itself.
fn applicable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object["metadata"].as_object_mut() {
        for kept in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            meta.remove(kept);
        }
    }
    object
}
