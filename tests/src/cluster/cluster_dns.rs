//! The cluster DNS of a cluster of several nodes, as kubeadm installs it: CoreDNS as the
//! Deployment `coredns` in kube-system behind the Service `kube-dns` at
//! [`node::CLUSTER_DNS_IP`] (which each flannel node's kubelet gives its pods as `clusterDNS`),
//! its RBAC, and the Corefile of kubeadm v1.35 less what needs an upstream resolver (`forward`,
//! `loop`) or a metrics scraper (`prometheus`). CoreDNS reaches the API server through the
//! `kubernetes` Service, so its readiness also proves kube-proxy's ClusterIPs on its node.
//!
//! The image is made here from the `coredns` binary `cargo xtask setup --for cluster` builds
//! from its Go module (`xtask/cluster/coredns`, which says which plugins and why): no registry
//! is reachable.

use std::{fs, time::Duration};

use super::{daemon::component, kubectl::pod_ready, node, Cluster};

const NAMESPACE: &str = "kube-system";
const IMAGE: &str = "ipq.test/coredns:cluster-tier";
/// kubeadm runs two; one answers the tier's few pods, and its start is what the tier waits for.
const REPLICAS: usize = 1;

/// Builds CoreDNS's image, imports it on every node, applies the manifests and waits until
/// CoreDNS is ready (its `ready` plugin answers once the `kubernetes` plugin has synced with the
/// API server).
pub fn install(cluster: &mut Cluster) -> anyhow::Result<()> {
    let work = cluster.host.dir().join("images/coredns");
    let rootfs = work.join("rootfs");
    fs::create_dir_all(rootfs.join("etc/coredns"))?;
    fs::copy(component("coredns")?, rootfs.join("coredns"))?;
    let archive = crate::oci::archive(&rootfs, &work, IMAGE, &["/coredns"], &[])?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    cluster.kubectl().apply(&manifests())?;
    cluster.wait_for(
        "CoreDNS to be ready",
        Duration::from_secs(180),
        &["-n", NAMESPACE, "get", "pods", "-l", "k8s-app=kube-dns"],
        |pods| {
            pods["items"]
                .as_array()
                .is_some_and(|items| items.iter().filter(|p| pod_ready(p)).count() == REPLICAS)
        },
    )?;
    Ok(())
}

fn manifests() -> String {
    let dns_ip = node::CLUSTER_DNS_IP;
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: {NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
  - kind: ServiceAccount
    name: coredns
    namespace: {NAMESPACE}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: {NAMESPACE}
data:
  Corefile: |
    .:53 {{
        errors
        health {{
           lameduck 5s
        }}
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }}
        cache 30 {{
           disable success cluster.local
           disable denial cluster.local
        }}
        reload
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: {NAMESPACE}
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: {REPLICAS}
  selector:
    matchLabels: {{k8s-app: kube-dns}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      tolerations:
        - {{key: CriticalAddonsOnly, operator: Exists}}
      containers:
        - name: coredns
          image: {IMAGE}
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          volumeMounts:
            - {{name: config-volume, mountPath: /etc/coredns, readOnly: true}}
          ports:
            - {{containerPort: 53, name: dns, protocol: UDP}}
            - {{containerPort: 53, name: dns-tcp, protocol: TCP}}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities:
              add: [NET_BIND_SERVICE]
              drop: [ALL]
            readOnlyRootFilesystem: true
          livenessProbe:
            httpGet: {{path: /health, port: 8080, scheme: HTTP}}
            initialDelaySeconds: 60
            timeoutSeconds: 5
          readinessProbe:
            httpGet: {{path: /ready, port: 8181, scheme: HTTP}}
            periodSeconds: 2
      dnsPolicy: Default
      volumes:
        - name: config-volume
          configMap:
            name: coredns
            items:
              - {{key: Corefile, path: Corefile}}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: {NAMESPACE}
  labels: {{k8s-app: kube-dns, kubernetes.io/name: CoreDNS}}
spec:
  selector: {{k8s-app: kube-dns}}
  clusterIP: {dns_ip}
  ports:
    - {{name: dns, port: 53, protocol: UDP}}
    - {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}
