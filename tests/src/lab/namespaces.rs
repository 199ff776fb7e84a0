//! The PID and mount namespaces a lab's agent runs in. By default its own, as the DaemonSet's
//! pod gives it (no `hostPID`): `unshare --pid --fork --mount --propagation slave` and a `/proc`
//! of the new namespace mounted over `/proc` (the node's bound aside first, as the DaemonSet
//! mounts it at `/host/proc`) start it as pid 1 of a new PID namespace, in a copy of the
//! test's mounts (the lab's bpffs dir among them), into which later mounts and unmounts of
//! the host's reach only from a mount the test made shared (as `mountPropagation:
//! HostToContainer` sees the host's). The test still signals the agent itself, by its pid in
//! the host's PID namespace: `unshare` forwards no signal, and as pid 1 of its namespace the
//! agent takes from outside only the signals it has a handler for, and SIGKILL and SIGSTOP.

use std::{
    fs,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::time::scaled;

/// Run by `sh` as pid 1 of the new PID namespace, in the new mount namespace: the node's
/// `/proc` bound at `$1`, a `/proc` of the new namespace over `/proc`, then the agent (the
/// rest of the arguments) in its place, so that it stays the launcher's one child.
pub const POD_PROC_SCRIPT: &str =
    r#"hp="$1"; shift; mount -o bind /proc "$hp" && mount -t proc proc /proc && exec "$@""#;

/// Where a lab's agent runs, besides the lab's node network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentNamespaces {
    /// Its own PID and mount namespaces, as in the DaemonSet's pod: every test unless it
    /// says why not.
    Pod,
    /// The test's own PID and mount namespaces. Only for a test whose agent must share
    /// mounts with the test both ways (an agent that mounts a bpffs itself, which the test
    /// then writes through): the DaemonSet's agent can mount nothing (no CAP_SYS_ADMIN).
    Host,
}

impl AgentNamespaces {
    /// The command line put in front of the agent's (and of a test's own wrapper, which must
    /// `exec` the agent: the agent is then the launcher's one child). In a pod's namespaces the
    /// node's `/proc` stays readable at `host_proc` (bound there before the pod's own `/proc`
    /// is mounted), as the DaemonSet mounts it at `/host/proc`: the agent reads its API peers'
    /// processes there (`api_peer_procfs`, which [`Self::agent_args`] sets).
    pub(super) fn launcher(self, host_proc: &std::path::Path) -> Vec<String> {
        match self {
            AgentNamespaces::Pod => [
                "unshare",
                "--pid",
                "--fork",
                // The agent dies with the launcher, as it dies with the test (die_with_parent).
                "--kill-child",
                "--mount",
                "--propagation",
                "slave",
                "--",
                "sh",
                "-c",
                POD_PROC_SCRIPT,
                "ipq-pod",
            ]
            .into_iter()
            .map(str::to_owned)
            .chain([host_proc.to_string_lossy().into_owned()])
            .collect(),
            AgentNamespaces::Host => Vec::new(),
        }
    }

    /// The agent's arguments these namespaces need.
    pub(super) fn agent_args(self, host_proc: &std::path::Path) -> Vec<String> {
        match self {
            AgentNamespaces::Pod => vec![
                "--api-peer-procfs".to_owned(),
                host_proc.to_string_lossy().into_owned(),
            ],
            AgentNamespaces::Host => Vec::new(),
        }
    }

    /// The agent's pid in the test's PID namespace, once `launcher` (spawned from
    /// [`launcher`](Self::launcher)) has started it: `launcher` itself in the host's
    /// namespaces; in a pod's, `unshare`'s one child, which is pid 1 of a PID namespace of its
    /// own (checked: `NSpid` in its status).
    pub(super) fn agent_pid(self, launcher: &mut Child) -> anyhow::Result<u32> {
        let wrapper = launcher.id();
        if self == AgentNamespaces::Host {
            return Ok(wrapper);
        }
        // Not `poll`: unshare's exit is an answer, not a reason to ask again.
        let timeout = scaled(Duration::from_secs(10));
        let deadline = Instant::now() + timeout;
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
                let nspid = nspid(pid)?;
                if nspid.len() < 2 || nspid.last().map(String::as_str) != Some("1") {
                    bail!(
                        "unshare's child {pid} is not pid 1 of a new PID namespace: NSpid \
                         {nspid:?}"
                    );
                }
                return Ok(pid);
            }
            if Instant::now() > deadline {
                bail!("unshare ({wrapper}) started no agent in {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// `NSpid` of `/proc/<pid>/status`: the process's pid in each PID namespace it is in, the
/// test's first.
fn nspid(pid: u32) -> anyhow::Result<Vec<String>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .context("NSpid in /proc/<pid>/status")?
        .split_whitespace()
        .map(str::to_owned)
        .collect())
}
