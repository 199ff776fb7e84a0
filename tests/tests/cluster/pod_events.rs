//! Events on the pods involved (#39 item 2): the rollout's early reuse leaves `IpqFenced` on
//! the old pod and `IpqEarlyReuse` on the new one, as `kubectl describe pod` shows them; and a
//! storm of 1000 conflicts through the local API's claim route (root, on the node) writes one
//! Event per pod and reason, whose series counts them, while the agent's metrics count what
//! was aggregated.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{node::POD_ADDRESS, Cluster};
use serde_json::{json, Value};

use super::{address_view, metric, Rollout};

/// The Events ipq wrote in `default`, as `kubectl get events` lists them.
fn ipq_events(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    let all = cluster
        .kubectl()
        .json(&["-n", "default", "get", "events.v1.events.k8s.io"])?;
    Ok(all["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["reportingController"] == "ipq.dev/agent")
        .collect())
}

pub fn both_pods_have_their_events(cluster: &mut Cluster, rollout: &Rollout) -> anyhow::Result<()> {
    for (pod, reason) in [
        (&rollout.old_name, "IpqFenced"),
        (&rollout.new_name, "IpqEarlyReuse"),
    ] {
        ipq_tests::lab::poll(
            &format!("kubectl describe pod {pod} to show {reason}"),
            Duration::from_secs(30),
            || {
                let described = cluster
                    .kubectl()
                    .run(&["-n", "default", "describe", "pod", pod])?;
                Ok(described.contains(reason).then_some(()))
            },
        )?;
    }
    let events = ipq_events(cluster)?;
    let fenced = events
        .iter()
        .find(|e| e["reason"] == "IpqFenced" && e["regarding"]["name"] == rollout.old_name.as_str())
        .with_context(|| format!("no IpqFenced Event on {}: {events:?}", rollout.old_name))?;
    let note = fenced["note"].as_str().unwrap_or_default();
    ensure!(
        note.starts_with(&format!(
            "traffic from {POD_ADDRESS} dropped: the address was reused by default/{}",
            rollout.new_name
        )),
        "the fenced pod's Event: {fenced}"
    );
    ensure!(fenced["type"] == "Warning", "{fenced}");
    ensure!(
        !fenced["reportingInstance"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{fenced}"
    );
    Ok(())
}

/// Storm pods: no such pods exist; the Events name them as the CNI would have.
const STORM_PODS: [&str; 2] = ["storm-a", "storm-b"];
const STORM_CONFLICTS: usize = 1000;
const STORM_ADDRESS: &str = "10.88.0.200";

pub fn a_storm_writes_a_bounded_number_of_events(cluster: &mut Cluster) -> anyhow::Result<()> {
    // Claims on the interface of the pod that holds the rollout's address: two identities
    // taking one spare address in turn, each claim an early reuse of it.
    let view = address_view(cluster)?;
    let interface = view["holder"]["ifname"]
        .as_str()
        .context("the holder's interface")?
        .to_owned();
    let aggregated_before = metric(
        cluster,
        "ipq_events_aggregated_total{reason=\"IpqEarlyReuse\"}",
    )?;
    let conflicts_before = metric(cluster, "ipq_conflicts_total{kind=\"early_reuse\"}")?;
    cluster
        .host
        .run_in_mount_namespace(|| -> anyhow::Result<()> {
            let socket = std::path::Path::new("/run/ipq/ipq.sock");
            for i in 0..=STORM_CONFLICTS {
                let pod = STORM_PODS[i % 2];
                let body = json!({
                    "addresses": [STORM_ADDRESS],
                    "holder": {
                        "interface": interface,
                        "container_id": format!("{pod}-container"),
                        "cni_ifname": "eth1",
                        "pod": {"namespace": "default", "name": pod, "uid": format!("uid-{pod}")},
                    },
                    "source": "api",
                });
                let answer =
                    ipq_tests::api::request(socket, "POST", "/v1/claims", Some(&body.to_string()))?;
                ensure!(answer.status == 200, "claim {i}: {}", answer.body);
            }
            Ok(())
        })??;
    let conflicts =
        metric(cluster, "ipq_conflicts_total{kind=\"early_reuse\"}")? - conflicts_before;
    ensure!(
        conflicts >= STORM_CONFLICTS as f64,
        "{conflicts} early reuses counted"
    );
    // One patch per series after the interval (1 m by default): then every count is in.
    std::thread::sleep(Duration::from_secs(70));
    let storm: Vec<Value> = ipq_events(cluster)?
        .into_iter()
        .filter(|e| STORM_PODS.contains(&e["regarding"]["name"].as_str().unwrap_or_default()))
        .collect();
    ensure!(
        storm.len() == 2,
        "{STORM_CONFLICTS} conflicts wrote {} Events (one per pod and reason expected): {storm:?}",
        storm.len()
    );
    let counted: u64 = storm
        .iter()
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum();
    ensure!(
        counted >= STORM_CONFLICTS as u64,
        "the Events' series count {counted} of {STORM_CONFLICTS} conflicts: {storm:?}"
    );
    let aggregated = metric(
        cluster,
        "ipq_events_aggregated_total{reason=\"IpqEarlyReuse\"}",
    )? - aggregated_before;
    ensure!(
        aggregated >= (STORM_CONFLICTS - 2) as f64,
        "ipq_events_aggregated_total grew by {aggregated}"
    );
    Ok(())
}
