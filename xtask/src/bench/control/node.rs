//! A node for the control-plane benchmark: a network namespace, a bpffs directory and a scratch
//! directory of its own (all removed on drop), and a release `ipq-agent` running in it.

use std::{
    ffi::CString,
    fs,
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::{
        fd::AsRawFd as _,
        unix::{net::UnixStream, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::util;

static NEXT: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

const METRICS_ADDR: &str = "127.0.0.1:9740";
const READY_TIMEOUT: Duration = Duration::from_secs(600);

pub struct Node {
    pub ns: String,
    ns_path: PathBuf,
    pub work: PathBuf,
    pub bpffs: PathBuf,
    /// `unshare`, which runs the agent in a pod's PID and mount namespaces and exits with it.
    agent: Option<Child>,
    /// The agent's own pid in the bench's PID namespace.
    agent_pid: u32,
    runs: u32,
    /// Arguments every agent of this node gets.
    args: Vec<String>,
}

impl Node {
    /// Adds `args` to what every later agent of this node gets.
    pub fn add_args(&mut self, args: &[&str]) {
        self.args.extend(args.iter().map(|s| (*s).to_owned()));
    }

    pub fn new(args: &[&str]) -> Result<Node> {
        let ns = unique("ipqb-node");
        util::output(&mut util::cmd("ip", ["netns", "add", &ns]))?;
        let work = std::env::temp_dir().join(unique("ipq-bench"));
        let bpffs = Path::new("/sys/fs/bpf").join(unique("ipq-bench"));
        let node = Node {
            ns_path: Path::new("/run/netns").join(&ns),
            ns,
            work,
            bpffs,
            agent: None,
            agent_pid: 0,
            runs: 0,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
        };
        fs::create_dir(&node.work).with_context(|| format!("creating {}", node.work.display()))?;
        fs::create_dir(&node.bpffs)
            .with_context(|| format!("creating {} (is bpffs mounted?)", node.bpffs.display()))?;
        fs::write(
            node.work.join("agent.toml"),
            "# every key from the command line\n",
        )?;
        node.ip(&["link", "set", "lo", "up"])?;
        Ok(node)
    }

    pub fn socket(&self) -> PathBuf {
        self.work.join("ipq.sock")
    }

    pub fn ip(&self, args: &[&str]) -> Result<String> {
        util::output(util::cmd("ip", ["-n", &self.ns]).args(args))
    }

    /// Runs `ip -batch` with `lines` in the namespace.
    pub fn ip_batch(&self, lines: &str) -> Result<()> {
        let file = self.work.join("batch.ip");
        fs::write(&file, lines)?;
        util::output(util::cmd("ip", ["-n", &self.ns, "-batch"]).arg(&file))?;
        Ok(())
    }

    /// A command run inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let path = CString::new(self.ns_path.as_os_str().as_encoded_bytes()).expect("no NUL");
        let mut cmd = Command::new(program);
        // SAFETY: only async-signal-safe calls (open, setns, close) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let rc = libc::setns(fd, libc::CLONE_NEWNET);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if rc != 0 {
                    return Err(err);
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.ns_path, f)
    }

    /// Starts the release agent in PID and mount namespaces of its own (as the DaemonSet runs
    /// it) and waits until `/readyz` answers 200; the time that took.
    pub fn start_agent(&mut self) -> Result<Duration> {
        let binary = util::workspace_root().join("target/release/ipq-agent");
        self.runs += 1;
        let log = fs::File::create(self.work.join(format!("agent-{}.log", self.runs)))?;
        let host_proc = self.work.join("host-proc");
        let launcher = super::super::pod_ns::launcher(&host_proc)?;
        let mut cmd = self.command(&launcher[0]);
        cmd.args(&launcher[1..])
            .arg(&binary)
            .args(super::super::pod_ns::agent_args(&host_proc))
            .arg("--config")
            .arg(self.work.join("agent.toml"))
            .arg("--bpffs-dir")
            .arg(&self.bpffs)
            .arg("--state-dir")
            .arg(self.work.join("state"))
            .arg("--api-socket")
            .arg(self.socket())
            .args(["--metrics-addr", METRICS_ADDR])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        self.agent_pid = match super::super::pod_ns::agent_pid(&mut child) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.context(format!("starting {}", binary.display())));
            }
        };
        self.agent = Some(child);
        loop {
            if let Some(status) = self
                .agent
                .as_mut()
                .and_then(|c| c.try_wait().ok())
                .flatten()
            {
                self.agent = None;
                bail!(
                    "ipq-agent exited {status} before it was ready:\n{}",
                    self.log()
                );
            }
            if matches!(self.http_get("/readyz"), Ok((200, _))) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!("ipq-agent not ready in {READY_TIMEOUT:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log(&self) -> String {
        let log = self.work.join(format!("agent-{}.log", self.runs));
        let text = fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The agent's pid in the bench's PID namespace (for `/proc/<pid>`).
    pub fn agent_pid(&self) -> Result<i32> {
        self.agent.as_ref().context("no agent running")?;
        Ok(self.agent_pid as i32)
    }

    /// SIGTERM to the agent, and waits for its exit (`unshare` exits with it).
    pub fn stop_agent(&mut self) -> Result<()> {
        if let Some(mut child) = self.agent.take() {
            if child.try_wait()?.is_none() {
                // SAFETY: `unshare` still runs, so the agent it waits for does: the pid is
                // still the agent's.
                unsafe { libc::kill(self.agent_pid as i32, libc::SIGTERM) };
            }
            child.wait()?;
        }
        Ok(())
    }

    /// `GET path` on the metrics listener, from inside the namespace.
    pub fn http_get(&self, path: &str) -> Result<(u16, String)> {
        self.run(|| http_get_here(path))
    }

    /// The value of an unlabelled metric.
    pub fn metric(&self, name: &str) -> Result<f64> {
        let (_, body) = self.http_get("/metrics")?;
        metric_in(&body, name)
    }
}

/// `GET path` to the agent's metrics address, from the calling thread's namespace.
pub fn http_get_here(path: &str) -> Result<(u16, String)> {
    let addr: SocketAddr = METRICS_ADDR.parse()?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: ipq\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    parse(&answer)
}

pub fn metric_in(body: &str, name: &str) -> Result<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .with_context(|| format!("no metric {name}"))
}

fn parse(answer: &str) -> Result<(u16, String)> {
    let (head, body) = answer.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("bad status line")?;
    Ok((status, body.to_owned()))
}

/// One request over the API socket (`Connection: close`): status and body.
pub fn api(socket: &Path, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    // One write, as an HTTP client sends a request: `write!` on the unbuffered stream made a
    // write per piece of the format, each waking the agent's reader for a partial request.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: ipq\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    parse(&answer)
}

/// A second namespace (a pod) wired to the node by a veth, removed on drop.
pub struct Pod {
    pub ns: String,
    ns_path: PathBuf,
}

impl Pod {
    pub fn new() -> Result<Pod> {
        let ns = unique("ipqb-pod");
        util::output(&mut util::cmd("ip", ["netns", "add", &ns]))?;
        Ok(Pod {
            ns_path: Path::new("/run/netns").join(&ns),
            ns,
        })
    }

    /// Runs `f` on a thread inside the pod's namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.ns_path, f)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = util::output(&mut util::cmd("ip", ["netns", "del", &self.ns]));
    }
}

fn run_in<T: Send>(ns_path: &Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = fs::File::open(ns_path).expect("the namespace exists");
                // SAFETY: a valid namespace fd; only this thread changes namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = util::output(&mut util::cmd("ip", ["netns", "del", &self.ns]));
        // Pins first (files in bpffs are removed like any file), then the directory.
        let _ = fs::remove_dir_all(&self.bpffs);
        let _ = fs::remove_dir_all(&self.work);
    }
}
