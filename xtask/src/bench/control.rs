//! Control-plane figures, against a release `ipq-agent` in a namespace of its own, at each
//! registry size (host routes on 16 workload veths, claimed from netlink):
//!
//! - `route_burst_p50/p99`: 1000 host routes added in one burst (`ip -batch`), until each is in
//!   the address map (`ipq_registry_entries`, polled), measured from the start of the burst;
//! - `cni_add_p99`: `ipq-cni ADD`, spawn to exit, p99 of `CNI_ADDS`;
//! - `api_fresh_claims`, `api_fresh_claim_p50/p99`: what a CNI ADD asks, 64 clients each on a
//!   workload veth of its own claiming addresses never held before for holders never seen
//!   before (reuse hygiene runs for every one), a fixed number each, timed to the last answer,
//!   once the veths are on their TCX links; `_during_tcx_move`: the same while those links are
//!   being created (a burst of new pods), whose `rtnl_lock` holds the hygiene's requests up;
//! - `api_reclaim_drain_ops` and `api_reclaim_p99`: 64 clients claiming and draining a few
//!   addresses each, over and over: mostly re-claims of the holder that just drained, which
//!   skip the flush (the cheap path, reported beside the fresh figure, not instead of it);
//! - `cni_gc`: one `POST /v1/gc` listing 1000 valid attachments, answered: the one request
//!   that compares the whole registry (O(n + m) on the owner loop), reported, not gated;
//! - `idle_cpu` and `rss`: the agent's CPU (user + system, % of one CPU) over a quiet spell,
//!   and its resident memory;
//! - `restart_ready`: SIGTERM, a new agent, until `/readyz` answers (journal + pinned maps);
//! - `route_burst_p99_during_tcx_move` / `_after_tcx_move`: the same 1000-route burst on that
//!   cold-started node while its veths move from netlink filters to TCX links, and after;
//! - `cold_start_1000_veths`: a first start with 1000 workload veths, until ready, and how many
//!   of them were protected then; `cold_start_tcx_done`: until the last of their netlink
//!   filters was replaced by its TCX link, and how many are on TCX then;
//! - `verify_pass_1000_veths`: the last verification pass over those veths' pins and links and
//!   the maps compared with what the agent wrote (off the owner loop); `verify_maps_off_loop`:
//!   that comparison alone; `verify_maps_compare`: the owner loop's look at what differed;
//! - `rss_with_1000_veths`: then 64k host routes spread over those veths, the agent's resident
//!   memory once they are all in the registry (a full node, not a node of 16 interfaces);
//!   `idle_cpu_1000_veths`: its CPU over four verification intervals of quiet there;
//! - `rss_after_churn_1000_veths`: then 63 000 new pods' claims on that node, each drained,
//!   until their addresses are released: the resident memory the node's past churn leaves
//!   (`churn_1000_veths`: those claims and drains a second, reported).
//!
//! The agent runs with `cooldown = 1s` so that what one measurement adds (each on an interface
//! of its own, deleted afterwards) is released before the next, keeping the registry at its
//! nominal size, and with a capacity above the largest size so that claims are never refused.

mod api_clients;
mod cold;
mod fenced;
pub(super) mod node;
mod workloads;

use std::time::Duration;

use anyhow::{bail, Result};

use self::{
    api_clients::{api_load, fresh_claims, Settle},
    cold::cold_start,
    fenced::Fenced,
    node::Node,
    workloads::{cni_adds, cni_gc, idle_cost, route_burst, wait_entries},
};
use super::{min_and_median, BenchOptions, Row, Target};

const GROUP: &str = "control";
const WORKLOAD_IFS: u32 = 16;
const BURST: u32 = 1000;
const API_CLIENTS: u32 = 64;
const API_ADDRS_PER_CLIENT: u32 = 8;
/// Fresh claims per client: 64 × 150 = 9600 new entries, within the capacity's headroom above
/// the largest nominal size.
const FRESH_PER_CLIENT: u32 = 150;
/// `ipq-cni ADD`s per run: enough that their p99 (nearest rank) is not simply the slowest one,
/// as it was of 40.
const CNI_ADDS: u32 = 200;
const GC_ATTACHMENTS: u32 = 1000;
/// New pods' claims (each drained) on the filled 1000-veth node before its RSS is read again:
/// about a node's population over again.
const CHURN_CLAIMS: u32 = 63_000;
/// The size the targets are stated at, and the one their ratio compares with.
const AT: u32 = 65536;
const BASE: u32 = 1000;

/// The agent's flags; `IPQ_BENCH_AGENT_ARGS` (whitespace-separated) adds flags for an
/// experiment, e.g. `--hygiene-flush false` to see what a claim costs without its flush.
fn agent_args() -> Vec<String> {
    let mut args: Vec<String> = [
        "--workload",
        "bw*",
        "--cooldown",
        "1s",
        "--quiet-period",
        "1s",
        "--max-cooldown",
        "2s",
        "--capacity",
        "81920",
    ]
    .map(String::from)
    .into();
    if let Ok(extra) = std::env::var("IPQ_BENCH_AGENT_ARGS") {
        args.extend(extra.split_whitespace().map(String::from));
    }
    args
}

/// The registry address of population member `i` (1-based).
fn population_addr(i: u32) -> String {
    format!("10.{}.{}.{}", 64 + (i >> 16), (i >> 8) & 255, i & 255)
}

fn row(name: &str, size: Option<u32>, unit: &'static str, values: &[f64]) -> Row {
    // A figure with no trial (or a NaN) shows as NaN: the table marks it, nothing panics.
    let (min, median) = min_and_median(values).unwrap_or((f64::NAN, f64::NAN));
    Row {
        group: GROUP,
        name: name.to_owned(),
        size,
        unit,
        min,
        median,
        target: None,
    }
}

fn target(mut row: Row, text: &str, met: impl Fn(f64) -> bool) -> Row {
    row.target = Some(Target {
        text: text.to_owned(),
        met: met(row.median),
    });
    row
}

/// At the size the targets are stated at, the row gets its target.
fn at_target(size: u32, row: Row, text: &str, met: impl Fn(f64) -> bool) -> Row {
    if size == AT {
        target(row, text, met)
    } else {
        row
    }
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Row>> {
    super::release_binaries(&["ipq-agent", "ipq-cni"])?;
    let mut rows = Vec::new();
    let args = agent_args();
    let mut node = Node::new(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let mut batch = String::new();
    for i in 0..WORKLOAD_IFS {
        batch.push_str(&format!(
            "link add bw{i} type veth peer bq{i}\nlink set bw{i} up\nlink set bq{i} up\n"
        ));
    }
    node.ip_batch(&batch)?;
    let mut populated = 0;
    let mut burst_p99 = Vec::new();
    let mut started = false;
    let mut fenced: Option<Fenced> = None;
    let mut extra = 0.0;
    for &size in &opts.sizes {
        eprintln!("bench control: populating {size} addresses");
        let mut lines = String::new();
        for i in populated + 1..=size {
            lines.push_str(&format!(
                "route add {}/32 dev bw{}\n",
                population_addr(i),
                i % WORKLOAD_IFS
            ));
        }
        if !lines.is_empty() {
            node.ip_batch(&lines)?;
        }
        populated = size;
        if !started {
            node.start_agent()?;
            started = true;
            wait_entries(&node, f64::from(size), Duration::from_secs(900))?;
            fenced = Some(Fenced::new(&node)?);
            // The fenced pod's address: one more entry from now on.
            extra = node.metric("ipq_registry_entries")? - f64::from(size);
        }
        wait_entries(&node, f64::from(size) + extra, Duration::from_secs(900))?;

        eprintln!("bench control: {size}: route bursts");
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for trial in 0..opts.trials {
            let (a, b) = route_burst(&node, trial)?;
            p50.push(a);
            p99.push(b);
        }
        rows.push(row("route_burst_p50", Some(size), "ms", &p50));
        let p99_row = row("route_burst_p99", Some(size), "ms", &p99);
        burst_p99.push((size, p99_row.median));
        rows.push(at_target(size, p99_row, "≤ 100 ms", |v| v <= 100.0));

        eprintln!("bench control: {size}: ipq-cni ADD");
        let adds = cni_adds(&node)?;
        rows.push(at_target(
            size,
            row("cni_add_p99", Some(size), "ms", &[adds]),
            "≤ 10 ms",
            |v| v <= 10.0,
        ));

        eprintln!(
            "bench control: {size}: API fresh claims (new pods), during their veths' TCX move"
        );
        let during = fresh_claims(&node, Settle::Protected, 0)?;
        rows.push(row(
            "api_fresh_claims_during_tcx_move",
            Some(size),
            "claims/s",
            &[during.per_second],
        ));
        rows.push(row(
            "api_fresh_claim_p99_during_tcx_move",
            Some(size),
            "ms",
            &[during.p99],
        ));
        // One round is about a second of claims: a round per trial, min and median over them.
        eprintln!("bench control: {size}: API fresh claims (new pods), their veths on TCX");
        let (mut per_second, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=opts.trials {
            let fresh = fresh_claims(&node, Settle::OnTcx, round)?;
            per_second.push(fresh.per_second);
            p50.push(fresh.p50);
            p99.push(fresh.p99);
        }
        rows.push(at_target(
            size,
            row("api_fresh_claims", Some(size), "claims/s", &per_second),
            "≥ 10000 claims/s",
            |v| v >= 10_000.0,
        ));
        rows.push(row("api_fresh_claim_p50", Some(size), "ms", &p50));
        rows.push(at_target(
            size,
            row("api_fresh_claim_p99", Some(size), "ms", &p99),
            "≤ 20 ms",
            |v| v <= 20.0,
        ));

        eprintln!("bench control: {size}: API re-claims and drains");
        let seconds = if opts.quick { 1.0 } else { 3.0 };
        let (ops, claim_p99) = api_load(&node, seconds)?;
        rows.push(at_target(
            size,
            row("api_reclaim_drain_ops", Some(size), "ops/s", &[ops]),
            "≥ 10000 ops/s",
            |v| v >= 10_000.0,
        ));
        rows.push(at_target(
            size,
            row("api_reclaim_p99", Some(size), "ms", &[claim_p99]),
            "≤ 20 ms",
            |v| v <= 20.0,
        ));

        eprintln!("bench control: {size}: CNI GC");
        rows.push(row(
            "cni_gc",
            Some(size),
            "ms",
            &cni_gc(&node, opts.trials)?,
        ));

        eprintln!("bench control: {size}: idle");
        let idle = if opts.quick { 3.0 } else { 10.0 };
        let (cpu, rss) = idle_cost(&node, idle)?;
        rows.push(at_target(
            size,
            row("idle_cpu", Some(size), "%", &[cpu]),
            "≤ 1 %",
            |v| v <= 1.0,
        ));
        rows.push(at_target(
            size,
            row("rss", Some(size), "MB", &[rss]),
            "≤ 64 MB",
            |v| v <= 64.0,
        ));

        eprintln!("bench control: {size}: restart");
        let Some(pod) = fenced.as_ref() else {
            bail!("no fenced pod");
        };
        let (ready, sent, delivered) = pod.while_running(|| -> Result<f64> {
            node.stop_agent()?;
            Ok(node.start_agent()?.as_secs_f64() * 1e3)
        });
        let ready = ready?;
        eprintln!(
            "bench control: {size}: restart: the fenced pod sent {sent}, {delivered} delivered"
        );
        rows.push(at_target(
            size,
            row(
                "restart_fenced_delivered",
                Some(size),
                "count",
                &[delivered as f64],
            ),
            "= 0",
            |v| v == 0.0,
        ));
        for line in node.log().lines() {
            if line.contains("journal") || line.contains("recovered") {
                eprintln!("bench control: {size}: restart: {line}");
            }
        }
        rows.push(at_target(
            size,
            row("restart_ready", Some(size), "ms", &[ready]),
            "≤ 1000 ms",
            |v| v <= 1000.0,
        ));
    }
    let p99_at = |s| {
        burst_p99
            .iter()
            .find(|(size, _)| *size == s)
            .map(|(_, v)| *v)
    };
    if let (Some(at), Some(base)) = (p99_at(AT), p99_at(BASE)) {
        let ratio = at / base;
        rows.push(target(
            row("route_burst_p99_ratio", Some(AT), "x", &[ratio]),
            "≤ 1.5× at 1k",
            |v| v <= 1.5,
        ));
    }
    drop(node);

    eprintln!("bench control: cold start with 1000 veths");
    let veths = if opts.quick { 100 } else { 1000 };
    let populated = if opts.quick { 1000 } else { AT };
    let cold = cold_start(veths, populated, opts.quick)?;
    rows.push(target(
        row(
            &format!("cold_start_{veths}_veths"),
            None,
            "ms",
            &[cold.ready_ms],
        ),
        "≤ 3000 ms",
        |v| v <= 3000.0,
    ));
    rows.push(target(
        row("cold_start_attached", None, "count", &[cold.protected]),
        &format!("= {veths}"),
        |v| v == f64::from(veths),
    ));
    rows.push(row("cold_start_tcx_done", None, "ms", &[cold.tcx_done_ms]));
    rows.push(target(
        row("cold_start_tcx_links", None, "count", &[cold.on_tcx]),
        &format!("= {veths}"),
        |v| v == f64::from(veths),
    ));
    // Reported beside each other, not gated: the pacing of the move is what they show.
    rows.push(row(
        "route_burst_p99_during_tcx_move",
        None,
        "ms",
        &[cold.burst_during_p99],
    ));
    rows.push(row(
        "route_burst_p99_after_tcx_move",
        None,
        "ms",
        &[cold.burst_after_p99],
    ));
    eprintln!(
        "bench control: the burst during the move started with {} of {veths} veths on TCX",
        cold.moved_before_burst
    );
    // Reported, not gated: what the backstop costs every `verify_interval`, off the owner loop.
    rows.push(row(
        &format!("verify_pass_{veths}_veths"),
        None,
        "ms",
        &[cold.verify_pass_ms],
    ));
    // The part of it that compares the maps with what the agent wrote (off the owner loop),
    // and the owner loop's look at what differed.
    rows.push(row(
        "verify_maps_off_loop",
        Some(populated),
        "ms",
        &[cold.verify_maps_ms],
    ));
    rows.push(row(
        "verify_maps_compare",
        Some(populated),
        "ms",
        &[cold.verify_compare_ms],
    ));
    rows.push(at_target(
        populated,
        row(
            &format!("rss_with_{veths}_veths"),
            Some(populated),
            "MB",
            &[cold.rss_populated_mb],
        ),
        "≤ 64 MB",
        |v| v <= 64.0,
    ));
    rows.push(at_target(
        populated,
        row(
            &format!("idle_cpu_{veths}_veths"),
            Some(populated),
            "%",
            &[cold.idle_cpu_populated],
        ),
        "≤ 1 %",
        |v| v <= 1.0,
    ));
    rows.push(row(
        &format!("churn_{veths}_veths"),
        Some(populated),
        "claims/s",
        &[cold.churn_per_second],
    ));
    rows.push(at_target(
        populated,
        row(
            &format!("rss_after_churn_{veths}_veths"),
            Some(populated),
            "MB",
            &[cold.rss_after_churn_mb],
        ),
        "≤ 64 MB",
        |v| v <= 64.0,
    ));
    Ok(rows)
}

pub(super) fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let at = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1;
    values[at]
}
