//! The real `ipq-agent` running in a lab: started, waited for, read (log, metrics, readiness),
//! stopped.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};

use crate::netns::{agent_binary, NetNs};
use crate::time::scaled;
use crate::wait::{die_with_parent, exit_within};

use super::*;

/// `GET path` over HTTP/1.0 to the agent, from inside `ns`: (status, body).
fn http_get(ns: &NetNs, path: &str) -> anyhow::Result<(u16, String)> {
    ns.run(|| {
        let addr: SocketAddr = METRICS_ADDR.parse().expect("valid");
        let mut stream = TcpStream::connect_timeout(&addr, scaled(Duration::from_secs(1)))?;
        stream.set_read_timeout(Some(scaled(Duration::from_secs(5))))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        // HTTP/1.0 without keep-alive: the server closes when the response is complete.
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("no end of headers in {response:?}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("bad status line in {head:?}"))?;
        Ok((status, body.to_owned()))
    })
}

/// A running `ipq-agent`, killed on drop if still running.
pub struct Agent<'l> {
    lab: &'l Lab,
    /// What the test spawned: `unshare` in a pod's namespaces, else the agent (or a wrapper
    /// that became it by `exec`). Waited for to know the agent gone: `unshare` exits with it.
    launcher: Option<Child>,
    /// The agent's own pid in the test's PID namespace: what the test signals and reads.
    pid: u32,
    log: PathBuf,
}

/// A config file that leaves `bpf_watcher` to the agent's default (the lab otherwise asks for
/// `auto`): it names the key, in a comment.
pub const WATCHER_DEFAULT: &str = "# bpf_watcher: the agent's default\n";

impl<'l> Agent<'l> {
    /// Starts the agent in `lab`'s node namespace on `lab`'s bpffs dir, with its own state dir,
    /// API socket and an empty config file (so nothing on the host leaks in), plus `extra`; in
    /// PID and mount namespaces of its own, as the DaemonSet runs it.
    pub fn start(lab: &'l Lab, extra: &[&str]) -> anyhow::Result<Agent<'l>> {
        Self::start_with(lab, &[], extra)
    }

    /// [`start`](Self::start) through `wrapper` (see [`Lab::start_agent_wrapped`]).
    pub fn start_with(lab: &'l Lab, wrapper: &[&str], extra: &[&str]) -> anyhow::Result<Agent<'l>> {
        Self::start_configured(lab, "# every key from the command line\n", wrapper, extra)
    }

    /// [`start_with`](Self::start_with), with `config_text` as the config file.
    pub fn start_configured(
        lab: &'l Lab,
        config_text: &str,
        wrapper: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Agent<'l>> {
        Self::start_in(lab, AgentNamespaces::Pod, config_text, wrapper, extra)
    }

    /// [`start_configured`](Self::start_configured) in `namespaces` (see
    /// [`AgentNamespaces::Host`] for when a test may ask for the host's).
    pub fn start_in(
        lab: &'l Lab,
        namespaces: AgentNamespaces,
        config_text: &str,
        wrapper: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Agent<'l>> {
        let work = lab.work_dir();
        let config = work.join("agent.toml");
        fs::write(&config, config_text)?;
        let runs = fs::read_dir(work)?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .count();
        let log = work.join(format!("agent-{}.log", runs + 1));
        let out = fs::File::create(&log)?;
        let host_proc = work.join("host-proc");
        fs::create_dir_all(&host_proc)?;
        let launcher: Vec<String> = namespaces
            .launcher(&host_proc)
            .into_iter()
            .chain(wrapper.iter().map(|w| (*w).to_owned()))
            .collect();
        let mut cmd = match launcher.as_slice() {
            [] => lab.node.command(agent_binary()),
            [program, args @ ..] => {
                let mut cmd = lab.node.command(program);
                cmd.args(args).arg(agent_binary());
                cmd
            }
        };
        cmd.arg("--config").arg(&config);
        // A test may put the pins elsewhere (a bpf mount of its own): its flag, given once.
        if !extra.contains(&"--bpffs-dir") {
            cmd.arg("--bpffs-dir").arg(lab.bpffs.path());
        }
        cmd.arg("--state-dir")
            .arg(work.join("state"))
            .arg("--api-socket")
            .arg(work.join("ipq.sock"))
            .args(["--metrics-addr", METRICS_ADDR]);
        for dir in lab.trusted_cni_bin_dirs() {
            cmd.arg("--ipam-cni-bin-dirs").arg(dir);
        }
        // The lab's agents run the watcher's fallback where the kernel refuses the trampolines
        // (this kind of build machine's): the tests of repair within milliseconds are tests of
        // the watcher, whatever the kernel. The shipped default (`trampolines`) is tested where
        // a test names it ([`WATCHER_DEFAULT`]) and in the cluster tier, which runs the
        // DaemonSet's own config.
        if !extra.contains(&"--bpf-watcher") && !config_text.contains("bpf_watcher") {
            cmd.args(["--bpf-watcher", "auto"]);
        }
        if !extra.contains(&"--api-peer-procfs") {
            cmd.args(namespaces.agent_args(&host_proc));
        }
        cmd.args(extra)
            // The per-address lines an operator's INFO log leaves out (transitions, hygiene
            // passes) are what a failed test's agent log is read for.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG")
                    .unwrap_or_else(|_| "info,ipq::transition=debug,ipq::hygiene=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // If the test process dies without unwinding, the agent must not live on holding
        // pins and attachments.
        die_with_parent(&mut cmd);
        let mut launcher = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let pid = match namespaces.agent_pid(&mut launcher) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = launcher.kill();
                let _ = launcher.wait();
                let text = fs::read_to_string(&log).unwrap_or_default();
                return Err(e.context(format!("starting {cmd:?}; its output:\n{text}")));
            }
        };
        let mut agent = Agent {
            lab,
            pid,
            launcher: Some(launcher),
            log,
        };
        agent.wait_ready()?;
        Ok(agent)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let timeout = scaled(READY_TIMEOUT);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .launcher
                .as_mut()
                .and_then(|c| c.try_wait().transpose())
            {
                self.launcher = None;
                bail!(
                    "ipq-agent exited ({}) before it was ready; log {}:\n{}",
                    status?,
                    self.log.display(),
                    self.log()
                );
            }
            let last = match http_get(&self.lab.node, "/readyz") {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("{status} {body}"),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "ipq-agent not ready in {timeout:?} (last /readyz: {last}); log {}:\n{}",
                    self.log.display(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's pid in the test's PID namespace (for `/proc/<pid>`, signals, prlimit); to
    /// itself, in a pod's namespaces, it is pid 1.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Everything the agent logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(unreadable: {e})"))
    }

    /// `/readyz`: status and body.
    pub fn readyz(&self) -> anyhow::Result<(u16, String)> {
        http_get(&self.lab.node, "/readyz")
    }

    /// The agent's API socket.
    pub fn api_socket(&self) -> PathBuf {
        self.lab.work_dir().join("ipq.sock")
    }

    /// When the last verification pass finished, as `/v1/status` says (null before the
    /// first, or when the API does not answer).
    pub fn verified_at(&self) -> serde_json::Value {
        crate::api::request(&self.api_socket(), "GET", "/v1/status", None)
            .and_then(|r| r.json())
            .map(|status| status["verification"]["at"].clone())
            .unwrap_or_default()
    }

    /// `/metrics`, as text.
    pub fn metrics(&self) -> anyhow::Result<String> {
        match http_get(&self.lab.node, "/metrics")? {
            (200, body) => Ok(body),
            (status, body) => bail!("/metrics answered {status}: {body}"),
        }
    }

    /// One scrape, parsed.
    pub fn scrape(&self) -> anyhow::Result<Scrape> {
        Scrape::parse(&self.metrics()?)
    }

    /// The value of `name` with `labels` (summed over the series carrying them all); an error
    /// if no such series exists, so a renamed metric cannot make a test pass by reading 0.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        self.scrape()?.get(name, labels)
    }

    /// Waits up to `timeout` until `name{labels}` satisfies `ok` (`what` says what it should
    /// be, for the failure); returns the value, or an error with the last value and the
    /// agent's log.
    pub fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        timeout: Duration,
        what: &str,
        ok: impl Fn(f64) -> bool,
    ) -> anyhow::Result<f64> {
        crate::wait::poll(&format!("{name}{labels:?} {what}"), timeout, || {
            Ok(Some(self.metric(name, labels)?).filter(|v| ok(*v)))
        })
        .with_context(|| format!("agent log:\n{}", self.log()))
    }

    /// The bpf() watcher the agent says it runs (`ipq_datapath_bpf_watcher_mode`):
    /// `trampolines`, `raw_tracepoint` or `none`, waited for (at most 5 s) until exactly one
    /// of them is 1.
    pub fn bpf_watcher_mode(&self) -> anyhow::Result<&'static str> {
        crate::wait::poll("one bpf() watcher mode", Duration::from_secs(5), || {
            let mut on = Vec::new();
            for mode in ["trampolines", "raw_tracepoint", "none"] {
                if self.metric("ipq_datapath_bpf_watcher_mode", &[("mode", mode)])? == 1.0 {
                    on.push(mode);
                }
            }
            Ok((on.len() == 1).then(|| on[0]))
        })
        .with_context(|| format!("agent log:\n{}", self.log()))
    }

    /// The kinds of the bpf links the agent holds open (`link_type` in its
    /// `/proc/<pid>/fdinfo`: `raw_tracepoint`, `tracing`, `tcx`, `xdp`, ...): what this agent
    /// attached, whatever the other agents on the machine hold.
    pub fn bpf_link_kinds(&self) -> anyhow::Result<Vec<String>> {
        bpf_link_kinds_of(self.pid)
    }

    /// Pod a's fenced drops so far: (tc_ingress, tc_egress).
    pub fn fenced_drops(&self) -> (f64, f64) {
        let get = |hook| {
            self.metric(
                "ipq_dropped_packets_total",
                &[("hook", hook), ("reason", "fenced")],
            )
            .unwrap_or_else(|e| panic!("{e:#}"))
        };
        (get("tc_ingress"), get("tc_egress"))
    }

    /// SIGKILL, as an OOM kill or a node crash would: no clean-up code runs.
    pub fn kill9(&mut self) {
        if let Some(mut launcher) = self.launcher.take() {
            if matches!(launcher.try_wait(), Ok(None)) {
                // SAFETY: the agent's launcher has not exited, so neither has the agent (it
                // dies with it): the pid is still the agent's.
                unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
            }
            let _ = launcher.wait();
        }
    }

    /// SIGTERM, then waits (bounded); the agent must exit 0 (`unshare` exits with its status).
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        let mut launcher = self.launcher.take().context("the agent is not running")?;
        if let Some(status) = launcher.try_wait()? {
            bail!(
                "ipq-agent had exited ({status}) before SIGTERM; log:\n{}",
                self.log()
            );
        }
        // SAFETY: the launcher still runs, so the agent does: the pid is still the agent's.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let timeout = scaled(Duration::from_secs(10));
        let Some(status) = exit_within(&mut launcher, timeout)? else {
            bail!(
                "ipq-agent ignored SIGTERM for {timeout:?}; log:\n{}",
                self.log()
            );
        };
        if !status.success() {
            bail!("ipq-agent exited {status} on SIGTERM; log:\n{}", self.log());
        }
        Ok(())
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Agent<'_> {
    /// How many `conflict` records of `kind` for `addr` the agent logged so far (JSON lines of
    /// target `ipq::conflict`; the kernel's raw `conflict_sample` lines are not counted).
    pub fn conflicts_logged(&self, kind: &str, addr: IpAddr) -> usize {
        let kind = format!("\"kind\":\"{kind}\"");
        let addr = format!("\"address\":\"{addr}\"");
        self.log()
            .lines()
            .filter(|l| l.contains("ipq::conflict") && l.contains("\"event\":\"conflict\""))
            .filter(|l| l.contains(&kind) && l.contains(&addr))
            .count()
    }
}

/// The kinds of the bpf links process `pid` holds (`link_type` in its `/proc/<pid>/fdinfo`):
/// what it has attached, not what the machine's other agents have.
pub fn bpf_link_kinds_of(pid: u32) -> anyhow::Result<Vec<String>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut kinds = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        // A descriptor closed since the listing has no fdinfo any more.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Some(kind) = info.lines().find_map(|l| l.strip_prefix("link_type:")) {
            kinds.push(kind.trim().to_owned());
        }
    }
    Ok(kinds)
}
