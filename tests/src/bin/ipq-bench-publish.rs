//! The NodeQuarantine probe of `cargo xtask bench --only publish` (not a test: it measures, it
//! asserts nothing). Issue 30: "a change visible through the API within 1 s p99, with the
//! write rate".
//!
//! The cluster tier's control plane without its node ([`ApiServer`]: etcd, kube-apiserver,
//! controller manager, scheduler, ipq's CRD and RBAC from `deploy/kubernetes/`), the agent (the
//! build `IPQ_AGENT_BINARY` names) in a lab with the ServiceAccount's token, driven through its
//! API at a steady churn of listed changes: address `j` claimed by a holder on vethpa, then by
//! one on vethpb (`fence-old`: the first is fenced, the object lists it), and `LAG` slots later
//! released (`--force`: the entry leaves the object). Every fence and every release is a
//! change; each is timed from its request to the first event of a watch on the object (kubectl
//! `get --raw ...?watch=true`, not polling) that shows it. The write rate is the agent's
//! `ipq_publish_writes_total` over the churn (and one 250 ms interval: the pace's own bound).
//!
//! Prints one JSON line per figure and trial on stdout:
//! `{"name":..,"rate":..,"unit":..,"trial":..,"value":..}`; xtask takes min and median.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use ipq_tests::{
    api::request,
    cluster::api_server::{ApiServer, Watch},
    lab::{Agent, Lab},
};
use serde_json::{json, Value};

const NODE: &str = "ipq-bench-node";
/// Clients driving the agent's API; each owns the slots `j ≡ its index (mod DRIVERS)`, so a
/// slot's release always follows its fence.
const DRIVERS: u64 = 32;
/// A slot is released this many slots after its fence: the object lists about `LAG` entries.
const LAG: u64 = 64;
/// The agent's least interval between two writes (`publish::Timing::default`).
const PACE: Duration = Duration::from_millis(250);
/// How long the object may take to show a trial's last changes before they count as unseen.
const GRACE: Duration = Duration::from_secs(10);

struct Options {
    rates: Vec<u64>,
    seconds: u64,
    trials: u32,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        rates: vec![50, 200],
        seconds: 10,
        trials: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rates" => {
                opts.rates = value
                    .split(',')
                    .map(|r| r.parse().with_context(|| format!("--rates {value}")))
                    .collect::<anyhow::Result<_>>()?
            }
            "--seconds" => opts.seconds = value.parse().context("--seconds")?,
            "--trials" => opts.trials = value.parse().context("--trials")?,
            _ => bail!("unknown flag {flag} (--rates a,b --seconds n --trials n)"),
        }
    }
    if opts.rates.contains(&0) || opts.seconds == 0 || opts.trials == 0 {
        bail!("rates, seconds and trials must be at least 1");
    }
    Ok(opts)
}

/// A listed change and when its request was sent.
#[derive(Clone)]
struct Change {
    addr: String,
    /// Fenced (listed) after it, or gone.
    listed: bool,
    sent: Instant,
}

/// What one trial measured.
struct Trial {
    /// Milliseconds from each change's request to the watch event showing it.
    visible_ms: Vec<f64>,
    unseen: usize,
    changes_per_s: f64,
    writes_per_s: f64,
    watch_events_per_s: f64,
    failures: f64,
}

/// The address of slot `n` of the run: 10.200.0.0/16, never reused.
fn slot_addr(n: u64) -> String {
    Ipv4Addr::from(0x0ac8_0000u32 + n as u32 + 1).to_string()
}

fn post(socket: &Path, path: &str, body: &Value) -> anyhow::Result<Value> {
    let answer = request(socket, "POST", path, Some(&body.to_string()))?;
    if answer.status != 200 {
        bail!("POST {path} {body}: {} {}", answer.status, answer.body);
    }
    answer.json()
}

fn claim(socket: &Path, addr: &str, interface: &str, container: &str) -> anyhow::Result<Value> {
    post(
        socket,
        "/v1/claims",
        &json!({
            "addresses": [addr],
            "holder": {"interface": interface, "container_id": container, "cni_ifname": "eth0"},
            "source": "cni",
        }),
    )
}

fn release(socket: &Path, addr: &str) -> anyhow::Result<()> {
    post(
        socket,
        &format!("/v1/addresses/{addr}/release"),
        &json!({"force": true}),
    )?;
    Ok(())
}

/// The fenced addresses an object lists.
fn listed(object: &Value) -> HashSet<String> {
    object["status"]["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["state"] == "fenced")
        .filter_map(|e| e["address"].as_str().map(str::to_owned))
        .collect()
}

/// One driver's part of a trial: its slots' fences and releases, each at its time.
fn drive(
    socket: &Path,
    driver: u64,
    first_slot: u64,
    slots: u64,
    rate: u64,
    began: Instant,
    changes: &Mutex<Vec<Change>>,
) -> anyhow::Result<()> {
    // Change 2j is slot j's fence, change 2(j + LAG) + 1 its release (the last LAG slots are
    // released after the trial, untimed).
    let mut events: Vec<(u64, u64, bool)> = Vec::new();
    for j in (driver..slots).step_by(DRIVERS as usize) {
        events.push((2 * j, j, true));
        if j + LAG < slots {
            events.push((2 * (j + LAG) + 1, j, false));
        }
    }
    events.sort_unstable();
    for (k, j, fence) in events {
        let due = began + Duration::from_secs_f64(k as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let addr = slot_addr(first_slot + j);
        if fence {
            claim(socket, &addr, "vethpa", &format!("a-{}", first_slot + j))?;
            let sent = Instant::now();
            let answer = claim(socket, &addr, "vethpb", &format!("b-{}", first_slot + j))?;
            if answer["conflicts"].as_array().is_none_or(Vec::is_empty) {
                bail!("{addr}: the second holder's claim fenced nobody: {answer}");
            }
            changes.lock().unwrap().push(Change {
                addr,
                listed: true,
                sent,
            });
        } else {
            let sent = Instant::now();
            release(socket, &addr)?;
            changes.lock().unwrap().push(Change {
                addr,
                listed: false,
                sent,
            });
        }
    }
    Ok(())
}

/// Reads the watch until `stop` says so and the object lists exactly `expect` (or `GRACE`
/// passes after the stop); every event read, with its time and listed addresses.
fn record_watch(
    watch: &mut Watch,
    stop: &Mutex<Option<(Instant, HashSet<String>)>>,
) -> anyhow::Result<Vec<(Instant, HashSet<String>)>> {
    let mut events = Vec::new();
    loop {
        let deadline = match &*stop.lock().unwrap() {
            Some((at, _)) => *at + GRACE,
            None => Instant::now() + Duration::from_millis(100),
        };
        let next = watch.next_before(deadline)?;
        if let Some((at, object)) = next {
            events.push((at, listed(&object)));
        }
        if let Some((at, expect)) = &*stop.lock().unwrap() {
            let settled = events.last().is_some_and(|(_, l)| l == expect);
            if settled || Instant::now() >= *at + GRACE {
                return Ok(events);
            }
        }
    }
}

fn trial(
    api: &ApiServer,
    agent: &Agent,
    rate: u64,
    seconds: u64,
    first_slot: u64,
) -> anyhow::Result<Trial> {
    let socket = agent.api_socket();
    let slots = rate * seconds / 2;
    let changes = Mutex::new(Vec::new());
    let stop = Mutex::new(None);
    let mut watch = api.watch_node_quarantine()?;
    let writes_before = agent.metric("ipq_publish_writes_total", &[])?;
    let failures_before = agent.scrape()?.count("ipq_publish_failures_total", &[]);
    let began = Instant::now() + Duration::from_millis(200);
    let (events, writes_at_end) = thread::scope(|scope| -> anyhow::Result<_> {
        let watcher = scope.spawn(|| record_watch(&mut watch, &stop));
        let drivers: Vec<_> = (0..DRIVERS)
            .map(|d| {
                let (socket, changes) = (&socket, &changes);
                scope.spawn(move || drive(socket, d, first_slot, slots, rate, began, changes))
            })
            .collect();
        let mut driven = Ok(());
        for driver in drivers {
            let result = driver.join().expect("a driver panicked");
            driven = driven.and(result);
        }
        // (The scrape's answer counts the writes done until the agent read its counter.)
        let writes_at_end = agent
            .metric("ipq_publish_writes_total", &[])
            .map(|n| (n, Instant::now()));
        let expect: HashSet<String> = if driven.is_ok() {
            (slots.saturating_sub(LAG)..slots)
                .map(|j| slot_addr(first_slot + j))
                .collect()
        } else {
            HashSet::new()
        };
        *stop.lock().unwrap() = Some((Instant::now(), expect));
        let events = watcher.join().expect("the watch reader panicked");
        driven?;
        Ok((events?, writes_at_end?))
    })?;
    // The writes while the changes were being made, per second of that window plus one of the
    // writer's intervals: a window of T seconds holds T / 250 ms + 1 writes at the pace, which
    // is then exactly 4 a second.
    let (writes_at_end, counted_until) = writes_at_end;
    let churn = counted_until.duration_since(began).as_secs_f64() + PACE.as_secs_f64();
    let writes = writes_at_end - writes_before;
    let failures = agent.scrape()?.count("ipq_publish_failures_total", &[]) - failures_before;
    let watch_events = events
        .iter()
        .filter(|(at, _)| *at >= began && *at <= counted_until)
        .count();

    let changes = changes.into_inner().unwrap();
    // The churn achieved, from the fences (evenly spread over the trial, where the releases
    // start only `LAG` slots in): two changes per fence.
    let fences: Vec<Instant> = changes
        .iter()
        .filter(|c| c.listed)
        .map(|c| c.sent)
        .collect();
    let fence_span = match (fences.iter().min(), fences.iter().max()) {
        (Some(first), Some(last)) => last.duration_since(*first).as_secs_f64(),
        _ => 0.0,
    };
    let mut visible_ms = Vec::new();
    let mut unseen = 0;
    for change in &changes {
        let seen = events
            .iter()
            .find(|(at, l)| *at >= change.sent && l.contains(&change.addr) == change.listed);
        match seen {
            Some((at, _)) => visible_ms.push((*at - change.sent).as_secs_f64() * 1000.0),
            None => unseen += 1,
        }
    }
    // The last LAG slots, released untimed: the next trial starts from an empty object.
    for j in slots.saturating_sub(LAG)..slots {
        release(&socket, &slot_addr(first_slot + j))?;
    }
    Ok(Trial {
        visible_ms,
        unseen,
        changes_per_s: 2.0 * fences.len().saturating_sub(1) as f64 / fence_span.max(1e-3),
        writes_per_s: writes / churn,
        watch_events_per_s: watch_events as f64 / churn,
        failures,
    })
}

/// The nearest-rank percentile `p` (0–100) of `values`.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn emit(name: &str, rate: u64, unit: &str, trial: u32, value: f64) {
    println!(
        "{}",
        json!({"name": name, "rate": rate, "unit": unit, "trial": trial, "value": value})
    );
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    let mut api = ApiServer::start(NODE)?;
    let lab = Lab::new()?;
    api.reachable_from(&lab.node)?;
    let kubeconfig: PathBuf = lab.work_dir().join("kubeconfig");
    api.agent_kubeconfig(&kubeconfig, Duration::from_secs(6 * 3600))?;
    let agent = lab.start_publishing_agent(NODE, &kubeconfig, &[])?;
    api.watch_node_quarantine()?
        .wait_for("the agent's first write", Duration::from_secs(30), |o| {
            o["status"]["publishedAt"].is_string()
        })
        .with_context(|| format!("agent log:\n{}", agent.log()))?;

    let mut first_slot = 0;
    for t in 0..opts.trials {
        for &rate in &opts.rates {
            let result = trial(&api, &agent, rate, opts.seconds, first_slot)
                .with_context(|| format!("trial {t} at {rate} changes/s"))?;
            first_slot += rate * opts.seconds / 2;
            let mut visible = result.visible_ms.clone();
            if visible.is_empty() {
                bail!("trial {t} at {rate}/s: no change seen through the watch");
            }
            eprintln!(
                "publish probe: trial {t} at {rate}/s: {} changes ({:.0}/s), {} unseen, p50 \
                 {:.0} ms, p99 {:.0} ms, {:.2} writes/s, {:.2} watch events/s, {} failures",
                result.visible_ms.len() + result.unseen,
                result.changes_per_s,
                result.unseen,
                percentile(&mut visible, 50.0),
                percentile(&mut visible, 99.0),
                result.writes_per_s,
                result.watch_events_per_s,
                result.failures,
            );
            // A change never seen counts as seen at the end of the grace: a lower bound that
            // misses the target, never a sample dropped.
            visible.extend(std::iter::repeat_n(
                GRACE.as_secs_f64() * 1000.0,
                result.unseen,
            ));
            emit("visible_p50", rate, "ms", t, percentile(&mut visible, 50.0));
            emit("visible_p99", rate, "ms", t, percentile(&mut visible, 99.0));
            emit("writes", rate, "ops/s", t, result.writes_per_s);
            emit("changes", rate, "ops/s", t, result.changes_per_s);
            emit("failed_writes", rate, "n", t, result.failures);
        }
    }
    api.check_running()?;
    Ok(())
}
