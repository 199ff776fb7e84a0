//! The cluster tier: a Kubernetes cluster of the test's own (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, a kubelet on containerd 2.x per node), built from
//! the Go modules pinned under `xtask/cluster/`, on namespaces that leave the machine untouched
//! ([`host`]): one node with a bridge network, or three joined by an L2 with flannel,
//! kube-proxy and CoreDNS ([`Cluster::start_nodes`]). Dropping the [`Cluster`] stops
//! everything and removes it; a run killed hard is swept by the next.

pub mod api_server;
pub mod cluster_dns;
pub mod control_plane;
pub mod daemon;
pub mod deploy;
pub mod flannel;
pub mod helm;
pub mod host;
pub mod image;
pub mod kubectl;
pub mod node;
pub mod peer;
pub mod pki;
pub mod tasks;
pub mod watch;
pub mod whereabouts;
pub mod workloads;

use std::time::{Duration, Instant};

use anyhow::Context as _;

use control_plane::{ControlPlane, ManyNodes, APISERVER_URL};
use host::{Host, Segment, NODE_IP};
use kubectl::Kubectl;
use node::{Node, NodeSpec, PodNetwork, NODE_NAME};
use pki::Pki;

/// The names of a cluster's nodes, in order: the first is the one-node tier's, and runs the
/// control plane.
pub const NODE_NAMES: [&str; 3] = [NODE_NAME, "ipq-node-b", "ipq-node-c"];

/// A node's address on the nodes' L2: the first is [`NODE_IP`], the peer has `.2`.
pub fn node_ip(index: usize) -> String {
    match index {
        0 => NODE_IP.to_owned(),
        n => format!("10.99.0.{}", n + 2),
    }
}

/// A running cluster: one node, or several joined by an L2 ([`Cluster::start_nodes`]). Fields
/// drop in order: the nodes' runtimes and kubelets, the control plane, then the hosts (which
/// kill what is left in their cgroups and remove it all).
pub struct Cluster {
    nodes: Vec<Node>,
    control_plane: ControlPlane,
    /// The first node's: the control plane runs there, kubectl and helm run there.
    pub host: Host,
    /// The other nodes' (in the order of [`NODE_NAMES`] after the first).
    pub other_hosts: Vec<Host>,
    /// The nodes' L2, for a cluster of several.
    pub segment: Option<Segment>,
    apiserver_url: String,
    /// How long the start took, for the report.
    pub started_in: Duration,
}

impl Cluster {
    /// Brings the one-node cluster up (bridge + host-local) and waits until its node is Ready.
    pub fn start() -> anyhow::Result<Cluster> {
        let began = Instant::now();
        let host = Host::create()?;
        let pki = Pki::create(
            &host.dir().join("pki"),
            &[NODE_NAME],
            &ControlPlane::serving_ips(),
        )?;
        let control_plane = ControlPlane::start(&host, &pki)?;
        let node = Node::start(
            &host,
            &pki,
            &pki.kubelets[0],
            APISERVER_URL,
            NodeSpec::single(),
        )?;
        let mut cluster = Cluster {
            nodes: vec![node],
            control_plane,
            host,
            other_hosts: Vec::new(),
            segment: None,
            apiserver_url: APISERVER_URL.to_owned(),
            started_in: Duration::ZERO,
        };
        cluster.wait_nodes_ready()?;
        cluster.started_in = began.elapsed();
        Ok(cluster)
    }

    /// Brings up `count` nodes (named [`NODE_NAMES`]) on one L2, the control plane on the
    /// first, each node its own namespaces, cgroup, containerd and kubelet with its own client
    /// certificate, and flannel as the pod network ([`flannel`]); waits until every node is
    /// Ready. Prints how long each phase took.
    pub fn start_nodes(count: usize) -> anyhow::Result<Cluster> {
        anyhow::ensure!(
            (2..=NODE_NAMES.len()).contains(&count),
            "a cluster of several nodes has 2 to {} nodes, not {count}",
            NODE_NAMES.len()
        );
        let began = Instant::now();
        let segment = Segment::create()?;
        let mut hosts = (0..count)
            .map(|i| Host::create_on(&segment, &node_ip(i)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let host = hosts.remove(0);
        let names = &NODE_NAMES[..count];
        let pki = Pki::create(&host.dir().join("pki"), names, &ControlPlane::serving_ips())?;
        let control_plane = ControlPlane::start_for(
            &host,
            &pki,
            Some(ManyNodes {
                cluster_cidr: flannel::CLUSTER_CIDR,
            }),
        )?;
        eprintln!(
            "cluster tier: control plane up {:.1?} after start",
            began.elapsed()
        );
        let apiserver_url = format!("https://{NODE_IP}:6443");
        let mut cluster = Cluster {
            nodes: Vec::new(),
            control_plane,
            host,
            other_hosts: hosts,
            segment: Some(segment),
            apiserver_url,
            started_in: Duration::ZERO,
        };
        for (i, name) in names.iter().enumerate() {
            let spec = NodeSpec {
                name: (*name).to_owned(),
                ip: node_ip(i),
                network: PodNetwork::Flannel,
            };
            let node = Node::start(
                cluster.host_at(i),
                &pki,
                &pki.kubelets[i],
                &cluster.apiserver_url,
                spec,
            )?;
            cluster.nodes.push(node);
        }
        eprintln!(
            "cluster tier: {count} containerds and kubelets up {:.1?} after start",
            began.elapsed()
        );
        let flannel_began = Instant::now();
        flannel::install(&mut cluster)?;
        eprintln!(
            "cluster tier: flannel on {count} nodes and every node Ready in {:.1?}",
            flannel_began.elapsed()
        );
        // Services and their DNS, as every cluster users run has them: kube-proxy on each
        // node once its Node is registered (it reads its addresses from it), then CoreDNS,
        // which reaches the API server through the `kubernetes` Service.
        let services_began = Instant::now();
        for (i, node) in cluster.nodes.iter_mut().enumerate() {
            let host = if i == 0 {
                &cluster.host
            } else {
                &cluster.other_hosts[i - 1]
            };
            node.start_kube_proxy(host, &pki, &cluster.apiserver_url, flannel::CLUSTER_CIDR)?;
        }
        cluster_dns::install(&mut cluster)?;
        eprintln!(
            "cluster tier: kube-proxy on {count} nodes and CoreDNS ready in {:.1?}",
            services_began.elapsed()
        );
        cluster.started_in = began.elapsed();
        Ok(cluster)
    }

    /// The nodes' names, in order.
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.spec.name.as_str()).collect()
    }

    /// Every node's host, in the order of [`Cluster::node_names`].
    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        std::iter::once(&self.host).chain(self.other_hosts.iter())
    }

    /// The host of the node at `index` (0: the first, [`Cluster::host`]).
    pub fn host_at(&self, index: usize) -> &Host {
        match index {
            0 => &self.host,
            n => &self.other_hosts[n - 1],
        }
    }

    /// The host of the node named `name`.
    pub fn host_of(&self, name: &str) -> anyhow::Result<&Host> {
        let index = self
            .node_names()
            .iter()
            .position(|n| *n == name)
            .with_context(|| format!("no node {name} in the cluster"))?;
        Ok(self.host_at(index))
    }

    /// Kills the kubelet of the node named `name` (a lost node): its Node stays until deleted,
    /// its containers run on.
    pub fn stop_kubelet(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.spec.name == name)
            .with_context(|| format!("no node {name} in the cluster"))?;
        node.stop_kubelet();
        Ok(())
    }

    /// The API server's URL as every node (and every host-network pod) reaches it.
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
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
        for node in &mut self.nodes {
            node.check_running()
                .with_context(|| format!("on node {}", node.spec.name))?;
        }
        Ok(())
    }

    /// The components' log tails, for an error message.
    pub fn node_logs(&self) -> String {
        let mut logs = self.control_plane.logs();
        for node in &self.nodes {
            let name = &node.spec.name;
            logs += &format!(
                "{name}'s kubelet's log ends:\n{}\n{name}'s containerd's log ends:\n{}\n",
                node.kubelet_log(),
                node.containerd_log()
            );
            let kube_proxy = node.kube_proxy_log();
            if !kube_proxy.is_empty() {
                logs += &format!("{name}'s kube-proxy's log ends:\n{kube_proxy}\n");
            }
        }
        logs
    }

    /// Waits until every node is Ready.
    pub fn wait_nodes_ready(&mut self) -> anyhow::Result<()> {
        let names: Vec<String> = self.node_names().iter().map(|n| n.to_string()).collect();
        let result = crate::lab::poll("every node to be Ready", Duration::from_secs(180), || {
            self.check_running()?;
            let Ok(nodes) = self.kubectl().json(&["get", "nodes"]) else {
                return Ok(None);
            };
            let ready = |name: &str| {
                nodes["items"].as_array().is_some_and(|items| {
                    items.iter().any(|node| {
                        node["metadata"]["name"] == name
                            && node["status"]["conditions"].as_array().is_some_and(|c| {
                                c.iter()
                                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
                            })
                    })
                })
            };
            Ok(names.iter().all(|n| ready(n)).then_some(()))
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
