//! A forged announcement of a live pod's address (the seeds' race network: whereabouts' range
//! on one L2 across the three nodes, ipq on each node's `eth1` as its uplink, `fence-old`).
//! A gratuitous ARP for a running pod's address, sent by the test from the segment's bridge,
//! reaches node A's uplink as a remote claim. The agent asks the API server whether the pod is
//! still there before fencing it (`agent/src/remote_claim/`): it is, so the claim is counted
//! and reported and the pod is not fenced. Its pings keep reaching the witness, and none of its
//! packets is dropped as fenced. (The cross-node race, `cross_node.rs`, is the other answer:
//! the force-deleted pod is gone from the API server and its holder is fenced.)

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{deploy::ipq_on, peer::Witness, whereabouts, Cluster, NODE_NAMES};
use serde_json::Value;

use super::{
    metric,
    whereabouts::{running_pod, wait_no_quarantine_on},
};

/// The live pod's ping payload size at the witness.
const LIVE: usize = 133;
/// The segment's bridge in the peer's namespace that whereabouts' range is on.
const SHARED_SEGMENT_BRIDGE: &str = "br1";
/// The forger's MAC (locally administered, no interface's).
const FORGER_MAC: [u8; 6] = [0x02, 0x66, 0x6f, 0x72, 0x67, 0x64];

pub fn a_forged_announcement_of_a_live_pods_address_fences_nothing(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let a = NODE_NAMES[0];
    let witness = Witness::start(&cluster.host.peer)?;
    let live = "forged-claim-live";
    let began = Instant::now();
    let address = running_pod(
        cluster,
        live,
        &whereabouts::pod_pinging_on(live, a, false, LIVE),
    )?;
    let v4: Ipv4Addr = address.parse()?;
    let ip = IpAddr::V4(v4);
    ipq_tests::lab::poll(
        "the live pod's pings at the witness",
        Duration::from_secs(60),
        || Ok((witness.count(ip, LIVE, began) >= 2).then_some(())),
    )?;
    let present = "ipq_remote_claim_checks_total{answer=\"present\"}";
    let claims = "ipq_conflicts_total{kind=\"remote_claim\"}";
    let fenced = "ipq_dropped_packets_total{hook=\"tc_ingress\",reason=\"fenced\"}";
    let (present_before, claims_before, fenced_before) = (
        metric(cluster, present)?,
        metric(cluster, claims)?,
        metric(cluster, fenced)?,
    );

    let segment = cluster
        .segment
        .as_ref()
        .context("a cluster of several nodes has a segment")?;
    let frame = ipq_tests::packets::gratuitous_arp(FORGER_MAC, v4);
    ipq_tests::lab::send_frames(
        &segment.peer,
        SHARED_SEGMENT_BRIDGE,
        &[frame.clone(), frame.clone(), frame],
    )?;
    // The conflict is recorded once the claim is decided (with the API server's answer).
    ipq_tests::lab::poll(
        "node A's agent to count the remote claim",
        Duration::from_secs(30),
        || Ok((metric(cluster, claims)? > claims_before).then_some(())),
    )?;
    let answered = Instant::now();
    ipq_tests::lab::poll(
        "10 of the live pod's pings at the witness after the answer",
        Duration::from_secs(30),
        || Ok((witness.count(ip, LIVE, answered) >= 10).then_some(())),
    )?;
    let dropped = metric(cluster, fenced)? - fenced_before;
    ensure!(
        dropped == 0.0,
        "{dropped} packets dropped as fenced on {a} after a forged announcement of {address}"
    );
    let checked = metric(cluster, present)? - present_before;
    ensure!(
        checked >= 1.0,
        "node A's agent decided the claim without finding the pod in the API server ({checked})"
    );
    let view: Value = serde_json::from_str(&ipq_on(cluster, a, &["-o", "json", "get", &address])?)?;
    ensure!(
        view["state"] == "active"
            && view["holder"].to_string().contains(live)
            && !view["fenced"].to_string().contains(live),
        "ipq get {address} on {a} after the forged announcement: {view}"
    );
    eprintln!("cluster tier: a forged GARP for {address}: reported, the live pod not fenced");

    cluster
        .kubectl()
        .run(&["-n", "default", "delete", "pod", live, "--wait"])?;
    wait_no_quarantine_on(cluster, a)
}
