//! whereabouts v0.9 as the node's IPAM (`cargo xtask setup --for cluster` builds it from its
//! pinned Go module): its CRDs (copied from the module into `target/cluster/crds`), the plugin
//! in the node's `/opt/cni/bin` with its flat config and kubeconfig in
//! `/etc/cni/net.d/whereabouts.d/` (what its install script writes), a conflist of the bridge
//! with whereabouts' IPAM on a range of [`RANGE`] addresses (lexically first, so the runtime
//! uses it and ipq's init step chains ipq-cni into it), and its control loop
//! (`ip-control-loop`) as a host-network DaemonSet with the RBAC of its manifests.
//!
//! A DaemonSet, as whereabouts ships it (doc/crds/daemonset-install.yaml): each node's control
//! loop watches only the pods whose `spec.nodeName` is its own (`NODENAME`), so a single
//! replica would free the addresses of the pods of whichever node it was scheduled on, and
//! of no other.
//!
//! whereabouts' control loop frees a deleted pod's addresses from the NetworkAttachmentDefinition
//! its `k8s.v1.cni.cncf.io/network-status` annotation names (Multus writes it; the tier runs no
//! Multus, so [`pod`] gives each pod the annotation Multus would, naming [`NAD`], whose config
//! is the node's IPAM config).

use std::{fs, path::PathBuf, time::Duration};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use super::{
    control_plane::APISERVER_URL,
    daemon::{bin_dir, component},
    kubectl::pod_ready,
    node::{import_image, BUSYBOX_IMAGE},
    Cluster,
};

/// whereabouts' namespace (its kubeconfig's context, its control loop's
/// `WHEREABOUTS_NAMESPACE`): where its manifests install it.
pub const NAMESPACE: &str = "kube-system";
/// The NetworkAttachmentDefinition (in `default`) the pods' network-status names.
pub const NAD: &str = "wb";
/// The range whereabouts hands out: two addresses, so that reuse is forced.
pub const RANGE_START: &str = "10.88.0.20";
pub const RANGE_END: &str = "10.88.0.21";
pub const RANGE: usize = 2;
/// whereabouts' IPPool of the range (`IPPoolName`: the CIDR normalized).
pub const POOL: &str = "10.88.0.0-24";
const CONFLIST: &str = "/etc/cni/net.d/05-whereabouts.conflist";
const CONFIG_DIR: &str = "/etc/cni/net.d/whereabouts.d";
const CONTROL_LOOP_IMAGE: &str = "ipq.test/whereabouts-control-loop:cluster-tier";
/// The labels of the control loop's pods.
pub const CONTROL_LOOP_SELECTOR: &str = "app=whereabouts-control-loop";

/// The IPAM section both the node's conflist and the NAD carry.
fn ipam() -> Value {
    json!({
        "type": "whereabouts",
        "range": "10.88.0.0/24",
        "range_start": RANGE_START,
        "range_end": RANGE_END,
        "gateway": "10.88.0.1",
        "routes": [{"dst": "0.0.0.0/0"}],
        "kubernetes": {"kubeconfig": format!("{CONFIG_DIR}/whereabouts.kubeconfig")},
    })
}

/// `target/cluster/crds`, where setup copies the CRDs.
fn crd_dir() -> PathBuf {
    bin_dir().join("../crds")
}

/// Installs whereabouts on the cluster; run before ipq's install, whose init step chains
/// ipq-cni into the conflist written here.
pub fn install(cluster: &mut Cluster) -> anyhow::Result<()> {
    let crds = crd_dir();
    if !crds
        .join("whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml")
        .is_file()
    {
        bail!(
            "{} lacks whereabouts' CRDs: `cargo xtask setup --for cluster` copies them",
            crds.display()
        );
    }
    let kubectl = cluster.kubectl();
    kubectl.run(&["apply", "-f", &crds.to_string_lossy()])?;
    kubectl.run(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/ippools.whereabouts.cni.cncf.io",
        "crd/overlappingrangeipreservations.whereabouts.cni.cncf.io",
        "crd/network-attachment-definitions.k8s.cni.cncf.io",
    ])?;
    let bridge = if cluster.other_hosts.is_empty() {
        "cni0"
    } else {
        shared_segment(cluster)?;
        SHARED_BRIDGE
    };
    for index in 0..cluster.node_names().len() {
        install_on_node(cluster, cluster.host_at(index), bridge)?;
    }
    let nad_config = json!({
        "cniVersion": "1.0.0",
        "name": NAD,
        "type": "bridge",
        "bridge": bridge,
        "ipam": ipam(),
    });
    let nad = json!({
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": NAD, "namespace": "default"},
        "spec": {"config": nad_config.to_string()},
    });
    cluster.kubectl().apply(&nad.to_string())?;
    start_control_loop(cluster)
}

/// The node-side bridge of whereabouts' network on a cluster of several nodes: its port
/// `eth1` is each node's second uplink, a port of the segment's `br1`.
pub const SHARED_BRIDGE: &str = "wb0";
/// The second uplink of every node, on the L2 whereabouts' range is shared on.
pub const SHARED_UPLINK: &str = "eth1";

/// On a cluster of several nodes, the range is one L2 across them: a second bridge (`br1`) in
/// the peer's namespace holding the range's gateway 10.88.0.1 (the peer, where the witness
/// counts), and on each node a bridge [`SHARED_BRIDGE`] whose port [`SHARED_UPLINK`] is a port
/// of `br1`; the bridge plugin puts the pods' veths on [`SHARED_BRIDGE`].
fn shared_segment(cluster: &Cluster) -> anyhow::Result<()> {
    let segment = cluster
        .segment
        .as_ref()
        .context("a cluster of several nodes has a segment")?;
    segment.add_bridge("br1", Some("10.88.0.1/24"))?;
    for host in cluster.hosts() {
        segment.plug_into("br1", &host.node, SHARED_UPLINK, None)?;
        let node = &host.node;
        node.ip(&["link", "add", SHARED_BRIDGE, "type", "bridge"])?;
        node.ip(&[
            "link",
            "set",
            SHARED_BRIDGE,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        node.ip(&["link", "set", SHARED_UPLINK, "master", SHARED_BRIDGE])?;
        node.ip(&["link", "set", SHARED_BRIDGE, "up"])?;
    }
    Ok(())
}

/// The plugin, its flat config and kubeconfig, and the conflist, in `host`'s mount namespace;
/// the pods' veths on `bridge`.
fn install_on_node(
    cluster: &Cluster,
    host: &super::host::Host,
    bridge: &str,
) -> anyhow::Result<()> {
    let dir = host.dir().join("whereabouts");
    fs::create_dir_all(&dir)?;
    // The admin's credentials, with whereabouts' namespace as the context's: the plugin keeps
    // its pools and reservations in the context's namespace.
    let admin = fs::read_to_string(cluster.admin_kubeconfig())?;
    let kubeconfig = admin.replacen(
        "    user: user\n",
        &format!("    user: user\n    namespace: {NAMESPACE}\n"),
        1,
    );
    if kubeconfig == admin {
        bail!("the admin kubeconfig has no context to set a namespace in:\n{admin}");
    }
    // Every node dials the API server where the cluster says it is reached.
    let kubeconfig = kubeconfig.replace(APISERVER_URL, cluster.apiserver_url());
    fs::write(dir.join("whereabouts.kubeconfig"), kubeconfig)?;
    // What whereabouts' install script writes; its control loop reads the reconciler's
    // schedule from it (daily, as shipped: it does not run during the test).
    let flat = json!({
        "datastore": "kubernetes",
        "kubernetes": {"kubeconfig": format!("{CONFIG_DIR}/whereabouts.kubeconfig")},
        "reconciler_cron_expression": "30 4 * * *",
    });
    fs::write(dir.join("whereabouts.conf"), flat.to_string())?;
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "ipq-whereabouts",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                // The one-node tier's node is its pods' gateway; across nodes the peer is.
                "isGateway": bridge == "cni0",
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": ipam(),
            },
        ],
    });
    fs::write(dir.join("conflist.json"), conflist.to_string())?;
    let script = format!(
        "set -e
        cp {plugin} /opt/cni/bin/whereabouts
        mkdir -p {CONFIG_DIR}
        cp {dir}/whereabouts.kubeconfig {dir}/whereabouts.conf {CONFIG_DIR}/
        cp {dir}/conflist.json {CONFLIST}",
        plugin = component("whereabouts")?.display(),
        dir = dir.display(),
    );
    let mut cmd = host.command("sh");
    cmd.args(["-c", &script]);
    let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "installing whereabouts on the node: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `ip-control-loop` as whereabouts' DaemonSet runs it (its service account and RBAC, the
/// node's `/etc/cni/net.d` at `/host/etc/cni/net.d`), in an image of its one static binary.
fn start_control_loop(cluster: &mut Cluster) -> anyhow::Result<()> {
    let work = cluster.host.dir().join("whereabouts-image");
    let rootfs = work.join("rootfs");
    fs::create_dir_all(rootfs.join("tmp"))?;
    fs::copy(
        component("ip-control-loop")?,
        rootfs.join("ip-control-loop"),
    )?;
    let archive = crate::oci::archive(
        &rootfs,
        &work,
        CONTROL_LOOP_IMAGE,
        &["/ip-control-loop"],
        &["PATH=/"],
    )?;
    for host in cluster.hosts() {
        import_image(host, &archive)?;
    }
    let url = cluster.apiserver_url().to_owned();
    let (host, port) = url
        .trim_start_matches("https://")
        .split_once(':')
        .context("the API server's URL has a port")?;
    cluster
        .kubectl()
        .apply(&control_loop_manifests(host, port))?;
    let nodes = cluster.node_names().len();
    cluster
        .wait_for(
            "whereabouts' control loop to run on every node",
            Duration::from_secs(120),
            &["-n", NAMESPACE, "get", "pods", "-l", CONTROL_LOOP_SELECTOR],
            |pods| {
                pods["items"]
                    .as_array()
                    .is_some_and(|items| items.iter().filter(|p| pod_ready(p)).count() == nodes)
            },
        )
        .map(|_| ())
}

/// The RBAC of whereabouts' doc/crds/daemonset-install.yaml (v0.9.2) and the control loop's
/// DaemonSet. The tier runs no kube-proxy: the API server's own address is given, as for
/// ipq's agent.
fn control_loop_manifests(host: &str, port: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: whereabouts
  namespace: {NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: whereabouts-cni
rules:
  - apiGroups: [whereabouts.cni.cncf.io]
    resources: [ippools, overlappingrangeipreservations, nodeslicepools]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: ["*"]
  - apiGroups: [""]
    resources: [pods]
    verbs: [list, watch, get]
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, watch]
  - apiGroups: [k8s.cni.cncf.io]
    resources: [network-attachment-definitions]
    verbs: [get, list, watch]
  - apiGroups: ["", events.k8s.io]
    resources: [events]
    verbs: [create, patch, update, get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: whereabouts
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: whereabouts-cni
subjects:
  - kind: ServiceAccount
    name: whereabouts
    namespace: {NAMESPACE}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: whereabouts-control-loop
  namespace: {NAMESPACE}
spec:
  selector:
    matchLabels: {{app: whereabouts-control-loop}}
  template:
    metadata:
      labels: {{app: whereabouts-control-loop}}
    spec:
      hostNetwork: true
      serviceAccountName: whereabouts
      containers:
        - name: control-loop
          image: {CONTROL_LOOP_IMAGE}
          imagePullPolicy: Never
          command: [/ip-control-loop, -log-level, debug]
          env:
            - name: NODENAME
              valueFrom:
                fieldRef: {{fieldPath: spec.nodeName}}
            - name: WHEREABOUTS_NAMESPACE
              value: {NAMESPACE}
            - name: KUBERNETES_SERVICE_HOST
              value: "{host}"
            - name: KUBERNETES_SERVICE_PORT
              value: "{port}"
          volumeMounts:
            - name: cni-net-dir
              mountPath: /host/etc/cni/net.d
      volumes:
        - name: cni-net-dir
          hostPath:
            path: /etc/cni/net.d
"#
    )
}

/// A bare pod on whereabouts' network with the network-status annotation Multus would give
/// it. `ignores_sigterm`: its container stays until killed (the force-delete victim); else it
/// leaves at once on SIGTERM.
pub fn pod(name: &str, ignores_sigterm: bool) -> String {
    let (grace, command) = if ignores_sigterm {
        (900, "trap '' TERM; while true; do sleep 1; done")
    } else {
        (1, "trap 'exit 0' TERM; sleep 2147483647 & wait")
    };
    pod_running(name, grace, command, None)
}

/// [`pod`] on `node`, pinging the range's gateway (the peer, where the witness counts) every
/// 200 ms with a payload of `size` bytes, its signature.
pub fn pod_pinging_on(name: &str, node: &str, ignores_sigterm: bool, size: usize) -> String {
    let (grace, trap) = if ignores_sigterm {
        (900, "trap '' TERM")
    } else {
        (1, "trap 'exit 0' TERM")
    };
    let command = format!("{trap}; while true; do ping -i 0.2 -s {size} 10.88.0.1; sleep 1; done");
    pod_running(name, grace, &command, Some(node))
}

fn pod_running(name: &str, grace: u32, command: &str, node: Option<&str>) -> String {
    let status = json!([{"name": format!("default/{NAD}"), "interface": "eth0", "default": false}]);
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app": "whereabouts-test"},
            "annotations": {"k8s.v1.cni.cncf.io/network-status": status.to_string()},
        },
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", command],
            }],
        },
    });
    let mut pod = pod;
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod.to_string()
}

/// The IPPool's allocations: (address offset key, podRef).
pub fn allocations(cluster: &Cluster) -> anyhow::Result<Vec<(String, String)>> {
    let pool = cluster.kubectl().json(&[
        "-n",
        NAMESPACE,
        "get",
        "ippools.whereabouts.cni.cncf.io",
        POOL,
    ])?;
    Ok(pool["spec"]["allocations"]
        .as_object()
        .map(|all| {
            all.iter()
                .map(|(key, a)| (key.clone(), a["podref"].as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default())
}

/// `addr`'s OverlappingRangeIPReservation, if there is one.
pub fn reservation(cluster: &Cluster, addr: &str) -> Option<Value> {
    cluster
        .kubectl()
        .json(&[
            "-n",
            NAMESPACE,
            "get",
            "overlappingrangeipreservations.whereabouts.cni.cncf.io",
            addr,
        ])
        .ok()
}
