//! whereabouts as the cluster IPAM (#30's real consumer): a pod whose container ignores SIGTERM
//! is deleted (terminating, its kubelet waiting out a long grace) and then force-deleted;
//! whereabouts' control loop frees its address on the Pod's DELETE while the container still
//! runs (a pod force-deleted before it terminates is killed by its kubelet within a second or
//! two: no holder would live on). Without ipq's projection the next pod is given that address at once;
//! with it (`kubernetes.whereabouts = true`), pods created meanwhile get the other address or
//! none, until the old holder is gone and ipq's quarantine of the address has ended, and then
//! the address is handed out again. Then the same across the agent's restarts: ipq's own
//! reservation watched through `kubectl rollout restart daemonset/ipq-agent` (never deleted),
//! and a force delete while no agent runs made good by the agent that comes back. Each wait is
//! for the state that proves the point.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    api_server::{watch_raw, Watch},
    deploy::{self, NAMESPACE},
    node::NODE_NAME,
    tasks,
    whereabouts::{self, allocations, reservation, RANGE_END, RANGE_START},
    Cluster,
};
use serde_json::Value;

use super::{
    agent_lifecycle::{restart_agent, wait_rolled},
    metric,
};

/// What ipq's own reservations name as their pod.
fn own_pod_ref() -> String {
    format!("ipq.dev:quarantine/{NODE_NAME}")
}

/// Creates the pod and waits until it runs; its address.
pub(super) fn running(
    cluster: &mut Cluster,
    name: &str,
    ignores_sigterm: bool,
) -> anyhow::Result<String> {
    running_pod(cluster, name, &whereabouts::pod(name, ignores_sigterm))
}

/// Applies `manifest` (the pod `name`) and waits until it runs; its address.
pub(super) fn running_pod(
    cluster: &mut Cluster,
    name: &str,
    manifest: &str,
) -> anyhow::Result<String> {
    cluster.kubectl().apply(manifest)?;
    address_once_running(cluster, name)
}

/// The address of pod `name` (in `default`) once it runs and is ready.
pub(super) fn address_once_running(cluster: &mut Cluster, name: &str) -> anyhow::Result<String> {
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
pub(super) fn terminate_then_force_delete_and_wait_freed(
    cluster: &mut Cluster,
    name: &str,
) -> anyhow::Result<()> {
    begin_termination(cluster, name)?;
    force_delete_and_wait_freed(cluster, name)
}

/// Deletes the pod and waits until its kubelet has begun terminating it.
fn begin_termination(cluster: &mut Cluster, name: &str) -> anyhow::Result<()> {
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
    Ok(())
}

/// Force-deletes the terminating pod (its container runs on: asserted) and waits until
/// whereabouts' control loop has freed its address.
fn force_delete_and_wait_freed(cluster: &mut Cluster, name: &str) -> anyhow::Result<()> {
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
            "-l",
            whereabouts::CONTROL_LOOP_SELECTOR,
            "--prefix",
            "--tail=40",
        ])
        .unwrap_or_else(|e| format!("{e:#}"))
}

/// Waits until ipq's NodeQuarantine lists nothing: every quarantine of the phase has ended.
pub(super) fn wait_no_quarantine(cluster: &mut Cluster) -> anyhow::Result<()> {
    wait_no_quarantine_on(cluster, NODE_NAME)
}

/// Waits until `node`'s NodeQuarantine lists nothing.
pub(super) fn wait_no_quarantine_on(cluster: &mut Cluster, node: &str) -> anyhow::Result<()> {
    // cooldown 30s at least, max_cooldown (the ConfigMap's 5m) at most.
    cluster
        .wait_for(
            "every quarantine to end",
            Duration::from_secs(420),
            &["get", "nodequarantines", node],
            |o| {
                o["status"]["publishedAt"].is_string()
                    && o["status"]["entries"]
                        .as_array()
                        .is_none_or(|entries| entries.is_empty())
            },
        )
        .map(|_| ())
}

/// Waits until `node`'s NodeQuarantine lists `address` as `state` with `pod` (in `default`)
/// as its holder, as the CNI named it; an orphan must have no end and be counted. The entry,
/// after printing how long it took.
pub(super) fn wait_listed_on(
    cluster: &mut Cluster,
    node: &str,
    address: &str,
    state: &str,
    pod: &str,
) -> anyhow::Result<Value> {
    let began = std::time::Instant::now();
    let object = cluster.wait_for(
        &format!("{node}'s NodeQuarantine to list {address} as {state}, held by {pod}"),
        Duration::from_secs(10),
        &["get", "nodequarantines", node],
        |o| {
            o["status"]["entries"].as_array().is_some_and(|entries| {
                entries.iter().any(|e| {
                    e["address"] == address && e["state"] == state && e["holder"]["pod"] == pod
                })
            })
        },
    )?;
    eprintln!(
        "cluster tier: {node}'s NodeQuarantine lists {address} {state} ({pod}) after {:.1?}",
        began.elapsed()
    );
    let entry = object["status"]["entries"]
        .as_array()
        .and_then(|entries| entries.iter().find(|e| e["address"] == address))
        .context("the entry")?
        .clone();
    ensure!(
        entry["holder"]["namespace"] == "default" && entry["holder"]["containerID"].is_string(),
        "the holder as the CNI told ipq: {entry}"
    );
    if state == "orphaned" {
        ensure!(
            entry.get("until").is_none() && object["status"]["orphaned"].as_u64() >= Some(1),
            "an orphan has no end, and is counted: {}",
            object["status"]
        );
    }
    Ok(entry)
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
    // The node's NodeQuarantine says so too, for every reader: the holder runs on, its pod is
    // gone.
    wait_listed_on(cluster, NODE_NAME, &address, "orphaned", victim)?;

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
    wait_no_address(cluster, third, "while the range's other address was kept")?;
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
    wait_listed_on(cluster, NODE_NAME, &address, "quarantined", victim)?;
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

/// Deletes the pods of the previous phase and waits until their quarantines have ended: the
/// range is whole again.
/// Waits for `pod`'s sandbox to fail for want of an address (its `FailedCreatePodSandBox`
/// event), then checks that it has none; `when` says why it must not.
pub fn wait_no_address(cluster: &mut Cluster, pod: &str, when: &str) -> anyhow::Result<()> {
    cluster.wait_for(
        &format!("{pod}'s sandbox to fail for want of an address"),
        Duration::from_secs(120),
        &[
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod},reason=FailedCreatePodSandBox"),
        ],
        |events| events["items"].as_array().is_some_and(|i| !i.is_empty()),
    )?;
    let status = &cluster
        .kubectl()
        .json(&["-n", "default", "get", "pod", pod])?["status"];
    ensure!(
        status["podIP"].is_null(),
        "{pod} got an address {when}: {status}"
    );
    Ok(())
}

fn clear(cluster: &mut Cluster, pods: &[&str]) -> anyhow::Result<()> {
    for pod in pods {
        cluster.kubectl().run(&[
            "-n",
            "default",
            "delete",
            "pod",
            pod,
            "--ignore-not-found",
            "--wait",
        ])?;
    }
    wait_no_quarantine(cluster)?;
    ensure!(
        allocations(cluster)?.is_empty(),
        "whereabouts still allocates: {:?}",
        allocations(cluster)?
    );
    Ok(())
}

/// A watch of `address`'s reservation: a DELETED event fails its reader.
fn watch_reservation(cluster: &Cluster, address: &str) -> anyhow::Result<Watch> {
    let path = format!(
        "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{}/overlappingrangeipreservations\
         ?watch=true&fieldSelector=metadata.name%3D{address}",
        whereabouts::NAMESPACE
    );
    watch_raw(&cluster.kubectl(), &path)
}

/// ipq's own reservation of `address`, made for the live holder of pod `victim`.
fn own_for(r: &Value, victim: &str) -> bool {
    r["spec"]["podref"] == own_pod_ref().as_str()
        && r["metadata"]["annotations"]["ipq.dev/holder"] == format!("default/{victim}").as_str()
}

/// The agent's own reservations, as `ipq status` shows them once a round has run.
fn status_reservations(cluster: &Cluster) -> anyhow::Result<u64> {
    let status: Value = serde_json::from_str(&deploy::ipq(cluster, &["-o", "json", "status"])?)?;
    status["whereabouts"]["reservations"]
        .as_u64()
        .with_context(|| format!("ipq status: {status}"))
}

/// ipq's own reservation, made when whereabouts freed a force-deleted pod's address under its
/// live container, survives `kubectl rollout restart daemonset/ipq-agent`: watched from before
/// the restart until the new agent has taken it over (and a while after), it is never deleted,
/// and a pod created then is given the range's other address.
pub fn the_own_reservation_survives_an_agent_restart(cluster: &mut Cluster) -> anyhow::Result<()> {
    clear(cluster, &["wb-b-second", "wb-b-third"])?;
    let victim = "wb-c-victim";
    let address = running(cluster, victim, true)?;
    ensure!(address == RANGE_START, "the first pod's address: {address}");
    terminate_then_force_delete_and_wait_freed(cluster, victim)?;
    wait_reservation(cluster, &address, "ipq's own", |r| own_for(r, victim))?;
    let mut watch = watch_reservation(cluster, &address)?;
    let (_, own) = watch.wait_for(
        "ipq's own, through the watch",
        Duration::from_secs(10),
        |r| own_for(r, victim),
    )?;

    let before = deploy::agent_pod(cluster)?["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_owned();
    restart_agent(cluster, &before)?;
    // The new agent's first round has listed and judged the reservation once its status
    // counts it (0 until then).
    ipq_tests::lab::poll(
        "the new agent to count ipq's own reservation",
        Duration::from_secs(30),
        || Ok((status_reservations(cluster)? == 1).then_some(())),
    )?;
    // The new agent lists the holder as orphaned again, from the reservation it found.
    wait_listed_on(cluster, NODE_NAME, &address, "orphaned", victim)?;
    // Every event of the reservation until 5 s after: none may be a DELETED (the watch fails
    // the read then), and the object is still the one made before the restart.
    let settle = std::time::Instant::now() + Duration::from_secs(5);
    while let Some((_, object)) = watch.next_before(settle)? {
        ensure!(
            object["metadata"]["uid"] == own["metadata"]["uid"],
            "the reservation was made again across the restart: {object}"
        );
    }
    let now = reservation(cluster, &address).context("the reservation after the restart")?;
    ensure!(
        now["metadata"]["uid"] == own["metadata"]["uid"] && own_for(&now, victim),
        "the reservation after the restart: {now}"
    );
    tasks::ensure_running(&cluster.host, victim, "after the agent's restart")?;
    let next = running(cluster, "wb-c-next", false)?;
    ensure!(
        next == RANGE_END,
        "after the agent's restart the next pod got {next}, not the range's other address"
    );
    tasks::kill_running(&cluster.host, victim)?;
    Ok(())
}

/// The force delete lands while no agent runs on the node (its DaemonSet's pod taken off the
/// node by a nodeSelector no node matches, the harsh form of a restart's gap): whereabouts
/// frees the address and deletes its reservation with nobody watching. The agent that comes
/// back finds the live holder's reservation missing and its pod gone, and makes its own; a pod
/// created then is given the range's other address.
pub fn a_force_delete_while_no_agent_runs_is_made_good_by_the_next(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    clear(cluster, &["wb-c-next"])?;
    let victim = "wb-d-victim";
    let address = running_and_labelled(cluster, victim)?;

    agent_off_the_node(cluster, true)?;
    terminate_then_force_delete_and_wait_freed(cluster, victim)?;
    ensure!(
        reservation(cluster, &address).is_none(),
        "with no agent running, whereabouts' freeing left a reservation: {:?}",
        reservation(cluster, &address)
    );
    agent_off_the_node(cluster, false)?;
    wait_reservation(
        cluster,
        &address,
        "ipq's own, made by the agent back",
        |r| own_for(r, victim),
    )?;
    tasks::ensure_running(&cluster.host, victim, "once the agent was back")?;
    let next = running(cluster, "wb-d-next", false)?;
    ensure!(
        next == RANGE_END,
        "the next pod got {next}, not the range's other address"
    );
    tasks::kill_running(&cluster.host, victim)?;
    Ok(())
}

/// The agent's watch of the reservations across a restart of kube-apiserver (kube's watcher
/// and its backoff): kube-apiserver is stopped while a pod whose container ignores SIGTERM is
/// terminating, and the agent's watch fails (counted as `unreachable`). kube-apiserver is
/// started again and the pod force-deleted at once: whereabouts frees its address while the
/// agent's watch is coming back (from a version the restarted API server may no longer have:
/// 410 Gone, a fresh list). The agent lists again (counted) and ends with exactly one
/// reservation labelled for its node, ipq's own for the live holder: none lost, none made
/// twice; the next pod is given the range's other address.
pub fn the_watch_comes_back_after_an_api_server_restart(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    clear(cluster, &["wb-d-next"])?;
    let victim = "wb-e-victim";
    let address = running_and_labelled(cluster, victim)?;
    let lists = "ipq_publish_whereabouts_lists_total";
    let unreachable = "ipq_publish_whereabouts_failures_total{reason=\"unreachable\"}";
    let lists_before = metric(cluster, lists)?;
    ensure!(
        lists_before >= 1.0,
        "{lists} is {lists_before} with the watch running"
    );
    let unreachable_before = metric(cluster, unreachable)?;
    begin_termination(cluster, victim)?;

    cluster.stop_apiserver();
    ipq_tests::lab::poll(
        "the agent's watch to fail on the stopped API server",
        Duration::from_secs(60),
        || Ok((metric(cluster, unreachable)? > unreachable_before).then_some(())),
    )?;
    cluster.start_apiserver()?;
    force_delete_and_wait_freed(cluster, victim)?;

    wait_reservation(cluster, &address, "ipq's own, after the restart", |r| {
        own_for(r, victim)
    })?;
    ipq_tests::lab::poll(
        "the agent's watch to list again",
        Duration::from_secs(60),
        || Ok((metric(cluster, lists)? > lists_before).then_some(())),
    )?;
    let labelled = cluster.kubectl().json(&[
        "-n",
        whereabouts::NAMESPACE,
        "get",
        "overlappingrangeipreservations.whereabouts.cni.cncf.io",
        "-l",
        &format!("ipq.dev/node={NODE_NAME}"),
    ])?;
    let items = labelled["items"].as_array().context("items")?;
    ensure!(
        items.len() == 1
            && items[0]["metadata"]["name"] == address.as_str()
            && own_for(&items[0], victim),
        "the reservations labelled for the node after the restart: {items:?}"
    );
    ipq_tests::lab::poll(
        "ipq status to count its one reservation",
        Duration::from_secs(30),
        || Ok((status_reservations(cluster)? == 1).then_some(())),
    )?;
    tasks::ensure_running(&cluster.host, victim, "after the API server's restart")?;
    let next = running(cluster, "wb-e-next", false)?;
    ensure!(
        next == RANGE_END,
        "after the API server's restart the next pod got {next}, not the range's other address"
    );
    tasks::kill_running(&cluster.host, victim)?;
    Ok(())
}

/// Starts `victim` (its container ignores SIGTERM) on the range's first address and waits until
/// ipq has labelled whereabouts' reservation of it; that address.
fn running_and_labelled(cluster: &mut Cluster, victim: &str) -> anyhow::Result<String> {
    let address = running(cluster, victim, true)?;
    ensure!(address == RANGE_START, "the first pod's address: {address}");
    wait_reservation(
        cluster,
        &address,
        "whereabouts' own, labelled by ipq",
        |r| {
            r["metadata"]["labels"]["ipq.dev/node"] == NODE_NAME
                && r["spec"]["podref"] == format!("default/{victim}").as_str()
        },
    )?;
    Ok(address)
}

/// Takes the agent's DaemonSet pod off the node (`off`: a nodeSelector label no node has) and
/// waits until it is gone, or puts it back and waits until it is ready.
fn agent_off_the_node(cluster: &mut Cluster, off: bool) -> anyhow::Result<()> {
    let value = if off { "\"true\"" } else { "null" };
    let patch = format!(
        r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{{"ipq.dev/test-no-agent":{value}}}}}}}}}}}"#
    );
    cluster.kubectl().run(&[
        "-n",
        NAMESPACE,
        "patch",
        "daemonset",
        "ipq-agent",
        "--type=strategic",
        "-p",
        &patch,
    ])?;
    if off {
        cluster.wait_for(
            "the agent's pod to leave the node",
            Duration::from_secs(120),
            &[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=ipq,app.kubernetes.io/component=agent",
            ],
            |pods| pods["items"].as_array().is_some_and(|i| i.is_empty()),
        )?;
    } else {
        deploy::wait_daemonset_ready(cluster)?;
    }
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
