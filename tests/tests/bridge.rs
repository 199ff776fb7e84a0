//! Holders on a bridge, as the CNI bridge plugin wires pods: no host routes, the pods' addresses
//! are only neighbours of the bridge, and the bridge's forwarding database says which port (the
//! pod's veth) each MAC is behind.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use anyhow::Context as _;
use ipq::netdev;
use ipq_tests::lab::{ping, Agent, Lab};

const BRIDGE_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
const POD_A: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 5);
const POD_B: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 6);
/// How long the agent gets to follow what the test did.
const SETTLE: Duration = Duration::from_secs(10);

/// Waits until `metric{labels}` is `want`.
fn wait_metric(
    agent: &Agent,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
) -> anyhow::Result<()> {
    agent.wait_metric(name, labels, SETTLE, &format!("= {want}"), |got| {
        got == want
    })?;
    Ok(())
}

/// Pings `dst` from `src` in `ns`; returns the replies.
fn ping_from(ns: &ipq_tests::netns::NetNs, src: Ipv4Addr, dst: Ipv4Addr) -> anyhow::Result<u32> {
    let out = ns
        .command("ping")
        .args([
            "-c",
            "3",
            "-i",
            "0.05",
            "-W",
            "1",
            "-I",
            &src.to_string(),
            &dst.to_string(),
        ])
        .output()
        .context("running ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.split(", ")
                .nth(1)?
                .strip_suffix(" received")?
                .parse()
                .ok()
        })
        .with_context(|| format!("ping printed no summary: {text}"))
}

#[test]
fn bridge_ports_hold_addresses_and_a_duplicate_is_dropped() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    node.ip(&["link", "add", "cni0", "type", "bridge"])?;
    node.ip(&["addr", "add", "10.88.0.1/24", "dev", "cni0"])?;
    node.ip(&["link", "set", "cni0", "up"])?;
    for (pod, port, mac, addr) in [
        (&lab.pod_a, "vethba", "02:88:00:00:0a:02", POD_A),
        (&lab.pod_b, "vethbb", "02:88:00:00:0b:02", POD_B),
    ] {
        let peer = format!("netns {}", pod.name());
        let args = format!("link add {port} type veth peer name eth1 address {mac} {peer}");
        node.ip(&args.split_whitespace().collect::<Vec<_>>())?;
        node.ip(&["link", "set", port, "master", "cni0", "up"])?;
        pod.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth1"])?;
        pod.ip(&["link", "set", "eth1", "up"])?;
    }
    let agent = lab.start_agent(&["--workload", "vethb*"])?;

    // The pods talk to the bridge: the node resolves them, the bridge learns their MACs.
    assert_eq!(ping_from(&lab.pod_a, POD_A, BRIDGE_V4)?, 3);
    assert_eq!(ping_from(&lab.pod_b, POD_B, BRIDGE_V4)?, 3);
    wait_metric(&agent, "ipq_addresses", &[("state", "active")], 2.0)?;
    let port_a = node.run(|| netdev::ifindex("vethba")).context("vethba")?;
    let show = lab.maps().tool(&["show"])?;
    let line = show
        .lines()
        .find(|l| l.starts_with(&POD_A.to_string()))
        .with_context(|| format!("{POD_A} not in the datapath:\n{show}"))?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[1..3], ["active", &port_a.to_string()], "{line}");

    // The IPAM hands pod A's address to pod B as well. On a bridge nothing routes it to B,
    // so B's use of it is a duplicate source: its announcements and packets are dropped at
    // its port, the node never learns B's MAC for it, and A keeps the address. (A claim for B
    // comes through CNI, not from traffic.)
    lab.pod_b
        .ip(&["addr", "add", &format!("{POD_A}/24"), "dev", "eth1"])?;
    lab.pod_b.ip(&["neigh", "flush", "dev", "eth1"])?;
    let labels = [("hook", "tc_ingress"), ("reason", "duplicate_source")];
    let before = agent.metric("ipq_dropped_packets_total", &labels)?;
    assert_eq!(ping_from(&lab.pod_b, POD_A, BRIDGE_V4)?, 0);
    let dropped = agent.metric("ipq_dropped_packets_total", &labels)? - before;
    assert!(
        dropped >= 1.0,
        "pod B's ARP from {POD_A} must be dropped, counted {dropped}"
    );
    let kind = [("kind", "duplicate_source")];
    agent.wait_metric("ipq_conflicts_total", &kind, SETTLE, ">= 1", |n| n >= 1.0)?;
    assert_eq!(
        ping_from(&lab.pod_a, POD_A, BRIDGE_V4)?,
        3,
        "pod A, the holder, keeps it"
    );
    assert_eq!(
        ping(&lab.pod_b, IpAddr::V4(BRIDGE_V4), 3),
        3,
        "pod B's own address flows"
    );
    let show = lab.maps().tool(&["show"])?;
    assert!(
        show.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3]
                == [POD_A.to_string().as_str(), "active", &port_a.to_string()]),
        "A still holds {POD_A}:\n{show}"
    );

    // Pod A goes away: its port is deleted, its address is quarantined.
    node.ip(&["link", "del", "vethba"])?;
    wait_metric(&agent, "ipq_addresses", &[("state", "quarantined")], 1.0)?;
    let show = lab.maps().tool(&["show"])?;
    assert!(
        show.lines()
            .any(|l| l.starts_with(&POD_A.to_string()) && l.contains("quarantined")),
        "{POD_A} quarantined:\n{show}"
    );
    Ok(())
}
