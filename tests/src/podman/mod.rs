//! A real container runtime, contained: podman (CNI network backend) + runc running busybox
//! containers from a local rootfs, inside a network namespace a test owns.
//!
//! Nothing of the machine's own is changed (podman only reads its packaged defaults, e.g. the
//! seccomp profile in `/usr/share/containers`):
//! - podman, conmon, runc and the CNI plugins run in the test's node namespace (the plugins'
//!   bridge and host-side veths are created there) and in a private mount namespace kept alive
//!   by a "holder" process, with fresh tmpfs over `/run` (runc state, container netns bind
//!   mounts) and `/var/lib` (libcni's result cache): nothing lands in the host's copies;
//! - storage (`--root`, `--runroot`, vfs), libpod's tmp dir, locks (file locks, not the shared
//!   `/dev/shm/libpod_lock`), the CNI config dir, the plugin dir (symlinks to
//!   `/usr/lib/cni/*` plus the test's own plugins) and host-local's `dataDir` are all in one
//!   temp dir, named through `CONTAINERS_CONF` / `CONTAINERS_STORAGE_CONF` /
//!   `CONTAINERS_REGISTRIES_CONF` and the global flags;
//! - containers get a cgroup parent of their own, `/ipq-podman-<pid>-<n>` in every hierarchy
//!   (conmon goes below it too), removed at the end.
//!
//! [`Podman`]'s drop force-removes every container (their CNI DEL runs), kills whatever is still
//! in its cgroups, ends the holder, removes the cgroups and the temp dir.

use std::{
    fs,
    io::Read as _,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _};

use crate::netns::{unique, NetNs};

mod cgroups;
mod config;

use cgroups::Cgroups;

/// How long one podman command may take before the test gives up on it.
const PODMAN_TIMEOUT: Duration = Duration::from_secs(30);

/// Busybox applets the containers' rootfs links (the scripts and probes use these).
const APPLETS: &[&str] = &["sh", "sleep", "cat", "echo", "ip", "true", "touch"];

/// Where Debian's `busybox-static` puts its statically linked binary: it runs in a rootfs that
/// has nothing else.
const BUSYBOX: &str = "/bin/busybox";

/// The reference CNI plugins (Debian `containernetworking-plugins`).
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// The bridge + host-local network the containers join; `chained` plugins follow `bridge` in
/// the conflist.
#[derive(Clone, Debug)]
pub struct BridgeNetwork {
    /// The CNI network name (`podman run --network <name>`).
    pub name: String,
    /// The Linux bridge the plugin creates in the node namespace.
    pub bridge: String,
    /// An IPv4 subnet, e.g. `10.99.0.0/24`; the gateway is on the bridge.
    pub subnet: String,
    pub gateway: IpAddr,
    /// Plugin objects (JSON text) after `bridge`, e.g. `{"type":"ipq-cni",...}`.
    pub chained: Vec<String>,
    /// ipq-ipam's section without its `delegate` (`{"type":"ipq-ipam","socket":...}`): when
    /// set, it wraps host-local as its delegate.
    pub ipam_wrapper: Option<serde_json::Value>,
}

/// Fails naming the Debian package when a tool the runtime needs is missing.
fn require_tools() -> anyhow::Result<()> {
    let programs = [
        ("podman", "podman"),
        ("conmon", "conmon (a dependency of podman)"),
        ("runc", "runc"),
        ("nsenter", "util-linux"),
        ("unshare", "util-linux"),
        ("ping", "iputils-ping"),
    ];
    for (name, package) in programs {
        if which_in_path(name).is_none() {
            bail!(
                "{name} is not in PATH: install the Debian package {package} (cargo xtask setup)"
            );
        }
    }
    for (path, package) in [
        (BUSYBOX, "busybox-static"),
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ] {
        if !Path::new(path).is_file() {
            bail!("{path} is missing: install the Debian package {package} (cargo xtask setup)");
        }
    }
    Ok(())
}

/// `name` found on `PATH`.
pub fn which_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` to completion, killing it after `timeout`; output captured either way.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Output> {
    let line = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {line}"))?;
    // Pipes are drained on their own threads so a chatty child never blocks on a full pipe.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    let Some(status) = crate::wait::exit_within(&mut child, timeout)? else {
        bail!("{line} did not finish in {timeout:?}");
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// As [`run_bounded`]; stdout on success, else an error quoting stderr.
pub fn output_bounded(cmd: &mut Command, timeout: Duration) -> anyhow::Result<String> {
    let line = format!("{cmd:?}");
    let out = run_bounded(cmd, timeout)?;
    if !out.status.success() {
        bail!(
            "{line} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One container as the host sees it.
#[derive(Clone, Debug)]
pub struct Container {
    pub name: String,
    pub id: String,
    /// Its init process, in the host's pid namespace.
    pub pid: u32,
}

impl Container {
    /// A host program run inside this container's network namespace only (`nsenter -n`):
    /// host tools (ping, ip) see the container's interfaces.
    pub fn net_command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.pid.to_string())
            .arg("-n")
            .arg("--")
            .arg(program);
        cmd
    }

    /// The container's `eth0`: the ifindex of its veth peer in the node, and its MAC.
    pub fn eth0(&self) -> anyhow::Result<(u32, String)> {
        let out = output_bounded(
            self.net_command("ip").args(["-o", "link", "show", "eth0"]),
            PODMAN_TIMEOUT,
        )?;
        // "2: eth0@if5: <...> ... link/ether 52:...:9a brd ff:..."
        let peer = out
            .split_whitespace()
            .nth(1)
            .and_then(|name| name.split_once("@if"))
            .and_then(|(_, index)| index.trim_end_matches(':').parse().ok())
            .with_context(|| format!("no veth peer index in {out:?}"))?;
        let mac = out
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .with_context(|| format!("no MAC in {out:?}"))?;
        Ok((peer, mac.to_owned()))
    }

    /// `ping -c n` from inside the container (the host's ping, the container's network);
    /// returns how many replies came back.
    pub fn ping(&self, dst: IpAddr, n: u32) -> anyhow::Result<u32> {
        let out = run_bounded(
            self.net_command("ping")
                .args(["-n", "-q", "-c", &n.to_string(), "-i", "0.05", "-W", "1"])
                .arg(dst.to_string()),
            PODMAN_TIMEOUT,
        )?;
        parse_ping(&out, dst)
    }
}

/// The received count of ping's summary line; an error if there is none or the request count
/// is not what was asked.
pub fn parse_ping(out: &Output, dst: IpAddr) -> anyhow::Result<u32> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "5 packets transmitted, 5 received, 0% packet loss, time 81ms"
    let summary = stdout
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .with_context(|| {
            format!(
                "no summary from ping {dst}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    summary
        .split(',')
        .find(|part| part.contains("received"))
        .and_then(|part| part.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no received count in {summary:?}"))
}

/// podman + runc + CNI in a test's node namespace; everything removed on drop.
pub struct Podman<'n> {
    node: &'n NetNs,
    dir: PathBuf,
    network: BridgeNetwork,
    /// The process keeping the private mount namespace alive; podman is run through
    /// `nsenter -t <holder> -m` (its network namespace comes from `node`).
    holder: Option<Child>,
    cgroups: Cgroups,
    /// Commands left running (e.g. a `podman stop` waiting for a slow container).
    background: Vec<Child>,
}

impl<'n> Podman<'n> {
    /// Sets up the private directories and config, links `/usr/lib/cni/*` and `extra_plugins`
    /// (type name → binary) into the plugin dir, writes `network`'s conflist, and starts the
    /// mount namespace holder in `node`.
    pub fn new(
        node: &'n NetNs,
        network: BridgeNetwork,
        extra_plugins: &[(&str, &Path)],
    ) -> anyhow::Result<Podman<'n>> {
        crate::netns::require_root()?;
        require_tools()?;
        let dir = std::env::temp_dir().join(unique("ipq-podman"));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut podman = Podman {
            node,
            cgroups: Cgroups::new(),
            dir,
            network,
            holder: None,
            background: Vec::new(),
        };
        config::write(&podman.dir, &podman.network, extra_plugins)?;
        // The private mount namespace podman runs in (see [`crate::mountns`]).
        podman.holder = Some(crate::mountns::private_mount_namespace(node, "ipq-podman")?);
        Ok(podman)
    }

    /// The temp dir holding storage, config, plugins, IPAM data and rootfs dirs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn network(&self) -> &BridgeNetwork {
        &self.network
    }

    /// host-local's reservation file for `addr`: deleting it frees the address in the IPAM.
    pub fn ipam_reservation(&self, addr: IpAddr) -> PathBuf {
        // host-local's `dataDir`, then one directory per network.
        self.dir
            .join("ipam")
            .join(&self.network.name)
            .join(addr.to_string())
    }

    /// `podman <global flags> <args>` in the node's network namespace and the private mount
    /// namespace, with the private config.
    pub fn command(&self, args: &[&str]) -> Command {
        let d = &self.dir;
        let mut cmd = self.node.command("nsenter");
        cmd.arg("-t")
            .arg(
                self.holder
                    .as_ref()
                    .expect("the holder runs")
                    .id()
                    .to_string(),
            )
            .args(["-m", "--", "podman"])
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .args(["--storage-driver", "vfs"])
            .args(["--cgroup-manager=cgroupfs", "--runtime", "runc"])
            .args(["--network-backend", "cni", "--events-backend", "none"])
            .arg("--network-config-dir")
            .arg(d.join("net.d"))
            .args(args)
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            .env_remove("CONTAINERS_POLICY")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_RUNTIME_DIR");
        cmd
    }

    /// Runs podman to completion; stdout, or an error quoting stderr.
    pub fn podman(&self, args: &[&str]) -> anyhow::Result<String> {
        output_bounded(&mut self.command(args), PODMAN_TIMEOUT)
    }

    /// Runs podman to completion and returns its whole output, success or not.
    pub fn podman_output(&self, args: &[&str]) -> anyhow::Result<Output> {
        run_bounded(&mut self.command(args), PODMAN_TIMEOUT)
    }

    /// Starts podman and leaves it running (e.g. `stop -t 60` of a container that takes its
    /// time); it is killed, if still running, on drop.
    pub fn spawn(&mut self, args: &[&str]) -> anyhow::Result<()> {
        let child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting podman {args:?}"))?;
        self.background.push(child);
        Ok(())
    }

    /// The `podman run -d` arguments of a busybox container `name` running `script` under
    /// `sh -c`, on the network, with `ip` if given.
    fn run_args(
        &self,
        name: &str,
        ip: Option<IpAddr>,
        script: &str,
    ) -> anyhow::Result<Vec<String>> {
        let rootfs = config::rootfs(&self.dir, name)?;
        let mut args: Vec<String> = ["run", "-d", "--name", name, "--network"]
            .map(String::from)
            .into();
        args.push(self.network.name.clone());
        if let Some(ip) = ip {
            args.extend(["--ip".to_owned(), ip.to_string()]);
        }
        args.extend(
            [
                "--cgroup-parent",
                self.cgroups.parent(),
                // runc cannot raise these limits over the machine's hard limits, which are
                // lower than podman's defaults here (DESIGN §8).
                "--ulimit",
                "nofile=20000:20000",
                "--ulimit",
                "nproc=4096:4096",
                "--rootfs",
            ]
            .map(String::from),
        );
        args.push(rootfs.display().to_string());
        args.extend(["/bin/sh", "-c", script].map(String::from));
        Ok(args)
    }

    /// Starts a busybox container; fails quoting podman's error.
    pub fn run(&self, name: &str, ip: Option<IpAddr>, script: &str) -> anyhow::Result<Container> {
        let args = self.run_args(name, ip, script)?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.podman(&args)?;
        self.container(name)
    }

    /// Tries to start a busybox container and returns podman's output whatever happened.
    pub fn try_run(&self, name: &str, ip: Option<IpAddr>, script: &str) -> anyhow::Result<Output> {
        let args = self.run_args(name, ip, script)?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.podman_output(&args)
    }

    /// `podman inspect`: the container's id and init pid.
    pub fn container(&self, name: &str) -> anyhow::Result<Container> {
        let out = self.podman(&["inspect", "-f", "{{.Id}} {{.State.Pid}}", name])?;
        let mut fields = out.split_whitespace();
        let (Some(id), Some(pid)) = (fields.next(), fields.next()) else {
            bail!("podman inspect {name} printed {out:?}");
        };
        let pid: u32 = pid.parse().with_context(|| format!("pid in {out:?}"))?;
        if pid == 0 {
            bail!("container {name} is not running (podman inspect: {out:?})");
        }
        Ok(Container {
            name: name.to_owned(),
            id: id.to_owned(),
            pid,
        })
    }

    /// The container's state as podman reports it (`running`, `stopping`, `exited`...).
    pub fn status(&self, name: &str) -> anyhow::Result<String> {
        Ok(self
            .podman(&["inspect", "-f", "{{.State.Status}}", name])?
            .trim()
            .to_owned())
    }

    /// The name, in the node, of the host-side veth of `container`'s `eth0`.
    pub fn host_veth(&self, container: &Container) -> anyhow::Result<String> {
        let (peer, _) = container.eth0()?;
        let links = self.node.ip(&["-o", "link", "show"])?;
        // "5: veth1a2b3c4d@if2: <...>"
        links
            .lines()
            .find_map(|l| {
                let (index, rest) = l.split_once(": ")?;
                (index.trim().parse::<u32>().ok()? == peer)
                    .then(|| rest.split(['@', ':']).next().map(str::to_owned))?
            })
            .with_context(|| format!("no link {peer} in {}:\n{links}", self.node.name()))
    }

    fn cleanup(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.holder.is_some() {
            // Every container, running or not: their CNI DEL runs here.
            let out = self.podman_output(&["rm", "--force", "--all", "--time", "0"]);
            match out {
                Ok(out) if out.status.success() => {}
                Ok(out) => problems.push(format!(
                    "podman rm --force --all: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => problems.push(format!("podman rm --force --all: {e:#}")),
            }
        }
        for mut child in self.background.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Whatever survived (a container podman could not remove, a conmon) dies with its
        // cgroup.
        problems.extend(self.cgroups.kill_and_remove());
        if let Some(mut holder) = self.holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            problems.push(format!("removing {}: {e}", self.dir.display()));
        }
        problems
    }
}

impl Drop for Podman<'_> {
    fn drop(&mut self) {
        for problem in self.cleanup() {
            eprintln!("cleanup: {problem}");
        }
    }
}
