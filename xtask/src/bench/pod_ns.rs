//! The bench's agents run as the DaemonSet runs them: in PID and mount namespaces of their own
//! (a pod without `hostPID`), started through `unshare`. Figures taken in the host's PID
//! namespace would miss what a pod's agent does differently (issue #36: its bpf() watcher took
//! its own calls for another process's there).

use std::{fs, process::Child, time::Duration};

use anyhow::{bail, Context as _, Result};

/// The command line put in front of the agent's: it becomes pid 1 of a new PID namespace
/// with a `/proc` of its own, in a copy of the mounts (the bench's bpffs dir among them), and
/// dies with `unshare` (`--kill-child`).
pub const LAUNCHER: [&str; 9] = [
    "unshare",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--propagation",
    "slave",
    "--mount-proc",
    "--",
];

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
