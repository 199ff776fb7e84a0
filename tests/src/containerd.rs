//! containerd of the test's own, driven through its CRI as the kubelet drives it.
//!
//! Everything is the test's: containerd's root, state, sockets, config, CNI conf and bin
//! directories live in the lab's work dir; it runs in the lab's node network namespace and in a
//! private mount namespace with fresh tmpfs on `/run` (its shims' sockets, the pods' netns
//! files) and `/var/lib`, so nothing of the machine changes; pods' cgroups go under a cgroupfs
//! parent of the test's own, removed afterwards. Images come from no registry: a pause image
//! and a busybox image are built here as OCI archives from Debian's static busybox and imported
//! with `ctr images import`; the CRI's sandbox image is the local pause.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _};

use crate::{
    mountns::private_mount_namespace,
    netns::NetNs,
    podman::{run_bounded, which_in_path},
    wait::{die_with_parent, unix_socket_accepts},
};

/// The images the CRI tier runs.
pub const PAUSE_IMAGE: &str = "docker.io/ipq/pause:test";
pub const BUSYBOX_IMAGE: &str = "docker.io/ipq/busybox:test";

const BUSYBOX: &str = "/bin/busybox";
const APPLETS: [&str; 12] = [
    "sh", "sleep", "ping", "ip", "cat", "echo", "true", "trap", "nc", "ls", "kill", "wget",
];
const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/cni";

/// A running containerd.
pub struct Containerd {
    dir: PathBuf,
    holder: Child,
    daemon: Option<Child>,
    cgroup: PathBuf,
}

impl Containerd {
    /// Starts containerd in `node`'s network namespace with everything under `dir`; its CNI
    /// binaries are Debian's plugins and the workspace's `ipq-cni`/`ipq-ipam` (linked into its
    /// own bin dir), and its conf dir starts empty.
    pub fn start(node: &NetNs, dir: &Path) -> anyhow::Result<Containerd> {
        for (tool, package) in [
            ("containerd", "containerd"),
            ("ctr", "containerd"),
            ("runc", "runc"),
            ("unshare", "util-linux"),
            ("tar", "tar"),
        ] {
            if which_in_path(tool).is_none() {
                bail!("{tool} is missing: install {package} (cargo xtask setup does)");
            }
        }
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(sweep_leftovers);
        fs::create_dir_all(dir)?;
        // Unique per test: the lab's work dir is.
        let unique = dir
            .parent()
            .and_then(Path::file_name)
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let cgroup = PathBuf::from("/sys/fs/cgroup").join(format!("ipq-cri-{unique}"));
        let holder = private_mount_namespace(node, "ipq-cri")?;
        let mut containerd = Containerd {
            dir: dir.to_owned(),
            holder,
            daemon: None,
            cgroup,
        };
        link_plugins(&containerd.bin_dir())?;
        fs::create_dir_all(containerd.conf_dir())?;
        fs::write(dir.join("config.toml"), config_toml(dir))?;
        containerd.spawn_daemon()?;
        for (image, entrypoint) in [
            (PAUSE_IMAGE, vec!["/bin/sleep", "2147483647"]),
            (BUSYBOX_IMAGE, vec!["/bin/sh"]),
        ] {
            containerd.import(image, &entrypoint)?;
        }
        Ok(containerd)
    }

    /// The CRI (and containerd API) socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// Where containerd's CRI reads CNI configs.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }

    /// The CNI bin dir: Debian's plugins and the workspace's ipq-cni and ipq-ipam.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("cni-bin")
    }

    /// Where pods' logs go (the kubelet's `log_directory`).
    pub fn log_dir(&self, pod: &str) -> PathBuf {
        self.dir.join("pods").join(pod)
    }

    /// The cgroupfs parent of the test's pods.
    pub fn cgroup_parent(&self) -> String {
        format!(
            "/{}",
            self.cgroup
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
        )
    }

    /// SIGKILLs the shim of sandbox `sandbox_id` (its pods' processes are left behind, as
    /// when a shim crashes); whether one was found.
    pub fn kill_shim_of(&self, sandbox_id: &str) -> bool {
        let needle = format!("-id {sandbox_id}");
        let mut found = false;
        for (pid, cmdline) in processes() {
            if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                found = true;
            }
        }
        found
    }

    /// The live processes of container (or sandbox) `id`: those whose cgroup is the
    /// container's (cgroupfs names it by its id under the test's parent), zombies left out.
    pub fn pids_of(&self, id: &str) -> Vec<i32> {
        let needle = format!("/{id}");
        let parent = self.cgroup_parent();
        processes()
            .into_iter()
            .filter_map(|(pid, _)| {
                let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // "pid (comm) S ...": the state follows the last ')'.
                let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
                if state == "Z" || state == "X" {
                    return None;
                }
                let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                cgroups
                    .lines()
                    .any(|l| l.contains(&parent) && l.ends_with(&needle))
                    .then_some(pid)
            })
            .collect()
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// `nsenter` into the private mount namespace, in the node's network namespace.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.holder.id().to_string())
            .args(["-m", "-n", "--", program]);
        cmd
    }

    fn spawn_daemon(&mut self) -> anyhow::Result<()> {
        let log = fs::File::create(self.dir.join("containerd.log"))?;
        let mut cmd = self.command("containerd");
        cmd.arg("--config")
            .arg(self.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut cmd);
        let mut daemon = cmd.spawn().context("starting containerd")?;
        let socket = self.socket();
        let up = crate::lab::poll(
            "containerd accepting on its socket",
            Duration::from_secs(30),
            || {
                if let Some(status) = daemon.try_wait()? {
                    bail!("containerd exited ({status})");
                }
                Ok(unix_socket_accepts(&socket).then_some(()))
            },
        );
        self.daemon = Some(daemon);
        up.with_context(|| format!("containerd log:\n{}", self.log()))?;
        Ok(())
    }

    /// Kills containerd with SIGKILL (its shims and pods keep running) and starts it again.
    pub fn kill9_and_restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.kill()?;
            daemon.wait()?;
        }
        let _ = fs::remove_file(self.socket());
        self.spawn_daemon()
    }

    fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command("ctr");
        cmd.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"])
            .args(args);
        let out = run_bounded(&mut cmd, Duration::from_secs(120))?;
        if !out.status.success() {
            bail!(
                "ctr {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Builds `image` (busybox, running `entrypoint`) as an OCI archive and imports it.
    fn import(&self, image: &str, entrypoint: &[&str]) -> anyhow::Result<()> {
        let tag = image.rsplit('/').next().unwrap_or(image).replace(':', "-");
        let work = self.dir.join("images").join(&tag);
        let archive = build_oci_archive(&work, image, entrypoint)?;
        self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "native",
            &archive.to_string_lossy(),
        ])?;
        Ok(())
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        // Shims outlive containerd by design, and pods outlive their shims' parent: kill the
        // shims of this containerd and every process in the test's cgroups.
        kill_shims_of(&self.socket());
        let trees = cgroup_trees(&self.cgroup);
        for tree in &trees {
            kill_cgroup_tree(tree);
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        for tree in &trees {
            remove_cgroup_tree(tree);
        }
    }
}

/// The test process (pid) that made a lab named `ipq-lab-<pid>-<n>` (the name `netns::unique`
/// gives a lab's work dir, which names its containerd's cgroup and socket).
fn lab_owner(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("ipq-lab-")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Whether `pid` still runs (a reused pid counts as running: its lab is then left alone).
fn running(pid: i32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Once per test process, before its first containerd: what a hard-killed earlier run left
/// behind, which no Drop removed: the shims of its containerds and the pods in its cgroups.
/// Only what ipq's tests name (`ipq-cri-ipq-lab-<pid>-<n>` cgroups, shims whose address is an
/// `ipq-lab-<pid>-<n>/containerd` socket) and only when that pid is gone: concurrent runs of
/// the tier (other worktrees, other test binaries) keep theirs.
fn sweep_leftovers() {
    let dead_lab = |name: &str| lab_owner(name).is_some_and(|pid| !running(pid));
    for (pid, cmdline) in processes() {
        if !cmdline.contains("containerd-shim") {
            continue;
        }
        let mut args = cmdline.split(' ');
        let address = args.find(|a| *a == "-address").and_then(|_| args.next());
        let lab = address.and_then(|a| {
            let socket = Path::new(a);
            (socket.file_name()? == "containerd.sock"
                && socket.parent()?.file_name()? == "containerd")
                .then(|| socket.parent()?.parent()?.file_name())
                .flatten()
        });
        if lab.is_some_and(|l| dead_lab(&l.to_string_lossy())) {
            eprintln!("sweep: killing the shim {pid} of a dead lab: {cmdline}");
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    // cgroup v2 has them right under the root; v1 under each controller's hierarchy.
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.to_owned()];
    if let Ok(entries) = fs::read_dir(root) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut trees = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.strip_prefix("ipq-cri-").is_some_and(&dead_lab) && entry.path().is_dir() {
                trees.push(entry.path());
            }
        }
    }
    for tree in &trees {
        eprintln!(
            "sweep: killing the pods of a dead lab's cgroup {}",
            tree.display()
        );
        kill_cgroup_tree(tree);
    }
    for tree in &trees {
        remove_cgroup_tree(tree);
    }
}

/// The test's cgroup parent in every hierarchy: one per controller on cgroup v1, one on v2.
fn cgroup_trees(v2_path: &Path) -> Vec<PathBuf> {
    let name = v2_path.file_name().unwrap_or_default();
    let root = Path::new("/sys/fs/cgroup");
    let mut trees = vec![v2_path.to_owned()];
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            let candidate = entry.path().join(name);
            if candidate.is_dir() {
                trees.push(candidate);
            }
        }
    }
    trees.retain(|t| t.is_dir());
    trees
}

/// Every process's pid and command line (arguments joined by spaces).
fn processes() -> Vec<(i32, String)> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            Some((pid, text))
        })
        .collect()
}

fn kill_shims_of(socket: &Path) {
    let needle = socket.to_string_lossy().into_owned();
    for (pid, cmdline) in processes() {
        if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn kill_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                kill_cgroup_tree(&entry.path());
            }
        }
    }
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// cgroup directories are removed leaves first (rmdir only), once their processes are gone.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    for _ in 0..100 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An OCI image archive of Debian's static busybox named `image`, running `entrypoint`.
pub fn build_oci_archive(work: &Path, image: &str, entrypoint: &[&str]) -> anyhow::Result<PathBuf> {
    let rootfs = work.join("rootfs");
    let bin = rootfs.join("bin");
    fs::create_dir_all(&bin)?;
    fs::copy(BUSYBOX, bin.join("busybox"))
        .with_context(|| format!("copying {BUSYBOX} (install busybox-static)"))?;
    for applet in APPLETS {
        symlink("busybox", bin.join(applet))?;
    }
    for dir in ["proc", "sys", "dev", "etc", "tmp"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    crate::oci::archive(&rootfs, work, image, entrypoint, &["PATH=/bin"])
}

/// Links the Debian CNI plugins into `bin`, the runtime's own plugin dir.
fn link_plugins(bin: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(bin)?;
    for entry in fs::read_dir(DEBIAN_PLUGIN_DIR)
        .with_context(|| format!("{DEBIAN_PLUGIN_DIR}: install containernetworking-plugins"))?
    {
        let entry = entry?;
        symlink(entry.path(), bin.join(entry.file_name()))?;
    }
    Ok(())
}

/// containerd's `config.toml` for a runtime whose every directory is under `dir`.
fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which a CI sandbox may not grant.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
snapshotter = "native"
default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
bin_dir = "{d}/cni-bin"
conf_dir = "{d}/net.d"
max_conf_num = 1
"#
    )
}
