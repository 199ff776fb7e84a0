//! The mode switched the way a Helm user switches it, while the rollout's old pod is still
//! alive, sending, and fenced: `helm upgrade --reuse-values --set mode=observe` (the README's
//! quick start begins in observe), `helm upgrade --set mode=enforce`, then `helm rollback` to the
//! observe revision and `helm rollback` to the enforce one (the tier's later scenarios need
//! enforce).
//!
//! What "no fenced packet delivered at any step" means here: observe drops nothing by design (it
//! counts what enforce would drop), so the fenced pod's pings *are* delivered while an observing
//! agent runs, and that is asserted as observe's witness (delivered, and counted in
//! `ipq_observed_packets_total{reason="fenced"}`). While enforce is in force (from the enforcing
//! agent's readiness until the next helm command, that command's rollout included up to the
//! moment the next agent is ready, since the pinned datapath keeps enforcing while no agent
//! runs) not one of the fenced pod's pings reaches the peer. Across every step the quarantine
//! state is kept (`ipq get`: the new pod holds the address, the old one is fenced), and each
//! step rolled the agent's pod because the config's checksum on the pod template changed.

use std::{
    net::IpAddr,
    time::{Instant, SystemTime},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{self, ipq, NAMESPACE},
    node::POD_ADDRESS,
    Cluster,
};
use serde_json::Value;

use super::{
    address_view,
    agent_lifecycle::{pod_name, wait_rolled},
    fenced_drops, metric, Rollout, OLD,
};

/// The annotation the chart puts the config's checksum in.
const CHECKSUM: &str = "checksum/config";

/// What a step runs: `helm upgrade --reuse-values --set <value>`, or `helm rollback <revision>`.
enum Step {
    Upgrade(&'static str),
    Rollback(u64),
}

pub fn observe_enforce_and_back_through_helm(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    let installed = cluster.helm()?.revision()?;
    // The install is enforcing: nothing of the fenced pod's reached the peer since the claim.
    let mut enforcing_since = Some(rollout.claimed);

    let observe = roll(
        cluster,
        rollout,
        &mut enforcing_since,
        Step::Upgrade("mode=observe"),
        "observe",
    )?;
    ensure!(
        observe == installed + 1,
        "helm's revision after the upgrade: {observe}"
    );
    let enforce = roll(
        cluster,
        rollout,
        &mut enforcing_since,
        Step::Upgrade("mode=enforce"),
        "enforce",
    )?;
    roll(
        cluster,
        rollout,
        &mut enforcing_since,
        Step::Rollback(observe),
        "observe",
    )?;
    roll(
        cluster,
        rollout,
        &mut enforcing_since,
        Step::Rollback(enforce),
        "enforce",
    )?;

    let leaked = rollout.witness.count(
        address,
        OLD,
        enforcing_since.context("enforce is the last step")?,
    );
    ensure!(
        leaked == 0,
        "{leaked} of the fenced pod's pings reached the peer after the rollback to enforce"
    );
    Ok(())
}

/// Runs `step`, waits for the agent's pod to roll (a new pod, whose config checksum differs
/// from the previous pod's and is the DaemonSet's), and checks the mode's witness; the release's
/// revision after it. `enforcing_since` is when the current enforce period began (None while
/// observing): no fenced ping may have reached the peer from then until the next agent is
/// ready, the rollout included.
fn roll(
    cluster: &mut Cluster,
    rollout: &Rollout,
    enforcing_since: &mut Option<Instant>,
    step: Step,
    mode: &str,
) -> anyhow::Result<u64> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    let before = deploy::agent_pod(cluster)?;
    let before_name = pod_name(&before)?;
    let what = match step {
        Step::Upgrade(set) => {
            cluster.helm()?.upgrade(&[set])?;
            format!("helm upgrade --set {set}")
        }
        Step::Rollback(revision) => {
            cluster.helm()?.rollback(revision)?;
            format!(
                "helm rollback {} {revision}",
                ipq_tests::cluster::helm::RELEASE
            )
        }
    };
    let pod = wait_rolled(cluster, &before_name).with_context(|| format!("after {what}"))?;
    let ready = Instant::now();
    if let Some(since) = *enforcing_since {
        // Enforce was in force until the new agent's process could write its mode: none of
        // the fenced pod's pings may have arrived from `since` to that container's start.
        let started = container_started(&pod)?;
        let leaked = rollout.witness.count(address, OLD, since)
            - rollout.witness.count(address, OLD, started.max(since));
        ensure!(
            leaked == 0,
            "{leaked} of the fenced pod's pings reached the peer while enforce was in force, \
             before the agent of {what} started"
        );
    }

    // The pod rolled because its config did: its checksum is the DaemonSet's, and new.
    let checksum = |pod: &Value| {
        pod["metadata"]["annotations"][CHECKSUM]
            .as_str()
            .map(str::to_owned)
    };
    let ds = cluster
        .kubectl()
        .json(&["-n", NAMESPACE, "get", "daemonset", deploy::DAEMONSET])?;
    let template = ds["spec"]["template"]["metadata"]["annotations"][CHECKSUM].as_str();
    ensure!(
        checksum(&pod).is_some() && checksum(&pod).as_deref() == template,
        "after {what}: the pod's {CHECKSUM} {:?}, the DaemonSet's {template:?}",
        checksum(&pod)
    );
    ensure!(
        checksum(&pod) != checksum(&before),
        "after {what}: the config's checksum did not change ({:?})",
        checksum(&pod)
    );
    let status: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "status"])?)?;
    ensure!(status["mode"] == mode, "after {what}: ipq status {status}");

    // The quarantine state survived the rollout.
    let view = address_view(cluster)?;
    ensure!(
        view["holder"].to_string().contains(&rollout.new_name)
            && view["fenced"].to_string().contains(&rollout.old_name),
        "after {what}, ipq get {address}: {view}"
    );

    if mode == "observe" {
        *enforcing_since = None;
        // Nothing dropped: the fenced pod's pings reach the peer, and are counted as observed.
        let observed_before = observed(cluster)?;
        ipq_tests::lab::poll(
            "the fenced pod's pings at the peer in observe mode",
            std::time::Duration::from_secs(60),
            || Ok((rollout.witness.count(address, OLD, ready) >= 3).then_some(())),
        )
        .with_context(|| format!("after {what}"))?;
        ipq_tests::lab::poll(
            "the observing agent to count the fenced pod's pings",
            std::time::Duration::from_secs(60),
            || Ok((observed(cluster)? >= observed_before + 3.0).then_some(())),
        )
        .with_context(|| format!("after {what}"))?;
    } else {
        *enforcing_since = Some(ready);
        let fenced_before = fenced_drops(cluster)?;
        ipq_tests::lab::poll(
            "the enforcing agent to drop the fenced pod's pings",
            std::time::Duration::from_secs(60),
            || Ok((fenced_drops(cluster)? >= fenced_before + 3.0).then_some(())),
        )
        .with_context(|| format!("after {what}"))?;
        let leaked = rollout.witness.count(address, OLD, ready);
        ensure!(
            leaked == 0,
            "{leaked} of the fenced pod's pings reached the peer once the agent of {what} was \
             ready"
        );
    }
    let revision = cluster.helm()?.revision()?;
    eprintln!(
        "cluster tier: {what}: revision {revision}, mode {mode}, pod {}",
        pod_name(&pod)?
    );
    Ok(revision)
}

/// When the agent's container of `pod` started (its `startedAt`, whole seconds: never later
/// than the start), on the witness' clock.
fn container_started(pod: &Value) -> anyhow::Result<Instant> {
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .context("the agent's pod has container statuses")?;
    let agent = statuses
        .iter()
        .find(|c| c["name"] == "agent")
        .with_context(|| format!("no agent container in {statuses:?}"))?;
    let text = agent["state"]["running"]["startedAt"]
        .as_str()
        .with_context(|| format!("the agent container is not running: {agent}"))?;
    let at = humantime::parse_rfc3339(text).with_context(|| format!("startedAt {text}"))?;
    let ago = SystemTime::now().duration_since(at).unwrap_or_default();
    Instant::now()
        .checked_sub(ago)
        .context("the agent started before this process' clock")
}

fn observed(cluster: &Cluster) -> anyhow::Result<f64> {
    metric(cluster, "ipq_observed_packets_total{reason=\"fenced\"}")
}
