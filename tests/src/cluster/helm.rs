//! helm against the cluster, run on the node as the test's admin, as an operator installs,
//! upgrades and rolls back ipq: the chart of `deploy/helm/ipq/`, helm built from
//! `xtask/cluster/helm/` (`cargo xtask setup --for cluster`), with Helm's cache, config and data
//! dirs in the cluster's work dir (nothing read from or written to the machine's ~/.config).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::{daemon::component, deploy::NAMESPACE, host::Host};

/// The release's name, as docs/kubernetes.md installs it.
pub const RELEASE: &str = "ipq";

/// The repository's chart.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/ipq")
}

/// Runs helm on a host with the admin's kubeconfig.
pub struct Helm<'h> {
    host: &'h Host,
    binary: PathBuf,
    kubeconfig: PathBuf,
}

impl<'h> Helm<'h> {
    pub fn new(host: &'h Host, kubeconfig: PathBuf) -> anyhow::Result<Helm<'h>> {
        Ok(Helm {
            host,
            binary: component("helm")?,
            kubeconfig,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let home = self.host.dir().join("helm");
        let mut cmd = self.host.command(&self.binary);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["--namespace", NAMESPACE])
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        cmd
    }

    /// `helm --namespace ipq-system <args>`: stdout, or an error quoting its output.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command(args);
        let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(180))?;
        if !out.status.success() {
            bail!(
                "helm {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm install ipq deploy/helm/ipq --namespace ipq-system --create-namespace --values
    /// <values>`, as docs/kubernetes.md has users install it.
    pub fn install(&self, values: &Path) -> anyhow::Result<String> {
        let chart = chart_dir();
        self.run(&[
            "install",
            RELEASE,
            &chart.to_string_lossy(),
            "--create-namespace",
            "--values",
            &values.to_string_lossy(),
        ])
    }

    /// `helm upgrade ipq deploy/helm/ipq --reuse-values --set <set>...`: the release's values
    /// with `set` changed.
    pub fn upgrade(&self, set: &[&str]) -> anyhow::Result<String> {
        self.upgrade_to(&chart_dir(), set)
    }

    /// `helm upgrade ipq <chart> --reuse-values --set <set>...`: the release moved to another
    /// chart (another release's) with its values kept, `set` changed.
    pub fn upgrade_to(&self, chart: &Path, set: &[&str]) -> anyhow::Result<String> {
        let mut args = vec!["upgrade", RELEASE, chart.to_str().context("a UTF-8 path")?];
        args.push("--reuse-values");
        for value in set {
            args.extend(["--set", value]);
        }
        self.run(&args)
    }

    /// `helm rollback ipq <revision>`.
    pub fn rollback(&self, revision: u64) -> anyhow::Result<String> {
        self.run(&["rollback", RELEASE, &revision.to_string()])
    }

    /// The release's current revision (`helm status -o json`'s `version`).
    pub fn revision(&self) -> anyhow::Result<u64> {
        let status = self.json(&["status", RELEASE])?;
        status["version"]
            .as_u64()
            .with_context(|| format!("helm status {RELEASE} has no version: {status}"))
    }

    /// `helm <args> -o json`, parsed.
    pub fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.run(&all)?;
        serde_json::from_str(&text).with_context(|| format!("helm {args:?} printed {text}"))
    }
}
