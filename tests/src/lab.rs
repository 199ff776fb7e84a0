//! The lab of "node + two pods + a peer behind an uplink", the real `ipq-agent` running in it,
//! and helpers that send traffic through it and read the agent's metrics.
//!
//! ```text
//!  pod-a eth0 10.77.0.2 fd77::2 ── vethpa ┐
//!                                          node ── up0 10.78.0.1 fd78::1 ── eth0 10.78.0.2  peer
//!  pod-b eth0 10.77.0.3 fd77::3 ── vethpb ┘  (forwarding)                  fd78::2
//! ```
//!
//! Pods are wired as the CNI ptp plugin wires them (a /32 and a /128 on the pod, the gateway
//! 10.77.0.1 and fe80::1 on every host-side veth, a host route per pod address). Every
//! neighbour entry traffic needs is PERMANENT and DAD is off, so no ARP or NDP packet is ever
//! sent during a test: datapath counters then equal the packets a test sends, exactly.

use std::{
    collections::BTreeMap,
    fs,
    io::{ErrorKind, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};

use crate::netns::{agent_binary, require_root, unique, BpffsDir, NetNs};
use crate::time::scaled;
/// The one bounded poll, here where the lab's users have always found it.
pub use crate::wait::poll;
use crate::wait::{die_with_parent, exit_within};

pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const GATEWAY_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
pub const POD_A_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const POD_A_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
pub const POD_B_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
pub const POD_B_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 3);
pub const UPLINK_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
pub const UPLINK_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 1);
pub const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 2);

const VETHPA_MAC: &str = "02:77:00:00:0a:01";
const POD_A_MAC: &str = "02:77:00:00:0a:02";
const VETHPB_MAC: &str = "02:77:00:00:0b:01";
const POD_B_MAC: &str = "02:77:00:00:0b:02";
const UP0_MAC: &str = "02:78:00:00:00:01";
const PEER_MAC: &str = "02:78:00:00:00:02";

/// Inside the node namespace only, so every lab can use the agent's default port.
pub const METRICS_ADDR: &str = "127.0.0.1:9740";

/// How long an agent may take from exec to `/readyz` answering 200 (times the time scale).
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A scratch directory for agent logs, state and config; removed on drop.
#[derive(Debug)]
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            eprintln!("cleanup: removing {}: {e}", self.0.display());
        }
    }
}

/// The four namespaces, the agent's bpffs dir and a scratch dir. Field order is drop order:
/// namespaces (and so every veth and attachment) first, then the pins, then the logs.
#[derive(Debug)]
pub struct Lab {
    pub node: NetNs,
    pub pod_a: NetNs,
    pub pod_b: NetNs,
    pub peer: NetNs,
    pub bpffs: BpffsDir,
    work: WorkDir,
}

/// `ip -n <ns> <format!(...)>`, split on whitespace: the wiring below reads like the shell
/// commands it runs.
macro_rules! ip {
    ($ns:expr, $($fmt:tt)+) => {
        $ns.ip(&format!($($fmt)+).split_whitespace().collect::<Vec<_>>())
    };
}

/// Wires one pod to the node through `host_if` as the CNI ptp plugin does.
fn wire_pod(
    node: &NetNs,
    pod: &NetNs,
    host_if: &str,
    (host_mac, pod_mac): (&str, &str),
    (v4, v6): (Ipv4Addr, Ipv6Addr),
) -> anyhow::Result<()> {
    let (gw4, gw6) = (GATEWAY_V4, GATEWAY_LL);
    let pod_end = format!("name eth0 address {pod_mac} netns {}", pod.name());
    ip!(
        node,
        "link add {host_if} address {host_mac} type veth peer {pod_end}"
    )?;
    ip!(node, "addr add {gw4}/32 dev {host_if}")?;
    ip!(node, "addr add {gw6}/64 dev {host_if} nodad")?;
    ip!(node, "link set {host_if} up")?;
    ip!(pod, "addr add {v4}/32 dev eth0")?;
    ip!(pod, "addr add {v6}/128 dev eth0 nodad")?;
    ip!(pod, "link set eth0 up")?;
    ip!(pod, "route add {gw4} dev eth0 scope link")?;
    ip!(pod, "route add default via {gw4} dev eth0")?;
    ip!(pod, "-6 route add default via {gw6} dev eth0")?;
    ip!(
        pod,
        "neigh add {gw4} lladdr {host_mac} dev eth0 nud permanent"
    )?;
    ip!(
        pod,
        "neigh add {gw6} lladdr {host_mac} dev eth0 nud permanent"
    )?;
    ip!(node, "route add {v4}/32 dev {host_if}")?;
    ip!(node, "-6 route add {v6}/128 dev {host_if}")?;
    ip!(
        node,
        "neigh add {v4} lladdr {pod_mac} dev {host_if} nud permanent"
    )?;
    ip!(
        node,
        "neigh add {v6} lladdr {pod_mac} dev {host_if} nud permanent"
    )?;
    Ok(())
}

/// The uplink: `up0` in the node, `eth0` in the peer, one /24 and one /64 between them.
fn wire_uplink(node: &NetNs, peer: &NetNs) -> anyhow::Result<()> {
    let peer_end = format!("name eth0 address {PEER_MAC} netns {}", peer.name());
    ip!(
        node,
        "link add up0 address {UP0_MAC} type veth peer {peer_end}"
    )?;
    ip!(node, "addr add {UPLINK_V4}/24 dev up0")?;
    ip!(node, "addr add {UPLINK_V6}/64 dev up0 nodad")?;
    ip!(node, "link set up0 up")?;
    ip!(peer, "addr add {PEER_V4}/24 dev eth0")?;
    ip!(peer, "addr add {PEER_V6}/64 dev eth0 nodad")?;
    ip!(peer, "link set eth0 up")?;
    ip!(peer, "route add 10.77.0.0/24 via {UPLINK_V4}")?;
    ip!(peer, "-6 route add fd77::/64 via {UPLINK_V6}")?;
    ip!(
        node,
        "neigh add {PEER_V4} lladdr {PEER_MAC} dev up0 nud permanent"
    )?;
    ip!(
        node,
        "neigh add {PEER_V6} lladdr {PEER_MAC} dev up0 nud permanent"
    )?;
    ip!(
        peer,
        "neigh add {UPLINK_V4} lladdr {UP0_MAC} dev eth0 nud permanent"
    )?;
    ip!(
        peer,
        "neigh add {UPLINK_V6} lladdr {UP0_MAC} dev eth0 nud permanent"
    )?;
    Ok(())
}

impl Lab {
    /// Builds the lab; fails (never skips) when not root or bpffs is missing.
    pub fn new() -> anyhow::Result<Lab> {
        require_root()?;
        let work = WorkDir(std::env::temp_dir().join(unique("ipq-lab")));
        fs::create_dir(&work.0).with_context(|| format!("creating {}", work.0.display()))?;
        let lab = Lab {
            node: NetNs::new("node")?,
            pod_a: NetNs::new("pa")?,
            pod_b: NetNs::new("pb")?,
            peer: NetNs::new("peer")?,
            bpffs: BpffsDir::new()?,
            work,
        };
        lab.node.sysctl("net.ipv4.ip_forward", "1")?;
        lab.node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        wire_pod(
            &lab.node,
            &lab.pod_a,
            "vethpa",
            (VETHPA_MAC, POD_A_MAC),
            (POD_A_V4, POD_A_V6),
        )?;
        wire_pod(
            &lab.node,
            &lab.pod_b,
            "vethpb",
            (VETHPB_MAC, POD_B_MAC),
            (POD_B_V4, POD_B_V6),
        )?;
        wire_uplink(&lab.node, &lab.peer)?;
        Ok(lab)
    }

    /// The names of the lab's namespaces.
    pub fn netns_names(&self) -> Vec<String> {
        [&self.node, &self.pod_a, &self.pod_b, &self.peer]
            .iter()
            .map(|ns| ns.name().to_owned())
            .collect()
    }

    /// Where agent logs, state and config go.
    pub fn work_dir(&self) -> &Path {
        &self.work.0
    }

    /// The lab's own CNI bin dir, for plugins a test writes (a delegate whose DEL fails): one
    /// of the directories its agents trust (see [`trusted_cni_bin_dirs`](Self::trusted_cni_bin_dirs)).
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.work_dir().join("cni-bin")
    }

    /// Where the lab's containerd keeps its state and its CNI bin dir (`cri_node`).
    pub fn containerd_dir(&self) -> PathBuf {
        self.work_dir().join("containerd")
    }

    /// What the lab's agents get as `ipam_cni_bin_dirs`, the directories whose delegates they
    /// run ipq-ipam's DELs from: Debian's plugin dir (the chains' `CNI_PATH`), the lab's own,
    /// and containerd's (links to Debian's). A test may add more with the flag.
    pub fn trusted_cni_bin_dirs(&self) -> Vec<PathBuf> {
        vec![
            PathBuf::from(crate::cni::DEBIAN_PLUGIN_DIR),
            self.cni_bin_dir(),
            self.containerd_dir().join("cni-bin"),
        ]
    }

    /// Starts the agent in the node namespace and waits until it is ready.
    pub fn start_agent(&self, extra: &[&str]) -> anyhow::Result<Agent<'_>> {
        Agent::start(self, extra)
    }

    /// Like [`start_agent`](Self::start_agent), with the agent run through `wrapper` (a
    /// command line that ends by running its arguments: `unshare --pid --fork --kill-child`,
    /// `prlimit --nofile=1024:4096`).
    pub fn start_agent_wrapped(
        &self,
        wrapper: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Agent<'_>> {
        Agent::start_with(self, wrapper, extra)
    }

    /// Like [`start_agent`](Self::start_agent), with `config` (TOML) as the agent's config
    /// file: for keys that have no command-line flag (`[hygiene]`).
    pub fn start_agent_configured(
        &self,
        config: &str,
        extra: &[&str],
    ) -> anyhow::Result<Agent<'_>> {
        Agent::start_configured(self, config, &[], extra)
    }

    /// `ipq-agent datapath <args> --bpffs-dir <lab's>` inside the node namespace (interface
    /// names resolve there). Returns stdout.
    pub fn datapath(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.node.command(agent_binary());
        cmd.arg("datapath")
            .args(args)
            .arg("--bpffs-dir")
            .arg(self.bpffs.path());
        crate::netns::output_of(&mut cmd)
    }

    /// Pod a is draining and fenced on its own interface: all its traffic is to be dropped.
    pub fn fence_pod_a(&self) -> anyhow::Result<()> {
        for addr in [IpAddr::from(POD_A_V4), POD_A_V6.into()] {
            self.set_entry(addr, "draining", "vethpa", Some("vethpa"))?;
        }
        Ok(())
    }

    /// Pod b holds its addresses normally: all its traffic is to pass.
    pub fn register_pod_b(&self) -> anyhow::Result<()> {
        for addr in [IpAddr::from(POD_B_V4), POD_B_V6.into()] {
            self.set_entry(addr, "active", "vethpb", None)?;
        }
        Ok(())
    }

    /// Writes one datapath entry by hand: through the running agent (`PUT /v1/datapath/{ip}`),
    /// which is the maps' one writer, or with `ipq-agent datapath set` when none runs (which
    /// refuses while one does).
    pub fn set_entry(
        &self,
        addr: IpAddr,
        state: &str,
        holder: &str,
        fenced: Option<&str>,
    ) -> anyhow::Result<()> {
        let socket = self.work_dir().join("ipq.sock");
        let body = serde_json::json!({ "state": state, "holder": holder, "fenced": fenced });
        match crate::api::request(
            &socket,
            "PUT",
            &format!("/v1/datapath/{addr}"),
            Some(&body.to_string()),
        ) {
            Ok(answer) if answer.status == 200 => return Ok(()),
            Ok(answer) => bail!("PUT /v1/datapath/{addr}: {} {}", answer.status, answer.body),
            // No agent listening: the break-glass tool writes the pinned maps itself.
            Err(_) => {}
        }
        let addr = addr.to_string();
        let mut args = vec!["set", &addr, "--state", state, "--holder", holder];
        if let Some(fenced) = fenced {
            args.extend(["--fenced", fenced]);
        }
        self.datapath(&args).map(drop)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // A failing test gets every agent log of the lab in its output.
        if !std::thread::panicking() {
            return;
        }
        let Ok(entries) = fs::read_dir(&self.work.0) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_else(|e| format!("(unreadable: {e})"));
            eprintln!("----- {} -----\n{text}----- end -----", log.display());
        }
    }
}

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
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
}

impl<'l> Agent<'l> {
    /// Starts the agent in `lab`'s node namespace on `lab`'s bpffs dir, with its own state dir,
    /// API socket and an empty config file (so nothing on the host leaks in), plus `extra`.
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
        let work = lab.work_dir();
        let config = work.join("agent.toml");
        fs::write(&config, config_text)?;
        let runs = fs::read_dir(work)?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .count();
        let log = work.join(format!("agent-{}.log", runs + 1));
        let out = fs::File::create(&log)?;
        let mut cmd = match wrapper {
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
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let mut agent = Agent {
            lab,
            pid: child.id(),
            child: Some(child),
            log,
        };
        agent.wait_ready()?;
        Ok(agent)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let timeout = scaled(READY_TIMEOUT);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().transpose()) {
                self.child = None;
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
        if let Some(mut child) = self.child.take() {
            // SAFETY: signals our own child, which has not been reaped yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (bounded); the agent must exit 0.
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().context("the agent is not running")?;
        // SAFETY: signals our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let timeout = scaled(Duration::from_secs(10));
        let Some(status) = exit_within(&mut child, timeout)? else {
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

/// One sample of the text format.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` response.
#[derive(Clone, Debug)]
pub struct Scrape(pub Vec<Sample>);

/// `{a="x",b="y"}` (after the name) → labels and the rest of the line.
fn parse_labels(s: &str) -> anyhow::Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').context("labels start with {")?;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (key, after) = rest.split_once("=\"").context("label without =\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().context("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().context("dangling escape")?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = &after[end + 1..];
    }
}

impl Scrape {
    pub fn parse(text: &str) -> anyhow::Result<Scrape> {
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parse = || -> anyhow::Result<Sample> {
                let end = line.find(['{', ' ']).context("no value")?;
                let (name, rest) = line.split_at(end);
                let (labels, rest) = if rest.starts_with('{') {
                    parse_labels(rest)?
                } else {
                    (BTreeMap::new(), rest)
                };
                let value = rest.split_whitespace().next().context("no value")?;
                Ok(Sample {
                    name: name.to_owned(),
                    labels,
                    value: value.parse()?,
                })
            };
            samples.push(parse().with_context(|| format!("metrics line {line:?}"))?);
        }
        Ok(Scrape(samples))
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The sum of every series of `name` carrying all of `labels`; an error if there is none.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        let mut found = false;
        let sum = self
            .matching(name, labels)
            .inspect(|_| found = true)
            .map(|s| s.value)
            .sum();
        if !found {
            bail!("no series {name} with labels {labels:?} in /metrics");
        }
        Ok(sum)
    }

    /// The sum of every series of `name` carrying all of `labels`; 0 if there is none (a
    /// counter whose labels no event has made yet, e.g. a network's first release).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Every series of `name` whose value differs from `before`, as `label=value,...` → the
    /// change. Comparing whole families shows what else moved, not just what a test expects.
    pub fn changes_since(&self, before: &Scrape, name: &str) -> BTreeMap<String, f64> {
        let mut changes = BTreeMap::new();
        for sample in self.matching(name, &[]) {
            let old = before
                .0
                .iter()
                .find(|s| s.name == sample.name && s.labels == sample.labels)
                .map_or(0.0, |s| s.value);
            if sample.value != old {
                let key = sample
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                changes.insert(key, sample.value - old);
            }
        }
        changes
    }
}

/// Agent flags for tests that watch a whole quarantine: workload veths, a 4 s cooldown, a
/// 1 s quiet period and at most 6 s: long enough to act during it, short enough to outlast.
pub const SHORT_QUARANTINE: [&str; 8] = [
    "--workload",
    "veth*",
    "--cooldown",
    "4s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "6s",
];

/// Sends `n` small UDP datagrams from `from` to `dst` (which lives in `to`) and returns how many
/// arrived. The receiver is bound before the first send; the count stops at `n` or after
/// 500 ms of silence, which is ample on veths where delivery is synchronous (also under
/// emulation, so this wait is not scaled: it is spent in full on every dropped burst).
pub fn udp_burst(from: &NetNs, to: &NetNs, dst: IpAddr, n: usize) -> usize {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    // A socket stays in the namespace it was made in, whichever thread uses it later.
    let rx = to
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a UDP receiver in {}: {e}", to.name()));
    let port = rx.local_addr().expect("bound").port();
    let tag = format!("ipq-test {}", unique("burst"));
    from.run(|| {
        let tx = UdpSocket::bind((any, 0)).expect("binding the UDP sender");
        for i in 0..n {
            tx.send_to(format!("{tag} {i}").as_bytes(), (dst, port))
                .unwrap_or_else(|e| panic!("sending to {dst}:{port} from {}: {e}", from.name()));
        }
    });
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("setting a timeout");
    let mut received = 0;
    let mut buf = [0u8; 256];
    while received < n {
        match rx.recv_from(&mut buf) {
            // Only our own datagrams count.
            Ok((len, _)) if buf[..len].starts_with(tag.as_bytes()) => received += 1,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("receiving in {}: {e}", to.name()),
        }
    }
    received
}

/// `ping -c n` from inside `from`; returns how many replies came back. Panics if ping did not
/// send exactly `n` requests, since callers compare counters with `n`.
pub fn ping(from: &NetNs, dst: IpAddr, n: u32) -> u32 {
    let out = from
        .command("ping")
        .args(["-n", "-q", "-c", &n.to_string(), "-i", "0.02", "-W", "1"])
        .arg(dst.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running ping (cargo xtask setup installs iputils-ping): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "5 packets transmitted, 5 received, 0% packet loss, time 81ms"
    let summary = stdout
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| {
            panic!(
                "no summary from ping {dst} in {}: {stdout}{}",
                from.name(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let count = |what: &str| -> u32 {
        summary
            .split(',')
            .find(|part| part.contains(what))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no '{what}' count in {summary:?}"))
    };
    let transmitted = count("transmitted");
    assert_eq!(
        transmitted, n,
        "ping {dst} sent {transmitted} requests, not {n}"
    );
    count("received")
}

// ---------------------------------------------------------------------------------------------
// Helpers of the incident tests (`tests/tests/incidents_*.rs`): addresses handed to a second
// pod, senders bound to an address or a device, crafted frames on the wire, the pinned map as
// `datapath show` prints it, the agent's conflict log, and bounded polling.

/// MAC addresses of the lab, as `ip` spells them: pod b's `eth0`, the peer's `eth0`.
pub const POD_B_LLADDR: &str = POD_B_MAC;
pub const PEER_LLADDR: &str = PEER_MAC;

/// `"02:77:00:00:0a:01"` → its six bytes.
pub fn mac_bytes(mac: &str) -> [u8; 6] {
    let mut bytes = [0u8; 6];
    let parts: Vec<u8> = mac
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).unwrap_or_else(|e| panic!("bad MAC {mac:?}: {e}")))
        .collect();
    assert_eq!(parts.len(), 6, "bad MAC {mac:?}");
    bytes.copy_from_slice(&parts);
    bytes
}

/// `/32` or `/128`.
fn host_prefix(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The interface index of `name` inside `ns`.
pub fn ifindex(ns: &NetNs, name: &str) -> anyhow::Result<u32> {
    let c_name = std::ffi::CString::new(name)?;
    // SAFETY: a valid C string.
    let index = ns.run(|| unsafe { libc::if_nametoindex(c_name.as_ptr()) });
    if index == 0 {
        bail!("no interface {name} in netns {}", ns.name());
    }
    Ok(index)
}

impl Lab {
    /// Starts `ip -batch` in the node making `n` veth pairs `{host}{i}` / `{peer}{i}`, host
    /// sides up: as fast as the kernel makes them. Returns the running `ip`, for the caller to
    /// act during the burst and then wait for it.
    pub fn spawn_veth_batch(&self, host: &str, peer: &str, n: usize) -> anyhow::Result<Child> {
        let mut batch = String::new();
        for i in 0..n {
            batch.push_str(&format!(
                "link add {host}{i} type veth peer name {peer}{i}\nlink set {host}{i} up\n"
            ));
        }
        let mut ip = self
            .node
            .command("ip")
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .context("spawning ip -batch")?;
        ip.stdin
            .take()
            .context("ip -batch's stdin")?
            .write_all(batch.as_bytes())
            .context("writing the veth batch")?;
        Ok(ip)
    }

    /// Gives `pod` one more address on its `eth0` (as an IPAM handing it out would), with the
    /// node's PERMANENT neighbour entry for it on `host_if` (`pod_mac`), but no route: routes
    /// are what the agent watches, so tests add them separately with
    /// [`add_host_route`](Self::add_host_route).
    pub fn add_pod_address(
        &self,
        pod: &NetNs,
        host_if: &str,
        pod_mac: &str,
        addr: IpAddr,
    ) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        match addr {
            IpAddr::V4(_) => ip!(pod, "addr add {prefix} dev eth0")?,
            IpAddr::V6(_) => ip!(pod, "addr add {prefix} dev eth0 nodad")?,
        };
        ip!(
            self.node,
            "neigh replace {addr} lladdr {pod_mac} dev {host_if} nud permanent"
        )?;
        Ok(())
    }

    /// `ip route add <addr>/32|128 dev <host_if> [metric m]` in the node: a per-pod host route
    /// in the main table, which the agent reads as a claim.
    pub fn add_host_route(
        &self,
        host_if: &str,
        addr: IpAddr,
        metric: Option<u32>,
    ) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        match metric {
            Some(m) => ip!(self.node, "route add {prefix} dev {host_if} metric {m}")?,
            None => ip!(self.node, "route add {prefix} dev {host_if}")?,
        };
        Ok(())
    }

    /// `ip route del <addr>/32|128 dev <host_if>` in the node: the pod's route withdrawn.
    pub fn del_host_route(&self, host_if: &str, addr: IpAddr) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        ip!(self.node, "route del {prefix} dev {host_if}")?;
        Ok(())
    }

    /// Makes `addrs` reachable through `dev` for node sockets bound to `dev` (SO_BINDTODEVICE),
    /// whatever the main table says: a rule `oif <dev> lookup <table>` and host routes in
    /// `table`. The agent reads only the main table, so this claims nothing; it lets a test
    /// reach a pod whose route was withdrawn or given to another pod.
    pub fn route_by_oif(&self, dev: &str, table: u32, addrs: &[IpAddr]) -> anyhow::Result<()> {
        ip!(
            self.node,
            "-4 rule add oif {dev} lookup {table} priority {table}"
        )?;
        ip!(
            self.node,
            "-6 rule add oif {dev} lookup {table} priority {table}"
        )?;
        for addr in addrs {
            let prefix = host_prefix(*addr);
            ip!(self.node, "route add {prefix} dev {dev} table {table}")?;
        }
        Ok(())
    }

    /// Makes everything the node forwards or sends to `addrs` go through `dev` (a rule
    /// `to <addr> lookup <table>` ahead of the main table, and host routes in `table`): the
    /// pod keeps two-way connectivity while its main-table route, the one the agent watches,
    /// is withdrawn.
    pub fn route_to_via_table(
        &self,
        dev: &str,
        table: u32,
        addrs: &[IpAddr],
    ) -> anyhow::Result<()> {
        for addr in addrs {
            let prefix = host_prefix(*addr);
            let family = if addr.is_ipv4() { "-4" } else { "-6" };
            ip!(
                self.node,
                "{family} rule add to {prefix} lookup {table} priority {table}"
            )?;
            ip!(self.node, "route add {prefix} dev {dev} table {table}")?;
        }
        Ok(())
    }

    /// Every entry of the pinned address map, as `ipq-agent datapath show` prints it.
    pub fn datapath_entries(&self) -> anyhow::Result<BTreeMap<IpAddr, MapEntry>> {
        let out = self.datapath(&["show"])?;
        let mut entries = BTreeMap::new();
        for line in out.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [addr, state, holder, fenced] = fields[..] else {
                continue;
            };
            let Ok(addr) = addr.parse::<IpAddr>() else {
                continue;
            };
            let entry = MapEntry {
                state: state.to_owned(),
                holder: holder
                    .parse()
                    .with_context(|| format!("holder in {line:?}"))?,
                fenced: fenced
                    .parse()
                    .with_context(|| format!("fenced in {line:?}"))?,
            };
            entries.insert(addr, entry);
        }
        Ok(entries)
    }

    /// The map entry of `addr`, if any.
    pub fn datapath_entry(&self, addr: IpAddr) -> anyhow::Result<Option<MapEntry>> {
        Ok(self.datapath_entries()?.remove(&addr))
    }

    /// Polls the map until `addr`'s entry satisfies `want` (None: no entry), for `timeout`.
    pub fn wait_entry(
        &self,
        addr: IpAddr,
        timeout: Duration,
        what: &str,
        want: impl Fn(Option<&MapEntry>) -> bool,
    ) -> anyhow::Result<Option<MapEntry>> {
        poll(&format!("{addr}: {what}"), timeout, || {
            let entry = self.datapath_entry(addr)?;
            Ok(want(entry.as_ref()).then_some(entry))
        })
    }
}

/// A map entry as the tests expect it.
pub fn map_entry(state: &str, holder: u32, fenced: u32) -> MapEntry {
    MapEntry {
        state: state.to_owned(),
        holder,
        fenced,
    }
}

/// Waits up to `settle` until `addr`'s map entry is exactly `want`; panics with what it saw.
pub fn wait_for_entry(lab: &Lab, addr: IpAddr, want: &MapEntry, settle: Duration) {
    lab.wait_entry(addr, settle, &format!("map entry {want:?}"), |e| {
        e == Some(want)
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Pod a's two addresses, each with the peer's address of the same family.
pub fn pod_a_and_peer() -> [(IpAddr, IpAddr); 2] {
    [
        (POD_A_V4.into(), PEER_V4.into()),
        (POD_A_V6.into(), PEER_V6.into()),
    ]
}

/// Waits up to `settle` until the agent's start-up dump claimed pod a's and pod b's addresses
/// for their veths; returns (vethpa, vethpb).
pub fn wait_claimed_at_start(lab: &Lab, settle: Duration) -> (u32, u32) {
    let vethpa = ifindex(&lab.node, "vethpa").expect("vethpa");
    let vethpb = ifindex(&lab.node, "vethpb").expect("vethpb");
    for (addr, holder) in [
        (IpAddr::from(POD_A_V4), vethpa),
        (POD_A_V6.into(), vethpa),
        (POD_B_V4.into(), vethpb),
        (POD_B_V6.into(), vethpb),
    ] {
        wait_for_entry(lab, addr, &map_entry("active", holder, 0), settle);
    }
    (vethpa, vethpb)
}

/// One entry of the pinned address map. `holder` and `fenced` are ifindexes, 0 for none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub state: String,
    pub holder: u32,
    pub fenced: u32,
}

/// How the sender of [`udp_burst_with`] is set up.
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpSender<'a> {
    /// Source address to bind to (else the kernel picks one).
    pub bind: Option<IpAddr>,
    /// Interface to bind to (SO_BINDTODEVICE), for a node socket that must leave through one
    /// pod's veth.
    pub device: Option<&'a str>,
}

/// Binds `socket` to interface `dev` (SO_BINDTODEVICE).
pub fn bind_to_device(socket: &UdpSocket, dev: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid socket and a buffer of the given length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            dev.as_ptr().cast(),
            dev.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// As [`udp_burst`], with the sender bound as `sender` says. Returns how many of the `n`
/// datagrams arrived; panics if the kernel refuses a send.
pub fn udp_burst_with(
    from: &NetNs,
    sender: UdpSender<'_>,
    to: &NetNs,
    dst: IpAddr,
    n: usize,
) -> usize {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let rx = to
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a UDP receiver in {}: {e}", to.name()));
    let port = rx.local_addr().expect("bound").port();
    let tag = format!("ipq-test {}", unique("burst"));
    from.run(|| {
        let tx = UdpSocket::bind((sender.bind.unwrap_or(any), 0)).unwrap_or_else(|e| {
            panic!(
                "binding the UDP sender to {:?} in {}: {e}",
                sender.bind,
                from.name()
            )
        });
        if let Some(dev) = sender.device {
            bind_to_device(&tx, dev)
                .unwrap_or_else(|e| panic!("SO_BINDTODEVICE {dev} in {}: {e}", from.name()));
        }
        for i in 0..n {
            // A send the kernel refuses (no route...) is a broken setup, not a drop: a packet
            // the datapath drops still leaves the socket successfully.
            tx.send_to(format!("{tag} {i}").as_bytes(), (dst, port))
                .unwrap_or_else(|e| {
                    panic!(
                        "sending to {dst}:{port} from {} ({sender:?}): {e}",
                        from.name()
                    )
                });
        }
    });
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("setting a timeout");
    let mut received = 0;
    let mut buf = [0u8; 256];
    while received < n {
        match rx.recv_from(&mut buf) {
            Ok((len, _)) if buf[..len].starts_with(tag.as_bytes()) => received += 1,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("receiving in {}: {e}", to.name()),
        }
    }
    received
}

/// Sends each of `frames` (whole Ethernet frames) out of `ifname` in `ns` through an AF_PACKET
/// raw socket: gratuitous ARP, unsolicited neighbour advertisements, anything no tool is
/// needed for.
pub fn send_frames(ns: &NetNs, ifname: &str, frames: &[Vec<u8>]) -> anyhow::Result<()> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let index = ifindex(ns, ifname)?;
    ns.run(|| -> anyhow::Result<()> {
        // Protocol 0: this socket only sends, it receives nothing.
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for frame in frames {
            // SAFETY: sockaddr_ll is plain old data.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_ifindex = index as i32;
            addr.sll_halen = 6;
            addr.sll_addr[..6].copy_from_slice(&frame[..6]);
            // SAFETY: valid buffers of the given lengths.
            let sent = unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if sent != frame.len() as isize {
                bail!(
                    "sending a {}-byte frame on {ifname}: {}",
                    frame.len(),
                    std::io::Error::last_os_error()
                );
            }
        }
        Ok(())
    })
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
