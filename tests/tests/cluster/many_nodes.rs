//! Three nodes on flannel with ipq chained (#37 item 1): ipq's init step chains ipq-cni into
//! flannel's conflist on every node, each node's agent is ready and publishes its own
//! NodeQuarantine (owned by its Node), pods run on every node with flannel's per-node ranges,
//! ipq on each node holds its pod's address, and a pod on the first node reaches a pod on the
//! third through flannel's vxlan overlay. Then the third node lost: its NodeQuarantine is
//! collected with its Node, the others go on.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{self, ipq_on},
    flannel,
    kubectl::pod_ready,
    tasks, workloads, Cluster,
};
use serde_json::Value;

/// ipq installed with helm on every node: the DaemonSet ready on each, ipq-cni chained last
/// into flannel's conflist on each node, `ipq status` ready and enforcing on each.
pub fn ipq_chained_into_flannel_on_every_node(cluster: &mut Cluster) -> anyhow::Result<()> {
    deploy::install_ipq(cluster)?;
    let names: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    for name in &names {
        let host = cluster.host_of(name)?;
        let types = deploy::chained_plugins(host, flannel::CONFLIST)?;
        ensure!(
            types == ["flannel", "portmap", "ipq-cni"],
            "{name}'s {} after ipq's install step: {types:?}",
            flannel::CONFLIST
        );
        ensure!(
            host.exists("/opt/cni/bin/ipq-cni")? && host.exists("/opt/cni/bin/flannel")?,
            "{name}'s /opt/cni/bin lacks ipq-cni or flannel"
        );
        let status: Value =
            serde_json::from_str(&ipq_on(cluster, name, &["-o", "json", "status"])?)?;
        ensure!(
            status["ready"] == true && status["mode"] == "enforce",
            "ipq status on {name}: {status}"
        );
    }
    Ok(())
}

/// Every node's NodeQuarantine: written by that node's agent, owned by that node's Node.
pub fn every_node_publishes_its_own(cluster: &mut Cluster) -> anyhow::Result<()> {
    let names: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    for name in &names {
        let object = cluster.wait_for(
            &format!("{name}'s NodeQuarantine to be published"),
            Duration::from_secs(60),
            &["get", "nodequarantines"],
            |list| {
                list["items"].as_array().is_some_and(|items| {
                    items.iter().any(|o| {
                        o["metadata"]["name"] == name.as_str()
                            && o["status"]["publishedAt"].is_string()
                    })
                })
            },
        )?;
        let object = object["items"]
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .find(|o| o["metadata"]["name"] == name.as_str())
            })
            .context("found above")?;
        let node = cluster.kubectl().json(&["get", "node", name])?;
        let owner = &object["metadata"]["ownerReferences"][0];
        ensure!(
            owner["kind"] == "Node"
                && owner["name"] == name.as_str()
                && owner["uid"] == node["metadata"]["uid"]
                && object["status"]["nodeName"] == name.as_str(),
            "{name}'s NodeQuarantine is not its own: {}",
            object["metadata"]
        );
        let status: Value =
            serde_json::from_str(&ipq_on(cluster, name, &["-o", "json", "status"])?)?;
        ensure!(
            status["publish"]["node"] == name.as_str() && status["publish"]["state"] == "published",
            "ipq status on {name}: {}",
            status["publish"]
        );
    }
    let table = cluster.kubectl().run(&["get", "nodequarantines"])?;
    eprintln!("cluster tier: kubectl get nodequarantines:\n{table}");
    Ok(())
}

/// A pod on every node, each Ready with an address of its node's flannel range and held by
/// that node's agent; the first node's pod pings the last node's through the overlay, and back.
pub fn pods_on_every_node_reach_each_other(cluster: &mut Cluster) -> anyhow::Result<()> {
    let names: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    let pods: Vec<String> = (0..names.len()).map(|i| format!("across-{i}")).collect();
    for (pod, node) in pods.iter().zip(&names) {
        cluster.kubectl().apply(&workloads::pod_on(
            pod,
            node,
            "across",
            1,
            workloads::SLEEPS,
        ))?;
    }
    let count = pods.len();
    let running = cluster.wait_for(
        "a pod Ready on every node",
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=across"],
        |list| {
            list["items"]
                .as_array()
                .is_some_and(|items| items.iter().filter(|p| pod_ready(p)).count() == count)
        },
    )?;
    let mut addresses = Vec::new();
    for (pod, node) in pods.iter().zip(&names) {
        let object = running["items"]
            .as_array()
            .and_then(|items| items.iter().find(|p| p["metadata"]["name"] == pod.as_str()))
            .context("listed above")?;
        let ip = object["status"]["podIP"]
            .as_str()
            .context("a pod IP")?
            .to_owned();
        let cidr = cluster.kubectl().json(&["get", "node", node])?["spec"]["podCIDR"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("{node} has no podCIDR"))?;
        let prefix = cidr.trim_end_matches("0/24");
        ensure!(
            ip.starts_with(prefix) && cidr.ends_with(".0/24"),
            "{pod} on {node} has {ip}, outside its node's range {cidr}"
        );
        let view: Value =
            serde_json::from_str(&ipq_on(cluster, node, &["-o", "json", "get", &ip])?)?;
        ensure!(
            view["state"]
                .as_str()
                .is_some_and(|s| s.eq_ignore_ascii_case("active"))
                && view["holder"].to_string().contains(pod.as_str()),
            "ipq on {node} does not hold {ip} for {pod}: {view}"
        );
        addresses.push(ip);
    }
    // The overlay is flannel's vxlan device on every node.
    for node in &names {
        let link = cluster
            .host_of(node)?
            .node
            .ip(&["-d", "link", "show", "flannel.1"])?;
        ensure!(
            link.contains("vxlan id 1 "),
            "{node}'s flannel.1 is not flannel's vxlan device: {link}"
        );
    }
    let (first, last) = (&pods[0], &pods[count - 1]);
    for (from, to) in [(first, &addresses[count - 1]), (last, &addresses[0])] {
        let out = cluster.kubectl().run(&[
            "-n", "default", "exec", from, "--", "ping", "-c", "3", "-W", "5", to,
        ])?;
        ensure!(
            out.contains("3 packets received"),
            "{from} -> {to} through flannel: {out}"
        );
    }
    eprintln!(
        "cluster tier: {first} ({}) and {last} ({}) reach each other through flannel's vxlan",
        addresses[0],
        addresses[count - 1]
    );
    Ok(())
}

/// A node lost: the third node's kubelet and its ipq agent killed, then its Node deleted. Its
/// NodeQuarantine goes with it (owned by the Node: the garbage collector deletes it), and the
/// other nodes' agents go on enforcing and publishing: a pod deleted on the second node has
/// its address quarantined and listed in that node's NodeQuarantine.
pub fn a_lost_node_is_collected_and_the_others_go_on(cluster: &mut Cluster) -> anyhow::Result<()> {
    lose_the_last_node(cluster)?;
    the_others_go_on(cluster, "across-1")
}

/// The last node lost: its kubelet and its ipq agent killed (its other containers run on, as
/// on a node cut off from the cluster), then its Node deleted; returns once its
/// NodeQuarantine was collected with its Node.
pub fn lose_the_last_node(cluster: &mut Cluster) -> anyhow::Result<()> {
    let names: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    let lost = names.last().context("nodes")?;
    cluster.stop_kubelet(lost)?;
    kill_container(cluster, lost, deploy::NAMESPACE, "agent")?;
    cluster.kubectl().run(&["delete", "node", lost])?;
    cluster.wait_for(
        &format!("{lost}'s NodeQuarantine to be collected with its Node"),
        Duration::from_secs(60),
        &["get", "nodequarantines"],
        |list| {
            list["items"].as_array().is_some_and(|items| {
                !items.iter().any(|o| o["metadata"]["name"] == lost.as_str())
                    && items.len() == names.len() - 1
            })
        },
    )?;
    Ok(())
}

/// Kills the process of the running container `container` of a pod in `namespace` on `node`
/// (SIGKILL, as a node's crash would) and waits until it is gone.
pub fn kill_container(
    cluster: &Cluster,
    node: &str,
    namespace: &str,
    container: &str,
) -> anyhow::Result<()> {
    let pid = tasks::running_pid(cluster.host_of(node)?, namespace, container)?;
    // SAFETY: kill has no memory-safety preconditions; the pid is the container's, read just
    // now.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    ipq_tests::lab::poll(
        &format!("{node}'s {namespace}/{container} to be gone"),
        Duration::from_secs(30),
        || Ok((!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())),
    )
}

/// After the last node was lost ([`lose_the_last_node`]), the others go on: `pod`, on the
/// second node, deleted, has its address listed as quarantined in that node's NodeQuarantine,
/// and every other node's agent is ready, enforcing and published.
pub fn the_others_go_on(cluster: &mut Cluster, pod: &str) -> anyhow::Result<()> {
    let names: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    let (lost, others) = names.split_last().context("nodes")?;
    let second = &others[1];
    let address = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pod", pod])?["status"]["podIP"]
        .as_str()
        .context("the pod's address")?
        .to_owned();
    cluster
        .kubectl()
        .run(&["-n", "default", "delete", "pod", pod, "--wait"])?;
    cluster.wait_for(
        &format!("{second}'s NodeQuarantine to list {address} as quarantined"),
        Duration::from_secs(30),
        &["get", "nodequarantines", second],
        |o| {
            o["status"]["entries"].as_array().is_some_and(|entries| {
                entries
                    .iter()
                    .any(|e| e["address"] == address.as_str() && e["state"] == "quarantined")
            })
        },
    )?;
    for name in others {
        let status: Value =
            serde_json::from_str(&ipq_on(cluster, name, &["-o", "json", "status"])?)?;
        ensure!(
            status["ready"] == true
                && status["mode"] == "enforce"
                && status["publish"]["state"] == "published",
            "ipq status on {name} after {lost} was lost: {status}"
        );
    }
    Ok(())
}
