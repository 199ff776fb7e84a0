//! ipq installed on the cluster as docs/kubernetes.md tells users: its image (made here, see
//! [`super::image`]) imported into the node's containerd, then `helm install ipq
//! deploy/helm/ipq --namespace ipq-system --create-namespace` with the image and the API
//! server's address as the only values ([`tier_values`]), and the DaemonSet waited for. The
//! chart's default rendering is `deploy/kubernetes/`, field for field (the host suite's
//! `helm_chart` tests), so this is also what `kubectl apply -f deploy/kubernetes/` installs.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use serde_json::Value;

use super::{image, kubectl::pod_ready, node, Cluster};

pub const NAMESPACE: &str = "ipq-system";
pub const DAEMONSET: &str = "ipq-agent";
/// The labels of the DaemonSet's pods.
pub const AGENT_SELECTOR: &str = "app.kubernetes.io/name=ipq,app.kubernetes.io/component=agent";

/// The repository's `deploy/kubernetes/`.
pub fn manifests_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The `type` of every plugin of the conflist at `path` on `host`, in order: what ipq's init
/// step chained ipq-cni into.
pub fn chained_plugins(host: &super::host::Host, path: &str) -> anyhow::Result<Vec<String>> {
    let text = host.read(path)?;
    let conflist: Value =
        serde_json::from_str(&text).with_context(|| format!("{path} is not JSON: {text}"))?;
    Ok(conflist["plugins"]
        .as_array()
        .with_context(|| format!("{path} has no plugins: {text}"))?
        .iter()
        .filter_map(|p| p["type"].as_str().map(str::to_owned))
        .collect())
}

/// Builds and imports ipq's image, installs the chart and waits until the DaemonSet's pod on
/// the node is ready; that pod.
pub fn install_ipq(cluster: &mut Cluster) -> anyhow::Result<Value> {
    install_ipq_with(cluster, "")
}

/// [`install_ipq`] with `extra` (YAML) appended to the tier's values.
pub fn install_ipq_with(cluster: &mut Cluster, extra: &str) -> anyhow::Result<Value> {
    let work = cluster.host.dir().join("ipq-image");
    let archive = image::build(&work)?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    let values = cluster.host.dir().join("ipq-values.yaml");
    std::fs::write(&values, tier_values(cluster.apiserver_url())? + extra)
        .with_context(|| format!("writing {}", values.display()))?;
    cluster.helm()?.install(&values)?;
    wait_daemonset_ready(cluster)
}

/// The chart's values the tier sets: the image made here, and the API server's own address
/// (`apiserver`, its URL as the nodes reach it).
/// The tier runs no kube-proxy, so the `kubernetes` Service's address (what a pod's
/// KUBERNETES_SERVICE_HOST names) leads nowhere: the agent's container is told the API
/// server's address instead, as clusters without kube-proxy (Cilium's replacement) do for
/// host-network pods. Nothing else differs from the defaults.
pub fn tier_values(apiserver: &str) -> anyhow::Result<String> {
    let (repository, tag) = image::IPQ_IMAGE
        .rsplit_once(':')
        .context("the test image has a tag")?;
    let (host, port) = apiserver
        .trim_start_matches("https://")
        .split_once(':')
        .context("the API server's URL has a port")?;
    Ok(format!(
        "image:\n  repository: {repository}\n  tag: {tag}\nextraEnv:\n  \
         - name: KUBERNETES_SERVICE_HOST\n    value: \"{host}\"\n  \
         - name: KUBERNETES_SERVICE_PORT\n    value: \"{port}\"\n"
    ))
}

/// Waits until the DaemonSet has its pod on every node scheduled, updated and ready; the
/// first node's pod.
pub fn wait_daemonset_ready(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let nodes = cluster.node_names().len();
    let waited = cluster.wait_for(
        "the ipq-agent DaemonSet to be ready on every node",
        Duration::from_secs(240),
        &["-n", NAMESPACE, "get", "daemonset", DAEMONSET],
        |ds| {
            let status = &ds["status"];
            let generation = &ds["metadata"]["generation"];
            status["observedGeneration"] == *generation
                && status["desiredNumberScheduled"] == nodes
                && status["updatedNumberScheduled"] == nodes
                && status["numberReady"] == nodes
                && status["numberUnavailable"].as_u64().unwrap_or(0) == 0
        },
    );
    waited.with_context(|| diagnose(cluster))?;
    agent_pod(cluster)
}

/// What an operator would look at when the DaemonSet does not come up: the pods as `kubectl
/// describe` shows them (events included) and each container's log.
pub fn diagnose(cluster: &Cluster) -> String {
    let kubectl = cluster.kubectl();
    let mut report = String::new();
    let text = |result: anyhow::Result<String>| result.unwrap_or_else(|e| format!("{e:#}"));
    let describe = text(kubectl.run(&["-n", NAMESPACE, "describe", "daemonset,pods"]));
    report += &format!("kubectl -n {NAMESPACE} describe daemonset,pods:\n{describe}\n");
    for container in ["mount-bpffs", "install-cni", "agent"] {
        let logs = text(kubectl.run(&[
            "-n",
            NAMESPACE,
            "logs",
            "ds/ipq-agent",
            "-c",
            container,
            "--tail=30",
        ]));
        report += &format!("logs of {container}:\n{logs}\n");
    }
    report
}

/// The DaemonSet's ready pod on the first node.
pub fn agent_pod(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let first = cluster.node_names()[0].to_owned();
    agent_pod_on(cluster, &first)
}

/// The DaemonSet's ready pod on `node`.
pub fn agent_pod_on(cluster: &Cluster, node: &str) -> anyhow::Result<Value> {
    let pods = cluster
        .kubectl()
        .json(&["-n", NAMESPACE, "get", "pods", "-l", AGENT_SELECTOR])?;
    pods["items"]
        .as_array()
        .and_then(|items| {
            items.iter().find(|p| {
                pod_ready(p)
                    && p["metadata"]["deletionTimestamp"].is_null()
                    && p["spec"]["nodeName"] == node
            })
        })
        .cloned()
        .with_context(|| format!("no ready ipq-agent pod on {node}: {pods}"))
}

/// `kubectl -n ipq-system exec <the agent's pod on node> -- ipq <args>`.
pub fn ipq_on(cluster: &Cluster, node: &str, args: &[&str]) -> anyhow::Result<String> {
    let pod = agent_pod_on(cluster, node)?;
    let name = pod["metadata"]["name"].as_str().context("the pod's name")?;
    let mut all = vec!["-n", NAMESPACE, "exec", name, "-c", "agent", "--", "ipq"];
    all.extend(args);
    cluster.kubectl().run(&all)
}

/// `kubectl -n ipq-system exec ds/ipq-agent -- ipq <args>`: what an operator runs.
pub fn ipq(cluster: &Cluster, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec![
        "-n",
        NAMESPACE,
        "exec",
        "ds/ipq-agent",
        "-c",
        "agent",
        "--",
        "ipq",
    ];
    all.extend(args);
    cluster.kubectl().run(&all)
}
