//! kubectl against the cluster, run on the node as the test's admin: what an operator types.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::{daemon::component, host::Host};

/// Runs kubectl on a host with the admin's kubeconfig.
pub struct Kubectl<'h> {
    host: &'h Host,
    binary: PathBuf,
    kubeconfig: PathBuf,
}

impl<'h> Kubectl<'h> {
    pub fn new(host: &'h Host, kubeconfig: PathBuf) -> anyhow::Result<Kubectl<'h>> {
        Ok(Kubectl {
            host,
            binary: component("kubectl")?,
            kubeconfig,
        })
    }

    /// `kubectl <args>` as a command, for one that runs beside the test (a `--follow`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.host.command(&self.binary);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args);
        cmd
    }

    /// `kubectl <args>`: stdout, or an error quoting stderr.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command(args);
        let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(120))?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl <args> -o json`, parsed.
    pub fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.run(&all)?;
        serde_json::from_str(&text).with_context(|| format!("kubectl {args:?} printed {text}"))
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON).
    pub fn apply(&self, manifest: &str) -> anyhow::Result<String> {
        let file = self
            .host
            .dir()
            .join(format!("apply-{}.yaml", crate::netns::unique("m")));
        std::fs::write(&file, manifest)?;
        self.run(&["apply", "-f", &file.to_string_lossy()])
    }
}

/// Whether a pod's `Ready` condition is true.
pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}
