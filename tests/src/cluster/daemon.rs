//! A long-running process of the node (etcd, the API server, containerd, the kubelet...), its
//! output in a log file of the work dir, killed when dropped.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::Context as _;

/// The directory of the Go components (`cargo xtask setup --for cluster` builds them there).
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cluster/bin")
}

/// `target/cluster/bin/<name>`, or why not.
pub fn component(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.is_file() {
        anyhow::bail!(
            "{} is missing: the cluster tier's Kubernetes components are built from Go modules \
             by `cargo xtask setup --for cluster` (cargo xtask test-cluster runs it)",
            path.display()
        );
    }
    Ok(path)
}

/// A running component.
pub struct Daemon {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` (already set up to run on the node) with its output in `<dir>/<name>.log`.
    pub fn spawn(name: &str, mut cmd: Command, dir: &Path) -> anyhow::Result<Daemon> {
        let log = dir.join(format!("{name}.log"));
        let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Daemon {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// Kills it and waits for it (an outage of the component); [`Daemon::restart`] brings it
    /// back.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts `cmd` in its place (it should be stopped), its output appended to the same log.
    pub fn restart(&mut self, mut cmd: Command) -> anyhow::Result<()> {
        self.stop();
        let file = fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        self.child = cmd
            .spawn()
            .with_context(|| format!("starting {} again", self.name))?;
        Ok(())
    }

    /// The last `lines` lines of its log, for an error message; the kubelet's periodic
    /// complaints about filesystem stats of the node's tmpfs mounts left out.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("cannot find filesystem info for device"))
            .collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Fails when the process has exited, quoting its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); its log ends:\n{}",
                self.name,
                self.log_tail(40)
            );
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
