//! Reuse hygiene under fault: a step that cannot be done is counted, alerted on and said in
//! the claim's answer; the claim itself, and the steps that can be done, still are.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    api,
    lab::{Lab, POD_A_V4, POD_B_LLADDR},
    netns::NetNs,
};
use serde_json::{json, Value};

const SHARED: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 5);

fn ip(ns: &NetNs, args: &str) -> anyhow::Result<String> {
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
    let answer = claim_ok(&lab, &body)?;
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
    let get = api::ipq(
        &lab.work_dir().join("ipq.sock"),
        &["get", &SHARED.to_string()],
    )?;
    assert!(get.ok().contains("Failed:"), "{}", get.ok());
    Ok(())
}

/// `conntrack args` in `ns`; its stdout, or an error with its stderr.
fn conntrack(ns: &NetNs, args: &[&str]) -> anyhow::Result<String> {
    let out = ns
        .command("conntrack")
        .args(args)
        .output()
        .context("running conntrack (cargo xtask setup installs it)")?;
    ensure!(
        out.status.success(),
        "conntrack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// capability.h's number of CAP_NET_ADMIN.
const CAP_NET_ADMIN: u32 = 12;

/// Whether `pid` has CAP_NET_ADMIN (bit 12) in its effective set.
fn has_net_admin(pid: u32) -> anyhow::Result<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("CapEff in /proc/<pid>/status")?;
    Ok(u64::from_str_radix(eff.trim(), 16)? & (1 << CAP_NET_ADMIN) != 0)
}

/// Injected: the agent runs without CAP_NET_ADMIN (a DaemonSet that grants SYS_ADMIN, BPF and
/// NET_RAW but forgot NET_ADMIN): the kernel refuses every ctnetlink request and every
/// neighbour deletion with EPERM, while the datapath, the netlink dumps and the API still
/// work / Holds: an early reuse is still claimed, its answer and `ipq get` say that conntrack
/// and neighbour flushing failed, both are counted in `ipq_hygiene_failures_total{step}`
/// (which IpqHygieneFailing alerts on), and the old holder's conntrack entry, which really is
/// still there, is not reported as flushed.
#[test]
fn without_cap_net_admin_the_flush_fails_is_counted_and_said_and_the_claim_still_succeeds(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    // An entry of the old holder's, and a learned (non-permanent) neighbour entry for its
    // address pointing at an old MAC: both are what the flush must delete.
    conntrack(
        node,
        &[
            "-I",
            "-p",
            "udp",
            "-s",
            "10.78.0.2",
            "-d",
            "10.77.0.2",
            "--sport",
            "5000",
            "--dport",
            "5001",
            "-t",
            "120",
        ],
    )?;
    ip(
        node,
        &format!("neigh add {POD_A_V4} lladdr 02:00:00:00:0a:99 dev up0 nud stale"),
    )?;
    let agent = lab.start_agent_wrapped(
        &[
            "setpriv",
            "--inh-caps",
            "-net_admin",
            "--bounding-set",
            "-net_admin",
            "--",
        ],
        &[],
    )?;
    ensure!(
        !has_net_admin(agent.pid())?,
        "the agent must run without CAP_NET_ADMIN for this row to mean anything"
    );

    let body = json!({
        "addresses": [IpAddr::from(POD_A_V4)],
        "holder": {"interface": "vethpb", "mac": POD_B_LLADDR, "container_id": "c-new"},
        "source": "cni",
    });
    let answer = claim_ok(&lab, &body)?;
    let view = &answer["addresses"][0];
    assert_eq!(view["state"], "active", "the claim succeeded: {answer}");
    let flush = &view["last_flush"];
    let errors: Vec<&str> = flush["errors"]
        .as_array()
        .with_context(|| format!("the answer must say what failed: {answer}"))?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for step in ["conntrack:", "neighbours:"] {
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(step) && e.contains("Operation not permitted")),
            "{step} failure, with the kernel's reason, missing from {errors:?}; log:\n{}",
            agent.log()
        );
    }
    assert_eq!(flush["conntrack_entries"], 0, "{flush}");
    assert!(
        conntrack(node, &["-L", "-d", "10.77.0.2"])?.contains("dport=5001"),
        "the old holder's entry really is still there"
    );
    for step in ["conntrack", "neighbours"] {
        assert!(
            agent.metric("ipq_hygiene_failures_total", &[("step", step)])? >= 1.0,
            "{step} failure counted"
        );
    }
    let get = api::ipq(
        &lab.work_dir().join("ipq.sock"),
        &["get", &POD_A_V4.to_string()],
    )?;
    let text = get.ok();
    assert!(
        text.contains("Failed:") && text.contains("conntrack:"),
        "{text}"
    );
    Ok(())
}

/// POSTs `body` to /v1/claims; the answer's JSON, which must be a 200.
fn claim_ok(lab: &Lab, body: &Value) -> anyhow::Result<Value> {
    let socket = lab.work_dir().join("ipq.sock");
    let answer = api::request(&socket, "POST", "/v1/claims", Some(&body.to_string()))?;
    ensure!(
        answer.status == 200,
        "claim: {} {}",
        answer.status,
        answer.body
    );
    answer.json()
}
