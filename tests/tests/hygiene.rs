//! Reuse hygiene on a real kernel: a reused address starts clean. Conntrack entries of the old
//! holder are flushed (a Service's UDP stream must not follow its entry to the next holder),
//! the node's neighbour entries are deleted and the new holder is announced on its bridge, and
//! what belongs to the node itself, or to holders only observed, is never touched.
//!
//! The misdelivery is first shown to be real without ipq; `conntrack -L` (conntrack-tools) is
//! the independent witness of what ipq flushed.

#[path = "hygiene/announce.rs"]
mod announce;
#[path = "hygiene/bridge.rs"]
mod bridge;
#[path = "hygiene/capture.rs"]
mod capture;
#[path = "hygiene/kernel_flush.rs"]
mod kernel_flush;
#[path = "hygiene/service.rs"]
mod service;
#[path = "hygiene/support.rs"]
mod support;

use std::{
    net::{IpAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    api,
    lab::{poll, Agent, Lab, POD_A_V4, POD_A_V6, POD_B_LLADDR},
    netns::NetNs,
};
use serde_json::{json, Value};

use bridge::{a_gone_b_configured, neighbour_mac, pings, BR_A_MAC, BR_B_MAC, SHARED};
use kernel_flush::{
    claim_flush_method, claim_takes_only_the_claimed_entries, entry_count, open_flows_to_pod_a,
};
use service::{
    add_service, conntrack_entries_of, remove_backend, wire_client, Listener, Stream, PORT_V4,
    PORT_V6, VIP_V4, VIP_V6,
};
use support::{address, claim, ip, run, socket, wait_flush};

/// A short quarantine, so that "after the cool-down" comes within the test.
const SHORT_QUARANTINE: [&str; 6] = [
    "--cooldown",
    "1s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "3s",
];

/// How pod B comes to hold pod A's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reuse {
    /// A is gone and its quarantine is over.
    AfterCooldown,
    /// A still lives (Draining); B's claim fences it.
    Early,
}

/// What pod B received of the Service's streams once it held A's addresses.
struct Outcome {
    received_v4: usize,
    received_v6: usize,
    sent_meanwhile: u64,
    left_v4: Vec<String>,
    left_v6: Vec<String>,
    claim_answer: Option<Value>,
}

/// The Service scenario: C streams to the VIP (DNAT to A); A's endpoint leaves the Service; B
/// takes A's addresses (as `reuse` says); then B listens for 1 s. With `agent`, B's addresses
/// are claimed through the API (as ipq-cni would) before B's routes go in.
fn service_scenario(lab: &Lab, agent: Option<&Agent>, reuse: Reuse) -> anyhow::Result<Outcome> {
    let client = NetNs::new("pc")?;
    wire_client(&lab.node, &client)?;
    add_service(&lab.node)?;
    let a_v4 = Listener::bind(&lab.pod_a, false, PORT_V4)?;
    let a_v6 = Listener::bind(&lab.pod_a, true, PORT_V6)?;
    let _s4 = Stream::start(&client, VIP_V4.into(), PORT_V4);
    let _s6 = Stream::start(&client, VIP_V6.into(), PORT_V6);
    ensure!(
        a_v4.count(Duration::from_millis(300))? > 0,
        "pod A gets the v4 stream"
    );
    ensure!(
        a_v6.count(Duration::from_millis(300))? > 0,
        "pod A gets the v6 stream"
    );
    ensure!(
        !conntrack_entries_of(&lab.node, POD_A_V4.into())?.is_empty(),
        "the v4 stream has its DNAT entry"
    );

    remove_backend(&lab.node)?;
    let addrs: [IpAddr; 2] = [POD_A_V4.into(), POD_A_V6.into()];
    match reuse {
        Reuse::AfterCooldown => {
            ip(&lab.node, "link del vethpa")?;
            match agent {
                Some(_) => {
                    for addr in addrs {
                        let flush = wait_flush(lab, addr, "holder_gone")?;
                        ensure!(
                            flush["errors"].is_null(),
                            "{addr}: holder-gone flush failed: {flush}"
                        );
                    }
                    for addr in addrs {
                        poll(
                            &format!("{addr} free after its quarantine"),
                            Duration::from_secs(15),
                            || Ok(address(lab, addr)?.is_none().then_some(())),
                        )?;
                    }
                }
                None => std::thread::sleep(Duration::from_secs(2)),
            }
        }
        Reuse::Early => {}
    }

    let b_v4 = Listener::bind(&lab.pod_b, false, PORT_V4)?;
    let b_v6 = Listener::bind(&lab.pod_b, true, PORT_V6)?;
    for addr in addrs {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
    }
    let claim_answer = match agent {
        Some(_) => Some(claim(lab, &addrs, "vethpb", POD_B_LLADDR)?.0),
        None => None,
    };
    // Calico's order: the route for the new holder goes in once its claim is answered.
    ip(
        &lab.node,
        &format!("route replace {POD_A_V4}/32 dev vethpb"),
    )?;
    ip(
        &lab.node,
        &format!("-6 route replace {POD_A_V6}/128 dev vethpb"),
    )?;
    let sent_before = _s4.sent() + _s6.sent();
    let received_v4 = b_v4.count(Duration::from_millis(1000))?;
    let received_v6 = b_v6.count(Duration::from_millis(200))?;
    let sent_meanwhile = _s4.sent() + _s6.sent() - sent_before;
    Ok(Outcome {
        received_v4,
        received_v6,
        sent_meanwhile,
        left_v4: conntrack_entries_of(&lab.node, POD_A_V4.into())?,
        left_v6: conntrack_entries_of(&lab.node, POD_A_V6.into())?,
        claim_answer,
    })
}

#[test]
fn without_ipq_a_services_stream_follows_its_conntrack_entry_to_the_next_holder(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let out = service_scenario(&lab, None, Reuse::AfterCooldown)?;
    assert!(out.sent_meanwhile > 100, "the stream kept going");
    assert!(
        out.received_v4 > 0 && out.received_v6 > 0,
        "without a flush, pod B receives the Service's stream meant for A (v4 {}, v6 {}); \
         conntrack: {:?} {:?}",
        out.received_v4,
        out.received_v6,
        out.left_v4,
        out.left_v6,
    );
    assert!(
        !out.left_v4.is_empty() && !out.left_v6.is_empty(),
        "conntrack still has the DNAT entries to A's addresses"
    );
    Ok(())
}

fn assert_clean(out: &Outcome, agent: &Agent) {
    assert!(out.sent_meanwhile > 100, "the stream kept going");
    assert_eq!(
        (out.received_v4, out.received_v6),
        (0, 0),
        "pod B must receive none of the Service's stream; log:\n{}",
        agent.log()
    );
    assert!(
        out.left_v4.is_empty() && out.left_v6.is_empty(),
        "conntrack -L still lists A's addresses after the claim: {:?} {:?}",
        out.left_v4,
        out.left_v6
    );
    let answer = out.claim_answer.as_ref().expect("claimed through the API");
    for view in answer["addresses"].as_array().expect("addresses") {
        let flush = &view["last_flush"];
        assert_eq!(
            flush["trigger"], "new_holder",
            "the claim is answered with its finished flush: {view}"
        );
        assert!(flush["errors"].is_null(), "{flush}");
        assert!(flush["at"].is_string(), "{flush}");
    }
}

#[test]
fn after_the_cooldown_the_next_holder_gets_none_of_a_services_stream() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent(&SHORT_QUARANTINE)?;
    let out = service_scenario(&lab, Some(&agent), Reuse::AfterCooldown)?;
    assert_clean(&out, &agent);
    let flushed = agent.metric("ipq_conntrack_entries_flushed_total", &[])?;
    assert!(
        flushed >= 2.0,
        "both DNAT entries flushed, counted {flushed}"
    );
    assert_eq!(
        agent.metric("ipq_hygiene_failures_total", &[("step", "conntrack")])?,
        0.0
    );
    Ok(())
}

#[test]
fn an_early_reuse_is_answered_after_the_flush_and_the_next_holder_gets_none() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    let agent = lab.start_agent(&[])?;
    let out = service_scenario(&lab, Some(&agent), Reuse::Early)?;
    assert_clean(&out, &agent);
    let answer = out.claim_answer.as_ref().expect("claimed");
    // The claim's own flush took the live DNAT entries (`conntrack -L` above). A dump counts
    // them exactly; the kernel's filtered flush counts what the kernel reported, which with
    // the default nf_conntrack_events = 2 and no event listener is nothing.
    for (view, family) in answer["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .zip(["IPv4", "IPv6"])
    {
        let flush = &view["last_flush"];
        let method = claim_flush_method(&agent, family)?;
        assert_eq!(flush["conntrack_flush"], method, "{family}: {flush}");
        if method == "dump" {
            assert!(
                flush["conntrack_entries"].as_u64() >= Some(1),
                "{family}: the dump counts the DNAT entry it deleted: {flush}"
            );
        }
    }
    // The old pod's PERMANENT neighbour entry (the ptp plugin's) points elsewhere: reported,
    // never deleted.
    let v4 = &answer["addresses"][0]["last_flush"];
    assert!(
        v4["permanent_neighbours"]
            .as_array()
            .is_some_and(|p| p.iter().any(|e| e
                .as_str()
                .is_some_and(|e| e.ends_with("lladdr 02:77:00:00:0a:02")))),
        "{v4}"
    );
    let kept = ip(&lab.node, &format!("neigh show {POD_A_V4} dev vethpa"))?;
    assert!(kept.contains("PERMANENT"), "{kept}");
    // The flush is in the event feed and in `ipq get`.
    let events = api::request(&socket(&lab), "GET", "/v1/events", None)?;
    let flushed_event = events.body.lines().any(|l| {
        serde_json::from_str::<Value>(l).is_ok_and(|e| {
            e["type"] == "hygiene"
                && e["address"] == POD_A_V4.to_string()
                && e["trigger"] == "new_holder"
                && e["conntrack_entries"].is_u64()
                && e["conntrack_flush"] == answer["addresses"][0]["last_flush"]["conntrack_flush"]
        })
    });
    assert!(
        flushed_event,
        "no hygiene event in /v1/events:\n{}",
        events.body
    );
    let get = api::ipq(&socket(&lab), &["get", &POD_A_V4.to_string()])?;
    let text = get.ok();
    assert!(
        text.contains("Last flush:") && text.contains("(new_holder)"),
        "{text}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// How a claim's entries are flushed.

/// An agent in `lab` whose IPv4 claims use the kernel's filtered flush, with every new
/// conntrack entry carrying the event extension (`nf_conntrack_events=1`), so that the kernel
/// echoes each deletion to it. This machine's kernel (6.18) honours the IPv4 filter: the probe
/// must say so, or the fast path is not what the caller tests.
fn agent_flushing_claims_in_kernel(lab: &Lab) -> anyhow::Result<Agent<'_>> {
    run(
        &lab.node,
        "sysctl",
        &["-qw", "net.netfilter.nf_conntrack_events=1"],
    )?;
    let agent = lab.start_agent(&[])?;
    assert_eq!(
        claim_flush_method(&agent, "IPv4")?,
        "kernel",
        "{}",
        agent.log()
    );
    Ok(agent)
}

#[test]
fn a_claims_flush_takes_the_claimed_addresses_entries_in_every_zone_and_nothing_else(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    // Every entry carries conntrack's event extension, so the kernel's filtered flush counts
    // exactly.
    let agent = agent_flushing_claims_in_kernel(&lab)?;
    // This machine's kernel (6.18) inverts the filter for IPv6: the probe must say so.
    assert_eq!(
        claim_flush_method(&agent, "IPv6")?,
        "dump",
        "{}",
        agent.log()
    );
    let status: Value = api::request(&socket(&lab), "GET", "/v1/status", None)?.json()?;
    let shown = &status["conntrack_claim_flush"];
    assert_eq!(shown["ipv4"], "kernel", "{status}");
    assert!(
        shown["ipv6"]
            .as_str()
            .is_some_and(|s| s.starts_with("dump (the kernel did not honour the filter")),
        "{status}"
    );
    let out = claim_takes_only_the_claimed_entries(&lab, &agent)?;
    for (flush, method) in out.flushes.iter().zip(["kernel", "dump"]) {
        assert!(flush["errors"].is_null(), "{flush}");
        assert_eq!(flush["conntrack_flush"], method, "{flush}");
        assert_eq!(
            flush["conntrack_entries"], 4,
            "the four entries carrying the address, counted: {flush}"
        );
    }
    assert_eq!(
        agent.metric("ipq_conntrack_entries_flushed_total", &[])?,
        8.0
    );
    Ok(())
}

#[test]
fn a_kernel_flush_whose_deletion_notices_overflow_the_socket_still_completes() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    // Each deletion is echoed to the agent: 30 000 notices are more than its socket holds.
    let agent = agent_flushing_claims_in_kernel(&lab)?;
    let flows: u16 = 30_000;
    let before = open_flows_to_pod_a(&lab, flows)?;
    ensure!(
        before >= u32::from(flows),
        "{before} entries for {flows} flows"
    );
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, POD_A_V4.into())?;
    let (answer, took) = claim(&lab, &[POD_A_V4.into()], "vethpb", POD_B_LLADDR)?;
    let flush = &answer["addresses"][0]["last_flush"];
    assert!(flush["errors"].is_null(), "{flush}; log:\n{}", agent.log());
    assert_eq!(flush["conntrack_flush"], "kernel", "{flush}");
    let reported = flush["conntrack_entries"].as_u64().expect("a count");
    assert!(
        reported <= u64::from(flows),
        "never more than it deleted: {reported}"
    );
    // Listed entries are the table; `conntrack -C` also counts deleted entries whose notice
    // waits for redelivery (on the event cache's dying list), freed within moments.
    let listed = conntrack_entries_of(&lab.node, POD_A_V4.into())?;
    assert!(
        listed.is_empty(),
        "the flush took every flow's entry: {} of {before} still listed ({reported} reported, \
         in {took:?}); log:\n{}",
        listed.len(),
        agent.log()
    );
    let left = poll("the deleted entries freed", Duration::from_secs(5), || {
        let left = entry_count(&lab.node)?;
        Ok((left < 100).then_some(left))
    });
    assert!(
        left.is_ok(),
        "deleted entries are freed: {left:?} ({} counted now)",
        entry_count(&lab.node)?
    );
    Ok(())
}

#[test]
fn with_the_filtered_flush_turned_off_a_claim_dumps_and_takes_the_same_entries(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent_configured("[hygiene]\nfiltered_flush = false\n", &[])?;
    for family in ["IPv4", "IPv6"] {
        assert_eq!(
            claim_flush_method(&agent, family)?,
            "dump",
            "{}",
            agent.log()
        );
    }
    let status: Value = api::request(&socket(&lab), "GET", "/v1/status", None)?.json()?;
    for family in ["ipv4", "ipv6"] {
        assert_eq!(
            status["conntrack_claim_flush"][family], "dump (hygiene.filtered_flush = false)",
            "{status}"
        );
    }
    let out = claim_takes_only_the_claimed_entries(&lab, &agent)?;
    for flush in &out.flushes {
        assert!(flush["errors"].is_null(), "{flush}");
        assert_eq!(flush["conntrack_flush"], "dump", "{flush}");
        assert_eq!(flush["conntrack_entries"], 4, "{flush}");
    }
    Ok(())
}

#[test]
fn without_cap_sys_admin_as_in_the_daemonset_the_probe_runs_in_a_user_namespace(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent_wrapped(
        &[
            "setpriv",
            "--inh-caps",
            "-sys_admin",
            "--bounding-set",
            "-sys_admin",
            "--",
        ],
        &[],
    )?;
    const CAP_SYS_ADMIN: u32 = 21;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid()))?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("CapEff")?;
    ensure!(
        u64::from_str_radix(eff.trim(), 16)? & (1 << CAP_SYS_ADMIN) == 0,
        "the agent runs without CAP_SYS_ADMIN"
    );
    // unshare(CLONE_NEWNET) alone is refused; with a user namespace the probe runs anyway.
    assert_eq!(
        claim_flush_method(&agent, "IPv4")?,
        "kernel",
        "{}",
        agent.log()
    );
    let out = claim_takes_only_the_claimed_entries(&lab, &agent)?;
    assert_eq!(
        out.flushes[0]["conntrack_flush"], "kernel",
        "{:?}",
        out.flushes
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Neighbour caches on a bridge.

#[test]
fn neighbour_caches_follow_the_new_holder_within_a_second() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    let third = NetNs::new("pt")?;
    let agent = a_gone_b_configured(&lab, &third)?;
    let shared = SHARED;
    let (answer, _) = claim(&lab, &shared, "vethbb", BR_B_MAC)?;
    let claimed = Instant::now();

    for addr in shared {
        // The third pod's cache now says B, before it sent B anything.
        let mac = poll(
            &format!("the third pod's entry for {addr} shows B's MAC"),
            Duration::from_secs(1),
            || Ok(neighbour_mac(&third, addr)?.filter(|m| m == BR_B_MAC)),
        )
        .with_context(|| format!("agent log:\n{}", agent.log()))?;
        assert_eq!(mac, BR_B_MAC);
        assert!(pings(&third, addr), "third pod -> B {addr}");
        assert!(pings(node, addr), "node -> B {addr}");
    }
    let took = claimed.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "node and third pod must reach B within a second of the claim (v4 and v6), took \
         {took:?}"
    );
    for view in answer["addresses"].as_array().expect("addresses") {
        let flush = &view["last_flush"];
        assert!(flush["errors"].is_null(), "{flush}");
        assert!(
            flush["announcements"].as_u64() >= Some(1),
            "announced on the bridge's other ports: {flush}"
        );
    }
    assert!(agent.metric("ipq_announcements_total", &[])? >= 2.0);
    // The node's own entries no longer point at A: deleted by a pass (the holder's departure
    // or the claim; counted in ipq_neighbours_flushed_total), or already overridden by B's
    // announcement when a pass looked, which under load can come first.
    let flushed = agent.metric("ipq_neighbours_flushed_total", &[])?;
    for addr in shared {
        let mac = neighbour_mac(node, addr)?;
        assert_ne!(
            mac.as_deref(),
            Some(BR_A_MAC),
            "the node's entry for {addr} still points at A ({flushed} neighbour entries \
             flushed)\n{}",
            agent.log()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Safety.

#[test]
fn the_nodes_own_addresses_and_connections_are_never_flushed() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    add_service(node)?;
    // A connection of the node's own: node -> peer over the uplink, in conntrack.
    let peer_rx = lab.peer.run(|| UdpSocket::bind(("10.78.0.2", 5400)))?;
    let node_tx = node.run(|| UdpSocket::bind(("10.78.0.1", 5401)))?;
    node_tx.send_to(b"node", ("10.78.0.2", 5400))?;
    peer_rx.set_read_timeout(Some(Duration::from_secs(1)))?;
    peer_rx.recv_from(&mut [0u8; 16])?;
    let node_addr: IpAddr = "10.78.0.1".parse()?;
    ensure!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "the node's own flow is tracked"
    );
    let agent = lab.start_agent(&[])?;

    // A pod address is flushed: the node's flow stays.
    ip(node, "link del vethpa")?;
    wait_flush(&lab, POD_A_V4.into(), "holder_gone")?;
    assert!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "flushing a pod's address took the node's own flow"
    );

    // An address the node owns, claimed by a workload (a misconfigured IPAM): the claim is
    // refused before anything could be flushed (the registry never makes a node address a
    // holder's), and nothing is.
    let body = json!({
        "addresses": [node_addr],
        "holder": {"interface": "vethpb", "mac": POD_B_LLADDR, "container_id": "c-new"},
        "source": "cni",
    });
    let refused = api::request(&socket(&lab), "POST", "/v1/claims", Some(&body.to_string()))?;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body.contains("configured on this node itself"),
        "{}",
        refused.body
    );
    assert_eq!(
        agent.metric("ipq_conntrack_entries_flushed_total", &[])?,
        0.0,
        "nothing of the node's was flushed, and the pod's address had no entry"
    );
    assert!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "the node's own flow survives a claim of its address; log:\n{}",
        agent.log()
    );
    Ok(())
}

#[test]
fn fencing_under_observe_flushes_nothing() -> anyhow::Result<()> {
    for flags in [
        &["--mode", "observe"][..],
        &["--on-early-reuse", "observe"][..],
    ] {
        let lab = Lab::new()?;
        let client = NetNs::new("pc")?;
        wire_client(&lab.node, &client)?;
        add_service(&lab.node)?;
        let a_v4 = Listener::bind(&lab.pod_a, false, PORT_V4)?;
        let agent = lab.start_agent(flags)?;
        let _stream = Stream::start(&client, VIP_V4.into(), PORT_V4);
        ensure!(
            a_v4.count(Duration::from_millis(300))? > 0,
            "A gets the stream"
        );
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, POD_A_V4.into())?;
        let (answer, _) = claim(&lab, &[POD_A_V4.into()], "vethpb", POD_B_LLADDR)?;
        assert!(
            answer["addresses"][0]["last_flush"].is_null(),
            "{flags:?}: nothing flushed, so nothing to report: {answer}"
        );
        assert!(
            !conntrack_entries_of(&lab.node, POD_A_V4.into())?.is_empty(),
            "{flags:?}: the observed old holder's flow keeps its conntrack entry"
        );
        assert!(
            a_v4.count(Duration::from_millis(300))? > 0,
            "{flags:?}: A still gets the stream"
        );
        assert_eq!(
            agent.metric("ipq_conntrack_entries_flushed_total", &[])?,
            0.0,
            "{flags:?}"
        );
        assert_eq!(agent.metric("ipq_neighbours_flushed_total", &[])?, 0.0);
    }
    Ok(())
}
