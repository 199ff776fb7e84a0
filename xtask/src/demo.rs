//! `cargo xtask demo`: a throwaway lab that replays SwarmKit #2407, then removes itself.
//!
//! Four network namespaces stand in for a node, two pods wired to it as the CNI ptp plugin
//! wires them, and a peer behind the node's uplink. The real `ipq-agent` runs in the node and
//! learns the pods' addresses from their host routes. Pod A starts terminating (its route is
//! withdrawn, its process still runs); the orchestrator hands its address to pod B at once.
//! ipq fences pod A: B's traffic flows, A's packets with that address are dropped and counted,
//! and the early reuse is reported as a conflict.
//!
//! `--runtime containerd` replays it on containerd's CRI instead (`tests/src/bin/ipq-cri-demo.rs`).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::util::{self, cmd, output};

const NODE: &str = "ipq-demo-node";
const POD_A: &str = "ipq-demo-pod-a";
const POD_B: &str = "ipq-demo-pod-b";
const PEER: &str = "ipq-demo-peer";
const BPFFS_DIR: &str = "/sys/fs/bpf/ipq-demo";
const METRICS: &str = "127.0.0.1:9740";
const STATE_DIR: &str = "/tmp/ipq-demo-state";
const API_SOCKET: &str = "/tmp/ipq-demo-state/ipq.sock";
/// The agent's own log, shown in part at the end: its JSON conflict records.
const AGENT_LOG: &str = "/tmp/ipq-demo-agent.log";

/// Removes everything the demo made, whatever happened.
struct Lab {
    agent: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = cmd("kill", ["-TERM", &agent.id().to_string()]).status();
            let _ = agent.wait();
        }
        for ns in [NODE, POD_A, POD_B, PEER] {
            let _ = cmd("ip", ["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(BPFFS_DIR);
        let _ = std::fs::remove_dir_all(STATE_DIR);
        say("cleaned up: namespaces, links and pins removed");
    }
}

fn say(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn ip(ns: &str, args: &str) -> Result<()> {
    let mut command = cmd("ip", ["-n", ns]);
    command.args(args.split_whitespace());
    output(&mut command).map(drop)
}

/// A command run inside `ns` without `ip netns exec`, which would remount /sys and hide the
/// bpf filesystem from the agent.
fn in_ns(ns: &str, program: &str) -> Command {
    let mut command = cmd("nsenter", [format!("--net=/run/netns/{ns}")]);
    command.arg(program);
    command
}

fn build_lab() -> Result<()> {
    for ns in [NODE, POD_A, POD_B, PEER] {
        let _ = cmd("ip", ["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
        output(&mut cmd("ip", ["netns", "add", ns]))?;
        ip(ns, "link set lo up")?;
    }
    for (pod, host, addr4, addr6, mac) in [
        (POD_A, "vethpa", "10.77.0.2", "fd77::2", "02:00:00:77:00:02"),
        (POD_B, "vethpb", "10.77.0.3", "fd77::3", "02:00:00:77:00:03"),
    ] {
        ip(
            NODE,
            &format!("link add {host} type veth peer name eth0 netns {pod}"),
        )?;
        ip(
            NODE,
            &format!("link set {host} address 02:00:00:77:01:01 up"),
        )?;
        ip(NODE, &format!("addr add 10.77.0.1/32 dev {host}"))?;
        ip(NODE, &format!("addr add fe80::1/64 dev {host} nodad"))?;
        ip(NODE, &format!("route add {addr4}/32 dev {host}"))?;
        ip(NODE, &format!("-6 route add {addr6}/128 dev {host}"))?;
        ip(pod, &format!("link set eth0 address {mac} up"))?;
        ip(pod, &format!("addr add {addr4}/32 dev eth0"))?;
        ip(pod, &format!("addr add {addr6}/128 dev eth0 nodad"))?;
        ip(pod, "route add 10.77.0.1 dev eth0 scope link")?;
        ip(pod, "route add default via 10.77.0.1 dev eth0")?;
        ip(pod, "-6 route add default via fe80::1 dev eth0")?;
    }
    ip(
        NODE,
        &format!("link add up0 type veth peer name eth0 netns {PEER}"),
    )?;
    ip(NODE, "link set up0 up")?;
    ip(NODE, "addr add 10.78.0.1/24 dev up0")?;
    ip(NODE, "addr add fd78::1/64 dev up0 nodad")?;
    ip(PEER, "link set eth0 up")?;
    ip(PEER, "addr add 10.78.0.2/24 dev eth0")?;
    ip(PEER, "addr add fd78::2/64 dev eth0 nodad")?;
    ip(PEER, "route add 10.77.0.0/24 via 10.78.0.1")?;
    ip(PEER, "-6 route add fd77::/64 via fd78::1")?;
    for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
        output(in_ns(NODE, "sysctl").args(["-qw", key]))?;
    }
    Ok(())
}

/// Builds what the demos run beside the agent (the `ipq` CLI it shows, the CNI plugins the CRI
/// demo installs) and returns the agent's path.
fn agent_binary() -> Result<PathBuf> {
    util::run(&mut util::cargo([
        "build",
        "--quiet",
        "--package",
        "ipq",
        "--package",
        "ipq-cni",
        "--package",
        "ipq-cli",
        "--bins",
    ]))?;
    let path = util::workspace_root().join("target/debug/ipq-agent");
    if !path.exists() {
        bail!("{} was not built", path.display());
    }
    Ok(path)
}

fn metrics() -> Result<String> {
    output(in_ns(NODE, "curl").args(["-sf", &format!("http://{METRICS}/metrics")]))
}

fn wait_ready() -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let ready = in_ns(NODE, "curl")
            .args([
                "-sf",
                "-o",
                "/dev/null",
                &format!("http://{METRICS}/readyz"),
            ])
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(200));
    }
    bail!("the agent did not become ready within 20 s")
}

/// Pings `dst` from `ns`; returns the replies received out of `count`.
fn ping(ns: &str, dst: &str, count: u32) -> Result<u32> {
    let out = in_ns(ns, "ping")
        .args(["-c", &count.to_string(), "-i", "0.05", "-W", "1", dst])
        .output()
        .context("running ping (cargo xtask setup installs iputils-ping)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let received = text
        .lines()
        .find_map(|l| {
            l.split(", ")
                .nth(1)?
                .strip_suffix(" received")?
                .parse()
                .ok()
        })
        .context("ping printed no summary")?;
    Ok(received)
}

/// The agent's series matching `prefix` that are not zero.
fn show_metrics(prefixes: &[&str]) -> Result<()> {
    for line in metrics()?.lines() {
        if prefixes.iter().any(|p| line.starts_with(p)) && !line.ends_with(" 0") {
            println!("  {line}");
        }
    }
    Ok(())
}

fn show_ping(from: &str, to: &str, what: &str) -> Result<()> {
    let got = ping(from, to, 5)?;
    println!("  {what}: {got}/5 replies");
    Ok(())
}

/// Where the demo's pods come from.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Runtime {
    /// Namespaces and veths wired by hand, addresses moved with `ip`.
    Netns,
    /// containerd of the demo's own, driven through its CRI as the kubelet drives it.
    Containerd,
    /// A one-node Kubernetes cluster of the demo's own (the cluster tier's), ipq applied from
    /// deploy/kubernetes/, a Deployment's rollout causing the incident.
    Kubernetes,
}

impl Runtime {
    /// What the demo on this runtime needs installed, and no more.
    pub fn setup_scope(self) -> crate::setup::Scope {
        match self {
            Runtime::Netns => crate::setup::Scope::Demo,
            Runtime::Containerd => crate::setup::Scope::DemoContainerd,
            Runtime::Kubernetes => crate::setup::Scope::Cluster,
        }
    }
}

/// The containerd demo: the test crate's `ipq-cri-demo`, which shares the CRI tier's node.
pub fn run_containerd() -> Result<()> {
    // The demo runs the workspace's agent, CLI and plugins: built first, as for the netns demo.
    agent_binary()?;
    util::run(&mut util::cargo([
        "run",
        "--quiet",
        "--package",
        "ipq-tests",
        "--bin",
        "ipq-cri-demo",
    ]))
}

/// The Kubernetes demo: the test crate's `ipq-cluster-demo`, on the cluster tier's node (or its
/// three nodes, `nodes` = 3: the cross-node race), with ipq's image made of the release build
/// (as the cluster tier's).
pub fn run_kubernetes(nodes: u8) -> Result<()> {
    util::run(util::release_build_of_shipped_binaries().arg("--quiet"))?;
    util::run(&mut util::cargo([
        "run",
        "--quiet",
        "--package",
        "ipq-tests",
        "--bin",
        "ipq-cluster-demo",
        "--",
        "--nodes",
        &nodes.to_string(),
    ]))
}

pub fn run() -> Result<()> {
    let agent = agent_binary()?;
    let _ = std::fs::remove_dir_all(STATE_DIR);
    say("building the lab: node, pod A (10.77.0.2, fd77::2), pod B (10.77.0.3, fd77::3), peer");
    let mut lab = Lab { agent: None };
    build_lab()?;

    say("starting ipq-agent in the node (TCX on vethpa/vethpb, XDP on the uplink up0)");
    let child = in_ns(NODE, agent.to_str().context("agent path is not UTF-8")?)
        .args(["--bpffs-dir", BPFFS_DIR, "--metrics-addr", METRICS])
        .args(["--state-dir", STATE_DIR, "--api-socket", API_SOCKET])
        .args(["--workload", "vethp*", "--uplink", "up0"])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(AGENT_LOG).context(AGENT_LOG)?)
        .spawn()
        .context("starting ipq-agent")?;
    lab.agent = Some(child);
    wait_ready()?;

    say("pods A and B run; ipq learned their addresses from their host routes");
    show_ping(POD_A, "10.78.0.2", "pod A (10.77.0.2) -> peer")?;
    show_ping(POD_B, "10.78.0.2", "pod B (10.77.0.3) -> peer")?;
    show_metrics(&["ipq_addresses"])?;

    say("pod A starts terminating: its route is withdrawn, its process keeps running");
    ip(NODE, "route del 10.77.0.2/32 dev vethpa")?;
    ip(NODE, "-6 route del fd77::2/128 dev vethpa")?;
    thread::sleep(Duration::from_millis(300));
    show_metrics(&["ipq_addresses"])?;

    say("the orchestrator hands 10.77.0.2 to pod B at once (SwarmKit #2407)");
    ip(POD_B, "addr add 10.77.0.2/32 dev eth0")?;
    ip(NODE, "route add 10.77.0.2/32 dev vethpb")?;
    thread::sleep(Duration::from_millis(300));
    println!("  without ipq, pod A's packets would now reach the peer with pod B's address");

    say("with ipq: pod B owns 10.77.0.2, pod A is fenced off it");
    show_ping(PEER, "10.77.0.2", "peer -> 10.77.0.2 (answered by pod B)")?;
    show_ping(
        POD_A,
        "10.78.0.2",
        "pod A, still alive, -> peer from 10.77.0.2",
    )?;
    show_ping(POD_B, "10.78.0.2", "pod B -> peer")?;

    say("what an operator sees: `ipq list` and `ipq conflicts` over the agent's API");
    let cli = agent.with_file_name("ipq");
    for args in [["list"], ["conflicts"]] {
        println!("  $ ipq {}", args.join(" "));
        let text = output(cmd(&cli, ["--socket", API_SOCKET]).args(args))?;
        for line in text.lines() {
            println!("  {line}");
        }
    }

    say("what the agent counted (from its /metrics)");
    show_metrics(&[
        "ipq_conflicts_total",
        "ipq_dropped_packets_total",
        "ipq_addresses",
        "ipq_datapath_interfaces",
    ])?;

    say(&format!(
        "the conflict as the agent logged it (full log: {AGENT_LOG})"
    ));
    let log = std::fs::read_to_string(AGENT_LOG).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("\"event\":\"conflict\"")) {
        println!("  {line}");
    }
    drop(lab);
    Ok(())
}
