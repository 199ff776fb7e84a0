//! Flushing a reused address's conntrack entries must not stall the registry's owner loop.
//!
//! A node namespace forwards a client's UDP to a pod; the client opens `entries` flows to the
//! pod's address X (one per destination port), so the node's conntrack table holds that many
//! entries carrying X. The real `ipq-agent` runs in the node. Each trial claims X through the
//! API (its answer waits for the flush of every entry) while another thread keeps reading
//! another address from the API, answered by the owner loop: the loop's latency during the
//! flush is compared with its latency at rest.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::UdpSocket,
    os::{fd::AsRawFd as _, unix::net::UnixStream, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};

use super::{min_and_median, BenchOptions, Row, Target};
use crate::util::{self, cmd, output};

const GROUP: &str = "conntrack";
const POD_X: &str = "10.99.0.2";
const CLIENT: &str = "10.99.0.3";
const POD_Y: &str = "10.99.0.4";
/// A claim that flushes this many entries should be answered within this.
const CLAIM_TARGET_MS: f64 = 1000.0;

/// The bench's namespaces, pins and scratch dir; removed on drop, agent first.
struct Setup {
    agent: Option<Child>,
    node: String,
    client: String,
    pod: String,
    bpffs: PathBuf,
    work: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        for ns in [&self.node, &self.client, &self.pod] {
            let _ = cmd("ip", ["netns", "del", ns.as_str()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.bpffs);
        let _ = fs::remove_dir_all(&self.work);
    }
}

fn ip(ns: &str, args: &str) -> Result<()> {
    let mut command = cmd("ip", ["-n", ns]);
    command.args(args.split_whitespace());
    util::run(&mut command)
}

/// `program` inside network namespace `ns` (setns, not `ip netns exec`, which hides bpffs).
fn in_netns(ns: &str, program: impl AsRef<Path>) -> Command {
    let path = std::ffi::CString::new(format!("/run/netns/{ns}")).expect("no NUL");
    let mut command = Command::new(program.as_ref());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    command
}

/// Runs `f` on a thread inside `ns`; sockets made there stay in it.
fn on_netns_thread<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = fs::File::open(format!("/run/netns/{ns}"))?;
    thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: a valid namespace fd; only this thread moves.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns {ns}: {}", std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {ns} panicked"))?
    })
}

impl Setup {
    fn new(quick: bool) -> Result<Setup> {
        let id = std::process::id();
        let work = std::env::temp_dir().join(format!("ipq-bench-ct-{id}"));
        fs::create_dir_all(&work)?;
        let mut setup = Setup {
            agent: None,
            node: format!("ipq-bct-node-{id}"),
            client: format!("ipq-bct-client-{id}"),
            pod: format!("ipq-bct-pod-{id}"),
            bpffs: PathBuf::from(format!("/sys/fs/bpf/ipq-bench-ct-{id}")),
            work,
        };
        for ns in [&setup.node, &setup.client, &setup.pod] {
            util::run(&mut cmd("ip", ["netns", "add", ns.as_str()]))?;
            ip(ns, "link set lo up")?;
        }
        let (node, client, pod) = (&setup.node, &setup.client, &setup.pod);
        ip(
            node,
            &format!("link add vethbc type veth peer eth0 netns {client}"),
        )?;
        ip(
            node,
            &format!("link add vethbp type veth peer eth0 netns {pod}"),
        )?;
        for dev in ["vethbc", "vethbp"] {
            ip(node, &format!("addr add 10.99.0.1/32 dev {dev}"))?;
            ip(node, &format!("link set {dev} up"))?;
        }
        ip(node, &format!("route add {CLIENT}/32 dev vethbc"))?;
        ip(node, &format!("route add {POD_X}/32 dev vethbp"))?;
        ip(node, &format!("route add {POD_Y}/32 dev vethbp"))?;
        for (ns, addrs) in [(client, &[CLIENT][..]), (pod, &[POD_X, POD_Y][..])] {
            for addr in addrs {
                ip(ns, &format!("addr add {addr}/32 dev eth0"))?;
            }
            ip(ns, "link set eth0 up")?;
            ip(ns, "route add 10.99.0.1 dev eth0 scope link")?;
            ip(ns, "route add default via 10.99.0.1")?;
        }
        let nft = |args: &[&str]| util::run(in_netns(node, "nft").args(args));
        nft(&["add", "table", "inet", "ipqbench"])?;
        nft(&[
            "add",
            "chain",
            "inet",
            "ipqbench",
            "track",
            "{ type filter hook forward priority 0; }",
        ])?;
        nft(&[
            "add", "rule", "inet", "ipqbench", "track", "ct", "state", "new", "accept",
        ])?;
        for (key, value) in [
            ("net/ipv4/ip_forward", "1"),
            // The flows must outlive a trial: unreplied UDP entries expire after 30 s.
            ("net/netfilter/nf_conntrack_udp_timeout", "600"),
        ] {
            let path = format!("/proc/sys/{key}");
            on_netns_thread(node, || fs::write(&path, value))?
                .with_context(|| format!("sysctl {key} in {node}"))?;
        }
        setup.start_agent(quick)?;
        Ok(setup)
    }

    fn socket(&self) -> PathBuf {
        self.work.join("ipq.sock")
    }

    fn start_agent(&mut self, quick: bool) -> Result<()> {
        // Release builds for figures; a smoke run makes do with the debug build.
        let mut build = util::cargo(["build", "-p", "ipq", "--bin", "ipq-agent"]);
        if !quick {
            build.arg("--release");
        }
        util::run(&mut build)?;
        let profile = if quick { "debug" } else { "release" };
        let binary = util::workspace_root()
            .join("target")
            .join(profile)
            .join("ipq-agent");
        let config = self.work.join("agent.toml");
        fs::write(&config, "")?;
        let log = fs::File::create(self.work.join("agent.log"))?;
        // In PID and mount namespaces of its own, as the DaemonSet runs it; dropped with
        // `unshare` (`--kill-child`).
        let host_proc = self.work.join("host-proc");
        let launcher = super::pod_ns::launcher(&host_proc)?;
        let mut command = in_netns(&self.node, &launcher[0]);
        command
            .args(&launcher[1..])
            .arg(&binary)
            .args(super::pod_ns::agent_args(&host_proc))
            .arg("--config")
            .arg(&config)
            .arg("--bpffs-dir")
            .arg(&self.bpffs)
            .arg("--state-dir")
            .arg(self.work.join("state"))
            .arg("--api-socket")
            .arg(self.socket())
            .args(["--metrics-addr", "127.0.0.1:9740", "--workload", "vethbp"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.agent = Some(command.spawn().context("starting ipq-agent")?);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !request(&self.socket(), "GET", "/v1/status", None).is_ok_and(|r| r.0 == 200) {
            if Instant::now() > deadline {
                bail!(
                    "ipq-agent not ready in 30 s:\n{}",
                    fs::read_to_string(self.work.join("agent.log")).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The node's conntrack entries (`conntrack -C`).
    fn entries(&self) -> Result<u32> {
        let count = output(in_netns(&self.node, "conntrack").args(["-C"]))?;
        count.trim().parse().context("conntrack -C")
    }

    /// Opens `n` UDP flows from the client to pod X (one per destination port).
    fn open_flows(&self, n: u16) -> Result<()> {
        on_netns_thread(&self.client, || -> Result<()> {
            let socket = UdpSocket::bind((CLIENT, 0))?;
            for port in 1..=n {
                socket.send_to(b"flow", (POD_X, port))?;
            }
            Ok(())
        })??;
        // Forwarding is synchronous on veths; give the last packets a moment anyway.
        thread::sleep(Duration::from_millis(50));
        let count = self.entries()?;
        ensure!(
            count >= u32::from(n),
            "only {count} conntrack entries after opening {n} flows"
        );
        Ok(())
    }

    /// Claims `addr`: (latency in ms, conntrack entries its flush deleted, if one ran and
    /// counted them exactly: a dump; the kernel's filtered flush counts only what the kernel
    /// reported).
    fn claim(&self, addr: &str) -> Result<(f64, Option<u64>)> {
        let body = format!(r#"{{"addresses":["{addr}"],"holder":{{"interface":"vethbp"}}}}"#);
        let started = Instant::now();
        let (status, answer) = request(&self.socket(), "POST", "/v1/claims", Some(&body))?;
        let took = started.elapsed().as_secs_f64() * 1e3;
        ensure!(status == 200, "claim {addr}: {status} {answer}");
        let flushed = answer
            .split_once("\"conntrack_entries\":")
            .and_then(|(_, rest)| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            });
        let exact = !answer.contains(r#""conntrack_flush":"kernel""#);
        Ok((took, flushed.filter(|_| exact)))
    }

    fn release(&self, addr: &str) -> Result<()> {
        let path = format!("/v1/addresses/{addr}/release");
        let (status, answer) = request(&self.socket(), "POST", &path, Some(r#"{"force":true}"#))?;
        ensure!(status == 200, "release {addr}: {status} {answer}");
        Ok(())
    }
}

/// One request over the API socket: (status, body).
fn request(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: ipq\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {answer:?}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

/// Latency (ms) of one owner-loop read.
fn read_latency(socket: &Path) -> Result<f64> {
    let started = Instant::now();
    let (status, body) = request(socket, "GET", &format!("/v1/addresses/{POD_Y}"), None)?;
    ensure!(status == 200, "GET {POD_Y}: {status} {body}");
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

fn p99(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[(values.len() * 99 / 100).min(values.len() - 1)]
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Row>> {
    let entries: u16 = if opts.quick { 1000 } else { 10_000 };
    let setup = Setup::new(opts.quick)?;
    let socket = setup.socket();
    // The agent found both addresses from their routes at start; X starts free.
    setup.claim(POD_Y)?;
    setup.release(POD_X)?;
    let (mut flush_ms, mut empty_ms, mut idle_p99, mut busy_p99) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.trials.max(1) {
        // At rest: the loop's read latency, and a claim with nothing to flush.
        let mut idle: Vec<f64> = (0..200)
            .map(|_| read_latency(&socket))
            .collect::<Result<_>>()?;
        idle_p99.push(p99(&mut idle));
        empty_ms.push(setup.claim(POD_X)?.0);
        setup.release(POD_X)?;

        // Under a flush of `entries` entries.
        setup.open_flows(entries)?;
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (stop, busy, socket) = (stop.clone(), busy.clone(), socket.clone());
            thread::spawn(move || -> Result<()> {
                while !stop.load(Ordering::Relaxed) {
                    let latency = read_latency(&socket)?;
                    busy.lock().expect("not poisoned").push(latency);
                }
                Ok(())
            })
        };
        let claimed = setup.claim(POD_X);
        stop.store(true, Ordering::Relaxed);
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))??;
        let (took, flushed) = claimed?;
        // What the kernel's filtered flush deleted, it does not count: the table says it.
        let left = setup.entries()?;
        ensure!(
            flushed.is_none_or(|n| n >= u64::from(entries)) && left < u32::from(entries),
            "the claim flushed {flushed:?} entries of {entries}; {left} left in the table"
        );
        flush_ms.push(took);
        let mut busy = std::mem::take(&mut *busy.lock().expect("not poisoned"));
        ensure!(!busy.is_empty(), "no read finished during the flush");
        busy_p99.push(p99(&mut busy));
        setup.release(POD_X)?;
    }
    let (idle_min, idle_median) = min_and_median(&idle_p99).context("no trial finished")?;
    let (busy_min, busy_median) = min_and_median(&busy_p99).context("no trial finished")?;
    let (flush_min, flush_median) = min_and_median(&flush_ms).context("no trial finished")?;
    let (empty_min, empty_median) = min_and_median(&empty_ms).context("no trial finished")?;
    let row = |name: String, (min, median): (f64, f64), target: Option<Target>| Row {
        group: GROUP,
        name,
        size: None,
        unit: "ms",
        min,
        median,
        target,
    };
    let loop_bound = 2.0 * idle_median + 5.0;
    Ok(vec![
        row("claim_no_entries".into(), (empty_min, empty_median), None),
        row(
            format!("claim_flushing_{entries}_entries"),
            (flush_min, flush_median),
            Some(Target {
                text: format!("≤ {CLAIM_TARGET_MS} ms"),
                met: flush_median <= CLAIM_TARGET_MS,
            }),
        ),
        row(
            "loop_read_p99_at_rest".into(),
            (idle_min, idle_median),
            None,
        ),
        row(
            format!("loop_read_p99_during_{entries}_flush"),
            (busy_min, busy_median),
            Some(Target {
                text: "≤ 2× at rest + 5 ms".into(),
                met: busy_median <= loop_bound,
            }),
        ),
    ])
}
