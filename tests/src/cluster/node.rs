//! The node's runtime and kubelet: containerd 2.x (runc, cgroupfs) at its default paths inside
//! the node's mount namespace, the node's conflist (bridge + host-local, as a kubeadm node with
//! the reference plugins has it; on a flannel node, only the reference plugins flannel
//! delegates to), the local images, a kubelet registered with the API server under the node's
//! name and address, and on a node of several, kube-proxy.

use std::{fs, path::Path, time::Duration};

use anyhow::{bail, Context as _};

use super::{
    daemon::{bin_dir, component, Daemon},
    host::{Host, NODE_IP, POD_SUBNET},
    pki::{write_kubeconfig, CertFiles, Pki},
};

/// The node's name in the API.
pub const NODE_NAME: &str = "ipq-node";
/// The images pods run, built from Debian's busybox (no registry is reachable).
pub const PAUSE_IMAGE: &str = "ipq.test/pause:cluster-tier";
pub const BUSYBOX_IMAGE: &str = "ipq.test/busybox:cluster-tier";

const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/cni";
/// The node's range is [`POD_ADDRESS`] to `10.88.0.<RANGE_LAST_OCTET>`, but every address after
/// the first is reserved in host-local's directory at start for [`RESERVED_ID`], so the IPAM
/// hands out this one address: a pod's address goes to the next pod as soon as the IPAM frees
/// it, which is what the incidents need. [`open_range`] gives the rest back, for scenarios
/// that need many pods.
pub const POD_ADDRESS: &str = "10.88.0.10";
/// The last octet of the node's range (10.88.0.10-10.88.0.90: 81 addresses).
pub const RANGE_LAST_OCTET: u8 = 90;
/// The container id host-local's reservations of the closed range are made for (a file in
/// host-local's directory holds the id and the interface of what reserved the address).
pub const RESERVED_ID: &str = "ipq-test-range-closed";
pub const POD_GATEWAY: &str = "10.88.0.1";
/// Where host-local keeps the node's allocations (one file per address).
pub const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks/ipq-cluster";

/// The cluster DNS Service's address (kube-dns's, in the API server's Service range), as
/// kubeadm picks it: the range's tenth.
pub const CLUSTER_DNS_IP: &str = "10.96.0.10";

/// The node's network: its name is what the CNI results and host-local's dataDir carry.
pub const NETWORK_NAME: &str = "ipq-cluster";

/// What a node's pod network is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodNetwork {
    /// The one-node tier's: the node's own conflist of a bridge with host-local on
    /// [`POD_SUBNET`], written here.
    Bridge,
    /// flannel's (its DaemonSet installs the plugin and `10-flannel.conflist`): only the
    /// reference plugins it delegates to are put in `/opt/cni/bin` here.
    Flannel,
}

/// Who a node is: its name in the API, its address on the nodes' L2, its pod network.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub ip: String,
    pub network: PodNetwork,
}

impl NodeSpec {
    /// The one-node tier's node.
    pub fn single() -> NodeSpec {
        NodeSpec {
            name: NODE_NAME.to_owned(),
            ip: NODE_IP.to_owned(),
            network: PodNetwork::Bridge,
        }
    }
}

/// containerd, the kubelet and, on a node of several, kube-proxy; dropping stops them
/// (kube-proxy, then the kubelet, then containerd).
pub struct Node {
    pub spec: NodeSpec,
    kube_proxy: Option<Daemon>,
    kubelet: Option<Daemon>,
    containerd: Option<Daemon>,
}

impl Node {
    /// Starts containerd (with the images imported) and the kubelet, which registers as
    /// `spec.name` with the client certificate `kubelet`.
    pub fn start(
        host: &Host,
        pki: &Pki,
        kubelet_cert: &CertFiles,
        apiserver: &str,
        spec: NodeSpec,
    ) -> anyhow::Result<Node> {
        let dir = host.dir();
        match spec.network {
            PodNetwork::Bridge => install_cni(host)?,
            PodNetwork::Flannel => link_reference_plugins(host)?,
        }
        let config = dir.join("containerd.toml");
        fs::write(&config, containerd_config())?;
        let mut containerd = host.command(component("containerd")?);
        containerd.arg("--config").arg(&config);
        // The shim is found on PATH; runc is Debian's.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bin_dir().display()
        );
        containerd.env("PATH", &path);
        let mut node = Node {
            spec,
            kube_proxy: None,
            kubelet: None,
            containerd: Some(Daemon::spawn("containerd", containerd, dir)?),
        };
        node.wait_containerd(host)?;
        import_busybox_images(host)?;

        let kubeconfig = dir.join("kubelet.kubeconfig");
        write_kubeconfig(&kubeconfig, apiserver, &pki.ca.cert, kubelet_cert)?;
        let kubelet_config = dir.join("kubelet.yaml");
        // Pods on a flannel node resolve through the cluster's DNS (kube-dns's Service,
        // `super::cluster_dns`), as on a kubeadm node.
        let cluster_dns = (node.spec.network == PodNetwork::Flannel).then_some(CLUSTER_DNS_IP);
        fs::write(
            &kubelet_config,
            kubelet_config_text(&host.kubelet_cgroup_root(), &pki.ca.cert, cluster_dns),
        )?;
        let mut kubelet = host.command(component("kubelet")?);
        kubelet
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node-ip={}", node.spec.ip))
            .arg(format!("--hostname-override={}", node.spec.name))
            .arg("--v=2")
            .env("PATH", &path);
        node.kubelet = Some(Daemon::spawn("kubelet", kubelet, dir)?);
        Ok(node)
    }

    /// Starts kube-proxy in iptables mode, as a kubeadm node runs it (there as a hostNetwork
    /// DaemonSet; here beside the kubelet, the way k3s and kops run it): the node's Services,
    /// ClusterIPs and NodePorts DNATed in the node's network namespace. `cluster_cidr` is the
    /// pods' range (traffic from outside it to a ClusterIP is masqueraded).
    pub fn start_kube_proxy(
        &mut self,
        host: &Host,
        pki: &Pki,
        apiserver: &str,
        cluster_cidr: &str,
    ) -> anyhow::Result<()> {
        let dir = host.dir();
        let kubeconfig = dir.join("kube-proxy.kubeconfig");
        write_kubeconfig(&kubeconfig, apiserver, &pki.ca.cert, &pki.kube_proxy)?;
        let config = dir.join("kube-proxy.yaml");
        fs::write(
            &config,
            kube_proxy_config_text(&kubeconfig, &self.spec.name, cluster_cidr),
        )?;
        let mut kube_proxy = host.command(component("kube-proxy")?);
        kube_proxy
            .arg(format!("--config={}", config.display()))
            .arg("--v=1")
            // iptables, iptables-restore and conntrack are Debian's.
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            );
        self.kube_proxy = Some(Daemon::spawn("kube-proxy", kube_proxy, dir)?);
        Ok(())
    }

    /// kube-proxy's log tail, for an error message.
    pub fn kube_proxy_log(&self) -> String {
        log_tail(&self.kube_proxy)
    }

    fn wait_containerd(&mut self, host: &Host) -> anyhow::Result<()> {
        let daemon = self.containerd.as_mut().expect("started");
        crate::lab::poll("containerd's socket", Duration::from_secs(60), || {
            daemon.check_running()?;
            let out = ctr(host, &["version"]);
            Ok(out.is_ok().then_some(()))
        })
        .with_context(|| {
            format!(
                "containerd's log ends:\n{}",
                self.containerd.as_ref().expect("started").log_tail(30)
            )
        })
    }

    /// Kills the kubelet, as on a node that is lost: what it started runs on, unattended.
    pub fn stop_kubelet(&mut self) {
        drop(self.kubelet.take());
    }

    /// Fails naming containerd or the kubelet when one has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for daemon in [
            &mut self.containerd,
            &mut self.kubelet,
            &mut self.kube_proxy,
        ]
        .into_iter()
        .flatten()
        {
            daemon.check_running()?;
        }
        Ok(())
    }

    /// The kubelet's log tail, for an error message.
    pub fn kubelet_log(&self) -> String {
        log_tail(&self.kubelet)
    }

    /// containerd's log tail, for an error message.
    pub fn containerd_log(&self) -> String {
        log_tail(&self.containerd)
    }
}

/// A daemon's last 40 lines; empty when it was never started or is stopped.
fn log_tail(daemon: &Option<Daemon>) -> String {
    daemon.as_ref().map(|d| d.log_tail(40)).unwrap_or_default()
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.kube_proxy.take());
        drop(self.kubelet.take());
        drop(self.containerd.take());
    }
}

/// `ctr -n k8s.io <args>` against the node's containerd; stdout.
pub fn ctr(host: &Host, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = host.command(component("ctr")?);
    cmd.args(["--address", CONTAINERD_SOCKET, "--namespace", "k8s.io"])
        .args(args);
    let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(180))?;
    if !out.status.success() {
        bail!(
            "ctr {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Imports the OCI archive at `archive` into the node's containerd, as an operator without a
/// registry would (`ctr -n k8s.io images import`).
pub fn import_image(host: &Host, archive: &Path) -> anyhow::Result<()> {
    ctr(host, &["images", "import", &archive.to_string_lossy()])?;
    Ok(())
}

fn import_busybox_images(host: &Host) -> anyhow::Result<()> {
    for (image, entrypoint) in [
        (PAUSE_IMAGE, vec!["/bin/sleep", "2147483647"]),
        (BUSYBOX_IMAGE, vec!["/bin/sh"]),
    ] {
        let tag = image.rsplit('/').next().unwrap_or(image).replace(':', "-");
        let work = host.dir().join("images").join(tag);
        let archive = crate::containerd::build_oci_archive(&work, image, &entrypoint)?;
        import_image(host, &archive)?;
    }
    Ok(())
}

/// The reference plugins in the node's `/opt/cni/bin` (links to Debian's): what a node whose
/// pod network installs its own conflist has.
fn link_reference_plugins(host: &Host) -> anyhow::Result<()> {
    let script = format!(
        "set -e
        for plugin in {DEBIAN_PLUGIN_DIR}/*; do ln -sf \"$plugin\" /opt/cni/bin/; done"
    );
    let mut cmd = host.command("sh");
    cmd.args(["-c", &script]);
    let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "installing the node's CNI plugins: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The reference plugins in the node's `/opt/cni/bin` (links to Debian's), and the node's
/// conflist: a bridge with host-local addresses (one free, see [`POD_ADDRESS`]), no masquerade
/// (a peer sees pods' own addresses). ipq's init step appends ipq-cni to it.
fn install_cni(host: &Host) -> anyhow::Result<()> {
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{
                        "subnet": POD_SUBNET,
                        "rangeStart": POD_ADDRESS,
                        "rangeEnd": format!("10.88.0.{RANGE_LAST_OCTET}"),
                        "gateway": POD_GATEWAY
                    }]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    let written = host.dir().join("conflist.json");
    fs::write(&written, conflist.to_string())?;
    let script = format!(
        "set -e
        for plugin in {DEBIAN_PLUGIN_DIR}/*; do ln -sf \"$plugin\" /opt/cni/bin/; done
        cp {} /etc/cni/net.d/10-{NETWORK_NAME}.conflist
        mkdir -p {HOST_LOCAL_DIR}
        for octet in $(seq 11 {RANGE_LAST_OCTET}); do
            printf '%s\\r\\neth0' {RESERVED_ID} > {HOST_LOCAL_DIR}/10.88.0.$octet
        done",
        written.display()
    );
    let mut cmd = host.command("sh");
    cmd.args(["-c", &script]);
    let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "installing the node's CNI plugins and conflist: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Gives the node's range back to host-local: the reservations made at start for
/// [`RESERVED_ID`] are removed, so the next pods get the addresses after the last one handed
/// out (host-local goes on from its `last_reserved_ip.0`).
pub fn open_range(host: &Host) -> anyhow::Result<()> {
    let script = format!(
        "set -e
        for file in {HOST_LOCAL_DIR}/10.88.0.*; do
            if grep -q {RESERVED_ID} \"$file\"; then rm \"$file\"; fi
        done"
    );
    let mut cmd = host.command("sh");
    cmd.args(["-c", &script]);
    let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "giving the node's range back to host-local: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn containerd_config() -> String {
    format!(
        r#"version = 3
# Everything at containerd's defaults (/var/lib/containerd, /run/containerd, /etc/cni/net.d,
# /opt/cni/bin): the node's mount namespace makes them the test's own.
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which a CI sandbox may not grant.
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
"#
    )
}

/// The kubelet's configuration: cgroupfs under the test's cgroup, anonymous read of its API
/// (the API server's exec and logs go through it), no swap check, nothing evicted for the
/// tmpfs it lives on, and no image garbage collection (the imported images cannot be pulled
/// again).
fn kubelet_config_text(cgroup_root: &str, ca: &Path, cluster_dns: Option<&str>) -> String {
    let cluster_dns = cluster_dns
        .map(|ip| format!("clusterDNS: [{ip}]\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
readOnlyPort: 0
clusterDomain: cluster.local
makeIPTablesUtilChains: false
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
{cluster_dns}",
        ca = ca.display()
    )
}

/// kube-proxy's configuration: iptables mode; the conntrack sysctls left as they are (0), as
/// they are the machine's and not the node namespace's (nf_conntrack_max is read-only outside
/// the initial namespace); metrics and health on the node's loopback.
fn kube_proxy_config_text(kubeconfig: &Path, node: &str, cluster_cidr: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {node}
mode: iptables
clusterCIDR: {cluster_cidr}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
        kubeconfig = kubeconfig.display()
    )
}
