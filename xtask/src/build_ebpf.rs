//! `cargo xtask build-ebpf`: builds the kernel programs and says where the object is.
//!
//! The agent package (`ipq`, in `agent/`) has a build script that compiles the eBPF crate with
//! aya-build into its OUT_DIR, as a file named `ipq`. Building the agent's library is therefore
//! what builds the eBPF object; cargo's JSON messages tell where that OUT_DIR is.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::setup::{self, Scope};
use crate::util;

/// The agent's package name, and the directory it lives in below the workspace root.
const AGENT_PACKAGE: &str = "ipq";
const AGENT_DIR: &str = "agent";
/// The file name aya-build gives the eBPF object in the agent's OUT_DIR.
const OBJECT_NAME: &str = "ipq";

pub fn run(release: bool) -> Result<()> {
    setup::ensure(Scope::Build)?;
    let object = build(release)?;
    let size = fs::metadata(&object)
        .with_context(|| {
            format!(
                "the agent's build script ran but wrote no eBPF object at {}; check \
                 agent/build.rs (aya-build) and the eBPF crate's binary name",
                object.display()
            )
        })?
        .len();
    if size == 0 {
        bail!(
            "the eBPF object {} is empty; check the bpf-linker output in the build log above",
            object.display()
        );
    }
    println!("build-ebpf: {}: {size} bytes", object.display());
    Ok(())
}

/// Builds the agent library and returns the path of the eBPF object in its OUT_DIR.
fn build(release: bool) -> Result<PathBuf> {
    let mut args = vec!["build", "--package", AGENT_PACKAGE, "--lib"];
    if release {
        args.push("--release");
    }
    args.push("--message-format=json-render-diagnostics");
    let mut command = util::cargo(args);
    command.current_dir(util::workspace_root());
    let line = util::command_line(&command);
    eprintln!("+ {line}");

    // Diagnostics are rendered on stderr (inherited); stdout carries one JSON message per line.
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut out_dir = None;
    for message in BufReader::new(stdout).lines() {
        let message = message.with_context(|| format!("cannot read the output of `{line}`"))?;
        if let Some(dir) = agent_out_dir(&message) {
            out_dir = Some(dir);
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("`{line}` did not finish"))?;
    if !status.success() {
        bail!("`{line}` failed with {status}; the compiler's errors are above");
    }
    let out_dir = out_dir.with_context(|| {
        format!(
            "cargo built `{AGENT_PACKAGE}` but reported no build script output for it; \
             building the eBPF programs needs {AGENT_DIR}/build.rs (aya-build)"
        )
    })?;
    Ok(out_dir.join(OBJECT_NAME))
}

/// The `out_dir` of a `build-script-executed` message for the agent package, if `message` is one.
pub(crate) fn agent_out_dir(message: &str) -> Option<PathBuf> {
    let value: Value = serde_json::from_str(message).ok()?;
    if value.get("reason")?.as_str()? != "build-script-executed" {
        return None;
    }
    let id = value.get("package_id")?.as_str()?;
    if !is_agent(id) {
        return None;
    }
    Some(PathBuf::from(value.get("out_dir")?.as_str()?))
}

/// Whether a cargo package id names the agent package. Accepts both formats:
/// `path+file:///work/main/agent#ipq@0.1.0` (cargo >= 1.77) and
/// `ipq 0.1.0 (path+file:///work/main/agent)` (older).
fn is_agent(id: &str) -> bool {
    let (name, url) = match id.split_once('#') {
        Some((url, fragment)) => {
            // The name is left out when it is the directory's name: `.../agent#0.1.0`.
            let name = match fragment.split_once('@') {
                Some((name, _version)) => name,
                None => url.rsplit('/').next().unwrap_or_default(),
            };
            (name, url)
        }
        None => {
            let name = id.split(' ').next().unwrap_or_default();
            let url = id
                .rsplit_once('(')
                .map_or("", |(_, rest)| rest.trim_end_matches(')'));
            (name, url)
        }
    };
    let agent_dir = util::workspace_root().join(AGENT_DIR);
    let agent_dir = agent_dir.to_string_lossy();
    name == AGENT_PACKAGE && url.ends_with(&format!("file://{agent_dir}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_agent_out_dir_in_both_package_id_formats() {
        let root = util::workspace_root();
        let root = root.display();
        let new = format!(
            r#"{{"reason":"build-script-executed","package_id":"path+file://{root}/agent#ipq@0.1.0","out_dir":"/t/out"}}"#
        );
        let old = format!(
            r#"{{"reason":"build-script-executed","package_id":"ipq 0.1.0 (path+file://{root}/agent)","out_dir":"/t/out"}}"#
        );
        assert_eq!(agent_out_dir(&new), Some(PathBuf::from("/t/out")));
        assert_eq!(agent_out_dir(&old), Some(PathBuf::from("/t/out")));
    }

    #[test]
    fn ignores_other_packages_and_messages() {
        let root = util::workspace_root();
        let root = root.display();
        let other = format!(
            r#"{{"reason":"build-script-executed","package_id":"path+file://{root}/ebpf#ipq-ebpf@0.1.0","out_dir":"/t/out"}}"#
        );
        let registry = r#"{"reason":"build-script-executed","package_id":"registry+https://github.com/rust-lang/crates.io-index#ipq@0.1.0","out_dir":"/t/out"}"#;
        let artifact = format!(
            r#"{{"reason":"compiler-artifact","package_id":"path+file://{root}/agent#ipq@0.1.0"}}"#
        );
        assert_eq!(agent_out_dir(&other), None);
        assert_eq!(agent_out_dir(registry), None);
        assert_eq!(agent_out_dir(&artifact), None);
        assert_eq!(agent_out_dir("not json"), None);
    }
}
