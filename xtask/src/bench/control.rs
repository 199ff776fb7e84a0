//! Control-plane figures, against a release `ipq-agent` in a namespace of its own, at each
//! registry size (host routes on 16 workload veths, claimed from netlink):
//!
//! - `route_burst_p50/p99`: 1000 host routes added in one burst (`ip -batch`), until each is in
//!   the address map (`ipq_registry_entries`, polled), measured from the start of the burst;
//! - `cni_add_p99`: `ipq-cni ADD`, spawn to exit;
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
//! - `verify_pass_1000_veths`: the last verification pass over those veths' pins and links;
//! - `rss_with_1000_veths`: then 64k host routes spread over those veths, the agent's resident
//!   memory once they are all in the registry (a full node, not a node of 16 interfaces).
//!
//! The agent runs with `cooldown = 1s` so that what one measurement adds (each on an interface
//! of its own, deleted afterwards) is released before the next, keeping the registry at its
//! nominal size, and with a capacity above the largest size so that claims are never refused.

mod api_clients;
mod cold;
mod fenced;
pub(super) mod node;

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use self::{
    api_clients::{api_load, fresh_claims, Settle},
    cold::cold_start,
    fenced::Fenced,
    node::{api, http_get_here, metric_in, Node},
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
const CNI_ADDS: u32 = 40;
const GC_ATTACHMENTS: u32 = 1000;
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
    let cold = cold_start(veths, populated)?;
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
    Ok(rows)
}

/// Polls `ipq_registry_entries` until it is `want`.
fn wait_entries(node: &Node, want: f64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let now = node.metric("ipq_registry_entries")?;
        if now == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the registry holds {now} entries, not {want}:\n{}",
                node.log()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// One burst of host routes on an interface of its own: (p50, p99) in ms from the start of
/// the burst until the 500th and 990th are in the map. The interface is deleted afterwards and
/// its addresses released after the cool-down.
fn route_burst(node: &Node, trial: u32) -> Result<(f64, f64)> {
    let dev = format!("bwb{trial}");
    node.ip(&[
        "link",
        "add",
        &dev,
        "type",
        "veth",
        "peer",
        &format!("bqb{trial}"),
    ])?;
    node.ip(&["link", "set", &dev, "up"])?;
    // Let the agent attach to it first: the burst measures routes, not the attach.
    thread::sleep(Duration::from_millis(500));
    let base = node.metric("ipq_registry_entries")?;
    let mut lines = String::new();
    for k in 1..=BURST {
        lines.push_str(&format!(
            "route add 10.{}.{}.{}/32 dev {dev}\n",
            100 + trial,
            k >> 8,
            k & 255
        ));
    }
    let file = node.work.join("burst.ip");
    std::fs::write(&file, lines)?;
    let marks = [500.0, 990.0];
    let times = node.run(|| -> Result<Vec<f64>> {
        let start = Instant::now();
        let mut child = std::process::Command::new("ip")
            .arg("-batch")
            .arg(&file)
            .spawn()?;
        let mut times = Vec::new();
        while times.len() < marks.len() {
            let (_, body) = http_get_here("/metrics")?;
            let count = metric_in(&body, "ipq_registry_entries")? - base;
            while times.len() < marks.len() && count >= marks[times.len()] {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("burst: only {count} of {BURST} routes in the map after 120 s");
            }
            thread::sleep(Duration::from_millis(1));
        }
        child.wait()?;
        Ok(times)
    })?;
    node.ip(&["link", "del", &dev])?;
    wait_entries(node, base, Duration::from_secs(120))?;
    Ok((times[0], times[1]))
}

/// `ipq-cni ADD` of one address on an interface of its own, `CNI_ADDS` times: p99 in ms.
fn cni_adds(node: &Node) -> Result<f64> {
    let cni = crate::util::workspace_root().join("target/release/ipq-cni");
    let before = node.metric("ipq_registry_entries")?;
    node.ip(&["link", "add", "bwc", "type", "veth", "peer", "bqc"])?;
    node.ip(&["link", "set", "bwc", "up"])?;
    thread::sleep(Duration::from_millis(300));
    let mut times = Vec::new();
    for k in 1..=CNI_ADDS {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "ipq-cni",
            "socket": node.socket(),
            "stateDir": node.work.join("cni"),
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    { "name": "bwc" },
                    { "name": "eth0", "sandbox": "/run/netns/bench" },
                ],
                "ips": [{ "address": format!("10.121.0.{k}/32"), "interface": 1 }],
            },
        });
        let start = Instant::now();
        let mut child = node
            .command(&cni)
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", format!("bench-cni-{k}"))
            .env("CNI_NETNS", "/run/netns/bench")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni.parent().context("ipq-cni has a directory")?)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            stdin.write_all(conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        if !out.status.success() {
            bail!(
                "ipq-cni ADD failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    node.ip(&["link", "del", "bwc"])?;
    wait_entries(node, before, Duration::from_secs(60))?;
    Ok(percentile(&mut times, 0.99))
}

/// One CNI GC per trial, listing `GC_ATTACHMENTS` attachments no holder has, against the whole
/// registry (whose holders it leaves alone: none was made through CNI): ms each.
fn cni_gc(node: &Node, trials: u32) -> Result<Vec<f64>> {
    let attachments: Vec<serde_json::Value> = (0..GC_ATTACHMENTS)
        .map(|i| serde_json::json!({ "container_id": format!("bench-gc-{i}"), "ifname": "eth0" }))
        .collect();
    let body =
        serde_json::json!({ "valid_attachments": attachments, "network": "bench" }).to_string();
    let socket = node.socket();
    (0..trials)
        .map(|_| {
            let start = Instant::now();
            match api(&socket, "POST", "/v1/gc", &body)? {
                (200, _) => Ok(start.elapsed().as_secs_f64() * 1e3),
                (status, answer) => bail!("CNI GC answered {status}: {answer}"),
            }
        })
        .collect()
}

pub(super) fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let at = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1;
    values[at]
}

fn cpu_ticks(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line; 12 and 13 after the comm.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// The agent's CPU over `seconds` of quiet (% of one CPU) and its resident memory (MB).
fn idle_cost(node: &Node, seconds: f64) -> Result<(f64, f64)> {
    let pid = node.agent_pid()?;
    thread::sleep(Duration::from_secs(2));
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let before = cpu_ticks(pid)?;
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(seconds));
    let used = (cpu_ticks(pid)? - before) as f64 / hz;
    let cpu = used / start.elapsed().as_secs_f64() * 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    Ok((cpu, rss_kb / 1024.0))
}
