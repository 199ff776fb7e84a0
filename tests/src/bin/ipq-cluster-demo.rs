//! `cargo xtask demo --runtime kubernetes`: the incident on a one-node Kubernetes cluster of the
//! demo's own (the cluster tier's: etcd, kube-apiserver, controller manager, scheduler, a
//! kubelet on containerd 2.x), ipq installed with `helm install` of deploy/helm/ipq, and a
//! Deployment rolled while its old pod ignores SIGTERM and its address goes to the new pod.
//! What a newcomer recognises is shown: `kubectl get pods -o wide`, the DaemonSet, `ipq
//! conflicts` through `kubectl exec`. Everything is removed at the end, whatever happens.

use std::time::Duration;

use anyhow::{Context as _, Result};
use ipq_tests::cluster::{
    deploy::{self, ipq, NAMESPACE},
    kubectl::pod_ready,
    node::{HOST_LOCAL_DIR, POD_ADDRESS},
    workloads::sender_deployment,
    Cluster,
};

fn say(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn show(cluster: &Cluster, args: &[&str]) -> Result<()> {
    println!("  $ kubectl {}", args.join(" "));
    for line in cluster.kubectl().run(args)?.lines() {
        println!("  {line}");
    }
    Ok(())
}

fn show_ipq(cluster: &Cluster, args: &[&str]) -> Result<()> {
    println!(
        "  $ kubectl -n {NAMESPACE} exec ds/ipq-agent -- ipq {}",
        args.join(" ")
    );
    for line in ipq(cluster, args)?.lines() {
        println!("  {line}");
    }
    Ok(())
}

fn senders(
    cluster: &mut Cluster,
    what: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Result<()> {
    cluster.wait_for(
        what,
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=sender"],
        |pods| pods["items"].as_array().is_some_and(|items| done(items)),
    )?;
    Ok(())
}

fn main() -> Result<()> {
    say("a one-node cluster of the demo's own: etcd, kube-apiserver, controller manager, scheduler, kubelet on containerd 2.x");
    let mut cluster = Cluster::start()?;
    println!("  node Ready after {:.1?}", cluster.started_in);
    show(&cluster, &["get", "nodes", "-o", "wide"])?;

    say("ipq installed as the README says: helm install ipq deploy/helm/ipq -n ipq-system --create-namespace (image built locally)");
    deploy::install_ipq(&mut cluster)?;
    show(
        &cluster,
        &["-n", NAMESPACE, "get", "daemonset,pods", "-o", "wide"],
    )?;

    say("a Deployment whose container ignores SIGTERM (grace period 900 s), pinging a peer");
    cluster.kubectl().apply(&sender_deployment(101))?;
    senders(&mut cluster, "the first pod to run", |pods| {
        pods.len() == 1 && pod_ready(&pods[0])
    })?;
    show(&cluster, &["get", "pods", "-o", "wide"])?;

    say("kubectl apply of a new revision: the old pod is terminating but lives on");
    cluster.kubectl().apply(&sender_deployment(202))?;
    senders(&mut cluster, "the old pod to be terminating", |pods| {
        pods.iter()
            .any(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })?;
    println!(
        "  the node's IPAM frees {POD_ADDRESS} early (as a cluster IPAM does on the Pod's DELETE)"
    );
    cluster
        .host
        .remove(&format!("{HOST_LOCAL_DIR}/{POD_ADDRESS}"))
        .context("freeing the address in host-local")?;
    senders(
        &mut cluster,
        "the new pod to run with the old pod's address",
        |pods| {
            pods.iter().any(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && pod_ready(p)
                    && p["status"]["podIP"] == POD_ADDRESS
            })
        },
    )?;
    show(&cluster, &["get", "pods", "-o", "wide"])?;

    say("two pods with one address: ipq fenced the old one, the new one works");
    show_ipq(&cluster, &["get", POD_ADDRESS])?;
    show_ipq(&cluster, &["conflicts"])?;

    say("removing the cluster");
    drop(cluster);
    println!("  done: namespaces, cgroups, processes and directories removed");
    Ok(())
}
