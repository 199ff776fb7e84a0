//! A private mount namespace for a runtime under test (podman, containerd): a process made by
//! `unshare -m` in a network namespace, with fresh tmpfs over `/run` and `/var/lib`, that sleeps
//! until killed (or its parent dies). Runtimes are started in it with `nsenter -t <pid> -m`, so
//! what they mount and write under those paths never reaches the machine.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Stdio},
};

use anyhow::{bail, Context as _};

use crate::{netns::NetNs, wait::die_with_parent};

/// The holder of a private mount namespace in `node`'s network namespace; `tag` names its
/// tmpfs mounts (`<tag>-run`, `<tag>-varlib`) for whoever reads `/proc/mounts`.
pub fn private_mount_namespace(node: &NetNs, tag: &str) -> anyhow::Result<Child> {
    let script = format!(
        "mount -t tmpfs -o mode=0755 {tag}-run /run \
         && mount -t tmpfs -o mode=0755 {tag}-varlib /var/lib \
         && echo ready && exec sleep 1000000"
    );
    let mut cmd = node.command("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().context("starting the mount namespace holder")?;
    let stdout = child
        .stdout
        .take()
        .context("the holder's stdout is piped")?;
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    if read.is_err() || line.trim() != "ready" {
        let _ = child.kill();
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        let _ = child.wait();
        bail!(
            "the private mount namespace ({tag}) could not be set up (unshare -m + tmpfs on /run \
             and /var/lib): {read:?} {line:?} {err}"
        );
    }
    Ok(child)
}
