//! `cargo xtask test`: the one test command of the project (README and `.ci/run` call it).
//!
//! Runs, in order and stopping at the first failure: the format check, clippy (host crates, then
//! the kernel crate for the bpf target), a build of every binary (the integration tests start the
//! agent binaries from next to their own executables), the whole test suite on this kernel, then
//! the kernel tier (`kernels`: Debian's older kernels under QEMU, the arm64 one beside the
//! amd64 ones) with the cluster tier beside it. It needs root, and says so, because the
//! datapath and integration tests load BPF programs and create network namespaces: a
//! privileged test never passes by being skipped.

use std::ffi::OsString;
use std::process::Command;

use anyhow::{Context, Result};

use crate::kernels;
use crate::setup::{self, Scope};
use crate::util;

/// The kernel crate only builds for the bpf target (`#![no_std]`, `#![no_main]`, no unwinding),
/// so the host steps leave it out of `--workspace`; the agent's build script compiles it for
/// bpf, and the `clippy-ebpf` step lints it there.
const EBPF_PACKAGE: &str = "ipq-ebpf";

/// The kernel crate's lints: for the bpf target, which needs nightly and `-Z build-std`.
const CLIPPY_EBPF: [&str; 12] = [
    "clippy",
    "--package",
    EBPF_PACKAGE,
    // The barriers of the ordered object are code only with it (the rest is the same source).
    "--features",
    "fetch-barriers",
    "--target",
    "bpfel-unknown-none",
    "-Z",
    "build-std=core",
    "--",
    "-D",
    "warnings",
];

/// Tests the host suite leaves to the kernel tier, which runs them on the kernels whose
/// premise they test (kept in step with `xtask/kernels.toml`), with what that premise is. On
/// this host each fails, saying so, as a test that cannot run must.
const KERNEL_TIER_ONLY: [(&str, &str); 4] = [
    // bpf_watch: this kind of build machine's kernel has no function tracer and refuses fentry
    // (EPERM); 6.1 and 6.12 run these.
    (
        "a_compat_bpf_write_is_undone_at_once",
        "the watcher's trampolines",
    ),
    (
        "a_write_through_a_pin_opened_by_a_relative_path_is_undone_at_once",
        "the watcher's trampolines",
    ),
    (
        "a_write_by_a_child_forked_after_the_open_is_undone_at_once",
        "the watcher's trampolines",
    ),
    // slots: the programs read only the hash map where the loader chooses that, before 5.12;
    // its elements outlive a run only before 6.1 (`ipq_common::addr::BPF_F_NO_PREALLOC`).
    (
        "packets_racing_the_agents_writes_get_the_old_or_the_new_verdict_from_the_hash_map",
        "a kernel before 6.1",
    ),
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
    // `--all-targets` leaves out test targets marked `test = false` (the cluster tier).
    step(
        "clippy-cluster",
        host([
            "clippy",
            "-p",
            "ipq-tests",
            "--test",
            "cluster",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    step("clippy-ebpf", util::nightly("cargo", CLIPPY_EBPF)?)?;
    step("build", host(["build", "--bins"]))?;
    // The shipped binaries for arm64 (checked: aarch64 ELFs embedding the host's eBPF
    // object); the host suite's image test makes the arm64 image of them.
    if crate::cross::Arch::host()? == crate::cross::Arch::Amd64 {
        println!("==> build-arm64");
        crate::cross::build(crate::cross::Arch::Arm64, false, &["--bins"])
            .context("xtask test: step `build-arm64` failed")?;
    }
    // Doc tests are left out: there are none, and their empty result would be the last line.
    let mut test = host(["test", "--no-fail-fast", "--lib", "--bins", "--tests"]);
    // Panics keep their backtraces; a test's returned error prints its message alone, so CI's
    // tail of the output shows why it failed, not the frames of anyhow's capture.
    test.args(test_args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "0");
    if test_args.is_empty() {
        test.arg("--");
        for (name, _) in KERNEL_TIER_ONLY {
            test.args(["--skip", name]);
        }
        println!(
            "test: {} tests run in the kernel tier, where their premise holds, not on this host:",
            KERNEL_TIER_ONLY.len()
        );
        for (name, premise) in KERNEL_TIER_ONLY {
            println!("  {name} ({premise})");
        }
    }
    println!("==> test");
    let host = run_tests(test, test_args.is_empty()).context("xtask test: step `test` failed")?;
    let mut totals = Totals::default();
    totals.add(&host.all);

    // The kernel tier (the datapath and netns labs again, on Debian's own older kernels; and on
    // arm64, the kernels marked `in_test` in xtask/kernels.toml) and the cluster tier (ipq
    // applied to Kubernetes clusters of the test's own: one node, three) run at once. Every
    // guest is one QEMU thread under TCG (`tcg,thread=single`), CPU-bound for ~30 minutes;
    // the cluster tier mostly waits on its cluster (pods starting, watches, an idle minute).
    // The guests run at a lower priority (`kernels::qemu`), so they fill the cores the
    // cluster tier leaves idle without slowing its latency measurements, and their own
    // timeouts are scaled for a busy host (`qemu.time_scale`). After each other the two took
    // 50 minutes (32 + 19); beside each other, the guests' 40. Both kernel tiers and the cluster
    // tier are prepared first, one after the other (test binaries built, kernels fetched, the
    // release build, the previous release): no two builds share the target dir at once, and
    // no compile competes with the guests.
    println!("==> kernels");
    let amd64 = kernels::prepare(crate::cross::Arch::Amd64, &[])
        .context("xtask test: step `kernels` failed")?;
    let arm64_kernels = kernels::in_test(crate::cross::Arch::Arm64)?;
    let arm64 =
        if crate::cross::Arch::host()? == crate::cross::Arch::Amd64 && !arm64_kernels.is_empty() {
            println!("==> kernels-arm64 ({})", arm64_kernels.join(", "));
            Some(
                kernels::prepare(crate::cross::Arch::Arm64, &arm64_kernels)
                    .context("xtask test: step `kernels-arm64` failed")?,
            )
        } else {
            None
        };
    let cluster = crate::test_cluster::prepare().context("xtask test: step `cluster` failed")?;
    let amd64 = std::thread::spawn(move || amd64.boot_all());
    let arm64 = arm64.map(|prepared| std::thread::spawn(move || prepared.boot_all()));

    // The guests are joined whatever the cluster tier does: returning before them would leave
    // their QEMUs running after xtask.
    let cluster = cluster.run();
    let tier = amd64
        .join()
        .map_err(|_| anyhow::anyhow!("xtask test: step `kernels` panicked"))?;
    let arm64 = match arm64 {
        Some(booting) => booting
            .join()
            .map_err(|_| anyhow::anyhow!("xtask test: step `kernels-arm64` panicked"))?,
        None => kernels::Tier::default(),
    };
    totals.add(&tier.totals);
    totals.add(&arm64.totals);
    let (cluster, cluster_failure) = match cluster {
        Ok(cluster) => (cluster, None),
        // What the tier counted before it failed, when it ran at all.
        Err(e) => (
            e.downcast_ref::<TestsFailed>()
                .map(|failed| failed.totals.clone())
                .unwrap_or_default(),
            Some(e),
        ),
    };
    totals.add(&cluster);
    let tiers = [
        ("CRI tier", &host.cri),
        ("kernel tier", &tier.totals),
        ("cluster tier", &cluster),
        ("arm64 kernel tier", &arm64.totals),
    ];
    let kernel_failures: Vec<String> = tier
        .failures
        .iter()
        .chain(&arm64.failures)
        .cloned()
        .collect();
    let mut why = Vec::new();
    if !kernel_failures.is_empty() {
        why.push(format!(
            "xtask test: step `kernels` failed:\n{}",
            kernel_failures.join("\n")
        ));
    }
    if let Some(e) = cluster_failure {
        why.push(format!("xtask test: step `cluster` failed: {e:#}"));
    }
    if !why.is_empty() {
        print_summary(&totals, &tiers);
        anyhow::bail!("{}", why.join("\n"));
    }

    println!("xtask test: all steps passed");
    print_summary(&totals, &tiers);
    Ok(())
}

/// `cargo xtask test-kernels [NAME...]`: the kernel tier alone.
pub fn run_kernels(arch: crate::cross::Arch, names: &[String]) -> Result<()> {
    util::require_root(
        "cargo xtask test-kernels",
        "it downloads kernels with apt and the tests in the guests run as root",
    )?;
    setup::ensure(Scope::All)?;
    let tier = kernels::run(arch, names)?;
    print_summary(&tier.totals, &[]);
    if !tier.failures.is_empty() {
        anyhow::bail!("kernel tier failed:\n{}", tier.failures.join("\n"));
    }
    Ok(())
}

/// One closing line for the whole suite, in the plain form CI reads, with the tiers that run
/// inside it counted apart.
pub(crate) fn print_summary(totals: &Totals, tiers: &[(&str, &Totals)]) {
    let parts: Vec<String> = tiers
        .iter()
        .map(|(name, t)| format!("{name}: {} passed, {} failed", t.passed, t.failed))
        .collect();
    let tiers = if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    };
    println!(
        "summary: {} passed, {} failed{tiers}",
        totals.passed, totals.failed
    );
}

/// The host step's results, and those of the CRI tier's test binary among them.
#[derive(Default)]
pub(crate) struct HostResults {
    pub all: Totals,
    cri: Totals,
}

/// The CRI tier's test binary (containerd through its CRI), as cargo names it when running it.
const CRI_TIER: &str = "tests/cri.rs";

#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Totals {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Totals {
    pub fn add(&mut self, other: &Totals) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }
}

/// Adds up one libtest line: `test result: ok. 9 passed; 0 failed; 0 ignored; ...`.
pub(crate) fn add_result_line(totals: &mut Totals, line: &str) {
    let Some(rest) = line.trim().strip_prefix("test result: ") else {
        return;
    };
    for part in rest.split(';') {
        let mut words = part.split_whitespace().rev();
        let (Some(what), Some(count)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        match what {
            "passed" => totals.passed += count,
            "failed" => totals.failed += count,
            "ignored" => totals.ignored += count,
            _ => {}
        }
    }
}

/// A test command that ran and failed: what it counted before it ended, and which tests
/// failed, so a summary stays true and CI's tail of the output names them.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` failed with {status}{}", failed_list(.failed, .hung))]
pub(crate) struct TestsFailed {
    pub command: String,
    pub status: std::process::ExitStatus,
    pub totals: Totals,
    /// The names libtest listed under `failures:`.
    pub failed: Vec<String>,
    /// The test binaries killed as hung.
    pub hung: Vec<String>,
}

fn failed_list(failed: &[String], hung: &[String]) -> String {
    let mut text = String::new();
    if !failed.is_empty() {
        text.push_str(&format!("; failing tests: {}", failed.join(", ")));
    }
    if !hung.is_empty() {
        text.push_str(&format!(":\n{}", hung.join("\n")));
    }
    text
}

/// Collects the names libtest lists at the end of a failed run: a `failures:` line, then one
/// test name per line, indented by four spaces, up to a blank line. (The section of captured
/// output, `---- name stdout ----`, has no such lines.)
#[derive(Default)]
struct FailureList {
    in_list: bool,
    names: Vec<String>,
}

impl FailureList {
    fn add_line(&mut self, line: &str) {
        if line == "failures:" {
            self.in_list = true;
        } else if line.trim().is_empty() {
            self.in_list = false;
        } else if self.in_list {
            if let Some(name) = line.strip_prefix("    ") {
                if !name.is_empty() && !name.contains(char::is_whitespace) {
                    self.names.push(name.to_owned());
                }
            }
        }
    }
}

/// Runs cargo test, echoing its output, and totals its result lines. Fails when cargo test
/// fails, when nothing ran, or when anything was ignored: an ignored test is one that does not
/// run, and this project does not count it as passing. The `whole_suite` (no test filter) must
/// also have run the CRI tier.
pub(crate) fn run_tests(mut command: Command, whole_suite: bool) -> Result<HostResults> {
    use std::process::Stdio;

    command.current_dir(util::workspace_root());
    let line = util::command_line(&command);
    eprintln!("+ {line}");
    // One pipe for stdout and stderr: cargo names each test binary ("Running ...") on stderr
    // and the binary's results come on stdout; read apart, their order would be lost.
    let (output, writer) = std::io::pipe().context("a pipe for cargo test's output")?;
    command
        .stdout(Stdio::from(writer.try_clone().context("cloning the pipe")?))
        .stderr(Stdio::from(writer));
    let mut child = command
        .spawn()
        .with_context(|| format!("starting `{line}`"))?;
    // The pipe's write ends live on only in the child: reading ends when it exits.
    drop(command);
    let mut results = HostResults::default();
    let mut in_cri_tier = false;
    let mut failures = FailureList::default();
    // A test binary silent for `stall::STALL` is killed as hung: its target fails, the rest
    // run, and the run ends with the reason instead of at CI's limit.
    let hung = crate::stall::read_lines(output, child.id(), crate::stall::STALL, |text| {
        println!("{text}");
        // "     Running tests/cri.rs (target/debug/deps/cri-...)" comes before its results.
        if let Some(target) = text.trim().strip_prefix("Running ") {
            in_cri_tier = target.starts_with(CRI_TIER);
        }
        add_result_line(&mut results.all, text);
        failures.add_line(text);
        if in_cri_tier {
            add_result_line(&mut results.cri, text);
        }
    })?;
    let totals = &results.all;
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{line}`"))?;
    if !status.success() {
        print_summary(totals, &[("CRI tier", &results.cri)]);
        return Err(TestsFailed {
            command: line,
            status,
            totals: totals.clone(),
            failed: failures.names,
            hung,
        }
        .into());
    }
    if totals.passed == 0 {
        anyhow::bail!("`{line}` ran no test");
    }
    if totals.ignored > 0 {
        anyhow::bail!("{} tests are #[ignore]d: make them run", totals.ignored);
    }
    if whole_suite && results.cri.passed == 0 {
        anyhow::bail!("the CRI tier ({CRI_TIER}) ran no test");
    }
    Ok(results)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_are_totalled() {
        let mut totals = Totals::default();
        add_result_line(
            &mut totals,
            "test result: ok. 9 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
        );
        add_result_line(
            &mut totals,
            "test result: FAILED. 2 passed; 1 failed; 3 ignored; 0 measured; 0 filtered out",
        );
        add_result_line(&mut totals, "running 3 tests");
        assert_eq!(
            totals,
            Totals {
                passed: 11,
                failed: 1,
                ignored: 3
            }
        );
    }

    #[test]
    fn the_failures_list_is_read_and_captured_output_is_not() {
        let output = [
            "test a::passes ... ok",
            "test b::fails ... FAILED",
            "",
            "failures:",
            "",
            "---- b::fails stdout ----",
            "Error: the reason",
            "    indented output of a test",
            "",
            "failures:",
            "    b::fails",
            "    c::also_fails",
            "",
            "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
        ];
        let mut failures = FailureList::default();
        for line in output {
            failures.add_line(line);
        }
        assert_eq!(failures.names, ["b::fails", "c::also_fails"]);
    }
}
