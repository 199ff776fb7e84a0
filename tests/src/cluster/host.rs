//! The machine a cluster tier's node runs on, made of namespaces of the test's own.
//!
//! - a network namespace for the node (`ipq-kn-<pid>-<n>`): its loopback carries the control
//!   plane's ports, its `eth0` (a veth) leads to a peer namespace (`ipq-kp-<pid>-<n>`) that
//!   stands for the rest of the network and sees what the node's pods send;
//! - a mount namespace, held by a sleeping process, in which `/run`, `/var/log` (pods' logs)
//!   and `/opt` are fresh tmpfs, `/var/lib` is a directory of the work dir (on a disk: the
//!   kubelet's cAdvisor finds no device for a tmpfs and its eviction manager then never
//!   synchronises), `/etc` is an overlay (so `/etc/cni/net.d` is the node's own and the
//!   machine's stays untouched) and `/sys/fs/bpf` is a bpffs instance of its own: the DaemonSet's
//!   hostPaths (`/opt/cni/bin`, `/etc/cni/net.d`, `/var/lib/ipq`, `/run/ipq`, `/sys/fs/bpf`) are
//!   then used exactly as written, and land here, not on the machine;
//! - a cgroup (`ipq-kn-<pid>-<n>` in every hierarchy) that every process of the node is put in
//!   (`system/`) and that the kubelet uses as its cgroup root: killing what is in the tree
//!   ends everything the node started, shims and pods included.
//!
//! A node of a cluster of several ([`Host::create_on`]) has the same namespaces, but its `eth0`
//! leads to a port of a bridge (`br0`) in a segment namespace shared by every node
//! ([`Segment`]): the L2 the nodes are joined by, which also holds the peer (the witness).
//!
//! Dropping the host kills all of that and removes it; a run killed hard (no Drop) is swept by
//! the next one, by the pid in the names.

use std::{
    ffi::CString,
    fs, io,
    io::{BufRead as _, BufReader},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context as _};

use crate::{netns::NetNs, wait::die_with_parent};

/// The node's address on its uplink, the peer's, and the pods' range (a bridge on the node).
pub const NODE_IP: &str = "10.99.0.1";
pub const PEER_IP: &str = "10.99.0.2";
pub const POD_SUBNET: &str = "10.88.0.0/24";

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The namespaces, the cgroup and the work dir of one node.
pub struct Host {
    pub node: NetNs,
    /// Shared, so that a server in it (Prometheus) can outlive borrows of the cluster.
    pub peer: Arc<NetNs>,
    dir: PathBuf,
    holder: Option<Child>,
    /// `ipq-kn-<pid>-<n>`: the cgroup's name in every hierarchy.
    cgroup: String,
}

impl Host {
    /// Sweeps what dead runs left, then makes the namespaces, the cgroup and `dir`.
    pub fn create() -> anyhow::Result<Host> {
        crate::netns::require_root()?;
        sweep_dead_runs();
        let node = NetNs::new("kn")?;
        let peer = Arc::new(NetNs::new("kp")?);
        let host = Host::assemble(node, peer, |host| host.wire())?;
        Ok(host)
    }

    /// A node of a cluster of several: its `eth0` (`address`/24, default route via
    /// [`PEER_IP`]) is a port of the segment's bridge. Sweeping dead runs is the segment's.
    pub fn create_on(segment: &Segment, address: &str) -> anyhow::Result<Host> {
        let node = NetNs::new("kn")?;
        Host::assemble(node, Arc::clone(&segment.peer), |host| {
            segment.plug(&host.node, "eth0", address)?;
            host.node.ip(&["route", "add", "default", "via", PEER_IP])?;
            host.node.sysctl("net.ipv4.ip_forward", "1")
        })
    }

    fn assemble(
        node: NetNs,
        peer: Arc<NetNs>,
        wire: impl FnOnce(&Host) -> anyhow::Result<()>,
    ) -> anyhow::Result<Host> {
        let cgroup = node.name().to_owned();
        let dir = std::env::temp_dir().join(&cgroup);
        let mut host = Host {
            node,
            peer,
            dir,
            holder: None,
            cgroup,
        };
        fs::create_dir_all(&host.dir)
            .with_context(|| format!("creating {}", host.dir.display()))?;
        wire(&host)?;
        host.make_cgroup()?;
        host.holder = Some(host.mount_namespace()?);
        Ok(host)
    }

    /// The work dir: certificates, configs, logs, etcd's data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cgroup the kubelet uses as its root (`--cgroup-root`), as a cgroupfs path.
    pub fn kubelet_cgroup_root(&self) -> String {
        format!("/{}", self.cgroup)
    }

    fn wire(&self) -> anyhow::Result<()> {
        let (node, peer) = (&self.node, &self.peer);
        node.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            peer.name(),
        ])?;
        node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"])?;
        node.ip(&["link", "set", "eth0", "up"])?;
        node.ip(&["route", "add", "default", "via", PEER_IP])?;
        node.sysctl("net.ipv4.ip_forward", "1")?;
        peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "eth0"])?;
        peer.ip(&["link", "set", "eth0", "up"])?;
        peer.ip(&["route", "add", POD_SUBNET, "via", NODE_IP])?;
        Ok(())
    }

    /// `ipq-kn-<pid>-<n>` in every cgroup hierarchy, cpuset's filled from the root's (a v1
    /// cpuset cgroup admits no process until it has CPUs and memory nodes).
    fn make_cgroup(&self) -> anyhow::Result<()> {
        for hierarchy in hierarchies() {
            let dir = hierarchy.join(&self.cgroup).join("system");
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if fs::metadata(hierarchy.join("cpuset.cpus")).is_ok() {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = fs::read_to_string(hierarchy.join(file))?;
                    for level in [hierarchy.join(&self.cgroup), dir.clone()] {
                        fs::write(level.join(file), value.trim())
                            .with_context(|| format!("{}/{file}", level.display()))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The holder of the node's mount namespace, in the node's network namespace and cgroup.
    fn mount_namespace(&self) -> anyhow::Result<Child> {
        let upper = self.dir.join("etc-upper");
        let work = self.dir.join("etc-work");
        fs::create_dir_all(&upper)?;
        fs::create_dir_all(&work)?;
        let script = format!(
            "set -e
            mount -t tmpfs -o mode=0755 ipq-kn-run /run
            mkdir -p {varlib}
            mount --bind {varlib} /var/lib
            mount -t tmpfs -o mode=0755 ipq-kn-varlog /var/log
            mount -t tmpfs -o mode=0755 ipq-kn-opt /opt
            mount -t overlay ipq-kn-etc -o lowerdir=/etc,upperdir={upper},workdir={work} /etc
            rm -rf /etc/cni/net.d
            mkdir -p /etc/cni/net.d /opt/cni/bin /run/netns
            mount -t bpf ipq-kn-bpffs /sys/fs/bpf
            mount --make-rshared /
            echo ready
            exec sleep 1000000",
            upper = upper.display(),
            varlib = self.dir.join("var-lib").display(),
            work = work.display(),
        );
        let mut cmd = self.node.command("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.enter_cgroup(&mut cmd);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().context("starting the node's mount namespace")?;
        let stdout = child.stdout.take().context("piped")?;
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        if read.is_err() || line.trim() != "ready" {
            let _ = child.kill();
            let out = child.wait_with_output();
            bail!(
                "the node's mount namespace could not be set up: {read:?} {line:?} {:?}",
                out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            );
        }
        Ok(child)
    }

    /// A command run on the node: in its network and mount namespaces and its cgroup. Dies
    /// with the test process.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let holder = self
            .holder
            .as_ref()
            .expect("the holder runs once created")
            .id();
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(holder.to_string())
            .args(["-m", "-n", "--"])
            .arg(program);
        self.enter_cgroup(&mut cmd);
        die_with_parent(&mut cmd);
        cmd
    }

    /// Puts the child in the node's `system` cgroup before it runs, in every hierarchy.
    fn enter_cgroup(&self, cmd: &mut Command) {
        let procs: Vec<CString> = hierarchies()
            .into_iter()
            .map(|h| h.join(&self.cgroup).join("system/cgroup.procs"))
            .filter_map(|p| CString::new(p.into_os_string().into_encoded_bytes()).ok())
            .collect();
        // SAFETY: only open/write/close run between fork and exec, on paths made before.
        unsafe {
            cmd.pre_exec(move || {
                for path in &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
    }

    /// Runs `f` on a fresh thread of the test's process that entered the node's mount
    /// namespace (after leaving the process's shared filesystem context, which `setns` of a
    /// mount namespace needs): paths resolve as on the node, outside every pod, e.g. a pin
    /// under the node's `/sys/fs/bpf` opened by its plain path. Descriptors `f` opens work
    /// on any thread.
    pub fn run_in_mount_namespace<T: Send>(
        &self,
        f: impl FnOnce() -> T + Send,
    ) -> anyhow::Result<T> {
        let holder = self
            .holder
            .as_ref()
            .expect("the holder runs once created")
            .id();
        let ns = fs::File::open(format!("/proc/{holder}/ns/mnt"))
            .context("the node's mount namespace")?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: plain syscalls that change only this thread's filesystem
                    // context and mount namespace.
                    unsafe {
                        if libc::unshare(libc::CLONE_FS) != 0 {
                            bail!("unshare(CLONE_FS): {}", io::Error::last_os_error());
                        }
                        if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                            bail!(
                                "setns into the node's mount namespace: {}",
                                io::Error::last_os_error()
                            );
                        }
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// A file's content as the node sees it (its mount namespace).
    pub fn read(&self, path: &str) -> anyhow::Result<String> {
        crate::netns::output_of(self.command("cat").arg(path))
    }

    /// Whether a path exists on the node.
    pub fn exists(&self, path: &str) -> anyhow::Result<bool> {
        let status = self
            .command("test")
            .args(["-e", path])
            .status()
            .context("running test -e on the node")?;
        Ok(status.success())
    }

    /// Removes a file on the node.
    pub fn remove(&self, path: &str) -> anyhow::Result<()> {
        crate::netns::output_of(self.command("rm").arg(path)).map(|_| ())
    }

    /// The pids in the node's cgroup tree whose command line contains `needle`.
    pub fn pids_matching(&self, needle: &str) -> Vec<i32> {
        let mut pids = Vec::new();
        for hierarchy in hierarchies().into_iter().take(1) {
            collect_pids(&hierarchy.join(&self.cgroup), &mut pids);
        }
        pids.retain(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        });
        pids
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        kill_and_remove_cgroup(&self.cgroup);
        if let Some(mut holder) = self.holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
        // The network namespaces go with their own guards, after this.
    }
}

/// The L2 segment the nodes of a cluster of several are joined by: a namespace of the test's
/// own (`ipq-kp-<pid>-<n>`, the peer: it holds the witness and [`PEER_IP`], the nodes'
/// default gateway) with a bridge per segment; each node's uplink is a veth whose other end is
/// a port of that bridge.
pub struct Segment {
    pub peer: Arc<NetNs>,
    ports: std::sync::atomic::AtomicUsize,
}

impl Segment {
    /// Sweeps what dead runs left, then makes the peer namespace and its bridge `br0`
    /// ([`PEER_IP`]/24).
    pub fn create() -> anyhow::Result<Segment> {
        crate::netns::require_root()?;
        sweep_dead_runs();
        let segment = Segment {
            peer: Arc::new(NetNs::new("kp")?),
            ports: std::sync::atomic::AtomicUsize::new(0),
        };
        segment.add_bridge("br0", Some(&format!("{PEER_IP}/24")))?;
        Ok(segment)
    }

    /// A further bridge (a second L2 across the nodes), with the peer's `address` on it.
    pub fn add_bridge(&self, bridge: &str, address: Option<&str>) -> anyhow::Result<()> {
        let peer = &self.peer;
        peer.ip(&["link", "add", bridge, "type", "bridge"])?;
        // No STP delay, no multicast snooping: frames flow the moment a port is up.
        peer.ip(&[
            "link",
            "set",
            bridge,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        peer.ip(&[
            "link",
            "set",
            bridge,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        if let Some(address) = address {
            peer.ip(&["addr", "add", address, "dev", bridge])?;
        }
        peer.ip(&["link", "set", bridge, "up"])?;
        Ok(())
    }

    /// Plugs `node`'s interface `ifname` (`address`/24, up) into `br0`.
    pub fn plug(&self, node: &NetNs, ifname: &str, address: &str) -> anyhow::Result<()> {
        self.plug_into("br0", node, ifname, Some(address))
    }

    /// Plugs `node`'s interface `ifname` (with `address`/24 if given, up) into `bridge`.
    pub fn plug_into(
        &self,
        bridge: &str,
        node: &NetNs,
        ifname: &str,
        address: Option<&str>,
    ) -> anyhow::Result<()> {
        let n = self
            .ports
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = format!("port{n}");
        node.ip(&[
            "link",
            "add",
            ifname,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            self.peer.name(),
        ])?;
        if let Some(address) = address {
            node.ip(&["addr", "add", &format!("{address}/24"), "dev", ifname])?;
        }
        node.ip(&["link", "set", ifname, "up"])?;
        self.peer
            .ip(&["link", "set", &port, "master", bridge, "up"])?;
        Ok(())
    }
}

/// Every cgroup hierarchy: the v2 root, or each v1 controller's (and v1's unified) mount.
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.procs").exists() {
        return vec![root.to_owned()];
    }
    let mut dirs: Vec<PathBuf> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    // Symlinks (cpu,cpuacct -> cpu) would count a hierarchy twice.
    dirs.retain(|p| !fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()));
    dirs.sort();
    dirs
}

fn collect_pids(dir: &Path, pids: &mut Vec<i32>) {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), pids);
        }
    }
}

/// SIGKILLs every process in `name`'s tree (again, until none is left: a dying shim may still
/// fork), then removes the cgroups leaves first.
fn kill_and_remove_cgroup(name: &str) {
    for _ in 0..250 {
        let mut pids = Vec::new();
        for hierarchy in hierarchies() {
            collect_pids(&hierarchy.join(name), &mut pids);
        }
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for hierarchy in hierarchies() {
        remove_tree(&hierarchy.join(name));
    }
}

fn remove_tree(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    for _ in 0..100 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a run killed hard left behind: its processes and cgroups (by the cgroup's name), its
/// network namespaces and its work dir. Only names whose pid is gone: a concurrent run keeps
/// its own.
fn sweep_dead_runs() {
    // A cluster run's names: `ipq-kn-<pid>-<n>` (the node) and `ipq-kp-<pid>-<n>` (its peer).
    let names = |dir: &Path| -> Vec<String> {
        let mut names = crate::netns::names_of_dead_tests(dir);
        names.retain(|n| n.starts_with("ipq-kn-") || n.starts_with("ipq-kp-"));
        names
    };
    let mut cgroups: Vec<String> = hierarchies().iter().flat_map(|h| names(h)).collect();
    cgroups.sort();
    cgroups.dedup();
    for cgroup in cgroups {
        eprintln!("sweep: a dead cluster run's cgroup {cgroup}");
        kill_and_remove_cgroup(&cgroup);
    }
    for netns in names(Path::new("/run/netns")) {
        eprintln!("sweep: a dead cluster run's network namespace {netns}");
        let _ = Command::new("ip").args(["netns", "del", &netns]).status();
    }
    for dir in names(&std::env::temp_dir()) {
        let _ = fs::remove_dir_all(std::env::temp_dir().join(dir));
    }
}
