//! The cluster tier: ipq on a real Kubernetes node. A one-node cluster of the test's own (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet on containerd 2.x with
//! runc and cgroupfs; `ipq_tests::cluster`), ipq installed with `helm install` of
//! `deploy/helm/ipq/` (whose default rendering is `deploy/kubernetes/`) as users install it, and
//! the incidents caused by Kubernetes itself.
//!
//! One cluster per test, brought up in phases whose durations are printed: the cluster, the
//! install, each scenario. Run it with `cargo xtask test-cluster` (it builds the Go components
//! and the release image's binaries first).

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};

#[path = "cluster/agent_in_pod.rs"]
mod agent_in_pod;
#[path = "cluster/agent_lifecycle.rs"]
mod agent_lifecycle;
#[path = "cluster/churn.rs"]
mod churn;
#[path = "cluster/cross_node.rs"]
mod cross_node;
#[path = "cluster/drain.rs"]
mod drain;
#[path = "cluster/forged_claim.rs"]
mod forged_claim;
#[path = "cluster/helm_modes.rs"]
mod helm_modes;
#[path = "cluster/lost_node.rs"]
mod lost_node;
#[path = "cluster/many_nodes.rs"]
mod many_nodes;
#[path = "cluster/own_objects.rs"]
mod own_objects;
#[path = "cluster/pod_events.rs"]
mod pod_events;
#[path = "cluster/pod_network_e2e.rs"]
mod pod_network_e2e;
#[path = "cluster/prometheus.rs"]
mod prometheus;
#[path = "cluster/publish.rs"]
mod publish;
#[path = "cluster/publish_old_crd.rs"]
mod publish_old_crd;
#[path = "cluster/publish_outage.rs"]
mod publish_outage;
#[path = "cluster/publish_refused.rs"]
mod publish_refused;
#[path = "cluster/rolling.rs"]
mod rolling;
#[path = "cluster/whereabouts.rs"]
mod whereabouts;
use ipq_tests::cluster::{
    deploy::{self, ipq},
    host::NODE_IP,
    kubectl::pod_ready,
    node::{HOST_LOCAL_DIR, NETWORK_NAME, POD_ADDRESS},
    peer::Witness,
    tasks,
    workloads::sender_deployment,
    Cluster,
};
use serde_json::Value;

/// Prints how long a phase took, for the tier's timings.
fn phase<T>(name: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let began = Instant::now();
    let result = f().with_context(|| format!("phase `{name}` failed"));
    eprintln!("cluster tier: {name}: {:.1?}", began.elapsed());
    result
}

/// ipq installed as the README says (helm install): the DaemonSet becomes ready, its init step chains ipq-cni
/// into the node's conflist, and `ipq status` answers through `kubectl exec`. Then the
/// Deployment rollout whose old pod ignores SIGTERM while its address goes to the new pod, and
/// that old pod force-deleted while it still runs.
#[test]
fn ipq_deployed_from_the_manifests_fences_a_rollouts_old_pod() -> anyhow::Result<()> {
    let mut cluster = phase("cluster start", Cluster::start)?;
    eprintln!(
        "cluster tier: node Ready {:.1?} after start",
        cluster.started_in
    );
    phase("install ipq", || installed_as_the_readme_says(&mut cluster))?;
    phase(
        "the agent in its own PID namespace under RuntimeDefault seccomp",
        || agent_in_pod::runs_as_its_daemonset_says(&cluster),
    )?;
    phase("the node's NodeQuarantine, owned by its Node", || {
        publish::published_and_owned_by_its_node(&mut cluster)
    })?;
    let peer = Arc::clone(&cluster.host.peer);
    let prometheus = phase(
        "Prometheus scrapes the agent with the shipped rules",
        || prometheus::scrapes_the_agent(&peer),
    )?;
    let rollout = phase("rollout with an old pod ignoring SIGTERM", || {
        rollout_fences_the_old_pod(&mut cluster)
    })?;
    phase("the shipped early-reuse alert", || {
        prometheus::early_reuse_alert_fires(&prometheus)
    })?;
    phase("force delete of the fenced old pod", || {
        force_delete_leaves_no_stale_holder_reachable(&mut cluster, &rollout)
    })?;
    phase(
        "NodeQuarantine lists the force-deleted pod as fenced",
        || publish::lists_the_force_deleted_pod_as_fenced(&mut cluster, &rollout),
    )?;
    phase(
        "a foreign write to the pinned IPQ_ADDRS undone (the watcher's 100 ms, else one pass)",
        || agent_in_pod::a_foreign_write_to_its_map_is_undone_at_once(&cluster),
    )?;
    phase("rollout restart of the agent", || {
        agent_lifecycle::agent_restart_keeps_the_fence(&mut cluster, &rollout)
    })?;
    phase(
        "helm upgrade to observe, to enforce, helm rollback to each",
        || helm_modes::observe_enforce_and_back_through_helm(&mut cluster, &rollout),
    )?;
    phase("rollout restart of the agent while pods churn", || {
        churn::agent_restart_while_pods_churn(&mut cluster, &rollout)
    })?;
    phase("kubectl drain of the node", || {
        drain::drain_quarantines_every_pod_address(&mut cluster, &rollout)
    })?;
    phase(
        "NodeQuarantine lists the drained address as quarantined",
        || publish::drained_address_listed_as_quarantined(&mut cluster, &rollout),
    )?;
    phase("NodeQuarantine entry gone once the quarantine ends", || {
        publish::entry_goes_when_the_quarantine_ends(&mut cluster, &rollout)
    })?;
    // Last, so that a bound it fails masks none of the scenarios above.
    phase("the agent idle for a minute", || {
        agent_in_pod::idle_it_is_quiet(&cluster)
    })?;
    Ok(())
}

/// Events on the pods involved (#39 item 2): the rollout's early reuse leaves an Event on
/// each pod, and a storm of conflicts a bounded number of them.
#[test]
fn the_pods_involved_in_a_conflict_get_events_and_a_storm_stays_bounded() -> anyhow::Result<()> {
    let mut cluster = phase("cluster start", Cluster::start)?;
    phase("install ipq", || {
        deploy::install_ipq(&mut cluster).map(|_| ())
    })?;
    let rollout = phase("rollout with an old pod ignoring SIGTERM", || {
        rollout_fences_the_old_pod(&mut cluster)
    })?;
    phase("Events on the old and the new pod", || {
        pod_events::both_pods_have_their_events(&mut cluster, &rollout)
    })?;
    phase("1000 conflicts, a bounded number of Events", || {
        pod_events::a_storm_writes_a_bounded_number_of_events(&mut cluster)
    })?;
    Ok(())
}

/// whereabouts as the cluster IPAM (its CRDs, its plugin in the node's conflist with ipq-cni
/// chained, its control loop): a force-deleted pod's address is handed out at once without
/// ipq's projection, and kept until ipq's quarantine of it ends with it.
#[test]
fn ipq_keeps_whereabouts_from_handing_out_a_quarantined_address() -> anyhow::Result<()> {
    let mut cluster = phase("cluster start", Cluster::start)?;
    phase("install whereabouts", || {
        ipq_tests::cluster::whereabouts::install(&mut cluster)
    })?;
    phase("install ipq", || {
        deploy::install_ipq(&mut cluster)?;
        let conflist = cluster
            .host
            .read("/etc/cni/net.d/05-whereabouts.conflist")?;
        let conflist: Value = serde_json::from_str(&conflist)?;
        let types: Vec<&str> = conflist["plugins"]
            .as_array()
            .context("plugins")?
            .iter()
            .filter_map(|p| p["type"].as_str())
            .collect();
        ensure!(
            types == ["bridge", "ipq-cni"],
            "whereabouts' conflist after ipq's install step: {types:?}"
        );
        Ok(())
    })?;
    phase("whereabouts without ipq's projection", || {
        whereabouts::without_the_projection_the_address_is_handed_out_at_once(&mut cluster)
    })?;
    phase("kubernetes.whereabouts = true", || {
        whereabouts::enable_the_projection(&mut cluster)
    })?;
    phase("whereabouts with ipq's projection", || {
        whereabouts::with_the_projection_the_address_waits_for_the_quarantine(&mut cluster)
    })?;
    phase("ipq's own reservation across an agent restart", || {
        whereabouts::the_own_reservation_survives_an_agent_restart(&mut cluster)
    })?;
    phase("a force delete while no agent runs", || {
        whereabouts::a_force_delete_while_no_agent_runs_is_made_good_by_the_next(&mut cluster)
    })?;
    phase(
        "the agent's watch across a restart of kube-apiserver",
        || whereabouts::the_watch_comes_back_after_an_api_server_restart(&mut cluster),
    )?;
    phase("each node's agent writes only its own objects", || {
        own_objects::a_nodes_token_is_refused_on_other_nodes_objects(&mut cluster)
    })?;
    Ok(())
}

/// Three nodes on one machine (#37): one control plane, per node its own namespaces, cgroup,
/// containerd, kubelet and kube-proxy, joined by an L2; flannel (vxlan) as the pod network,
/// installed as kube-flannel installs it, with ipq chained into its conflist by ipq's own init
/// step; CoreDNS as the cluster's DNS.
#[test]
fn three_nodes_on_flannel_with_ipq_chained() -> anyhow::Result<()> {
    let began = Instant::now();
    let mut cluster = phase("three-node cluster start (flannel)", || {
        Cluster::start_nodes(3)
    })?;
    let without = phase(
        "Kubernetes' networking conformance specs (pods, Services, DNS) without ipq",
        || {
            pod_network_e2e::import_images(&cluster)?;
            let outcomes = pod_network_e2e::run(&cluster, "without-ipq")?;
            pod_network_e2e::all_passed(&outcomes, "without ipq")?;
            Ok(outcomes)
        },
    )?;
    phase("install ipq on three nodes, chained into flannel", || {
        many_nodes::ipq_chained_into_flannel_on_every_node(&mut cluster)
    })?;
    phase("every node's NodeQuarantine, owned by its Node", || {
        many_nodes::every_node_publishes_its_own(&mut cluster)
    })?;
    phase(
        "pods on every node, the first reaching the last through flannel",
        || many_nodes::pods_on_every_node_reach_each_other(&mut cluster),
    )?;
    phase(
        "the same conformance specs with ipq chained, enforcing",
        || {
            let with = pod_network_e2e::run(&cluster, "with-ipq")?;
            pod_network_e2e::none_broken_by_ipq(&without, &with)
        },
    )?;
    phase(
        "helm upgrade and rollback node by node under long-lived flows",
        || rolling::upgrade_and_rollback_node_by_node(&mut cluster),
    )?;
    phase(
        "node C lost: kubelet and agent killed, Node deleted",
        || many_nodes::a_lost_node_is_collected_and_the_others_go_on(&mut cluster),
    )?;
    eprintln!("cluster tier: three nodes: {:.1?} in all", began.elapsed());
    Ok(())
}

/// The seeds' cross-node race (#37 item 2): whereabouts' one range shared by three nodes on
/// flannel; a force-deleted pod on node A whose container lives on; without ipq's projection
/// node B's pod gets the address and node A fences its stale holder on B's announcement; with
/// it no other node's pod gets the address until the quarantine ends. Then node C lost: its
/// pod's address left to whereabouts' own rules, untouched by ipq.
#[test]
fn the_seeds_cross_node_race_on_three_nodes() -> anyhow::Result<()> {
    let began = Instant::now();
    let mut cluster = phase("three-node cluster start (flannel)", || {
        Cluster::start_nodes(3)
    })?;
    phase("install whereabouts across the nodes", || {
        ipq_tests::cluster::whereabouts::install(&mut cluster)
    })?;
    phase("install ipq, uplink eth1", || {
        deploy::install_ipq_with(&mut cluster, cross_node::UPLINK_VALUES).map(|_| ())
    })?;
    phase("without the projection: node A fences on B's claim", || {
        cross_node::without_the_projection_a_remote_claim_fences_the_stale_holder(&mut cluster)
    })?;
    phase("forged announcements of live pods' addresses", || {
        forged_claim::forged_announcements_of_live_pods_addresses(&mut cluster)
    })?;
    phase("kubernetes.whereabouts = true on every node", || {
        cross_node::enable_the_projection(&mut cluster)
    })?;
    phase(
        "with the projection: no other node gets the address",
        || cross_node::with_the_projection_no_other_node_gets_the_address(&mut cluster),
    )?;
    phase(
        "node C lost: its pod's whereabouts address left to whereabouts",
        || lost_node::a_lost_nodes_address_is_left_to_whereabouts(&mut cluster),
    )?;
    eprintln!(
        "cluster tier: the cross-node race: {:.1?} in all",
        began.elapsed()
    );
    Ok(())
}

fn installed_as_the_readme_says(cluster: &mut Cluster) -> anyhow::Result<()> {
    let pod = deploy::install_ipq(cluster)?;
    // hostNetwork: the agent's pod IP is the node's.
    ensure!(
        pod["status"]["podIP"] == NODE_IP,
        "the agent's pod IP is not the node's: {}",
        pod["status"]
    );

    // The init step chained ipq-cni last into the conflist the runtime reads, and put the
    // plugin where the runtime runs plugins from.
    let types = deploy::chained_plugins(
        &cluster.host,
        &format!("/etc/cni/net.d/10-{NETWORK_NAME}.conflist"),
    )?;
    ensure!(
        types == ["bridge", "portmap", "ipq-cni"],
        "the node's conflist after the install step: {types:?}"
    );
    ensure!(
        cluster.host.exists("/opt/cni/bin/ipq-cni")?,
        "the install step left no /opt/cni/bin/ipq-cni"
    );

    let status: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "status"])?)?;
    ensure!(status["ready"] == true, "ipq status: {status}");
    ensure!(status["mode"] == "enforce", "ipq status: {status}");
    Ok(())
}

/// The payload sizes that tell the revisions' pings apart at the peer.
const OLD: usize = 101;
const NEW: usize = 202;

fn sender_pods(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    let pods = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pods", "-l", "app=sender"])?;
    Ok(pods["items"].as_array().cloned().unwrap_or_default())
}

fn rollout_fences_the_old_pod(cluster: &mut Cluster) -> anyhow::Result<Rollout> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    let witness = Witness::start(&cluster.host.peer)?;
    cluster.kubectl().apply(&sender_deployment(OLD))?;
    let old = cluster.wait_for(
        "the first revision's pod to run",
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=sender"],
        |pods| {
            pods["items"]
                .as_array()
                .is_some_and(|items| items.len() == 1 && pod_ready(&items[0]))
        },
    )?["items"][0]
        .clone();
    let old_name = old["metadata"]["name"].as_str().context("name")?.to_owned();
    ensure!(
        old["status"]["podIP"] == POD_ADDRESS,
        "the old pod's address: {}",
        old["status"]
    );
    let began = Instant::now();
    ipq_tests::lab::poll(
        "the old pod's datagrams at the peer",
        Duration::from_secs(60),
        || Ok((witness.count(address, OLD, began) >= 2).then_some(())),
    )?;

    // The rollout: the old pod is told to terminate and ignores it; the new pod is created
    // at once and waits for an address.
    cluster.kubectl().apply(&sender_deployment(NEW))?;
    cluster.wait_for(
        "the old pod to be terminating",
        Duration::from_secs(60),
        &["-n", "default", "get", "pod", &old_name],
        |pod| !pod["metadata"]["deletionTimestamp"].is_null(),
    )?;
    // The incident: the IPAM frees the terminating pod's address (as a cluster IPAM does on
    // the Pod's DELETE, or a GC of "leaked" addresses), and the new pod is given it while the
    // old one still runs.
    cluster
        .host
        .remove(&format!("{HOST_LOCAL_DIR}/{POD_ADDRESS}"))?;
    let new = cluster.wait_for(
        "the new pod to run with the old pod's address",
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=sender"],
        |pods| {
            pods["items"].as_array().is_some_and(|items| {
                items.iter().any(|p| {
                    p["metadata"]["name"] != old_name.as_str()
                        && pod_ready(p)
                        && p["status"]["podIP"] == POD_ADDRESS
                })
            })
        },
    )?;
    let claimed = Instant::now();
    let new_name = new["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|p| p["metadata"]["name"] != old_name.as_str())
        })
        .and_then(|p| p["metadata"]["name"].as_str())
        .context("the new pod's name")?
        .to_owned();

    // The new pod works: its datagrams reach the peer from the address.
    ipq_tests::lab::poll(
        "the new pod's datagrams at the peer",
        Duration::from_secs(60),
        || Ok((witness.count(address, NEW, claimed) >= 3).then_some(())),
    )?;
    // The old pod is still alive and still sending, and ipq drops what it sends.
    let fenced_before = fenced_drops(cluster)?;
    ipq_tests::lab::poll(
        "ipq to drop the old pod's datagrams",
        Duration::from_secs(60),
        || Ok((fenced_drops(cluster)? >= fenced_before + 3.0).then_some(())),
    )?;
    let pods = sender_pods(cluster)?;
    let old_now = pods
        .iter()
        .find(|p| p["metadata"]["name"] == old_name.as_str())
        .with_context(|| format!("the old pod {old_name} is gone already: {pods:?}"))?;
    ensure!(
        old_now["status"]["containerStatuses"][0]["state"]["running"].is_object(),
        "the old pod's container is not running any more: {}",
        old_now["status"]
    );
    // Not one of the old pod's datagrams reached the peer once the address was the new pod's.
    let leaked = witness.count(address, OLD, claimed);
    ensure!(
        leaked == 0,
        "{leaked} of the old pod's datagrams reached the peer from {address} after {new_name} \
         was given it"
    );

    // ipq saw it: the conflict is counted and listed.
    let conflicts: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "conflicts"])?)?;
    let listed = conflicts
        .as_array()
        .or_else(|| conflicts["conflicts"].as_array())
        .is_some_and(|all| {
            all.iter()
                .any(|c| c["address"] == POD_ADDRESS && c["kind"].as_str() == Some("early_reuse"))
        });
    ensure!(
        listed,
        "ipq conflicts lists no early reuse of {address}: {conflicts}"
    );
    let counted = metric(cluster, "ipq_conflicts_total{kind=\"early_reuse\"}")?;
    ensure!(
        counted >= 1.0,
        "ipq_conflicts_total{{kind=\"early_reuse\"}} is {counted}"
    );
    // And says who: the new pod holds the address, the old one is fenced.
    let view = address_view(cluster)?;
    ensure!(
        view["holder"].to_string().contains(&new_name)
            && view["fenced"].to_string().contains(&old_name),
        "ipq get {address}: {view}"
    );
    Ok(Rollout {
        witness,
        old_name,
        new_name,
        claimed,
    })
}

/// What the rollout scenario leaves for the next one: the new pod holding the address, the old
/// one still terminating and fenced.
struct Rollout {
    witness: Witness,
    old_name: String,
    new_name: String,
    claimed: Instant,
}

/// `ipq -o json get <the pod address>`.
fn address_view(cluster: &Cluster) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&ipq(
        cluster,
        &["-o", "json", "get", POD_ADDRESS],
    )?)?)
}

/// `kubectl delete pod --force --grace-period=0` of the old pod while its container still runs:
/// the Pod object is gone at once, but the kubelet goes on with the termination it had started
/// (900 s of grace), so the container lives on with the address, out of the API's sight. No
/// stale holder is reachable: ipq keeps it fenced (its pings are still being dropped), the new
/// pod keeps the address and its traffic, and not one of the old pod's pings reached the peer.
fn force_delete_leaves_no_stale_holder_reachable(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let address: IpAddr = POD_ADDRESS.parse()?;
    cluster.kubectl().run(&[
        "-n",
        "default",
        "delete",
        "pod",
        &rollout.old_name,
        "--force",
        "--grace-period=0",
    ])?;
    ensure!(
        !sender_pods(cluster)?
            .iter()
            .any(|p| p["metadata"]["name"] == rollout.old_name.as_str()),
        "the force-deleted pod {} is still in the API",
        rollout.old_name
    );
    // It was terminating already (the rollout's), so the kubelet goes on waiting out its
    // grace: its container must still run, or what follows tests a plain quarantine.
    tasks::ensure_running(
        &cluster.host,
        &rollout.old_name,
        "right after the force delete",
    )?;
    let deleted = Instant::now();
    // The stale holder still sends, and ipq still drops it.
    let fenced_before = fenced_drops(cluster)?;
    ipq_tests::lab::poll(
        "ipq to go on dropping the force-deleted pod's pings",
        Duration::from_secs(60),
        || Ok((fenced_drops(cluster)? >= fenced_before + 3.0).then_some(())),
    )?;
    let view = address_view(cluster)?;
    ensure!(
        view["holder"].to_string().contains(&rollout.new_name)
            && view["fenced"].to_string().contains(&rollout.old_name),
        "after the force delete, ipq get {address}: {view}"
    );
    ipq_tests::lab::poll(
        "the new pod's pings after the force delete",
        Duration::from_secs(60),
        || Ok((rollout.witness.count(address, NEW, deleted) >= 3).then_some(())),
    )?;
    let leaked = rollout.witness.count(address, OLD, rollout.claimed);
    ensure!(
        leaked == 0,
        "{leaked} of the old pod's pings reached the peer from {address}"
    );
    Ok(())
}

/// The agent's metrics, scraped on the node as Prometheus and the kubelet's probes reach them.
fn metrics(cluster: &Cluster) -> anyhow::Result<String> {
    let out = cluster
        .host
        .command("curl")
        .args(["-sf", &format!("http://{NODE_IP}:9740/metrics")])
        .output()?;
    ensure!(out.status.success(), "curl of the agent's metrics: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sum of the samples whose series starts with `series` (labels in the given order first).
fn metric(cluster: &Cluster, series: &str) -> anyhow::Result<f64> {
    let text = metrics(cluster)?;
    let (name, labels) = series.split_once('{').unwrap_or((series, ""));
    let wanted: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty())
        .collect();
    Ok(text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(key, _)| {
            key.split('{').next() == Some(name) && wanted.iter().all(|w| key.contains(w))
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum())
}

/// Packets ipq dropped because their holder was fenced, every hook.
fn fenced_drops(cluster: &Cluster) -> anyhow::Result<f64> {
    metric(cluster, "ipq_dropped_packets_total{reason=\"fenced\"}")
}
