//! `cargo xtask test`: the one test command of the project (README and `.ci/run` call it).
//!
//! Runs, in order and stopping at the first failure: the format check, clippy (host crates, then
//! the kernel crate for the bpf target), a build of every binary (the integration tests start the
//! agent binaries from next to their own executables) and the whole test suite. It needs root,
//! and says so, because the datapath and integration tests load BPF programs and create network
//! namespaces: a privileged test never passes by being skipped.

use std::ffi::OsString;
use std::process::Command;

use anyhow::{Context, Result};

use crate::setup::{self, Scope};
use crate::util;

/// The kernel crate only builds for the bpf target (`#![no_std]`, `#![no_main]`, no unwinding),
/// so the host steps leave it out of `--workspace`; the agent's build script compiles it for
/// bpf, and the `clippy-ebpf` step lints it there.
const EBPF_PACKAGE: &str = "ipq-ebpf";

/// The kernel crate's lints: for the bpf target, which needs nightly and `-Z build-std`.
const CLIPPY_EBPF: [&str; 10] = [
    "clippy",
    "--package",
    EBPF_PACKAGE,
    "--target",
    "bpfel-unknown-none",
    "-Z",
    "build-std=core",
    "--",
    "-D",
    "warnings",
];

pub fn run(test_args: &[OsString]) -> Result<()> {
    util::require_root(
        "cargo xtask test",
        "the datapath and integration tests load BPF programs and create network namespaces",
    )?;
    setup::ensure(Scope::All)?;

    step("fmt", util::cargo(["fmt", "--all", "--", "--check"]))?;
    step(
        "clippy",
        host(["clippy", "--all-targets", "--", "-D", "warnings"]),
    )?;
    step("clippy-ebpf", util::nightly("cargo", CLIPPY_EBPF))?;
    step("build", host(["build", "--bins"]))?;
    let mut test = host(["test", "--no-fail-fast"]);
    test.args(test_args).env("RUST_BACKTRACE", "1");
    step("test", test)?;

    println!("xtask test: all steps passed");
    Ok(())
}

/// `cargo <subcommand> --workspace --exclude ipq-ebpf <rest>`.
fn host<const N: usize>(args: [&str; N]) -> Command {
    let (subcommand, rest) = args.split_first().expect("a cargo subcommand");
    let mut command = util::cargo([subcommand, "--workspace", "--exclude", EBPF_PACKAGE]);
    command.args(rest);
    command
}

fn step(name: &str, mut command: Command) -> Result<()> {
    println!("==> {name}");
    command.current_dir(util::workspace_root());
    util::run(&mut command).with_context(|| format!("xtask test: step `{name}` failed"))
}
