//! `cargo xtask demo --runtime kubernetes`: the incident on a one-node Kubernetes cluster of the
//! demo's own (the cluster tier's: etcd, kube-apiserver, controller manager, scheduler, a
//! kubelet on containerd 2.x), ipq installed with `helm install` of deploy/helm/ipq, and a
//! Deployment rolled while its old pod ignores SIGTERM and its address goes to the new pod.
//! What a newcomer recognises is shown: `kubectl get pods -o wide`, the DaemonSet, `ipq
//! conflicts` through `kubectl exec`. Everything is removed at the end, whatever happens.
//!
//! With `--nodes 3` (`cargo xtask demo --runtime kubernetes --nodes 3`): the seeds' cross-node
//! race on three nodes with flannel, whereabouts' one range shared by them
//! ([`cross_node`]).

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--nodes", "1"] => one_node(),
        ["--nodes", "3"] => cross_node::run(),
        _ => anyhow::bail!("usage: ipq-cluster-demo [--nodes 1|3], not {args:?}"),
    }
}

fn one_node() -> Result<()> {
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

/// The seeds' cross-node race on three nodes: whereabouts frees a force-deleted pod's address
/// on node A while its container lives on, node B's pod gets it, and node A's agent fences the
/// stale holder on B's announcement.
mod cross_node {
    use std::{
        net::IpAddr,
        time::{Duration, Instant},
    };

    use anyhow::{ensure, Context as _, Result};
    use ipq_tests::cluster::{
        deploy::{self, ipq_on, NAMESPACE},
        peer::Witness,
        tasks,
        whereabouts::{self, allocations},
        Cluster, NODE_NAMES,
    };

    use super::{say, show};

    const STALE: usize = 111;
    const NEW: usize = 222;

    fn show_ipq_on(cluster: &Cluster, node: &str, args: &[&str]) -> Result<()> {
        println!(
            "  $ kubectl -n {NAMESPACE} exec <ipq-agent on {node}> -- ipq {}",
            args.join(" ")
        );
        for line in ipq_on(cluster, node, args)?.lines() {
            println!("  {line}");
        }
        Ok(())
    }

    fn pods_per_node(cluster: &Cluster) -> Result<()> {
        for node in cluster.node_names() {
            println!("  pods on {node}:");
            let selector = format!("spec.nodeName={node}");
            show(
                cluster,
                &[
                    "-n",
                    "default",
                    "get",
                    "pods",
                    "-o",
                    "wide",
                    "--field-selector",
                    &selector,
                ],
            )?;
        }
        Ok(())
    }

    fn running(cluster: &mut Cluster, name: &str, manifest: &str) -> Result<String> {
        cluster.kubectl().apply(manifest)?;
        let pod = cluster.wait_for(
            &format!("pod {name} to run"),
            Duration::from_secs(180),
            &["-n", "default", "get", "pod", name],
            |pod| ipq_tests::cluster::kubectl::pod_ready(pod) && pod["status"]["podIP"].is_string(),
        )?;
        Ok(pod["status"]["podIP"].as_str().context("podIP")?.to_owned())
    }

    pub fn run() -> Result<()> {
        let (a, b) = (NODE_NAMES[0], NODE_NAMES[1]);
        say("three nodes of the demo's own on one L2, each its own containerd and kubelet; flannel (vxlan) as the pod network");
        let mut cluster = Cluster::start_nodes(3)?;
        println!("  every node Ready after {:.1?}", cluster.started_in);
        show(&cluster, &["get", "nodes", "-o", "wide"])?;

        say("whereabouts: one range (10.88.0.20-21) shared by the three nodes on a second L2 (each node's eth1)");
        whereabouts::install(&mut cluster)?;
        say("ipq installed with helm install, uplink eth1 (where other nodes' announcements arrive)");
        deploy::install_ipq_with(&mut cluster, "interfaces:\n  uplink: [eth1]\n")?;
        show(&cluster, &["-n", NAMESPACE, "get", "pods", "-o", "wide"])?;

        let witness = Witness::start(&cluster.host.peer)?;
        say(&format!(
            "pod `stale` on {a}: its container ignores SIGTERM; it pings the range's gateway"
        ));
        let address = running(
            &mut cluster,
            "stale",
            &whereabouts::pod_pinging_on("stale", a, true, STALE),
        )?;
        let ip: IpAddr = address.parse()?;
        pods_per_node(&cluster)?;

        say("kubectl delete pod stale, then --force --grace-period=0 while its kubelet waits out the grace");
        cluster
            .kubectl()
            .run(&["-n", "default", "delete", "pod", "stale", "--wait=false"])?;
        cluster.wait_for(
            "the kubelet to begin terminating stale",
            Duration::from_secs(60),
            &[
                "-n",
                "default",
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=stale,reason=Killing",
            ],
            |events| events["items"].as_array().is_some_and(|i| !i.is_empty()),
        )?;
        cluster.kubectl().run(&[
            "-n",
            "default",
            "delete",
            "pod",
            "stale",
            "--force",
            "--grace-period=0",
        ])?;
        ipq_tests::lab::poll(
            "whereabouts to free the address",
            Duration::from_secs(60),
            || {
                Ok((!allocations(&cluster)?
                    .iter()
                    .any(|(_, p)| p == "default/stale"))
                .then_some(()))
            },
        )?;
        tasks::ensure_running(&cluster.host, "stale", "after the force delete")?;
        println!("  the Pod object is gone and whereabouts freed {address}; its container still runs on {a}");

        say(&format!(
            "pod `new` on {b}: whereabouts hands it {address} at once"
        ));
        let asked = Instant::now();
        let got = running(
            &mut cluster,
            "new",
            &whereabouts::pod_pinging_on("new", b, false, NEW),
        )?;
        ensure!(got == address, "new got {got}, not {address}");
        pods_per_node(&cluster)?;
        let first_new = ipq_tests::lab::poll(
            "new's pings at the gateway",
            Duration::from_secs(60),
            || Ok(witness.first(ip, NEW, asked)),
        )?;
        ipq_tests::lab::poll(
            &format!("{a}'s agent to fence on {b}'s claim"),
            Duration::from_secs(30),
            || {
                let view: serde_json::Value =
                    serde_json::from_str(&ipq_on(&cluster, a, &["-o", "json", "get", &address])?)?;
                Ok(view["fenced"].to_string().contains("stale").then_some(()))
            },
        )?;
        // A window of pings to count: five seconds of both pods sending.
        std::thread::sleep(Duration::from_secs(5));

        say(&format!("{a} saw {b}'s announcement of {address} on eth1: a remote claim, and the stale holder fenced"));
        show_ipq_on(&cluster, a, &["get", &address])?;
        show_ipq_on(&cluster, a, &["conflicts"])?;
        let stale = witness.count(ip, STALE, first_new);
        let new = witness.count(ip, NEW, first_new);
        println!(
            "  pings from {address} at the gateway since new's first: new {new}, stale {stale} \
             (the stale holder is fenced: 0 expected)"
        );
        show(&cluster, &["get", "nodequarantines"])?;

        say("removing the cluster");
        tasks::kill_running(&cluster.host, "stale")?;
        drop(cluster);
        println!("  done: namespaces, cgroups, processes and directories removed");
        Ok(())
    }
}
