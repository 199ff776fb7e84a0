//! The control group's workloads besides the API clients: route bursts, `ipq-cni ADD`s, a
//! CNI GC and the agent at rest.

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    node::{api, http_get_here, metric_in, Node},
    percentile, BURST, CNI_ADDS, GC_ATTACHMENTS,
};

/// One burst of host routes on an interface of its own: (p50, p99) in ms from the start of
/// the burst until the 500th and 990th are in the map. The interface is deleted afterwards and
/// its addresses released after the cool-down.
pub(super) fn route_burst(node: &Node, trial: u32) -> Result<(f64, f64)> {
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
pub(super) fn cni_adds(node: &Node) -> Result<f64> {
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
                "ips": [{
                    "address": format!("10.121.{}.{}/32", k / 256, k % 256),
                    "interface": 1,
                }],
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
pub(super) fn cni_gc(node: &Node, trials: u32) -> Result<Vec<f64>> {
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

fn cpu_ticks(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line; 12 and 13 after the comm.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// The agent's CPU over `seconds` of quiet (% of one CPU) and its resident memory (MB).
pub(super) fn idle_cost(node: &Node, seconds: f64) -> Result<(f64, f64)> {
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

/// The agent's resident memory by kind (`/proc/<pid>/status`): anonymous (the heap, thread
/// stacks), file-backed (code), shared (the mapped `IPQ_SLOTS`), for the log.
pub(super) fn rss_parts(node: &Node) -> Result<String> {
    let pid = node.agent_pid()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let parts: Vec<String> = status
        .lines()
        .filter(|l| l.starts_with("Rss") || l.starts_with("VmRSS"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    Ok(parts.join(", "))
}

/// Polls `ipq_registry_entries` until it is `want`.
pub(super) fn wait_entries(node: &Node, want: f64, timeout: Duration) -> Result<()> {
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
