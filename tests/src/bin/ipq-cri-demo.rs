//! `cargo xtask demo --runtime containerd`: the demo's incident (SwarmKit #2407) the way a
//! Kubernetes node runs it. containerd of the demo's own runs pods through its CRI, as the
//! kubelet asks it to; the node's conflist is bridge + host-local with ipq-cni installed by
//! `ipq-cni install`; the real ipq-agent runs beside it. Everything lives in throwaway
//! namespaces and directories and is removed at the end, whatever happens.

use std::{process::Command, time::Duration};

use anyhow::{Context as _, Result};
use ipq::registry::StateName;
use ipq_tests::{
    cni::AgentApi,
    cri::stop_container_in_background,
    cri_node::{
        free_early, node_with, pings, run_pod, run_pod_with, Range, GATEWAY, IGNORES_SIGTERM,
    },
    lab::{Agent, Lab},
    netns::workspace_binary,
};

fn say(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn ipq(lab: &Lab, args: &[&str]) -> Result<()> {
    println!("  $ ipq {}", args.join(" "));
    let out = Command::new(workspace_binary("ipq"))
        .arg("--socket")
        .arg(lab.work_dir().join("ipq.sock"))
        .args(args)
        .output()
        .context("running ipq")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  {line}");
    }
    Ok(())
}

/// ipq's drops of fenced holders' packets so far, both hooks.
fn fenced_drops(agent: &Agent<'_>) -> f64 {
    ["tc_ingress", "tc_egress"]
        .iter()
        .map(|hook| {
            agent
                .metric(
                    "ipq_dropped_packets_total",
                    &[("hook", hook), ("reason", "fenced")],
                )
                .unwrap_or(0.0)
        })
        .sum()
}

fn main() -> Result<()> {
    say("a node: containerd (its own, CRI), bridge + host-local (10.99.0.2-3), ipq-agent");
    let lab = Lab::new()?;
    let agent = lab.start_agent(&["--workload", "veth*"])?;
    let api = AgentApi::new(&lab)?;
    let (containerd, cri) = node_with(&lab, Range::TwoAddresses, false)?;
    println!("  ipq-cni installed into containerd's conflist by `ipq-cni install`");

    say("the kubelet runs pod `old`: RunPodSandbox (CNI ADD), its container ignores SIGTERM");
    let old = run_pod_with(&cri, &containerd, "old", &IGNORES_SIGTERM)?;
    api.wait_state(old.ip, StateName::Active)?;
    println!(
        "  pod old has {}; pings to its gateway: {}/3",
        old.ip,
        pings(&cri, &old, GATEWAY)?
    );

    say("pod old is deleted: the kubelet stops its container with a 10 s grace period");
    let stopping = stop_container_in_background(
        &containerd.socket(),
        &old.container,
        Duration::from_secs(10),
    );
    println!(
        "  ... and an allocator frees {} at once (the SwarmKit #2407 mistake)",
        old.ip
    );
    free_early(&lab, old.ip)?;

    say("the kubelet runs pod `new`; host-local hands it the freed address");
    let new = run_pod(&cri, &containerd, "new")?;
    println!("  pod new has {}", new.ip);
    println!(
        "  pod new -> gateway: {}/3 replies",
        pings(&cri, &new, GATEWAY)?
    );
    let drops_before = fenced_drops(&agent);
    let old_replies = pings(&cri, &old, GATEWAY)?;
    let dropped = fenced_drops(&agent) - drops_before;
    // What ipq says, not what the demo expects: the new pod's sandbox holds the address, the
    // old pod's is fenced, and its packets were just dropped as fenced.
    let view = api.get(old.ip)?;
    let holder = view
        .as_ref()
        .and_then(|v| v.holder.as_ref())
        .and_then(|h| h.container_id());
    let fenced = view
        .as_ref()
        .and_then(|v| v.fenced.as_ref())
        .and_then(|h| h.container_id());
    let verdict = if new.ip != old.ip {
        format!("not fenced: pod new got {}, not the old address", new.ip)
    } else if holder == Some(new.sandbox.as_str())
        && fenced == Some(old.sandbox.as_str())
        && dropped > 0.0
        && old_replies == 0
    {
        format!("fenced by ipq: {dropped} of its packets dropped as fenced")
    } else {
        format!(
            "NOT fenced by ipq as expected: holder {holder:?}, fenced {fenced:?}, {dropped} \
             packets dropped as fenced"
        )
    };
    println!(
        "  pod old, still in its grace period, -> gateway: {old_replies}/3 replies ({verdict})"
    );

    say("what an operator sees");
    ipq(&lab, &["list"])?;
    ipq(&lab, &["conflicts"])?;
    for line in agent.metrics()?.lines() {
        if (line.starts_with("ipq_conflicts_total") || line.starts_with("ipq_dropped_packets"))
            && !line.ends_with(" 0")
        {
            println!("  {line}");
        }
    }

    say("the grace period ends; StopPodSandbox and RemovePodSandbox, as the kubelet does");
    let took = stopping
        .join()
        .map_err(|_| anyhow::anyhow!("the StopContainer thread panicked"))??;
    println!("  the old container was stopped after {took:?}");
    cri.stop_pod_sandbox(&old.sandbox)?;
    cri.remove_pod_sandbox(&old.sandbox)?;
    cri.stop_pod_sandbox(&new.sandbox)?;
    cri.remove_pod_sandbox(&new.sandbox)?;
    println!(
        "  with `ipq-cni install --hold-ipam` the freed address would have stayed allocated \
         and pod new would have got 10.99.0.3 instead (see docs/cni.md, ipq-ipam)"
    );
    drop(containerd);
    drop(agent);
    drop(lab);
    say("cleaned up: containerd, pods, namespaces, pins and directories removed");
    Ok(())
}
