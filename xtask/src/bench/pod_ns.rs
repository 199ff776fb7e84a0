//! The bench's agents run as the DaemonSet runs them: in PID and mount namespaces of their own
//! (a pod without `hostPID`), started through `unshare`. Figures taken in the host's PID
//! namespace would miss what a pod's agent does differently (issue #36: its bpf() watcher took
//! its own calls for another process's there).

use std::{fs, path::Path, process::Child, time::Duration};

use anyhow::{bail, Context as _, Result};

/// The command line put in front of the agent's, with `host_proc` the directory where the
/// node's `/proc` stays readable: it becomes pid 1 of a new PID namespace with a `/proc` of its
/// own, in a copy of the mounts (the bench's bpffs dir among them), and dies with `unshare`
/// (`--kill-child`). The node's `/proc` is bound at `host_proc` first, as the DaemonSet mounts
/// it at `/host/proc`; [`agent_args`] points the agent's API at it (its peers' processes).
pub fn launcher(host_proc: &Path) -> Result<Vec<String>> {
    fs::create_dir_all(host_proc).with_context(|| format!("creating {}", host_proc.display()))?;
    Ok([
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "slave",
        "--",
        "sh",
        "-c",
        r#"hp="$1"; shift; mount -o bind /proc "$hp" && mount -t proc proc /proc && exec "$@""#,
        "ipq-pod",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([host_proc.to_string_lossy().into_owned()])
    .collect())
}

/// The agent's arguments for [`launcher`]'s namespaces.
pub fn agent_args(host_proc: &Path) -> [String; 2] {
    [
        "--api-peer-procfs".to_owned(),
        host_proc.to_string_lossy().into_owned(),
    ]
}

/// The agent's pid in the bench's PID namespace: `unshare`'s one child, which is pid 1 of a
/// namespace of its own (`NSpid`). Signals go to it: `unshare` forwards none.
pub fn agent_pid(launcher: &mut Child) -> Result<u32> {
    let wrapper = launcher.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = launcher.try_wait()? {
            bail!("unshare exited ({status}) before the agent ran");
        }
        let children = fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .with_context(|| format!("the children of unshare ({wrapper})"))?;
        if let Some(child) = children.split_whitespace().next() {
            let pid: u32 = child
                .parse()
                .context("a pid in /proc/<pid>/task/*/children")?;
            let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
            let nspid = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .context("NSpid in /proc/<pid>/status")?;
            if nspid.split_whitespace().last() != Some("1") {
                bail!("unshare's child {pid} is not pid 1 of a new PID namespace: {nspid}");
            }
            return Ok(pid);
        }
        if std::time::Instant::now() > deadline {
            bail!("unshare ({wrapper}) started no agent in 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
