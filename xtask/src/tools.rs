//! The checkers the deploy tests run that Debian does not package, installed under
//! `target/tools/` of the checkout (nothing system-wide, removable with the target dir):
//!
//! - `kubernetes-validate` (PyPI) in a Python venv, `target/tools/venv`. A venv, not
//!   `pip install --user`: Debian 12's Python refuses pip outside a venv (PEP 668), and root's
//!   user site would leak into every other Python program on the machine.
//! - `@grafana/schema` and `typescript` (npm), `target/tools/grafana-schema`, installed with
//!   `npm ci` from the package.json and lock file committed in `deploy/grafana/schema-check/`,
//!   so every machine checks the dashboard against the same schema.
//!
//! Each step first checks that the pinned version is there and runs, and installs only if not.
//! The paths are the ones `tests/tests/deploy.rs` looks in.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::setup::Outcome;
use crate::util::{self, cmd};

/// Pinned: its bundled schemas include the Kubernetes version the tests validate against.
pub const KUBERNETES_VALIDATE_VERSION: &str = "1.35.0";

fn tools_dir() -> PathBuf {
    util::workspace_root().join("target/tools")
}

fn venv_dir() -> PathBuf {
    tools_dir().join("venv")
}

/// `kubernetes-validate` in `target/tools/venv`, at the pinned version.
pub fn kubernetes_validate() -> Result<Outcome> {
    let exe = venv_dir().join("bin/kubernetes-validate");
    let installed = || {
        util::probe(&mut cmd(&exe, ["--version"])).is_ok_and(|o| {
            o.status.success() && o.stdout.trim_ascii() == KUBERNETES_VALIDATE_VERSION.as_bytes()
        })
    };
    if installed() {
        return Ok(Outcome::Present);
    }
    ensure_debian_packages(
        || {
            util::probe(&mut cmd("python3", ["-m", "venv", "--help"]))
                .is_ok_and(|o| o.status.success())
        },
        &["python3", "python3-venv"],
        "python3 with its venv module",
    )?;
    // --clear: a venv left by another Python (upgraded, or removed by pyenv) is rebuilt.
    util::run(cmd("python3", ["-m", "venv", "--clear"]).arg(venv_dir()))
        .context("cannot create the Python venv for kubernetes-validate")?;
    let pip = venv_dir().join("bin/pip");
    let requirement = format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}");
    let args = [
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        &requirement,
    ];
    util::run(&mut cmd(&pip, args)).with_context(|| {
        format!("pip could not install {requirement}; check network access to pypi.org")
    })?;
    if !installed() {
        bail!(
            "pip installed {requirement} but `{} --version` does not print {KUBERNETES_VALIDATE_VERSION}",
            exe.display()
        );
    }
    Ok(Outcome::Installed)
}

/// `@grafana/schema` and `typescript` in `target/tools/grafana-schema`, exactly as locked.
pub fn grafana_schema() -> Result<Outcome> {
    let source = util::workspace_root().join("deploy/grafana/schema-check");
    let dir = tools_dir().join("grafana-schema");
    let files = ["package.json", "package-lock.json"];
    let same_files = || {
        files.iter().all(
            |f| match (fs::read(source.join(f)), fs::read(dir.join(f))) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            },
        )
    };
    let tsc = dir.join("node_modules/.bin/tsc");
    let runs = || {
        dir.join("node_modules/@grafana/schema/package.json")
            .is_file()
            && util::probe(&mut cmd(&tsc, ["--version"])).is_ok_and(|o| o.status.success())
    };
    if same_files() && runs() {
        return Ok(Outcome::Present);
    }
    ensure_debian_packages(
        || util::probe(&mut cmd("npm", ["--version"])).is_ok_and(|o| o.status.success()),
        &["nodejs", "npm"],
        "node and npm",
    )?;
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for f in files {
        copy(&source.join(f), &dir.join(f))?;
    }
    let mut ci = cmd("npm", ["ci", "--ignore-scripts", "--no-audit", "--no-fund"]);
    util::run(ci.current_dir(&dir)).context(
        "`npm ci` could not install @grafana/schema and typescript; check network access to \
         registry.npmjs.org",
    )?;
    if !runs() {
        bail!("npm ci succeeded but {} does not run", tsc.display());
    }
    Ok(Outcome::Installed)
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))
}

/// Makes `present` true, installing `packages` with apt if it is not; `what` names them.
fn ensure_debian_packages(present: impl Fn() -> bool, packages: &[&str], what: &str) -> Result<()> {
    if present() {
        return Ok(());
    }
    let list = packages.join(" ");
    util::require_root(
        &format!("installing {what} ({list})"),
        &format!("run `cargo xtask setup` as root, or `sudo apt-get install {list}`"),
    )?;
    if which::which("apt-get").is_err() {
        bail!("{what} is missing and this is not a Debian-like system: install {list} by hand");
    }
    util::run(&mut cmd("apt-get", ["update"]))
        .context("`apt-get update` failed; check the apt sources and network access")?;
    let mut install = cmd("apt-get", ["install", "-y", "--no-install-recommends"]);
    install
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut install).with_context(|| format!("cannot install {list} with apt-get"))?;
    if !present() {
        bail!("apt-get installed {list} but {what} still does not work");
    }
    Ok(())
}
