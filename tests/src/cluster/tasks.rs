//! A pod's containers as containerd runs them, for the scenarios whose premise is a container
//! that lives on out of the API's sight (a force-deleted pod): which of them have a running
//! task, and killing those as the node would at the end of their grace; and the pid of a
//! running container's process, for what only the node can see of it (`/proc/<pid>`).
//!
//! A container's record outlives its task (`ctr containers ls` still lists a container whose
//! process is gone), so "still runs" is read from `ctr tasks ls`, whose status is the shim's.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _};

use super::{host::Host, node::ctr};

/// The ids of `pod`'s containers (its sandbox left out) that have a task in state `RUNNING`.
pub fn running_containers(host: &Host, pod: &str) -> anyhow::Result<Vec<String>> {
    let filter = format!(
        "labels.\"io.kubernetes.pod.name\"=={pod},labels.\"io.cri-containerd.kind\"==container"
    );
    Ok(running_tasks(host, &filter)?
        .into_iter()
        .map(|task| task.id)
        .collect())
}

/// The pid, in the node's (and the test's) PID namespace, of the process of the one running
/// container named `container` of a pod in `namespace`.
pub fn running_pid(host: &Host, namespace: &str, container: &str) -> anyhow::Result<u32> {
    let filter = format!(
        "labels.\"io.kubernetes.pod.namespace\"=={namespace},\
         labels.\"io.kubernetes.container.name\"=={container}"
    );
    match running_tasks(host, &filter)?.as_slice() {
        [task] => Ok(task.pid),
        tasks => bail!(
            "{} running containers {namespace}/{container}: {tasks:?}",
            tasks.len()
        ),
    }
}

/// The running tasks of the containers `filter` selects (`ctr containers ls` syntax).
fn running_tasks(host: &Host, filter: &str) -> anyhow::Result<Vec<Task>> {
    let ids = ctr(host, &["containers", "ls", "-q", filter])?;
    let ids: Vec<&str> = ids.split_whitespace().collect();
    Ok(tasks(host)?
        .into_iter()
        .filter(|t| t.status == "RUNNING" && ids.contains(&t.id.as_str()))
        .collect())
}

/// Fails unless `pod` has a container whose task runs: the premise of a scenario about a
/// holder that outlives its Pod object. `when` says at which point, for the failure.
pub fn ensure_running(host: &Host, pod: &str, when: &str) -> anyhow::Result<Vec<String>> {
    let running = running_containers(host, pod)?;
    ensure!(
        !running.is_empty(),
        "{when}, pod {pod} has no running container on the node (ctr tasks ls: {:?}): the \
         scenario's premise, a holder that lives on, does not hold",
        tasks(host)?
    );
    Ok(running)
}

/// SIGKILLs every running task of `pod`'s containers, as its node would at the end of their
/// grace, and waits until none of them runs. Fails if none ran (the scenario would then test
/// something else) or one is still running after the wait.
pub fn kill_running(host: &Host, pod: &str) -> anyhow::Result<()> {
    let running = ensure_running(host, pod, "before the kill")?;
    for id in &running {
        ctr(host, &["tasks", "kill", "--signal", "SIGKILL", id])
            .with_context(|| format!("killing the task of {pod}'s container {id}"))?;
    }
    crate::wait::poll(
        &format!("{pod}'s killed containers to stop"),
        Duration::from_secs(30),
        || {
            let tasks = tasks(host)?;
            Ok((!tasks
                .iter()
                .any(|t| running.contains(&t.id) && t.status == "RUNNING"))
            .then_some(()))
        },
    )
}

/// One line of `ctr tasks ls`.
#[derive(Debug)]
struct Task {
    /// The container's id.
    id: String,
    pid: u32,
    status: String,
}

/// Every task on the node, as `ctr tasks ls` lists them.
fn tasks(host: &Host) -> anyhow::Result<Vec<Task>> {
    let out = ctr(host, &["tasks", "ls"])?;
    let mut lines = out.lines();
    match lines.next() {
        Some(header) if header.split_whitespace().eq(["TASK", "PID", "STATUS"]) => {}
        other => bail!("ctr tasks ls printed an unexpected header: {other:?}"),
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [id, pid, status] => Ok(Task {
                    id: id.to_owned(),
                    pid: pid
                        .parse()
                        .with_context(|| format!("the pid in ctr tasks ls's line {line:?}"))?,
                    status: status.to_owned(),
                }),
                _ => bail!("ctr tasks ls printed an unexpected line: {line:?}"),
            },
        )
        .collect()
}
