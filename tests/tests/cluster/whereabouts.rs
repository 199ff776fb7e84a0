//! whereabouts as the cluster IPAM (#30's real consumer): a pod whose container ignores SIGTERM
//! is deleted (terminating, its kubelet waiting out a long grace) and then force-deleted;
//! whereabouts' control loop frees its address on the Pod's DELETE while the container still
//! runs (a pod force-deleted before it terminates is killed by its kubelet within a second or
//! two: no holder would live on). Without ipq's projection the next pod is given that address at once;
//! with it (`kubernetes.whereabouts = true`), pods created meanwhile get the other address or
//! none, until the old holder is gone and ipq's quarantine of the address has ended, and then
//! the address is handed out again. Each wait is for the state that proves the point.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{self, NAMESPACE},
    node::NODE_NAME,
    tasks,
    whereabouts::{self, allocations, reservation, RANGE_END, RANGE_START},
    Cluster,
};
use serde_json::Value;

use super::{agent_lifecycle::wait_rolled, metric};

/// What ipq's own reservations name as their pod.
fn own_pod_ref() -> String {
    format!("ipq.dev:quarantine/{NODE_NAME}")
}

/// Creates the pod and waits until it runs; its address.
fn running(cluster: &mut Cluster, name: &str, ignores_sigterm: bool) -> anyhow::Result<String> {
    cluster
        .kubectl()
        .apply(&whereabouts::pod(name, ignores_sigterm))?;
    let pod = cluster.wait_for(
        &format!("pod {name} to run"),
        Duration::from_secs(180),
        &["-n", "default", "get", "pod", name],
        |pod| ipq_tests::cluster::kubectl::pod_ready(pod) && pod["status"]["podIP"].is_string(),
    )?;
    Ok(pod["status"]["podIP"].as_str().context("podIP")?.to_owned())
}

/// Deletes the pod (its container ignores SIGTERM through a long grace), waits until its
/// kubelet has begun that termination, then `kubectl delete --force --grace-period=0`: the Pod
/// object goes while its container runs on (asserted, from containerd's tasks), and waits until
/// whereabouts' control loop has freed the pod's address (its IPPool no longer names the pod).
fn terminate_then_force_delete_and_wait_freed(
    cluster: &mut Cluster,
    name: &str,
) -> anyhow::Result<()> {
    cluster
        .kubectl()
        .run(&["-n", "default", "delete", "pod", name, "--wait=false"])?;
    // The kubelet's `Killing` event: it has sent SIGTERM and waits out the pod's grace, so the
    // force delete that follows cannot cut that grace short.
    cluster.wait_for(
        &format!("the kubelet to begin terminating {name}"),
        Duration::from_secs(60),
        &[
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},reason=Killing"),
        ],
        |events| events["items"].as_array().is_some_and(|i| !i.is_empty()),
    )?;
    cluster.kubectl().run(&[
        "-n",
        "default",
        "delete",
        "pod",
        name,
        "--force",
        "--grace-period=0",
    ])?;
    tasks::ensure_running(&cluster.host, name, "right after the force delete")?;
    let pod_ref = format!("default/{name}");
    ipq_tests::lab::poll(
        "whereabouts' control loop to free the force-deleted pod's address",
        Duration::from_secs(60),
        || {
            let all = allocations(cluster)?;
            Ok((!all.iter().any(|(_, p)| *p == pod_ref)).then_some(()))
        },
    )
    .with_context(|| control_loop_logs(cluster))
}

fn control_loop_logs(cluster: &Cluster) -> String {
    cluster
        .kubectl()
        .run(&[
            "-n",
            whereabouts::NAMESPACE,
            "logs",
            "deploy/whereabouts-control-loop",
            "--tail=40",
        ])
        .unwrap_or_else(|e| format!("{e:#}"))
}

/// Waits until ipq's NodeQuarantine lists nothing: every quarantine of the phase has ended.
fn wait_no_quarantine(cluster: &mut Cluster) -> anyhow::Result<()> {
    // cooldown 30s at least, max_cooldown (the ConfigMap's 5m) at most.
    cluster
        .wait_for(
            "every quarantine to end",
            Duration::from_secs(420),
            &["get", "nodequarantines", NODE_NAME],
            |o| {
                o["status"]["publishedAt"].is_string()
                    && o["status"]["entries"]
                        .as_array()
                        .is_none_or(|entries| entries.is_empty())
            },
        )
        .map(|_| ())
}

/// Without the projection (the shipped default): the force-deleted pod's address goes to the
/// next pod at once, while the old container still runs. The phase ends with both pods gone
/// and every quarantine over.
pub fn without_the_projection_the_address_is_handed_out_at_once(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let victim = "wb-a-victim";
    let address = running(cluster, victim, true)?;
    ensure!(address == RANGE_START, "the first pod's address: {address}");
    terminate_then_force_delete_and_wait_freed(cluster, victim)?;
    tasks::ensure_running(&cluster.host, victim, "once its address was freed")?;
    let next = running(cluster, "wb-a-next", false)?;
    ensure!(
        next == address,
        "without ipq's projection whereabouts gave the next pod {next}, not the freed {address}"
    );
    ensure!(
        reservation(cluster, &address).is_none_or(|r| r["spec"]["podref"] != own_pod_ref()),
        "no reservation of ipq's without the projection"
    );
    tasks::kill_running(&cluster.host, victim)?;
    cluster
        .kubectl()
        .run(&["-n", "default", "delete", "pod", "wb-a-next", "--wait"])?;
    wait_no_quarantine(cluster)
}

/// `helm upgrade --reuse-values --set whereabouts.enabled=true`: the chart adds the Role in
/// whereabouts' namespace and `[kubernetes] whereabouts = true` to agent.toml, and the config's
/// checksum on the pod template rolls the agent, which then projects.
pub fn enable_the_projection(cluster: &mut Cluster) -> anyhow::Result<()> {
    let before = deploy::agent_pod(cluster)?["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_owned();
    cluster.helm()?.upgrade(&["whereabouts.enabled=true"])?;
    let role = cluster.kubectl().json(&[
        "-n",
        whereabouts::NAMESPACE,
        "get",
        "role",
        "ipq-agent-whereabouts",
    ])?;
    ensure!(
        role["rules"][0]["resources"][0] == "overlappingrangeipreservations",
        "the chart's whereabouts Role: {role}"
    );
    let config =
        cluster
            .kubectl()
            .json(&["-n", NAMESPACE, "get", "configmap", "ipq-agent-config"])?;
    let toml = config["data"]["agent.toml"]
        .as_str()
        .context("the ConfigMap has agent.toml")?;
    ensure!(
        toml.contains("[kubernetes]\nwhereabouts = true"),
        "agent.toml after the upgrade: {toml}"
    );
    wait_rolled(cluster, &before)?;
    Ok(())
}

/// With the projection: the same force delete, and the address is kept from every pod created
/// while its old holder runs and while ipq's quarantine of it lasts, through whereabouts'
/// deletions of the reservation; then handed out.
pub fn with_the_projection_the_address_waits_for_the_quarantine(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let victim = "wb-b-victim";
    let address = running(cluster, victim, true)?;
    ensure!(address == RANGE_START, "the first pod's address: {address}");
    // ipq watches whereabouts' own reservation of the live pod (labelled, spec untouched).
    let label = |r: &Value| r["metadata"]["labels"]["ipq.dev/node"] == NODE_NAME;
    wait_reservation(
        cluster,
        &address,
        "whereabouts' own, labelled by ipq",
        |r| label(r) && r["spec"]["podref"] == format!("default/{victim}").as_str(),
    )?;

    terminate_then_force_delete_and_wait_freed(cluster, victim)?;
    tasks::ensure_running(&cluster.host, victim, "once its address was freed")?;
    let own = wait_reservation(cluster, &address, "ipq's own", |r| {
        r["spec"]["podref"] == own_pod_ref().as_str()
    })?;
    let owner = &own["metadata"]["ownerReferences"][0];
    ensure!(
        owner["kind"] == "NodeQuarantine" && owner["name"] == NODE_NAME,
        "ipq's reservation is not owned by the NodeQuarantine: {}",
        own["metadata"]
    );

    // whereabouts' reconciler deletes a reservation whose podRef is no live pod (as it would
    // on its schedule): ipq makes it again.
    cluster.kubectl().run(&[
        "-n",
        whereabouts::NAMESPACE,
        "delete",
        "overlappingrangeipreservations.whereabouts.cni.cncf.io",
        &address,
    ])?;
    let old_uid = own["metadata"]["uid"].clone();
    wait_reservation(cluster, &address, "ipq's own, made again", |r| {
        r["spec"]["podref"] == own_pod_ref().as_str() && r["metadata"]["uid"] != old_uid
    })?;

    let second = running(cluster, "wb-b-second", false)?;
    ensure!(
        second == RANGE_END,
        "with ipq's projection the next pod got {second}, not the range's other address"
    );
    // The range is full but for the kept address: the third pod gets none.
    let third = "wb-b-third";
    cluster.kubectl().apply(&whereabouts::pod(third, false))?;
    cluster.wait_for(
        "the third pod's sandbox to fail for want of an address",
        Duration::from_secs(120),
        &[
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={third},reason=FailedCreatePodSandBox"),
        ],
        |events| events["items"].as_array().is_some_and(|i| !i.is_empty()),
    )?;
    let pod = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pod", third])?;
    ensure!(
        pod["status"]["podIP"].is_null(),
        "the third pod got an address while the range's other one was kept: {}",
        pod["status"]
    );
    ensure!(
        !allocations(cluster)?
            .iter()
            .any(|(_, p)| *p == format!("default/{third}")),
        "whereabouts allocated to the third pod: {:?}",
        allocations(cluster)?
    );

    // The old holder goes (it ran until now: asserted before the kill); ipq's quarantine of
    // the address then runs and ends, and the third pod is given the address.
    tasks::kill_running(&cluster.host, victim)?;
    let pod = cluster.wait_for(
        "the third pod to run on the address once the quarantine ended",
        Duration::from_secs(480),
        &["-n", "default", "get", "pod", third],
        ipq_tests::cluster::kubectl::pod_ready,
    )?;
    ensure!(
        pod["status"]["podIP"] == address.as_str(),
        "the third pod's address: {}",
        pod["status"]
    );
    let recreated = metric(cluster, "ipq_publish_whereabouts_recreated_total")?;
    ensure!(
        recreated >= 2.0,
        "ipq_publish_whereabouts_recreated_total is {recreated}: the control loop's and the \
         reconciler's deletions were each made good"
    );
    let failures = metric(cluster, "ipq_publish_whereabouts_failures_total")?;
    ensure!(
        failures == 0.0,
        "ipq_publish_whereabouts_failures_total is {failures}"
    );
    let status: Value = serde_json::from_str(&deploy::ipq(cluster, &["-o", "json", "status"])?)?;
    let view = &status["whereabouts"];
    ensure!(
        view["namespace"] == whereabouts::NAMESPACE
            && view["recreated_total"].as_u64() >= Some(2)
            && view["failures_total"] == 0
            && view.get("last_error").is_none(),
        "ipq status: {view}"
    );
    Ok(())
}

/// Waits until `address`'s reservation satisfies `done`; that reservation.
fn wait_reservation(
    cluster: &mut Cluster,
    address: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let mut last = Value::Null;
    ipq_tests::lab::poll(
        &format!("{address}'s reservation: {what}"),
        Duration::from_secs(30),
        || {
            last = reservation(cluster, address).unwrap_or(Value::Null);
            Ok(done(&last).then(|| last.clone()))
        },
    )
    .with_context(|| {
        format!(
            "last reservation: {last}\nagent logs:\n{}",
            cluster
                .kubectl()
                .run(&[
                    "-n",
                    NAMESPACE,
                    "logs",
                    "ds/ipq-agent",
                    "-c",
                    "agent",
                    "--tail=30"
                ])
                .unwrap_or_else(|e| format!("{e:#}"))
        )
    })
}
