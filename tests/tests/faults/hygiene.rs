//! Reuse hygiene under fault: a step that cannot be done is counted, alerted on and said in
//! the claim's answer; the claim itself, and the steps that can be done, still are.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{ensure, Context as _};
use ipq_tests::{api, lab::Lab};
use serde_json::{json, Value};

const SHARED: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 5);

fn ip(ns: &ipq_tests::netns::NetNs, args: &str) -> anyhow::Result<String> {
    ns.ip(&args.split_whitespace().collect::<Vec<_>>())
}

/// Injected: a new holder on a bridge whose MAC nobody knows (the claim names none, the bridge
/// learns none behind its port) / Holds: the announcement is counted as failed
/// (`ipq_hygiene_failures_total{step="announce"}`, which IpqHygieneFailing alerts on), the
/// claim succeeds and its answer says what failed; conntrack and neighbours are still flushed.
#[test]
fn an_announcement_without_a_mac_is_counted_and_said_and_the_claim_still_succeeds(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    ip(node, "link add cni0 type bridge")?;
    ip(node, "addr add 10.88.0.1/24 dev cni0")?;
    ip(node, "link set cni0 up")?;
    for (pod, port, mac) in [
        (&lab.pod_a, "vethba", "02:88:00:00:0a:02"),
        (&lab.pod_b, "vethbb", "02:88:00:00:0b:02"),
    ] {
        ip(
            node,
            &format!(
                "link add {port} type veth peer name eth1 address {mac} netns {}",
                pod.name()
            ),
        )?;
        ip(node, &format!("link set {port} master cni0 up"))?;
        // The bridge learns nothing behind the ports.
        ip(
            node,
            &format!("link set dev {port} type bridge_slave learning off"),
        )?;
        ip(pod, "link set eth1 up")?;
    }
    let agent = lab.start_agent(&["--workload", "vethb*"])?;
    let before = agent.metric("ipq_hygiene_failures_total", &[("step", "announce")])?;

    let body = json!({
        "addresses": [IpAddr::from(SHARED)],
        "holder": {"interface": "vethbb"},
        "source": "api",
    });
    let socket = lab.work_dir().join("ipq.sock");
    let answer = api::request(&socket, "POST", "/v1/claims", Some(&body.to_string()))?;
    ensure!(
        answer.status == 200,
        "claim: {} {}",
        answer.status,
        answer.body
    );
    let answer: Value = answer.json()?;
    let view = &answer["addresses"][0];
    assert_eq!(view["state"], "active", "the claim succeeded: {answer}");
    let flush = &view["last_flush"];
    let errors = flush["errors"]
        .as_array()
        .with_context(|| format!("the answer must say what failed: {answer}"))?;
    assert!(
        errors.len() == 1
            && errors[0]
                .as_str()
                .is_some_and(|e| e.starts_with("announce:") && e.contains("MAC is unknown")),
        "{flush}"
    );
    assert_eq!(flush["announcements"], 0, "{flush}");
    assert!(
        flush["conntrack_entries"].is_u64() && flush["neighbours"].is_u64(),
        "the flush itself ran: {flush}"
    );
    let after = agent.metric("ipq_hygiene_failures_total", &[("step", "announce")])?;
    assert_eq!(after - before, 1.0, "the failure is counted once");
    assert_eq!(
        agent.metric("ipq_hygiene_failures_total", &[("step", "conntrack")])?,
        0.0
    );
    let get = api::ipq(&socket, &["get", &SHARED.to_string()])?;
    assert!(get.ok().contains("Failed:"), "{}", get.ok());
    Ok(())
}
