//! flannel as the pod network of a cluster of several nodes, installed the way kube-flannel's
//! manifest (v0.28) installs it: a hostNetwork DaemonSet in `kube-flannel` running
//! `flanneld --ip-masq --kube-subnet-mgr` (each Node's `spec.podCIDR`, given by the controller
//! manager's `--allocate-node-cidrs`, is its subnet), its init containers copying the `flannel`
//! CNI plugin into the node's `/opt/cni/bin` and the ConfigMap's `cni-conf.json` to
//! `/etc/cni/net.d/10-flannel.conflist`, and `net-conf.json` naming the backend: vxlan,
//! flannel's default (the kernel here has it). The plugin delegates to bridge + host-local
//! (Debian's, linked into `/opt/cni/bin` by the node), and ipq's init step chains ipq-cni
//! into that conflist.
//!
//! The image is made here from the binaries `cargo xtask setup --for cluster` builds from their
//! Go modules (no registry is reachable): flanneld (cgo) with the libraries it links, the
//! plugin, busybox for the init containers' `cp`, and the `iptables` (nft) and `nft` that
//! flanneld runs for its masquerade and forward rules, with their libraries and iptables'
//! extensions.

use std::{
    fs,
    net::Ipv4Addr,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use super::{
    daemon::component, host::Host, image::copy_linked_libraries, kubectl::pod_ready, node, Cluster,
};

pub const NAMESPACE: &str = "kube-flannel";
pub const DAEMONSET: &str = "kube-flannel-ds";
/// The cluster's pod range (`--cluster-cidr`, net-conf.json's `Network`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The conflist flannel's init container writes, and ipq's init step chains into.
pub const CONFLIST: &str = "/etc/cni/net.d/10-flannel.conflist";
const IMAGE: &str = "ipq.test/flannel:cluster-tier";
/// Where host-local keeps a flannel node's allocations (one file per address): flannel's
/// plugin delegates to host-local without a `dataDir`, so under the conflist's network name.
pub const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks/cbr0";
/// Where Debian keeps iptables' extensions (loaded by name at run time).
const XTABLES_DIR: &str = "/usr/lib/x86_64-linux-gnu/xtables";

/// Builds flannel's image, imports it on every node, applies kube-flannel's manifests and
/// waits until flannel runs on every node and every node is Ready.
pub fn install(cluster: &mut Cluster) -> anyhow::Result<()> {
    let archive = build_image(&cluster.host.dir().join("flannel-image"))?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    let url = cluster.apiserver_url().to_owned();
    let (host, port) = url
        .trim_start_matches("https://")
        .split_once(':')
        .context("the API server's URL has a port")?;
    cluster.kubectl().apply(&manifests(host, port))?;
    let nodes = cluster.node_names().len();
    cluster.wait_for(
        "flannel to run on every node",
        Duration::from_secs(240),
        &["-n", NAMESPACE, "get", "pods", "-l", "app=flannel"],
        |pods| {
            pods["items"]
                .as_array()
                .is_some_and(|items| items.iter().filter(|p| pod_ready(p)).count() == nodes)
        },
    )?;
    cluster.wait_nodes_ready()
}

/// Frees `address` in host-local's store on the node of `host` and points its round robin
/// (`last_reserved_ip.0`: the one range) just before it, so that the next pod on that node is
/// given it: what an IPAM that frees a terminating pod's address too early does, the
/// incident, made on purpose. The address must be allocated (its file is removed).
pub fn hand_out_again(host: &Host, address: Ipv4Addr) -> anyhow::Result<()> {
    host.remove(&format!("{HOST_LOCAL_DIR}/{address}"))
        .with_context(|| format!("freeing {address} in host-local's store"))?;
    let before = Ipv4Addr::from(u32::from(address) - 1);
    let script = format!("printf %s {before} > {HOST_LOCAL_DIR}/last_reserved_ip.0");
    crate::netns::output_of(host.command("sh").args(["-c", &script]))
        .with_context(|| format!("pointing host-local's round robin at {address}"))?;
    Ok(())
}

/// flannel's image: `/opt/bin/flanneld`, `/flannel` (the CNI plugin), busybox, iptables, nft.
fn build_image(work: &Path) -> anyhow::Result<PathBuf> {
    let rootfs = work.join("rootfs");
    for dir in ["bin", "opt/bin", "etc", "tmp", "run", "proc", "sys", "dev"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    let flanneld = component("flanneld")?;
    fs::copy(&flanneld, rootfs.join("opt/bin/flanneld"))?;
    fs::copy(component("flannel")?, rootfs.join("flannel"))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("copying /bin/busybox (install busybox-static)")?;
    for applet in ["sh", "cp", "mkdir", "cat", "ls"] {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    let mut executables = vec![flanneld];
    for (file, names) in [
        (
            "/usr/sbin/xtables-nft-multi",
            &[
                "iptables",
                "iptables-save",
                "iptables-restore",
                "ip6tables",
                "ip6tables-save",
                "ip6tables-restore",
            ][..],
        ),
        ("/usr/sbin/nft", &["nft"][..]),
    ] {
        let inside = rootfs.join(file.trim_start_matches('/'));
        fs::create_dir_all(inside.parent().context("in a directory")?)?;
        fs::copy(file, &inside)
            .with_context(|| format!("copying {file} (install iptables, nftables)"))?;
        for name in names {
            symlink(file, rootfs.join("bin").join(name))?;
        }
        executables.push(PathBuf::from(file));
    }
    let extensions = rootfs.join(XTABLES_DIR.trim_start_matches('/'));
    fs::create_dir_all(&extensions)?;
    for entry in fs::read_dir(XTABLES_DIR).with_context(|| format!("reading {XTABLES_DIR}"))? {
        let entry = entry?;
        let path = fs::canonicalize(entry.path())?;
        fs::copy(&path, extensions.join(entry.file_name()))?;
        executables.push(path);
    }
    copy_linked_libraries(&rootfs, &executables)?;
    for file in ["/etc/protocols", "/etc/ethertypes"] {
        if Path::new(file).is_file() {
            fs::copy(file, rootfs.join(file.trim_start_matches('/')))?;
        }
    }
    crate::oci::archive(
        &rootfs,
        work,
        IMAGE,
        &["/opt/bin/flanneld"],
        &["PATH=/bin:/opt/bin"],
    )
}

/// kube-flannel.yml (v0.28) with the image made here and, as for every host-network pod of
/// the tier (no kube-proxy), the API server's own address. Its `cni-conf.json` is
/// kube-flannel's, cniVersion 0.3.1 included: ipq-cni is chained into it as users have it.
fn manifests(apiserver_host: &str, apiserver_port: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
  labels:
    pod-security.kubernetes.io/enforce: privileged
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: flannel
  namespace: {NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: flannel
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get]
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [nodes/status]
    verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: flannel
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: flannel
subjects:
  - kind: ServiceAccount
    name: flannel
    namespace: {NAMESPACE}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-flannel-cfg
  namespace: {NAMESPACE}
  labels: {{tier: node, app: flannel}}
data:
  cni-conf.json: |
    {{
      "name": "cbr0",
      "cniVersion": "0.3.1",
      "plugins": [
        {{"type": "flannel", "delegate": {{"hairpinMode": true, "isDefaultGateway": true}}}},
        {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
      ]
    }}
  net-conf.json: |
    {{
      "Network": "{CLUSTER_CIDR}",
      "EnableNFTables": false,
      "Backend": {{"Type": "vxlan"}}
    }}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {DAEMONSET}
  namespace: {NAMESPACE}
  labels: {{tier: node, app: flannel}}
spec:
  selector:
    matchLabels: {{app: flannel}}
  template:
    metadata:
      labels: {{tier: node, app: flannel}}
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations:
        - operator: Exists
          effect: NoSchedule
      serviceAccountName: flannel
      initContainers:
        - name: install-cni-plugin
          image: {IMAGE}
          imagePullPolicy: Never
          command: [cp]
          args: [-f, /flannel, /opt/cni/bin/flannel]
          volumeMounts:
            - {{name: cni-plugin, mountPath: /opt/cni/bin}}
        - name: install-cni
          image: {IMAGE}
          imagePullPolicy: Never
          command: [cp]
          args: [-f, /etc/kube-flannel/cni-conf.json, /etc/cni/net.d/10-flannel.conflist]
          volumeMounts:
            - {{name: cni, mountPath: /etc/cni/net.d}}
            - {{name: flannel-cfg, mountPath: /etc/kube-flannel/}}
      containers:
        - name: kube-flannel
          image: {IMAGE}
          imagePullPolicy: Never
          command: [/opt/bin/flanneld]
          args: [--ip-masq, --kube-subnet-mgr]
          resources:
            requests: {{cpu: 100m, memory: 50Mi}}
          securityContext:
            privileged: false
            capabilities:
              add: [NET_ADMIN, NET_RAW]
          env:
            - name: POD_NAME
              valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
            - name: POD_NAMESPACE
              valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
            - name: EVENT_QUEUE_DEPTH
              value: "5000"
            - name: KUBERNETES_SERVICE_HOST
              value: "{apiserver_host}"
            - name: KUBERNETES_SERVICE_PORT
              value: "{apiserver_port}"
          volumeMounts:
            - {{name: run, mountPath: /run/flannel}}
            - {{name: flannel-cfg, mountPath: /etc/kube-flannel/}}
            - {{name: xtables-lock, mountPath: /run/xtables.lock}}
      volumes:
        - name: run
          hostPath: {{path: /run/flannel}}
        - name: cni-plugin
          hostPath: {{path: /opt/cni/bin}}
        - name: cni
          hostPath: {{path: /etc/cni/net.d}}
        - name: flannel-cfg
          configMap: {{name: kube-flannel-cfg}}
        - name: xtables-lock
          hostPath: {{path: /run/xtables.lock, type: FileOrCreate}}
"#
    )
}
