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
            "type": "bridge", "bridge": "cnicri0", "isGateway": true, "ipMasq": false,
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

/// An allocator that errs (SwarmKit #2407): `ip`'s host-local allocation is freed while its
/// pod lives, and host-local's round-robin (in a [`Range::TwoAddresses`] node) points at it
/// next.
pub fn free_early(lab: &Lab, ip: IpAddr) -> anyhow::Result<()> {
    let store = data_dir(lab).join(NETWORK);
    std::fs::remove_file(store.join(ip.to_string()))?;
    std::fs::write(store.join("last_reserved_ip.0"), "10.99.0.3")?;
    Ok(())
}
