//! The cluster tier: a one-node Kubernetes cluster of the test's own (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, a kubelet on containerd 2.x), built from the Go
//! modules pinned under `xtask/cluster/`, on namespaces that leave the machine untouched
//! ([`host`]). Dropping the [`Cluster`] stops everything and removes it; a run killed hard is
//! swept by the next.

pub mod api_server;
pub mod control_plane;
pub mod daemon;
pub mod deploy;
pub mod helm;
pub mod host;
pub mod image;
pub mod kubectl;
pub mod node;
pub mod peer;
pub mod pki;
pub mod tasks;
pub mod whereabouts;
pub mod workloads;

use std::time::{Duration, Instant};

use anyhow::Context as _;

use control_plane::{ControlPlane, APISERVER_URL};
use host::Host;
use kubectl::Kubectl;
use node::{Node, NODE_NAME};
use pki::Pki;

/// A running one-node cluster. Fields drop in order: the node's runtime and kubelet, the
/// control plane, then the host (which kills what is left in its cgroup and removes it all).
pub struct Cluster {
    node: Node,
    control_plane: ControlPlane,
    pub host: Host,
    /// How long the start took, for the report.
    pub started_in: Duration,
}

impl Cluster {
    /// Brings the cluster up and waits until its node is Ready.
    pub fn start() -> anyhow::Result<Cluster> {
        let began = Instant::now();
        let host = Host::create()?;
        let pki = Pki::create(
            &host.dir().join("pki"),
            NODE_NAME,
            &ControlPlane::serving_ips(),
        )?;
        let control_plane = ControlPlane::start(&host, &pki)?;
        let node = Node::start(&host, &pki, APISERVER_URL)?;
        let mut cluster = Cluster {
            node,
            control_plane,
            host,
            started_in: Duration::ZERO,
        };
        cluster.wait_node_ready()?;
        cluster.started_in = began.elapsed();
        Ok(cluster)
    }

    /// kubectl as the cluster's admin.
    pub fn kubectl(&self) -> Kubectl<'_> {
        Kubectl::new(&self.host, self.control_plane.admin_kubeconfig.clone())
            .expect("kubectl was there when the cluster started")
    }

    /// helm as the cluster's admin.
    pub fn helm(&self) -> anyhow::Result<helm::Helm<'_>> {
        helm::Helm::new(&self.host, self.control_plane.admin_kubeconfig.clone())
    }

    /// The cluster admin's kubeconfig.
    pub fn admin_kubeconfig(&self) -> &std::path::Path {
        &self.control_plane.admin_kubeconfig
    }

    /// Stops kube-apiserver (killed: its port refuses connections) until
    /// [`Cluster::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.control_plane.stop_apiserver();
    }

    /// Starts kube-apiserver again; returns once it answers `/readyz`, with when the probe that
    /// saw it ready began.
    pub fn start_apiserver(&mut self) -> anyhow::Result<std::time::SystemTime> {
        self.control_plane.start_apiserver(&self.host)
    }

    /// Fails naming the first component that has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.control_plane.check_running()?;
        self.node.check_running()
    }

    /// The components' log tails, for an error message.
    pub fn node_logs(&self) -> String {
        format!(
            "{}kubelet's log ends:\n{}\ncontainerd's log ends:\n{}",
            self.control_plane.logs(),
            self.node.kubelet_log(),
            self.node.containerd_log()
        )
    }

    fn wait_node_ready(&mut self) -> anyhow::Result<()> {
        let result = crate::lab::poll("the node to be Ready", Duration::from_secs(180), || {
            self.check_running()?;
            let Ok(node) = self.kubectl().json(&["get", "node", NODE_NAME]) else {
                return Ok(None);
            };
            let ready = node["status"]["conditions"]
                .as_array()
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            Ok(ready.then_some(()))
        });
        result.with_context(|| self.node_logs())
    }

    /// Waits until `what` (a kubectl JSON query's result) satisfies `done`; the error quotes
    /// the last value and the node's logs.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        query: &[&str],
        mut done: impl FnMut(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let mut last = serde_json::Value::Null;
        let result = crate::lab::poll(what, timeout, || {
            self.check_running()?;
            last = self.kubectl().json(query)?;
            Ok(done(&last).then(|| last.clone()))
        });
        result.with_context(|| format!("last {query:?}: {last}\n{}", self.node_logs()))
    }
}
