//! Network namespaces and bpffs directories owned by one test, removed when it ends (also when it
//! panics), plus the preconditions every privileged test checks first.
//!
//! Processes are put into a namespace with `setns` in `pre_exec`, never with `ip netns exec`:
//! that one remounts `/sys` for the new namespace, which hides `/sys/fs/bpf` and so the pins the
//! agent must see.

use std::{
    ffi::{CString, OsStr},
    fs, io,
    os::unix::{fs::PermissionsExt as _, io::AsRawFd as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicU32, Ordering},
        Once,
    },
};

use anyhow::{bail, Context as _};

/// One counter for every name this process makes: namespaces and bpffs dirs of tests running in
/// parallel (threads of one test binary) never collide, and the pid separates test binaries.
static NEXT: AtomicU32 = AtomicU32::new(0);

pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Where `ip netns` keeps its named namespaces, and the bpffs the tests make dirs in.
const NETNS_DIR: &str = "/run/netns";
const BPFFS: &str = "/sys/fs/bpf";

/// The pid in a name [`unique`] made (`<prefix>-<pid>-<n>`) whose prefix starts with `ipq-`.
fn owner_of(name: &str) -> Option<u32> {
    let mut parts = name.rsplitn(3, '-');
    let (n, pid, prefix) = (parts.next()?, parts.next()?, parts.next()?);
    n.parse::<u32>().ok()?;
    prefix
        .starts_with("ipq-")
        .then(|| pid.parse().ok())
        .flatten()
}

/// The entries of `dir` named by [`unique`] for a process no longer alive (a pid that lives,
/// this run's or reused since, keeps its names).
pub(crate) fn names_of_dead_tests(dir: &Path) -> Vec<String> {
    let alive = |pid: u32| Path::new("/proc").join(pid.to_string()).exists();
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| owner_of(name).is_some_and(|pid| !alive(pid)))
        .collect()
}

/// Removes the namespaces and bpffs dirs that test processes no longer alive left behind: a
/// test killed by a signal (a timeout's SIGKILL, a cancelled CI job) runs no `Drop`, and its
/// pins keep their maps and programs in the kernel. Once per test process, before its first
/// namespace or dir. A name whose pid lives (this run's other test binaries, or a pid reused
/// since) is left alone.
fn sweep_what_dead_tests_left() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        // A dead cluster run's processes live on in its namespaces once they are deleted:
        // its own sweep (`cluster::host`) stops them by their cgroups.
        for name in names_of_dead_tests(Path::new(NETNS_DIR)) {
            match output_of(Command::new("ip").args(["netns", "del", &name])) {
                Ok(_) => eprintln!("cleanup: deleted netns {name}, left by a test no longer alive"),
                Err(e) => eprintln!("cleanup: deleting netns {name}: {e:#}"),
            }
        }
        for name in names_of_dead_tests(Path::new(BPFFS)) {
            let path = Path::new(BPFFS).join(&name);
            match fs::remove_dir_all(&path) {
                Ok(()) => eprintln!(
                    "cleanup: removed {}, left by a test no longer alive",
                    path.display()
                ),
                Err(e) => eprintln!("cleanup: removing {}: {e}", path.display()),
            }
        }
    });
}

/// Fails unless the test runs as root: namespaces, veths and BPF all need it.
pub fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this test needs root (cargo xtask test runs as root)");
    }
    Ok(())
}

/// `target/<profile>/<name>`: one of the workspace's binaries (`ipq-agent`, `ipq`, `ipq-cni`),
/// next to the directory (`deps/`) a test binary runs from, or beside a binary of this crate
/// (the containerd demo) that runs from `target/<profile>` itself.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let dir = exe.parent().expect("a binary lives in a directory");
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("target/<profile>/deps has a parent")
    } else {
        dir
    };
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first: cargo build --bins (cargo xtask test does)",
        path.display()
    );
    path
}

/// The variable naming another `ipq-agent` for the labs to run: the cluster tier and the
/// publish bench run the release build their binaries are built in, not the dev one.
pub const AGENT_BINARY_ENV: &str = "IPQ_AGENT_BINARY";

/// `target/<profile>/ipq-agent`, or the one [`AGENT_BINARY_ENV`] names.
pub fn agent_binary() -> PathBuf {
    match std::env::var_os(AGENT_BINARY_ENV) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{AGENT_BINARY_ENV}={} is no file",
                path.display()
            );
            path
        }
        None => workspace_binary("ipq-agent"),
    }
}

/// Runs `cmd` and returns its stdout; the error names the command line and quotes stderr.
pub fn output_of(cmd: &mut Command) -> anyhow::Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {line}"))?;
    if !out.status.success() {
        bail!(
            "{line} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    /// `/run/netns/<name>`: what `setns` opens.
    path: PathBuf,
}

impl NetNs {
    /// Creates `ipq-<role>-<pid>-<n>` with `lo` up and duplicate address detection off, so
    /// addresses are usable at once and no DAD probe ever shows up in a packet count.
    pub fn new(role: &str) -> anyhow::Result<NetNs> {
        sweep_what_dead_tests_left();
        let name = unique(&format!("ipq-{role}"));
        output_of(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on the guard exists, so a failure below still deletes the namespace.
        let ns = NetNs {
            path: Path::new(NETNS_DIR).join(&name),
            name,
        };
        for scope in ["all", "default"] {
            ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")?;
        }
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> <args>`; returns stdout.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        output_of(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Writes `/proc/sys/<key with dots as slashes>` as seen from inside the namespace: net
    /// sysctls are resolved against the namespace of the thread that opens them.
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        self.run(|| fs::write(&path, value))
            .with_context(|| format!("sysctl {key}={value} in netns {}", self.name))
    }

    /// A command that runs inside this namespace (only the network namespace changes: the
    /// mount namespace, hence `/sys/fs/bpf`, stays the host's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let path = CString::new(self.path.as_os_str().as_encoded_bytes())
            .expect("netns paths have no NUL");
        let mut cmd = Command::new(program);
        // SAFETY: between fork and exec only async-signal-safe calls (open, setns, close) run,
        // and the path was allocated before the fork.
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

    /// Runs `f` on a fresh thread that entered this namespace (`setns` affects the calling
    /// thread only, so the caller's thread never changes namespace). Sockets keep the namespace
    /// they were created in, so `f` may return them for use anywhere.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                let file = fs::File::open(&self.path)
                    .unwrap_or_else(|e| panic!("opening {}: {e}", self.path.display()));
                // SAFETY: a valid namespace fd; only this thread changes namespace.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    panic!(
                        "setns into {}: {}",
                        self.path.display(),
                        io::Error::last_os_error()
                    );
                }
                f()
            });
            match thread.join() {
                Ok(value) => value,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace destroys its veths, and with them every link attached there.
        if let Err(e) = output_of(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("cleanup: {e:#}");
        }
    }
}

/// A directory of its own under `/sys/fs/bpf` for one agent's pins, removed (pins and all) on
/// drop.
#[derive(Debug)]
pub struct BpffsDir {
    path: PathBuf,
}

impl BpffsDir {
    pub fn new() -> anyhow::Result<BpffsDir> {
        const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
        let c_path = CString::new(BPFFS).expect("no NUL");
        // SAFETY: statfs is plain old data, filled in by the call.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and out-parameter.
        let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
        if rc != 0 || stat.f_type as i64 != BPF_FS_MAGIC {
            bail!(
                "{BPFFS} is not a bpf filesystem: run cargo xtask setup \
                 (or mount -t bpf bpf {BPFFS})"
            );
        }
        sweep_what_dead_tests_left();
        let path = Path::new(BPFFS).join(unique("ipq-test"));
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod {}", path.display()))?;
        Ok(BpffsDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpffsDir {
    fn drop(&mut self) {
        // Unlinking a link pin detaches its program unless a process still holds the link.
        if let Err(e) = fs::remove_dir_all(&self.path) {
            eprintln!("cleanup: removing {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::owner_of;

    #[test]
    fn a_name_made_by_unique_names_its_owner_and_nothing_else_does() {
        assert_eq!(owner_of("ipq-test-13253-19"), Some(13253));
        assert_eq!(owner_of("ipq-bench-node-77-0"), Some(77));
        assert_eq!(owner_of("ipq-kn-5-3"), Some(5));
        assert_eq!(owner_of("ipq"), None);
        assert_eq!(owner_of("ipq-test"), None);
        assert_eq!(owner_of("ipqprof"), None);
        assert_eq!(owner_of("cni-1234-5678"), None);
        assert_eq!(owner_of("ipq-demo-node"), None);
        assert_eq!(owner_of("ipq-x-12-y"), None);
    }
}
