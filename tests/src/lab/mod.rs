//! The lab of "node + two pods + a peer behind an uplink", the real `ipq-agent` running in it,
//! and helpers that send traffic through it and read the agent's metrics.
//!
//! Here: the lab's set-up and addresses. Beside it, one concern each (every item re-exported
//! here, so `ipq_tests::lab::...` is the one path): `agent` the running agent, `entries`
//! the pinned address map written, read and waited for, `metrics` `/metrics` parsed,
//! `packets` traffic and crafted frames, `routes` veths and routes added later, `namespaces`
//! the agent's own PID and mount namespaces, as in the DaemonSet's pod. The one
//! bounded wait is [`poll`] (`crate::wait`).
//!
//! ```text
//!  pod-a eth0 10.77.0.2 fd77::2 ── vethpa ┐
//!                                          node ── up0 10.78.0.1 fd78::1 ── eth0 10.78.0.2  peer
//!  pod-b eth0 10.77.0.3 fd77::3 ── vethpb ┘  (forwarding)                  fd78::2
//! ```
//!
//! Pods are wired as the CNI ptp plugin wires them (a /32 and a /128 on the pod, the gateway
//! 10.77.0.1 and fe80::1 on every host-side veth, a host route per pod address). Every
//! neighbour entry traffic needs is PERMANENT and DAD is off, so no ARP or NDP packet is ever
//! sent during a test: datapath counters then equal the packets a test sends, exactly.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::netns::{require_root, unique, BpffsDir, NetNs};

/// The one bounded poll, here where the lab's users have always found it.
pub use crate::wait::poll;

pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const GATEWAY_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
pub const POD_A_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const POD_A_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
pub const POD_B_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
pub const POD_B_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 3);
pub const UPLINK_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
pub const UPLINK_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 1);
pub const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 2);

const VETHPA_MAC: &str = "02:77:00:00:0a:01";
const POD_A_MAC: &str = "02:77:00:00:0a:02";
const VETHPB_MAC: &str = "02:77:00:00:0b:01";
const POD_B_MAC: &str = "02:77:00:00:0b:02";
const UP0_MAC: &str = "02:78:00:00:00:01";
const PEER_MAC: &str = "02:78:00:00:00:02";

/// Inside the node namespace only, so every lab can use the agent's default port.
pub const METRICS_ADDR: &str = "127.0.0.1:9740";

/// A wrapper for [`Lab::start_agent_wrapped`] that runs the agent with what
/// deploy/helm/ipq/templates/daemonset.yaml grants it: `BPF`, `NET_ADMIN`, `NET_RAW` and
/// `PERFMON`, no `CAP_SYS_ADMIN`.
pub const DAEMONSET_CAPS: [&str; 6] = [
    "setpriv",
    "--inh-caps",
    "-all",
    "--bounding-set",
    "-all,+bpf,+net_admin,+net_raw,+perfmon",
    "--",
];

/// How long an agent may take from exec to `/readyz` answering 200 (times the time scale).
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A scratch directory for agent logs, state and config; removed on drop.
#[derive(Debug)]
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            eprintln!("cleanup: removing {}: {e}", self.0.display());
        }
    }
}

/// The four namespaces, the agent's bpffs dir and a scratch dir. Field order is drop order:
/// namespaces (and so every veth and attachment) first, then the pins, then the logs.
#[derive(Debug)]
pub struct Lab {
    pub node: NetNs,
    pub pod_a: NetNs,
    pub pod_b: NetNs,
    pub peer: NetNs,
    pub bpffs: BpffsDir,
    work: WorkDir,
}

/// `ip -n <ns> <format!(...)>`, split on whitespace: the wiring below reads like the shell
/// commands it runs.
macro_rules! ip {
    ($ns:expr, $($fmt:tt)+) => {
        $ns.ip(&format!($($fmt)+).split_whitespace().collect::<Vec<_>>())
    };
}

/// Wires one pod to the node through `host_if` as the CNI ptp plugin does.
fn wire_pod(
    node: &NetNs,
    pod: &NetNs,
    host_if: &str,
    (host_mac, pod_mac): (&str, &str),
    (v4, v6): (Ipv4Addr, Ipv6Addr),
) -> anyhow::Result<()> {
    let (gw4, gw6) = (GATEWAY_V4, GATEWAY_LL);
    let pod_end = format!("name eth0 address {pod_mac} netns {}", pod.name());
    ip!(
        node,
        "link add {host_if} address {host_mac} type veth peer {pod_end}"
    )?;
    ip!(node, "addr add {gw4}/32 dev {host_if}")?;
    ip!(node, "addr add {gw6}/64 dev {host_if} nodad")?;
    ip!(node, "link set {host_if} up")?;
    ip!(pod, "addr add {v4}/32 dev eth0")?;
    ip!(pod, "addr add {v6}/128 dev eth0 nodad")?;
    ip!(pod, "link set eth0 up")?;
    ip!(pod, "route add {gw4} dev eth0 scope link")?;
    ip!(pod, "route add default via {gw4} dev eth0")?;
    ip!(pod, "-6 route add default via {gw6} dev eth0")?;
    ip!(
        pod,
        "neigh add {gw4} lladdr {host_mac} dev eth0 nud permanent"
    )?;
    ip!(
        pod,
        "neigh add {gw6} lladdr {host_mac} dev eth0 nud permanent"
    )?;
    ip!(node, "route add {v4}/32 dev {host_if}")?;
    ip!(node, "-6 route add {v6}/128 dev {host_if}")?;
    ip!(
        node,
        "neigh add {v4} lladdr {pod_mac} dev {host_if} nud permanent"
    )?;
    ip!(
        node,
        "neigh add {v6} lladdr {pod_mac} dev {host_if} nud permanent"
    )?;
    Ok(())
}

/// The uplink: `up0` in the node, `eth0` in the peer, one /24 and one /64 between them.
fn wire_uplink(node: &NetNs, peer: &NetNs) -> anyhow::Result<()> {
    let peer_end = format!("name eth0 address {PEER_MAC} netns {}", peer.name());
    ip!(
        node,
        "link add up0 address {UP0_MAC} type veth peer {peer_end}"
    )?;
    ip!(node, "addr add {UPLINK_V4}/24 dev up0")?;
    ip!(node, "addr add {UPLINK_V6}/64 dev up0 nodad")?;
    ip!(node, "link set up0 up")?;
    ip!(peer, "addr add {PEER_V4}/24 dev eth0")?;
    ip!(peer, "addr add {PEER_V6}/64 dev eth0 nodad")?;
    ip!(peer, "link set eth0 up")?;
    ip!(peer, "route add 10.77.0.0/24 via {UPLINK_V4}")?;
    ip!(peer, "-6 route add fd77::/64 via {UPLINK_V6}")?;
    ip!(
        node,
        "neigh add {PEER_V4} lladdr {PEER_MAC} dev up0 nud permanent"
    )?;
    ip!(
        node,
        "neigh add {PEER_V6} lladdr {PEER_MAC} dev up0 nud permanent"
    )?;
    ip!(
        peer,
        "neigh add {UPLINK_V4} lladdr {UP0_MAC} dev eth0 nud permanent"
    )?;
    ip!(
        peer,
        "neigh add {UPLINK_V6} lladdr {UP0_MAC} dev eth0 nud permanent"
    )?;
    Ok(())
}

impl Lab {
    /// Builds the lab; fails (never skips) when not root or bpffs is missing.
    pub fn new() -> anyhow::Result<Lab> {
        require_root()?;
        let work = WorkDir(std::env::temp_dir().join(unique("ipq-lab")));
        fs::create_dir(&work.0).with_context(|| format!("creating {}", work.0.display()))?;
        let lab = Lab {
            node: NetNs::new("node")?,
            pod_a: NetNs::new("pa")?,
            pod_b: NetNs::new("pb")?,
            peer: NetNs::new("peer")?,
            bpffs: BpffsDir::new()?,
            work,
        };
        lab.node.sysctl("net.ipv4.ip_forward", "1")?;
        lab.node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        wire_pod(
            &lab.node,
            &lab.pod_a,
            "vethpa",
            (VETHPA_MAC, POD_A_MAC),
            (POD_A_V4, POD_A_V6),
        )?;
        wire_pod(
            &lab.node,
            &lab.pod_b,
            "vethpb",
            (VETHPB_MAC, POD_B_MAC),
            (POD_B_V4, POD_B_V6),
        )?;
        wire_uplink(&lab.node, &lab.peer)?;
        Ok(lab)
    }

    /// The names of the lab's namespaces.
    pub fn netns_names(&self) -> Vec<String> {
        [&self.node, &self.pod_a, &self.pod_b, &self.peer]
            .iter()
            .map(|ns| ns.name().to_owned())
            .collect()
    }

    /// Where agent logs, state and config go.
    pub fn work_dir(&self) -> &Path {
        &self.work.0
    }

    /// The lab's own CNI bin dir, for plugins a test writes (a delegate whose DEL fails): one
    /// of the directories its agents trust (see [`trusted_cni_bin_dirs`](Self::trusted_cni_bin_dirs)).
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.work_dir().join("cni-bin")
    }

    /// Where the lab's containerd keeps its state and its CNI bin dir (`cri_node`).
    pub fn containerd_dir(&self) -> PathBuf {
        self.work_dir().join("containerd")
    }

    /// What the lab's agents get as `ipam_cni_bin_dirs`, the directories whose delegates they
    /// run ipq-ipam's DELs from: Debian's plugin dir (the chains' `CNI_PATH`), the lab's own,
    /// and containerd's (links to Debian's). A test may add more with the flag.
    pub fn trusted_cni_bin_dirs(&self) -> Vec<PathBuf> {
        vec![
            PathBuf::from(crate::cni::DEBIAN_PLUGIN_DIR),
            self.cni_bin_dir(),
            self.containerd_dir().join("cni-bin"),
        ]
    }

    /// Starts the agent in the node namespace and waits until it is ready; in PID and mount
    /// namespaces of its own, as the DaemonSet runs it.
    pub fn start_agent(&self, extra: &[&str]) -> anyhow::Result<Agent<'_>> {
        Agent::start(self, extra)
    }

    /// Like [`start_agent`](Self::start_agent), in the test's own PID and mount namespaces:
    /// only where the test must say why ([`AgentNamespaces::Host`]).
    pub fn start_agent_in_host_namespaces(&self, extra: &[&str]) -> anyhow::Result<Agent<'_>> {
        Agent::start_in(
            self,
            AgentNamespaces::Host,
            "# every key from the command line\n",
            &[],
            extra,
        )
    }

    /// An agent on the lab's pods (`vethp*`, uplink `up0`, `fence-old`) that publishes the
    /// NodeQuarantine of `node` through `kubeconfig`, with `extra` arguments after those.
    pub fn start_publishing_agent(
        &self,
        node: &str,
        kubeconfig: &std::path::Path,
        extra: &[&str],
    ) -> anyhow::Result<Agent<'_>> {
        let kubeconfig = kubeconfig.to_string_lossy();
        let mut args = vec![
            "--workload",
            "vethp*",
            "--uplink",
            "up0",
            "--on-early-reuse",
            "fence-old",
            "--kubernetes-node-name",
            node,
            "--kubernetes-kubeconfig",
            &kubeconfig,
        ];
        args.extend_from_slice(extra);
        self.start_agent(&args)
    }

    /// Like [`start_agent`](Self::start_agent), with the agent run through `wrapper` (a
    /// command line that ends by `exec`ing its arguments, inside the agent's namespaces:
    /// `prlimit --nofile=1024:4096 --`, `setpriv --inh-caps -net_admin ... --`).
    pub fn start_agent_wrapped(
        &self,
        wrapper: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Agent<'_>> {
        Agent::start_with(self, wrapper, extra)
    }

    /// Like [`start_agent`](Self::start_agent), with `config` (TOML) as the agent's config
    /// file: for keys that have no command-line flag (`[hygiene]`).
    pub fn start_agent_configured(
        &self,
        config: &str,
        extra: &[&str],
    ) -> anyhow::Result<Agent<'_>> {
        Agent::start_configured(self, config, &[], extra)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // A failing test gets every agent log of the lab in its output.
        if !std::thread::panicking() {
            return;
        }
        let Ok(entries) = fs::read_dir(&self.work.0) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_else(|e| format!("(unreadable: {e})"));
            eprintln!("----- {} -----\n{text}----- end -----", log.display());
        }
    }
}

/// Agent flags for tests that watch a whole quarantine: workload veths, a 4 s cooldown, a
/// 1 s quiet period and at most 6 s: long enough to act during it, short enough to outlast.
pub const SHORT_QUARANTINE: [&str; 8] = [
    "--workload",
    "veth*",
    "--cooldown",
    "4s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "6s",
];

/// MAC addresses of the lab, as `ip` spells them: pod b's `eth0`, the peer's `eth0`.
pub const POD_B_LLADDR: &str = POD_B_MAC;
pub const PEER_LLADDR: &str = PEER_MAC;

/// Pod a's two addresses, each with the peer's address of the same family.
pub fn pod_a_and_peer() -> [(IpAddr, IpAddr); 2] {
    [
        (POD_A_V4.into(), PEER_V4.into()),
        (POD_A_V6.into(), PEER_V6.into()),
    ]
}

mod agent;
mod entries;
mod metrics;
mod namespaces;
mod packets;
mod routes;

pub use agent::{bpf_link_kinds_of, Agent, WATCHER_DEFAULT};
pub use entries::{map_entry, wait_claimed_at_start, wait_for_entry, MapEntry};
pub use metrics::{Sample, Scrape};
pub use namespaces::AgentNamespaces;
pub use packets::{
    bind_to_device, mac_bytes, ping, pod_a_traffic, pod_traffic, send_frames, udp_burst,
    udp_burst_with, UdpSender,
};
pub use routes::ifindex;
