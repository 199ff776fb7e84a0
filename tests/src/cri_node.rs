//! A node as a cluster has it, for the CRI tier and the containerd demo: containerd of the
//! test's own with the node's conflist (`bridge` + `host-local`), `ipq-cni` put in by
//! `ipq-cni install` while containerd runs, and pods run through the CRI as the kubelet runs
//! them.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use serde_json::json;

use crate::{
    containerd::{Containerd, BUSYBOX_IMAGE},
    cri::{Cri, PodSpec},
    lab::{poll, Lab},
};

pub const NETWORK: &str = "cri-pods";
pub const GATEWAY: &str = "10.99.0.1";
/// The pods' bridge (bridge plugin, `isGateway`): the gateway's address is on it.
pub const BRIDGE: &str = "cnicri0";

pub fn data_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("cni-data")
}

/// The node's range: the /29's .2 to .6, or `.2` and `.3` only (a range that wraps at once).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Range {
    Slash29,
    TwoAddresses,
}

/// The node's conflist before ipq: bridge + host-local, as a cluster would have it.
pub fn node_conflist(lab: &Lab, conf_dir: &Path, range: Range) -> anyhow::Result<()> {
    let mut ranges = json!([[{"subnet": "10.99.0.0/29"}]]);
    if range == Range::TwoAddresses {
        ranges[0][0]["rangeStart"] = json!("10.99.0.2");
        ranges[0][0]["rangeEnd"] = json!("10.99.0.3");
    }
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": data_dir(lab),
                "ranges": ranges,
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    std::fs::write(
        conf_dir.join("10-pods.conflist"),
        serde_json::to_string_pretty(&conflist)?,
    )?;
    Ok(())
}

/// `ipq-cni install --hold-ipam` into containerd's conf and bin dirs while it runs, as the
/// DaemonSet does; returns once containerd's CRI has loaded the new conflist.
pub fn install_ipq(
    lab: &Lab,
    containerd: &Containerd,
    cri: &Cri,
    hold_ipam: bool,
) -> anyhow::Result<()> {
    let binary = crate::netns::workspace_binary("ipq-cni");
    let out = Command::new(&binary)
        .arg("install")
        .arg("--cni-conf-dir")
        .arg(containerd.conf_dir())
        .arg("--cni-bin-dir")
        .arg(containerd.bin_dir())
        .arg("--binary")
        .arg(&binary)
        .arg("--socket")
        .arg(lab.work_dir().join("ipq.sock"))
        .arg("--state-dir")
        .arg(lab.work_dir().join("state"))
        .args(hold_ipam.then_some("--hold-ipam"))
        .output()?;
    ensure!(
        out.status.success(),
        "ipq-cni install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    poll(
        "containerd's CRI loading ipq's conflist",
        Duration::from_secs(10),
        || {
            let loaded = cri.cni_config()?;
            Ok(
                (loaded.contains("ipq-cni") && loaded.contains("ipq-ipam") == hold_ipam)
                    .then_some(()),
            )
        },
    )?;
    Ok(())
}

/// A pod containerd runs for the test.
pub struct Pod {
    pub spec: PodSpec,
    pub sandbox: String,
    pub container: String,
    pub ip: IpAddr,
}

pub fn run_pod(cri: &Cri, containerd: &Containerd, name: &str) -> anyhow::Result<Pod> {
    run_pod_with(cri, containerd, name, &["/bin/sleep", "100000"])
}

/// A pod whose one container runs `command`.
pub fn run_pod_with(
    cri: &Cri,
    containerd: &Containerd,
    name: &str,
    command: &[&str],
) -> anyhow::Result<Pod> {
    let spec = PodSpec {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}-{}", std::process::id()),
        cgroup_parent: containerd.cgroup_parent(),
    };
    let log_dir = containerd.log_dir(name);
    std::fs::create_dir_all(&log_dir)?;
    let sandbox = cri
        .run_pod_sandbox(&spec, &log_dir)
        .with_context(|| format!("containerd log:\n{}", containerd.log()))?;
    let container =
        cri.start_container(&sandbox, &spec, &log_dir, "main", BUSYBOX_IMAGE, command)?;
    let ip = cri.pod_ip(&sandbox)?;
    Ok(Pod {
        spec,
        sandbox,
        container,
        ip,
    })
}

/// Pings from inside the pod's container (CRI ExecSync, as `kubectl exec` does); replies of 3.
pub fn pings(cri: &Cri, pod: &Pod, dst: &str) -> anyhow::Result<u32> {
    let (code, out) = cri.exec_sync(
        &pod.container,
        &["ping", "-c", "3", "-W", "1", "-i", "0.2", dst],
        Duration::from_secs(10),
    )?;
    // busybox: "3 packets transmitted, 0 packets received, 100% packet loss". No summary
    // means ping did not run, which must not read as "no reply" (a fence asserted for free).
    let summary = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .with_context(|| {
            format!(
                "no ping summary from {} (exit {code}): {out}",
                pod.spec.name
            )
        })?;
    summary
        .split(", ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no received count in {summary:?}"))
}

/// containerd with the node's conflist, its images checked, ipq installed into it.
pub fn node(lab: &Lab) -> anyhow::Result<(Containerd, Cri)> {
    node_with(lab, Range::Slash29, true)
}

pub fn node_with(lab: &Lab, range: Range, hold_ipam: bool) -> anyhow::Result<(Containerd, Cri)> {
    let containerd = Containerd::start(&lab.node, &lab.containerd_dir())?;
    node_conflist(lab, &containerd.conf_dir(), range)?;
    let cri = Cri::connect(&containerd.socket())?;
    let images = cri.images()?;
    ensure!(
        images.iter().any(|i| i == BUSYBOX_IMAGE),
        "the local images are in the CRI's store: {images:?}"
    );
    install_ipq(lab, &containerd, &cri, hold_ipam)?;
    Ok((containerd, cri))
}

/// What the old pod of the SwarmKit incident runs: a container that ignores SIGTERM, so the
/// kubelet's StopContainer waits out the whole grace period.
pub const IGNORES_SIGTERM: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap '' TERM; while true; do sleep 1; done",
];

/// Like [`IGNORES_SIGTERM`], and it keeps sending to its gateway ([`GATEWAY`]) all the while,
/// through the whole grace period: a ping every ~0.2 s (or, once its neighbour entry fails, an
/// ARP request for the gateway each try).
pub const SENDS_AND_IGNORES_SIGTERM: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap '' TERM; while true; do ping -c 1 -W 1 10.99.0.1 >/dev/null 2>&1; sleep 0.2; done",
];

/// The MAC of the pod's `eth0`, as the pod has it.
pub fn pod_mac(cri: &Cri, pod: &Pod) -> anyhow::Result<String> {
    let (code, out) = cri.exec_sync(
        &pod.container,
        &["cat", "/sys/class/net/eth0/address"],
        Duration::from_secs(10),
    )?;
    let mac = out.trim();
    ensure!(
        code == 0 && mac.len() == 17,
        "the MAC of {}'s eth0 (exit {code}): {out}",
        pod.spec.name
    );
    Ok(mac.to_owned())
}

/// The MAC the node's neighbour table has for `addr` on the pods' bridge (the gateway's view).
pub fn gateway_neighbour(lab: &Lab, addr: IpAddr) -> anyhow::Result<Option<String>> {
    let out = lab
        .node
        .ip(&["neigh", "show", &addr.to_string(), "dev", BRIDGE])?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_owned))
}

/// The peers' side of the pods' bridge: nftables counters (bridge family, prerouting) on the
/// frames that enter the bridge from one MAC with one source address (IPv4 with it as source,
/// or ARP with it as sender). Every frame a pod sends to any peer on the bridge, or to the
/// gateway, passes there, after ipq's programs on the pod's host veth: a frame ipq drops is
/// never counted, one it lets through always is. The table lives in the lab's node namespace
/// and goes with it.
pub struct BridgeWatch<'l> {
    lab: &'l Lab,
}

const WATCH_TABLE: &str = "ipqcriwatch";

impl<'l> BridgeWatch<'l> {
    pub fn new(lab: &'l Lab) -> anyhow::Result<BridgeWatch<'l>> {
        let watch = BridgeWatch { lab };
        watch.nft(&["add", "table", "bridge", WATCH_TABLE])?;
        watch.nft(&[
            "add",
            "chain",
            "bridge",
            WATCH_TABLE,
            "pre",
            "{ type filter hook prerouting priority -300 ; }",
        ])?;
        Ok(watch)
    }

    fn nft(&self, args: &[&str]) -> anyhow::Result<String> {
        crate::netns::output_of(self.lab.node.command("nft").args(args))
    }

    /// Counts, as `name`, the frames from `mac` with source `addr`.
    pub fn watch(&self, name: &str, mac: &str, addr: IpAddr) -> anyhow::Result<()> {
        let addr = addr.to_string();
        for (suffix, matched) in [("ip", ["ip", "saddr"]), ("arp", ["arp", "saddr ip"])] {
            let counter = format!("{name}_{suffix}");
            self.nft(&["add", "counter", "bridge", WATCH_TABLE, &counter])?;
            self.nft(&[
                "add",
                "rule",
                "bridge",
                WATCH_TABLE,
                "pre",
                "ether",
                "saddr",
                mac,
                matched[0],
                matched[1],
                &addr,
                "counter",
                "name",
                &counter,
            ])?;
        }
        Ok(())
    }

    /// The frames counted as `name` so far.
    pub fn frames(&self, name: &str) -> anyhow::Result<u64> {
        let mut total = 0;
        for suffix in ["ip", "arp"] {
            let counter = format!("{name}_{suffix}");
            let out = self.nft(&["-j", "list", "counter", "bridge", WATCH_TABLE, &counter])?;
            let listed: serde_json::Value = serde_json::from_str(&out)?;
            total += listed["nftables"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|o| o["counter"]["packets"].as_u64())
                .with_context(|| format!("no packets in nft's {counter}: {out}"))?;
        }
        Ok(total)
    }
}

/// An allocator that errs (SwarmKit #2407): `ip`'s host-local allocation is freed while its
/// pod lives, and host-local's round-robin (in a [`Range::TwoAddresses`] node) points at it
/// next.
pub fn free_early(lab: &Lab, ip: IpAddr) -> anyhow::Result<()> {
    let store = data_dir(lab).join(NETWORK);
    std::fs::remove_file(store.join(ip.to_string()))?;
    std::fs::write(store.join("last_reserved_ip.0"), "10.99.0.3")?;
    Ok(())
}
