//! The CRI tier: ipq on the path the kubelet takes. containerd of the test's own (Debian's
//! 1.6, its CRI plugin, runc, cgroupfs) runs pods the way the kubelet asks it to, through a
//! kubelet-shaped CRI client (`ipq_tests::cri`); the node's conflist is `bridge` + `host-local`
//! with `ipq-cni` (and `ipq-ipam` around host-local) put in by `ipq-cni install --hold-ipam`
//! while containerd runs; the real agent beside it.
//!
//! A pod's whole life: `RunPodSandbox` runs the CNI ADD with the pod's namespace, name and uid
//! in `CNI_ARGS`, and the agent holds the address for that pod; the pod reaches its gateway;
//! `StopContainer` with the grace period, then `StopPodSandbox` (containerd kills the pause
//! container, then runs the CNI DEL, whose ipq-cni step drains, and bridge's step removes the
//! veth: quarantined), then `RemovePodSandbox`. The event feed has Active, then Draining, then
//! Quarantined, in that order; and host-local's allocation is held until the quarantine is over.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use ipq::{api::model::EventBody, registry::StateName};
use ipq_tests::{
    cni::{host_local_allocations, AgentApi},
    containerd::{Containerd, BUSYBOX_IMAGE},
    cri::{Cri, PodSpec},
    lab::{poll, Lab},
};
use serde_json::json;

const NETWORK: &str = "cri-pods";
const GATEWAY: &str = "10.99.0.1";

fn data_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("cni-data")
}

/// The node's conflist before ipq: bridge + host-local, as a cluster would have it.
fn node_conflist(lab: &Lab, conf_dir: &Path) -> anyhow::Result<()> {
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge", "bridge": "cnicri0", "isGateway": true, "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": data_dir(lab),
                "ranges": [[{"subnet": "10.99.0.0/29"}]],
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
fn install_ipq(lab: &Lab, containerd: &Containerd, cri: &Cri) -> anyhow::Result<()> {
    let binary = ipq_tests::netns::workspace_binary("ipq-cni");
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
        .arg("--hold-ipam")
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
            Ok((loaded.contains("ipq-cni") && loaded.contains("ipq-ipam")).then_some(()))
        },
    )?;
    Ok(())
}

struct Pod {
    spec: PodSpec,
    sandbox: String,
    container: String,
    ip: IpAddr,
}

fn run_pod(cri: &Cri, containerd: &Containerd, name: &str) -> anyhow::Result<Pod> {
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
    let container = cri.start_container(
        &sandbox,
        &spec,
        &log_dir,
        "main",
        BUSYBOX_IMAGE,
        &["/bin/sleep", "100000"],
    )?;
    let ip = cri.pod_ip(&sandbox)?;
    Ok(Pod {
        spec,
        sandbox,
        container,
        ip,
    })
}

/// Pings from inside the pod's container (CRI ExecSync, as `kubectl exec` does); replies of 3.
fn pings(cri: &Cri, pod: &Pod, dst: &str) -> anyhow::Result<u32> {
    let (_, out) = cri.exec_sync(
        &pod.container,
        &["ping", "-c", "3", "-W", "1", "-i", "0.2", dst],
        Duration::from_secs(10),
    )?;
    Ok(out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

const QUARANTINE: [&str; 8] = [
    "--workload",
    "veth*",
    "--cooldown",
    "4s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "6s",
];

#[test]
fn a_pods_whole_life_through_containerds_cri() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let containerd = Containerd::start(&lab.node, &lab.work_dir().join("containerd"))?;
    node_conflist(&lab, &containerd.conf_dir())?;
    let cri = Cri::connect(&containerd.socket())?;
    let images = cri.images()?;
    ensure!(
        images.iter().any(|i| i == BUSYBOX_IMAGE),
        "the local images are in the CRI's store: {images:?}"
    );
    install_ipq(&lab, &containerd, &cri)?;

    let a = run_pod(&cri, &containerd, "a")?;
    let view = api.wait_state(a.ip, StateName::Active)?;
    let holder = view.holder.as_ref().context("an active holder")?;
    ensure!(
        holder.container_id() == Some(a.sandbox.as_str()),
        "held for the sandbox {}: {holder:?}",
        a.sandbox
    );
    let pod = holder.pod().context("the pod as the kubelet named it")?;
    ensure!(
        pod.namespace == a.spec.namespace
            && pod.name == a.spec.name
            && pod.uid.as_deref() == Some(a.spec.uid.as_str()),
        "K8S_POD_* as sent: {pod:?}"
    );
    ensure!(pings(&cri, &a, GATEWAY)? == 3, "A reaches its gateway");

    cri.stop_container(&a.container, Duration::from_secs(2))?;
    cri.stop_pod_sandbox(&a.sandbox)?;
    api.wait_state(a.ip, StateName::Quarantined)?;
    cri.remove_pod_sandbox(&a.sandbox)?;
    ensure!(
        host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip),
        "host-local's allocation of {} is held during the quarantine",
        a.ip
    );

    let mut states = Vec::new();
    api.runtime.block_on(api.client.events(false, |event| {
        if let EventBody::Transition { address, to, .. } = event.body {
            if address == a.ip {
                states.push(to);
            }
        }
        true
    }))?;
    ensure!(
        states
            == vec![
                StateName::Active,
                StateName::Draining,
                StateName::Quarantined
            ],
        "the feed in order: {states:?}"
    );
    poll(
        "host-local's release after the quarantine",
        Duration::from_secs(30),
        || {
            Ok(
                (!host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip))
                    .then_some(()),
            )
        },
    )?;
    Ok(())
}
