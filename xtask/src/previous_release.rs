//! The previous release the cluster tier rolls ipq's DaemonSet to and back from (#37): the
//! shipped binaries and the Helm chart of the commit `xtask/previous-release.toml` names, built
//! from that commit's own tree (its Cargo.lock, its build scripts, its eBPF object) as a
//! release is built.
//!
//! Built into a cache outside the checkout (`$XDG_CACHE_HOME/ipq-xtask/previous-release`, else
//! `~/.cache/...`): a clean clone finds it there, so the cold release build of the older tree
//! (about 8 minutes on 2 cores) is paid once per machine and commit, not once per clone. Its
//! cargo target dir is kept across commits, so moving the commit rebuilds ipq's crates only.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::cross::SHIPPED_BINARIES;
use crate::util;

/// What the release's directory holds once it is complete: written last.
const COMPLETE: &str = "complete";

/// `xtask/previous-release.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pin {
    /// The release's commit, 40 hex digits.
    commit: String,
    /// What it is, for the log.
    what: String,
}

fn read_pin() -> Result<Pin> {
    let path = util::workspace_root().join("xtask/previous-release.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_pin(&text, &path)
}

fn parse_pin(text: &str, path: &Path) -> Result<Pin> {
    let pin: Pin =
        toml::from_str(text).with_context(|| format!("{} is not valid", path.display()))?;
    if pin.commit.len() != 40 || !pin.commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{}: commit {:?} is not a full commit hash (40 hex digits)",
            path.display(),
            pin.commit
        );
    }
    Ok(pin)
}

fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(
            std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?,
        )
        .join(".cache"),
    };
    Ok(base.join("ipq-xtask").join("previous-release"))
}

/// `cargo xtask previous-release`: builds it when missing and prints its directory.
pub fn run() -> Result<()> {
    let dir = ensure()?;
    println!("{}", dir.display());
    Ok(())
}

/// The previous release's directory, built first when missing: `bin/` (the four shipped
/// binaries), `chart/` (its deploy/helm/ipq), `commit`.
pub fn ensure() -> Result<PathBuf> {
    let pin = read_pin()?;
    let cache = cache_dir()?;
    let out = cache.join(&pin.commit);
    if out.join(COMPLETE).is_file() {
        return Ok(out);
    }
    let _lock = util::exclusive_lock(
        &cache.join(".lock"),
        "previous-release: another xtask is building the previous release",
    )?;
    if out.join(COMPLETE).is_file() {
        return Ok(out);
    }
    println!(
        "==> the previous release: {} ({}), built once into {}",
        pin.commit,
        pin.what,
        cache.display()
    );
    let root = util::workspace_root();
    let known = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", &format!("{}^{{commit}}", pin.commit)])
        .status()
        .context("running git")?;
    if !known.success() {
        bail!(
            "commit {} (xtask/previous-release.toml: {}) is not in {}'s history: the cluster \
             tier rolls back to it. A shallow clone lacks it: `git fetch --unshallow`",
            pin.commit,
            pin.what,
            root.display()
        );
    }
    // One source path for every commit: cargo then rebuilds only what changed between them.
    let src = cache.join("src");
    if src.exists() {
        fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))?;
    }
    fs::create_dir_all(&src)?;
    extract(&root, &pin.commit, &src)?;
    let target = cache.join("target");
    let mut build = util::release_build_of_shipped_binaries();
    build
        .arg("--locked")
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        // The release is built as its own tree builds, not with this checkout's settings.
        .env_remove("CARGO_MANIFEST_DIR")
        .env_remove("RUSTFLAGS");
    util::run(&mut build).with_context(|| {
        format!(
            "building the previous release {} ({})",
            pin.commit,
            util::free_space_of(&cache)
        )
    })?;

    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    let bin = out.join("bin");
    fs::create_dir_all(&bin)?;
    for name in SHIPPED_BINARIES {
        let from = target.join("release").join(name);
        fs::copy(&from, bin.join(name))
            .with_context(|| format!("{} is missing after the release build", from.display()))?;
    }
    util::run(
        Command::new("cp")
            .arg("-a")
            .arg(src.join("deploy/helm/ipq"))
            .arg(out.join("chart")),
    )?;
    fs::write(out.join("commit"), format!("{}\n", pin.commit))?;
    fs::write(out.join(COMPLETE), "")?;
    forget_other_commits(&cache, &pin.commit)?;
    Ok(out)
}

/// `git archive <commit> | tar -x -C <dest>`.
fn extract(root: &Path, commit: &str, dest: &Path) -> Result<()> {
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let stdout = archive.stdout.take().context("git archive's stdout")?;
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dest)
        .stdin(stdout)
        .status()
        .context("running tar")?;
    let archived = archive.wait()?;
    if !archived.success() || !untar.success() {
        bail!(
            "git archive {commit} | tar -x -C {}: {archived}, {untar}",
            dest.display()
        );
    }
    Ok(())
}

/// Removes the directories of other commits (a pin moved on): each holds a few binaries.
fn forget_other_commits(cache: &Path, commit: &str) -> Result<()> {
    for entry in fs::read_dir(cache)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.len() == 40 && name != commit && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_pin_parses() {
        // Whether it is in this clone's history is checked when it is built (a shallow clone
        // lacks it, and then says so), not here.
        read_pin().expect("xtask/previous-release.toml parses");
    }

    #[test]
    fn a_short_or_non_hex_commit_is_refused_naming_the_file() {
        let path = Path::new("xtask/previous-release.toml");
        for bad in ["32284a3", "zz84a36c484d0e2b7c14260ad5f175dfe73dc88zz"] {
            let text = format!("commit = \"{bad}\"\nwhat = \"x\"");
            let error = parse_pin(&text, path).expect_err(bad).to_string();
            assert!(
                error.contains("previous-release.toml") && error.contains(bad),
                "{error}"
            );
        }
        let good = "commit = \"32284a36c484d0e2b7c14260ad5f175dfe73dc88\"\nwhat = \"x\"";
        assert!(parse_pin(good, path).is_ok());
        let unknown = format!("{good}\nbranch = \"main\"");
        assert!(parse_pin(&unknown, path).is_err());
    }
}
