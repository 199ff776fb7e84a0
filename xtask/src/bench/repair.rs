//! Repair figures: how long a fence is down after another tool deletes ipq's TC attachment, on
//! a node whose TC hooks use ipq's netlink filter (`tc_attach = "netlink"`, what every 5.10 and
//! 6.1 node gets), with `IFACES` protected workload veths:
//!
//! - `repair_qdisc_del_p50/p99`: `tc qdisc del dev <veth> clsact` (what felix does when its
//!   eBPF dataplane is switched off), until ipq's filter is back on both hooks of that veth;
//! - `repair_filter_del_p99`: `tc filter del dev <veth> ingress|egress pref 2`, until ipq's
//!   filter is back on that hook.
//!
//! Both are timed by the kernel's own notifications, as `tc -ts monitor` prints them in the
//! node's namespace: from the deletion's event to the event of the last filter re-added.
//! Nothing polls, so the figure is the agent's (notification → owner loop → attach worker →
//! netlink), not the bench's. Target: p99 ≤ 100 ms.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    control::{node::Node, percentile},
    min_and_median, BenchOptions, Row, Target,
};

const GROUP: &str = "repair";
const IFACES: u32 = 1000;
const QUICK_IFACES: u32 = 50;
/// Deletions of each kind per trial, each on a veth of its own.
const DELETIONS: u32 = 20;
/// How long one repair may take before the bench gives up on it.
const GIVE_UP: Duration = Duration::from_secs(10);
/// ipq's filter: priority 2, handle 0x4951 ("IQ").
const IPQ_HANDLE: &str = "handle 0x4951";

/// One line of `tc -ts monitor`: its timestamp in µs since midnight, and the event.
struct TcEvent {
    at_us: u64,
    line: String,
}

/// `[2026-11-24T22:35:06.739882] deleted qdisc ...` → (µs since midnight, the rest).
fn parse(line: &str) -> Option<TcEvent> {
    let rest = line.strip_prefix('[')?;
    let (stamp, event) = rest.split_once("] ")?;
    let time = stamp.split_once('T')?.1;
    let (hms, frac) = time.split_once('.')?;
    let mut secs = 0u64;
    for part in hms.split(':') {
        secs = secs * 60 + part.parse::<u64>().ok()?;
    }
    let micros: u64 = frac.get(..6)?.parse().ok()?;
    Some(TcEvent {
        at_us: secs * 1_000_000 + micros,
        line: event.to_owned(),
    })
}

/// `tc -ts monitor` in the node's namespace, its events on a channel.
struct Monitor {
    child: Child,
    events: Receiver<TcEvent>,
}

impl Monitor {
    fn start(node: &Node) -> Result<Monitor> {
        let mut child = node
            .command("tc")
            .args(["-ts", "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tc monitor")?;
        let stdout = child.stdout.take().context("tc monitor's stdout")?;
        let (tx, events) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(event) = parse(&line) {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Monitor { child, events })
    }

    /// Waits for the event that `is` picks; its timestamp.
    fn wait(&self, what: &str, is: impl Fn(&str) -> bool) -> Result<u64> {
        let deadline = Instant::now() + GIVE_UP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) if is(&event.line) => return Ok(event.at_us),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => bail!("no {what} within {GIVE_UP:?}"),
                Err(RecvTimeoutError::Disconnected) => bail!("tc monitor stopped"),
            }
        }
    }

    /// Forgets the events so far (another veth's, the set-up's).
    fn drain(&self) {
        while self.events.try_recv().is_ok() {}
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_ipq_filter_added(line: &str, ifname: &str, hook: &str) -> bool {
    !line.starts_with("deleted")
        && line.contains("filter")
        && line.contains(&format!("dev {ifname} {hook} "))
        && line.contains(IPQ_HANDLE)
}

/// Deletes with `tc args` on `ifname` and times until ipq's filter is back on `hooks`: ms.
fn time_repair(
    node: &Node,
    monitor: &Monitor,
    ifname: &str,
    args: &[&str],
    deleted: &str,
    hooks: &[&str],
) -> Result<f64> {
    monitor.drain();
    crate::util::output(node.command("tc").args(args))?;
    let gone = monitor.wait(&format!("{deleted} on {ifname}"), |line| {
        line.starts_with("deleted")
            && line.contains(deleted)
            && line.contains(&format!("dev {ifname} "))
    })?;
    let mut back = gone;
    for hook in hooks {
        let at = monitor.wait(&format!("ipq's {hook} filter back on {ifname}"), |line| {
            is_ipq_filter_added(line, ifname, hook)
        })?;
        back = back.max(at);
    }
    Ok(back.saturating_sub(gone) as f64 / 1000.0)
}

/// `ipq_datapath_unprotected_interfaces`, summed over its hooks.
fn unprotected(node: &Node) -> Result<f64> {
    let (_, body) = node.http_get("/metrics")?;
    let series: Vec<f64> = body
        .lines()
        .filter_map(|l| l.strip_prefix("ipq_datapath_unprotected_interfaces{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse().ok())
        .collect();
    if series.is_empty() {
        bail!("no ipq_datapath_unprotected_interfaces in the agent's metrics");
    }
    Ok(series.iter().sum())
}

/// A deletion ipq did not repair: the figure cannot be had, and the agent's log says why.
fn unrepaired(node: &Node, e: anyhow::Error) -> anyhow::Error {
    e.context(format!(
        "a deletion was not repaired; the agent's last lines:\n{}",
        node.log()
    ))
}

fn row(name: &str, values: &[f64], target: Option<&str>) -> Row {
    let (min, median) = min_and_median(values).unwrap_or((f64::NAN, f64::NAN));
    Row {
        group: GROUP,
        name: name.to_owned(),
        size: None,
        unit: "ms",
        min,
        median,
        target: target.map(|text| Target {
            text: text.to_owned(),
            met: median <= 100.0,
        }),
    }
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Row>> {
    super::release_binaries(&["ipq-agent"])?;
    let ifaces = if opts.quick { QUICK_IFACES } else { IFACES };
    let mut node = Node::new(&["--workload", "bw*", "--tc-attach", "netlink"])?;
    let mut batch = String::new();
    for i in 0..ifaces {
        batch.push_str(&format!(
            "link add bw{i} type veth peer bq{i}\nlink set bw{i} up\nlink set bq{i} up\n"
        ));
    }
    node.ip_batch(&batch)?;
    node.start_agent()?;
    let protected = Instant::now();
    while unprotected(&node)? > 0.0 {
        if protected.elapsed() > Duration::from_secs(300) {
            bail!("{ifaces} veths not protected in 5 min:\n{}", node.log());
        }
        thread::sleep(Duration::from_millis(50));
    }
    let monitor = Monitor::start(&node)?;
    let (mut qdisc_p50, mut qdisc_p99, mut filter_p99) = (Vec::new(), Vec::new(), Vec::new());
    let mut next_if = 0;
    for trial in 0..opts.trials {
        eprintln!("bench repair: trial {} of {}", trial + 1, opts.trials);
        let (mut qdisc, mut filter) = (Vec::new(), Vec::new());
        for n in 0..DELETIONS {
            let ifname = format!("bw{}", next_if % ifaces);
            next_if += 1;
            let timed = time_repair(
                &node,
                &monitor,
                &ifname,
                &["qdisc", "del", "dev", &ifname, "clsact"],
                "qdisc clsact",
                &["ingress", "egress"],
            );
            qdisc.push(timed.map_err(|e| unrepaired(&node, e))?);
            let hook = if n % 2 == 0 { "ingress" } else { "egress" };
            let timed = time_repair(
                &node,
                &monitor,
                &ifname,
                &["filter", "del", "dev", &ifname, hook, "pref", "2"],
                "filter",
                &[hook],
            );
            filter.push(timed.map_err(|e| unrepaired(&node, e))?);
        }
        qdisc_p50.push(percentile(&mut qdisc.clone(), 0.5));
        qdisc_p99.push(percentile(&mut qdisc, 0.99));
        filter_p99.push(percentile(&mut filter, 0.99));
    }
    drop(monitor);
    node.stop_agent()?;
    Ok(vec![
        row("repair_qdisc_del_p50", &qdisc_p50, None),
        row("repair_qdisc_del_p99", &qdisc_p99, Some("≤ 100 ms")),
        row("repair_filter_del_p99", &filter_p99, Some("≤ 100 ms")),
    ])
}
