//! A first start on a node with many workload veths: until ready, until every veth has moved
//! to its TCX link, a route burst during and after the move, and the agent's memory once the
//! node is filled with pods' addresses, and again after as many new pods came and went.

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use super::{
    agent_args, api_clients::churn, idle_cost, node::api, population_addr, route_burst,
    wait_entries, workloads::rss_parts, Node, CHURN_CLAIMS,
};

/// What a cold start measured.
pub(super) struct ColdStart {
    /// From spawn to `/readyz` answering 200.
    pub(super) ready_ms: f64,
    /// Workload veths `protected` at that moment (by a netlink filter or a TCX link).
    pub(super) protected: f64,
    /// From spawn until `ipq_datapath_tc_upgrades_pending` reached 0: the last netlink filter
    /// replaced by its TCX link (`tc_attach = auto` on a kernel with TCX).
    pub(super) tcx_done_ms: f64,
    /// Workload veths whose attachment is `tcx` after that.
    pub(super) on_tcx: f64,
    /// A 1000-route burst's p99 while the move runs, and after it.
    pub(super) burst_during_p99: f64,
    /// Veths already on TCX when that burst started (the move was under way, not over).
    pub(super) moved_before_burst: f64,
    pub(super) burst_after_p99: f64,
    /// The agent's RSS once the registry holds `populated` addresses on these veths: what a
    /// node with many pods costs, not a node with a few interfaces.
    pub(super) rss_populated_mb: f64,
    /// The agent's CPU (% of one CPU) over a quiet spell on that filled node: what an idle
    /// node of many pods pays, its verification passes over 1000 interfaces and 64k addresses
    /// included.
    pub(super) idle_cpu_populated: f64,
    /// The last verification pass (pins, links and their place on each hook, and the maps
    /// read whole, against the kernel) once every veth is on its TCX link and the node is
    /// filled: O(interfaces + addresses), off the owner loop.
    pub(super) verify_pass_ms: f64,
    /// That pass's comparison of the maps with what the agent wrote, on its owner loop
    /// (the maps were read in the pass, off the loop): O(addresses).
    pub(super) verify_compare_ms: f64,
    pub(super) verify_maps_ms: f64,
    /// The agent's RSS after `CHURN_CLAIMS` new pods' claims and their drains on that filled
    /// node, once their addresses are released: what the node's past churn leaves resident.
    pub(super) rss_after_churn_mb: f64,
    /// Those claims (each with its drain) a second.
    pub(super) churn_per_second: f64,
}

/// A first start on a node with `veths` workload veths; then `populated` host routes over them.
pub(super) fn cold_start(veths: u32, populated: u32, quick: bool) -> Result<ColdStart> {
    let args = agent_args();
    let mut node = Node::new(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let mut batch = String::new();
    for i in 0..veths {
        batch.push_str(&format!(
            "link add bw{i} type veth peer bq{i}\nlink set bw{i} up\nlink set bq{i} up\n"
        ));
    }
    node.ip_batch(&batch)?;
    let spawned = Instant::now();
    let ready_ms = node.start_agent()?.as_secs_f64() * 1e3;
    let protected = count_workload(&node, "protection", "protected")?;
    // A 1000-route burst while the move to TCX links runs: each link create holds rtnl_lock
    // for a grace period, and every route add waits behind it.
    let moved_before_burst = count_workload(&node, "attachment", "tcx")?;
    let (_, burst_during_p99) = route_burst(&node, 60)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while node.metric("ipq_datapath_tc_upgrades_pending")? > 0.0 {
        if Instant::now() > deadline {
            bail!("TCX upgrades not done in 300 s:\n{}", node.log());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let tcx_done_ms = spawned.elapsed().as_secs_f64() * 1e3;
    let on_tcx = count_workload(&node, "attachment", "tcx")?;
    // The same burst once the move is over: what the node's other rtnl users get normally.
    let (_, burst_after_p99) = route_burst(&node, 61)?;
    // The node filled: `populated` pods' addresses spread over the veths.
    let mut lines = String::new();
    for i in 1..=populated {
        lines.push_str(&format!(
            "route add {}/32 dev bw{}\n",
            population_addr(i),
            i % veths
        ));
    }
    node.ip_batch(&lines)?;
    wait_entries(&node, f64::from(populated), Duration::from_secs(900))?;
    // Four of the agent's default verification intervals (5 s): the idle cost of a full node
    // is mostly its periodic O(interfaces + addresses) pass, which a shorter spell could miss.
    let (idle_cpu_populated, rss_populated_mb) = idle_cost(&node, if quick { 10.0 } else { 20.0 })?;
    // Filling the node took several verification intervals: the gauge is a pass over them all.
    let verify_pass_ms = node.metric("ipq_datapath_verify_seconds")? * 1e3;
    let verify_compare_ms = node.metric("ipq_datapath_verify_maps_compare_seconds")? * 1e3;
    let verify_maps_ms = node.metric("ipq_datapath_verify_maps_seconds")? * 1e3;
    eprintln!("bench control: filled: {}", rss_parts(&node)?);
    let claims = if quick {
        CHURN_CLAIMS / 10
    } else {
        CHURN_CLAIMS
    };
    eprintln!("bench control: {claims} new pods' claims and drains on the filled node");
    let churn_per_second = churn(&node, claims)?;
    let (_, rss_after_churn_mb) = idle_cost(&node, 3.0)?;
    eprintln!("bench control: after the churn: {}", rss_parts(&node)?);
    Ok(ColdStart {
        ready_ms,
        protected,
        tcx_done_ms,
        on_tcx,
        burst_during_p99,
        moved_before_burst,
        burst_after_p99,
        rss_populated_mb,
        idle_cpu_populated,
        verify_pass_ms,
        verify_compare_ms,
        verify_maps_ms,
        rss_after_churn_mb,
        churn_per_second,
    })
}

/// Workload veths (`bw*`) whose `field` in `/v1/status` is `value`.
pub(super) fn count_workload(node: &Node, field: &str, value: &str) -> Result<f64> {
    let (status, body) = api(&node.socket(), "GET", "/v1/status", "")?;
    if status != 200 {
        bail!("GET /v1/status answered {status}: {body}");
    }
    let status: serde_json::Value = serde_json::from_str(&body)?;
    let count = status["interfaces"].as_array().map_or(0, |list| {
        list.iter()
            .filter(|i| {
                i["name"].as_str().is_some_and(|n| n.starts_with("bw")) && i[field] == value
            })
            .count()
    });
    Ok(count as f64)
}
