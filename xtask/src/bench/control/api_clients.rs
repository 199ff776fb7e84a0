//! The API under load from 64 clients: new pods' claims (each one's reuse hygiene included),
//! and the re-claim/drain cycle.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use super::{
    node::api, percentile, workloads::wait_entries, Node, API_ADDRS_PER_CLIENT, API_CLIENTS,
    FRESH_PER_CLIENT,
};

/// What the fresh claims measured.
pub(super) struct Fresh {
    pub(super) per_second: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
}

/// Fresh address `n` of client `c`: 10.128.0.0/10, never a population address (10.64/15);
/// rounds number their `n`s apart, so no round claims an address an earlier one held.
pub(super) fn fresh_addr(c: u32, n: u32) -> String {
    let v = (10u32 << 24) | (128 << 16) | (c << 16) | n;
    std::net::Ipv4Addr::from(v).to_string()
}

/// How far the client veths' attachment has come before the claims start.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// Protected by ipq's netlink filter; their move to TCX links runs meanwhile (each link
    /// create holds `rtnl_lock` for a grace period, which every rtnetlink request of the
    /// claims' reuse hygiene then waits behind): a burst of new pods.
    Protected,
    /// On their TCX links, nothing left to move: a node's steady state.
    OnTcx,
}

/// New pods' claims, as CNI ADDs make them: `API_CLIENTS` clients, each on a workload veth of
/// its own, each claiming `FRESH_PER_CLIENT` addresses never held before for holders never seen
/// before (`source: cni`), so every claim runs reuse hygiene for a new holder. Timed from the
/// first request to the last answer. Each `round` claims addresses and holders of its own.
pub(super) fn fresh_claims(node: &Node, settle: Settle, round: u32) -> Result<Fresh> {
    let before = node.metric("ipq_registry_entries")?;
    add_client_veths(node, settle)?;
    let socket = node.socket();
    let start_line = Arc::new(std::sync::Barrier::new(API_CLIENTS as usize + 1));
    let clients: Vec<_> = (0..API_CLIENTS)
        .map(|c| {
            let (socket, start_line, interface) =
                (socket.clone(), start_line.clone(), client_veth(c));
            thread::spawn(move || -> Result<Vec<f64>> {
                start_line.wait();
                let mut latencies = Vec::with_capacity(FRESH_PER_CLIENT as usize);
                for n in round * FRESH_PER_CLIENT + 1..=(round + 1) * FRESH_PER_CLIENT {
                    let body = serde_json::json!({
                        "addresses": [fresh_addr(c, n)],
                        "holder": {
                            "interface": interface,
                            "container_id": format!("fresh-{c}-{n}"),
                        },
                        "source": "cni",
                    })
                    .to_string();
                    let start = Instant::now();
                    let (status, answer) = api(&socket, "POST", "/v1/claims", &body)?;
                    latencies.push(start.elapsed().as_secs_f64() * 1e3);
                    if status != 200 {
                        bail!("a fresh claim answered {status}: {answer}");
                    }
                }
                Ok(latencies)
            })
        })
        .collect();
    // Said when the claims start (not when the veths are ready): a profiler attached from
    // outside waits for this line.
    eprintln!(
        "bench control: fresh claims: {API_CLIENTS} clients x {FRESH_PER_CLIENT} claims start"
    );
    start_line.wait();
    let start = Instant::now();
    let mut latencies = Vec::new();
    for client in clients {
        let mine = client
            .join()
            .map_err(|_| anyhow::anyhow!("a fresh-claim client panicked"))??;
        latencies.extend(mine);
    }
    let elapsed = start.elapsed().as_secs_f64();
    del_client_veths(node)?;
    wait_entries(node, before, Duration::from_secs(120))?;
    let claims = latencies.len() as f64;
    Ok(Fresh {
        per_second: claims / elapsed,
        p50: percentile(&mut latencies, 0.5),
        p99: percentile(&mut latencies, 0.99),
    })
}

/// `API_CLIENTS` clients, each claiming then draining addresses of its own on one interface,
/// for `seconds`: (operations per second, claim p99 in ms).
pub(super) fn api_load(node: &Node, seconds: f64) -> Result<(f64, f64)> {
    let before = node.metric("ipq_registry_entries")?;
    node.ip(&["link", "add", "bwa", "type", "veth", "peer", "bqa"])?;
    node.ip(&["link", "set", "bwa", "up"])?;
    thread::sleep(Duration::from_millis(300));
    let socket = node.socket();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let claims: Arc<Mutex<Vec<f64>>> = Arc::default();
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let clients: Vec<_> = (0..API_CLIENTS)
        .map(|c| {
            let (socket, stop, ops, claims, failure) = (
                socket.clone(),
                stop.clone(),
                ops.clone(),
                claims.clone(),
                failure.clone(),
            );
            thread::spawn(move || {
                let mut mine = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let addr = format!("10.120.{c}.{}", n % API_ADDRS_PER_CLIENT + 1);
                    n += 1;
                    let body = serde_json::json!({
                        "addresses": [addr],
                        "holder": { "interface": "bwa", "container_id": format!("bench-{c}") },
                    })
                    .to_string();
                    let start = Instant::now();
                    let claim = api(&socket, "POST", "/v1/claims", &body);
                    mine.push(start.elapsed().as_secs_f64() * 1e3);
                    let drain = api(&socket, "POST", &format!("/v1/addresses/{addr}/drain"), "");
                    match (claim, drain) {
                        (Ok((200, _)), Ok((200, _))) => {
                            ops.fetch_add(2, Ordering::Relaxed);
                        }
                        (claim, drain) => {
                            *failure.lock().unwrap() = Some(format!("{claim:?} / {drain:?}"));
                            break;
                        }
                    }
                }
                claims.lock().unwrap().extend(mine);
            })
        })
        .collect();
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.join();
    }
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(failure) = failure.lock().unwrap().take() {
        bail!("an API client failed: {failure}");
    }
    node.ip(&["link", "del", "bwa"])?;
    wait_entries(node, before, Duration::from_secs(60))?;
    let mut claims = claims.lock().unwrap().clone();
    Ok((
        ops.load(Ordering::Relaxed) as f64 / elapsed,
        percentile(&mut claims, 0.99),
    ))
}

/// The client veth of client `c` (a new pod's).
fn client_veth(c: u32) -> String {
    format!("bwn{c}")
}

/// A new veth for each of the `API_CLIENTS` clients, once every one is protected (and, with
/// [`Settle::OnTcx`], on its TCX link): the claims, not the attaches, are measured.
fn add_client_veths(node: &Node, settle: Settle) -> Result<()> {
    for c in 0..API_CLIENTS {
        node.ip(&[
            "link",
            "add",
            &client_veth(c),
            "type",
            "veth",
            "peer",
            &format!("bqf{c}"),
        ])?;
        node.ip(&["link", "set", &client_veth(c), "up"])?;
    }
    // Every client veth protected first: the claims, not the attaches, are measured.
    let socket = node.socket();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, status) = api(&socket, "GET", "/v1/status", "")?;
        let status: serde_json::Value = serde_json::from_str(&status)?;
        let protected = status["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| {
                i["name"].as_str().is_some_and(|n| n.starts_with("bwn"))
                    && i["protection"] == "protected"
            })
            .count();
        let moved =
            settle == Settle::Protected || node.metric("ipq_datapath_tc_upgrades_pending")? == 0.0;
        if protected == API_CLIENTS as usize && moved {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {protected} of the {API_CLIENTS} client veths were protected (and moved: \
                 {moved}) in 60 s"
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The client veths deleted: their holders are gone, their addresses quarantined.
fn del_client_veths(node: &Node) -> Result<()> {
    for c in 0..API_CLIENTS {
        node.ip(&["link", "del", &client_veth(c)])?;
    }
    Ok(())
}

/// New pods' claims on a filled node, and the pods' ends: `claims` claims of addresses and
/// holders never seen before (`source: cni`, reuse hygiene for each), in rounds of at most
/// `API_CLIENTS × FRESH_PER_CLIENT`, each round's clients on new veths; every address drained
/// once answered, then the round's veths deleted (holders gone: quarantine, released after the
/// cool-down) and the registry back at its size before the next round. The churn a node sees
/// over its pods' lives: what the agent's memory must not keep. Claims (with their drains) a
/// second, counting only the clients' time.
pub(super) fn churn(node: &Node, claims: u32) -> Result<f64> {
    let before = node.metric("ipq_registry_entries")?;
    let socket = node.socket();
    let mut made = 0;
    let mut busy = 0.0;
    let mut round = 0;
    while made < claims {
        let this_round = (claims - made).min(API_CLIENTS * FRESH_PER_CLIENT);
        add_client_veths(node, Settle::Protected)?;
        let start = Instant::now();
        let clients: Vec<_> = (0..API_CLIENTS)
            .map(|c| {
                let socket = socket.clone();
                thread::spawn(move || -> Result<u32> {
                    let mut done = 0;
                    // Client `c` takes every `API_CLIENTS`th claim of the round.
                    for k in (c..this_round).step_by(API_CLIENTS as usize) {
                        let n = round * FRESH_PER_CLIENT + k / API_CLIENTS + 1;
                        let addr = churn_addr(c, n);
                        let body = serde_json::json!({
                            "addresses": [addr],
                            "holder": {
                                "interface": client_veth(c),
                                "container_id": format!("churn-{c}-{n}"),
                            },
                            "source": "cni",
                        })
                        .to_string();
                        match api(&socket, "POST", "/v1/claims", &body)? {
                            (200, _) => {}
                            (status, answer) => {
                                bail!("a churn claim answered {status}: {answer}")
                            }
                        }
                        let path = format!("/v1/addresses/{addr}/drain");
                        match api(&socket, "POST", &path, "")? {
                            (200, _) => {}
                            (status, answer) => {
                                bail!("a churn drain answered {status}: {answer}")
                            }
                        }
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        for client in clients {
            made += client
                .join()
                .map_err(|_| anyhow::anyhow!("a churn client panicked"))??;
        }
        busy += start.elapsed().as_secs_f64();
        del_client_veths(node)?;
        wait_entries(node, before, Duration::from_secs(300))?;
        round += 1;
    }
    Ok(f64::from(made) / busy)
}

/// Churn address `n` of client `c`: 10.192.0.0/10, apart from the population (10.64/15), the
/// fresh claims' rounds (10.128/10) and the re-claims (10.120/16).
fn churn_addr(c: u32, n: u32) -> String {
    let v = (10u32 << 24) | (192 << 16) | (c << 16) | n;
    std::net::Ipv4Addr::from(v).to_string()
}
