//! Each node's agent writes only its own objects (#37·3): deploy/kubernetes/16-admission-policy.yaml
//! (a ValidatingAdmissionPolicy, applied with the rest of `deploy/kubernetes/`) refuses the
//! ipq-agent service account any NodeQuarantine but its node's, and any whereabouts reservation
//! but its node's own (or a metadata-only label of another). The agent's own writes pass it:
//! every scenario of the tier runs with it.
//!
//! The other node's object, written by hand as that node's agent would, is also what this
//! node's `ipq status` must show in its cluster-wide view (#39·6).
//!
//! The token is the one a compromised node would hold: `kubectl create token ipq-agent
//! --bound-object-kind Pod` bound to the agent pod of this node (the API server puts the pod's
//! node in it). Each refusal is checked with `--dry-run=server` (admission runs, nothing is
//! stored), beside a request of the same token the policy lets through, so that a refusal is
//! the policy's and not RBAC's.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    control_plane::APISERVER_URL,
    deploy::{self, NAMESPACE},
    kubectl::Kubectl,
    node::NODE_NAME,
    whereabouts, Cluster,
};
use serde_json::json;

/// The policy's name, which the API server quotes in a refusal.
const POLICY: &str = "ipq-agent-own-node";
/// A second node made by hand, with its NodeQuarantine.
const OTHER_NODE: &str = "ipq-other-node";
/// A reservation of another pod's.
const OTHER_RESERVATION: &str = "10.88.0.99";
/// The address the other node's NodeQuarantine lists.
const OTHER_ADDRESS: &str = "10.244.7.7";

/// A kubeconfig for `token`, with the cluster's CA and API server.
fn token_kubeconfig(cluster: &Cluster, token: &str, name: &str) -> anyhow::Result<PathBuf> {
    let ca = cluster.kubectl().run(&[
        "config",
        "view",
        "--raw",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority}",
    ])?;
    let path = cluster.host.dir().join(format!("{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             {APISERVER_URL}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    \
             token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n",
            token = token.trim()
        ),
    )?;
    Ok(path)
}

/// Fails unless `result` is the policy's refusal saying `says`.
fn refused(what: &str, result: anyhow::Result<String>, says: &str) -> anyhow::Result<()> {
    match result {
        Ok(out) => anyhow::bail!("{what}: accepted ({out})"),
        Err(e) => {
            let text = format!("{e:#}");
            ensure!(
                text.contains(POLICY) && text.contains(says),
                "{what}: refused, but not by {POLICY} saying {says:?}: {text}"
            );
            Ok(())
        }
    }
}

/// The node-bound token of the agent pod of this node is refused on another node's
/// NodeQuarantine and on another pod's reservation, and accepted on its own; an unbound token
/// of the same service account is refused everywhere (what a cluster without node-bound tokens
/// sees). Needs whereabouts' CRDs and the RBAC of deploy/kubernetes/whereabouts/.
pub fn a_nodes_token_is_refused_on_other_nodes_objects(
    cluster: &mut Cluster,
) -> anyhow::Result<()> {
    let admin = cluster.kubectl();
    admin.apply(
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER_NODE}}).to_string(),
    )?;
    admin.apply(
        &json!({
            "apiVersion": "ipq.dev/v1alpha1", "kind": "NodeQuarantine",
            "metadata": {"name": OTHER_NODE}, "spec": {},
        })
        .to_string(),
    )?;
    // What that node's agent would publish: one quarantined address (the admin writes it).
    let other_status = json!({"status": {
        "nodeName": OTHER_NODE, "quarantined": 1, "fenced": 0,
        "entries": [{"address": OTHER_ADDRESS, "state": "quarantined",
                     "since": "2026-01-01T00:00:00Z",
                     "holder": {"namespace": "default", "pod": "web-gone"}}],
    }})
    .to_string();
    admin.run(&[
        "patch",
        "nodequarantines",
        OTHER_NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &other_status,
    ])?;
    admin.apply(
        &json!({
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
            "kind": "OverlappingRangeIPReservation",
            "metadata": {"name": OTHER_RESERVATION, "namespace": whereabouts::NAMESPACE},
            "spec": {"podref": "default/someone-else", "ifname": "eth0"},
        })
        .to_string(),
    )?;

    let agent = deploy::agent_pod(cluster)?;
    let pod = agent["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_owned();
    let uid = agent["metadata"]["uid"].as_str().context("uid")?.to_owned();
    let bound = cluster.kubectl().run(&[
        "-n",
        NAMESPACE,
        "create",
        "token",
        "ipq-agent",
        "--duration=600s",
        "--bound-object-kind=Pod",
        &format!("--bound-object-name={pod}"),
        &format!("--bound-object-uid={uid}"),
    ])?;
    let unbound = cluster.kubectl().run(&[
        "-n",
        NAMESPACE,
        "create",
        "token",
        "ipq-agent",
        "--duration=600s",
    ])?;
    let as_node = Kubectl::new(
        &cluster.host,
        token_kubeconfig(cluster, &bound, "node-a-agent")?,
    )?;
    let as_nobody = Kubectl::new(
        &cluster.host,
        token_kubeconfig(cluster, &unbound, "unbound-agent")?,
    )?;

    // The premise: the API server put this node in the pod-bound token's identity.
    let whoami = as_node.json(&["auth", "whoami"])?;
    ensure!(
        whoami["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"][0]
            == NODE_NAME,
        "the pod-bound token's identity names no node: {whoami}"
    );

    let status_patch = json!({"status": {}}).to_string();
    let patch_status = |kubectl: &Kubectl<'_>, node: &str| {
        kubectl.run(&[
            "patch",
            "nodequarantines",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status_patch,
            "--dry-run=server",
        ])
    };
    patch_status(&as_node, NODE_NAME).context("the agent's token on its own NodeQuarantine")?;
    refused(
        "the agent's token on another node's NodeQuarantine status",
        patch_status(&as_node, OTHER_NODE),
        &format!("may write only NodeQuarantine {NODE_NAME}, not {OTHER_NODE}"),
    )?;
    let label = json!({"metadata": {"labels": {"x": "y"}}}).to_string();
    refused(
        "the agent's token patching another node's NodeQuarantine",
        as_node.run(&[
            "patch",
            "nodequarantines",
            OTHER_NODE,
            "--type=merge",
            "-p",
            &label,
            "--dry-run=server",
        ]),
        "may write only NodeQuarantine",
    )?;

    let reservations = "overlappingrangeipreservations.whereabouts.cni.cncf.io";
    let own = |node: &str| {
        json!({
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
            "kind": "OverlappingRangeIPReservation",
            "metadata": {"name": "10.88.0.98", "namespace": whereabouts::NAMESPACE,
                         "labels": {"ipq.dev/node": node}},
            "spec": {"podref": format!("ipq.dev:quarantine/{node}"), "ifname": "ipq-quarantine"},
        })
        .to_string()
    };
    let create = |kubectl: &Kubectl<'_>, node: &str| -> anyhow::Result<String> {
        let body = own(node);
        let file = cluster
            .host
            .dir()
            .join(format!("own-reservation-{node}.json"));
        std::fs::write(&file, body)?;
        kubectl.run(&["create", "-f", &file.to_string_lossy(), "--dry-run=server"])
    };
    create(&as_node, NODE_NAME).context("the agent's token making its node's own reservation")?;
    refused(
        "the agent's token making another node's reservation",
        create(&as_node, OTHER_NODE),
        "may create or delete only its own reservations",
    )?;
    refused(
        "the agent's token deleting another pod's reservation",
        as_node.run(&[
            "-n",
            whereabouts::NAMESPACE,
            "delete",
            reservations,
            OTHER_RESERVATION,
            "--dry-run=server",
        ]),
        "may create or delete only its own reservations",
    )?;
    let spec = json!({"spec": {"podref": format!("ipq.dev:quarantine/{NODE_NAME}")}}).to_string();
    refused(
        "the agent's token taking another pod's reservation over",
        as_node.run(&[
            "-n",
            whereabouts::NAMESPACE,
            "patch",
            reservations,
            OTHER_RESERVATION,
            "--type=merge",
            "-p",
            &spec,
            "--dry-run=server",
        ]),
        "not change its spec",
    )?;
    let watched = json!({"metadata": {"labels": {"ipq.dev/node": NODE_NAME}}}).to_string();
    as_node
        .run(&[
            "-n",
            whereabouts::NAMESPACE,
            "patch",
            reservations,
            OTHER_RESERVATION,
            "--type=merge",
            "-p",
            &watched,
            "--dry-run=server",
        ])
        .context("the agent's token labelling a reservation as watched by its node")?;

    // A token of the same service account that names no node: refused even on its own node's.
    refused(
        "an unbound token on the node's own NodeQuarantine",
        patch_status(&as_nobody, NODE_NAME),
        "this token names no node",
    )?;

    // The cluster-wide view (#39·6): this node's agent lists the other node's object (RBAC
    // `list`, which the policy does not restrict) and `ipq status` shows its quarantine. The
    // agent reads every `READ_EVERY` (30 s): waited for up to that and a margin.
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&deploy::ipq(cluster, &["-o", "json", "status"])?)?;
        let shown = status["cluster"]["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| {
                n["node"] == OTHER_NODE
                    && n["quarantined"] == 1
                    && n["newest"][0]["address"] == OTHER_ADDRESS
                    && n["newest"][0]["pod"] == "default/web-gone"
            })
        });
        if shown {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "ipq status does not show {OTHER_NODE}'s quarantine of {OTHER_ADDRESS} 45 s after \
             it was written: {}",
            status["cluster"]
        );
        std::thread::sleep(Duration::from_secs(1));
    }

    let admin = cluster.kubectl();
    admin.run(&["delete", "nodequarantines", OTHER_NODE])?;
    admin.run(&["delete", "node", OTHER_NODE])?;
    admin.run(&[
        "-n",
        whereabouts::NAMESPACE,
        "delete",
        reservations,
        OTHER_RESERVATION,
    ])?;
    Ok(())
}
