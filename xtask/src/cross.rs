//! `cargo xtask build --arch amd64|arm64`: the shipped binaries (`ipq-agent`, `ipq`,
//! `ipq-cni`, `ipq-ipam`) for one architecture, checked after the build.
//!
//! For arm64 the build cross-compiles for `aarch64-unknown-linux-gnu` with Debian's cross gcc
//! as linker and C compiler (`ring` has C), set here through cargo's environment variables so
//! that nobody's `~/.cargo/config.toml` has to change. The eBPF object is not per
//! architecture: the agent's build script builds it for the bpf target on the build machine
//! either way, and the check below proves that the arm64 agent embeds the very bytes the host
//! agent embeds.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use crate::elf;
use crate::foreign_debs::ForeignDebs;
use crate::setup::{self, Scope};
use crate::util;

/// The packages and binaries shipped in the image (`deploy/docker/Dockerfile`).
const PACKAGES: [&str; 3] = ["ipq", "ipq-cni", "ipq-cli"];
pub const SHIPPED_BINARIES: [&str; 4] = ["ipq-agent", "ipq", "ipq-cni", "ipq-ipam"];

/// The eBPF objects the agent's build script writes into its OUT_DIR (`agent/build.rs`).
const OBJECTS: [&str; 2] = ["ipq", "ipq-fetch-barriers"];

/// A CPU architecture ipq ships for, by its Kubernetes/OCI name (also Debian's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    #[default]
    Amd64,
    Arm64,
}

impl Arch {
    /// Rust's target triple.
    pub const fn triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The ELF `e_machine` of its executables.
    pub const fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => elf::EM_X86_64,
            Arch::Arm64 => elf::EM_AARCH64,
        }
    }

    /// The OCI/Kubernetes name (`kubernetes.io/arch`).
    pub const fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The architecture of the machine xtask runs on.
    pub fn host() -> Result<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Arch::Amd64),
            "aarch64" => Ok(Arch::Arm64),
            other => bail!("ipq builds on x86-64 and aarch64 machines, not on {other}"),
        }
    }

    /// The setup this architecture's build needs on this host. Cross builds go from x86-64 to
    /// arm64 only (Debian's cross gcc for aarch64); an arm64 machine builds arm64.
    fn setup_scope(self) -> Result<Scope> {
        match (Arch::host()?, self) {
            (host, arch) if host == arch => Ok(Scope::Build),
            (Arch::Amd64, Arch::Arm64) => Ok(Scope::Arm64),
            (host, arch) => bail!(
                "building for {} on {} is not set up: ipq cross-builds from x86-64 to arm64 \
                 only (in Docker, build on an amd64 builder)",
                arch.name(),
                host.name()
            ),
        }
    }
}

/// What a build produced.
pub struct Built {
    /// The shipped binaries, by name, for the architecture asked for.
    pub binaries: Vec<(String, PathBuf)>,
}

/// `cargo xtask build --arch ARCH [--release]`.
pub fn run(arch: Arch, release: bool, locked: bool) -> Result<()> {
    let started = std::time::Instant::now();
    let mut extra = vec!["--bins"];
    if locked {
        extra.push("--locked");
    }
    let built = build(arch, release, &extra)?;
    for (name, path) in &built.binaries {
        println!("build: {} ({}): {}", name, arch.name(), path.display());
    }
    println!(
        "build: {} binaries for {} checked (ELF machine, the shared eBPF object) in {:.0?}",
        built.binaries.len(),
        arch.name(),
        started.elapsed()
    );
    Ok(())
}

/// Builds the shipped binaries for `arch` (`extra` goes to `cargo build`), then checks that each
/// is an executable for `arch` and that the agent embeds the same eBPF objects as a build for
/// the host.
pub fn build(arch: Arch, release: bool, extra: &[&str]) -> Result<Built> {
    setup::ensure(arch.setup_scope()?)?;
    let mut args = vec!["build", "--target", arch.triple()];
    for package in PACKAGES {
        args.extend(["-p", package]);
    }
    if release {
        args.push("--release");
    }
    args.extend(extra);
    args.push("--message-format=json-render-diagnostics");
    let mut command = util::cargo(&args);
    cross_environment(&mut command, arch);
    let artifacts = run_json(&mut command)?;

    let profile_dir = util::workspace_root()
        .join("target")
        .join(arch.triple())
        .join(if release { "release" } else { "debug" });
    let mut binaries = Vec::new();
    for name in SHIPPED_BINARIES {
        let path = profile_dir.join(name);
        check_machine(&path, arch)?;
        binaries.push((name.to_owned(), path));
    }
    if arch != Arch::host()? {
        stage_busybox(arch)?;
    }
    let out_dir = artifacts.agent_out_dir.with_context(|| {
        format!("cargo reported no build script output for the agent's build for {arch:?}")
    })?;
    let host_out_dir = host_agent_out_dir(release)?;
    check_same_objects(&out_dir, &host_out_dir, &binaries[0].1)?;
    Ok(Built { binaries })
}

/// `target/<triple>/busybox`: Debian's static busybox for `arch`, the shell, grep and mount of
/// the image the cluster tier's image builder makes for `arch` (its host image copies the
/// machine's own `/bin/busybox`).
pub fn stage_busybox(arch: Arch) -> Result<PathBuf> {
    let staged = util::workspace_root()
        .join("target")
        .join(arch.triple())
        .join("busybox");
    if !staged.is_file() {
        let root = ForeignDebs::new(arch.name()).unpacked("busybox-static")?;
        let from = root.join("bin/busybox");
        fs::copy(&from, &staged)
            .with_context(|| format!("cannot copy {} to {}", from.display(), staged.display()))?;
    }
    check_machine(&staged, arch)?;
    Ok(staged)
}

/// The linker and C compiler for `arch` when it is not the host's: Debian's cross gcc.
pub fn cross_environment(command: &mut std::process::Command, arch: Arch) {
    if arch == Arch::Arm64 && Arch::host().ok() != Some(Arch::Arm64) {
        command
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                "aarch64-linux-gnu-gcc",
            )
            .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
            .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar");
    }
}

/// Fails, naming the file, unless `path` is an ELF executable for `arch`.
pub fn check_machine(path: &Path, arch: Arch) -> Result<()> {
    let machine = elf::machine(path)?;
    if machine != arch.elf_machine() {
        bail!(
            "{} is for {}, not {}",
            path.display(),
            elf::machine_name(machine),
            arch.name()
        );
    }
    Ok(())
}

/// The same objects in both OUT_DIRs, and the agent binary embedding each of them.
fn check_same_objects(out_dir: &Path, host_out_dir: &Path, agent: &Path) -> Result<()> {
    let read =
        |path: PathBuf| fs::read(&path).with_context(|| format!("cannot read {}", path.display()));
    let agent_bytes = read(agent.to_owned())?;
    for name in OBJECTS {
        let ours = read(out_dir.join(name))?;
        let host = read(host_out_dir.join(name))?;
        if ours != host {
            bail!(
                "the eBPF object {name} built with {} differs from the host build's in {}: \
                 one object must serve every architecture",
                out_dir.display(),
                host_out_dir.display()
            );
        }
        if !contains(&agent_bytes, &ours) {
            bail!(
                "{} does not embed the eBPF object {}",
                agent.display(),
                out_dir.join(name).display()
            );
        }
    }
    Ok(())
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == first)
        .any(|(at, _)| haystack[at..].starts_with(needle))
}

/// The agent's OUT_DIR in a build for the host (where `cargo xtask build-ebpf` puts the object).
fn host_agent_out_dir(release: bool) -> Result<PathBuf> {
    let mut args = vec!["build", "-p", "ipq", "--lib"];
    if release {
        args.push("--release");
    }
    args.push("--message-format=json-render-diagnostics");
    run_json(&mut util::cargo(&args))?
        .agent_out_dir
        .context("cargo reported no build script output for the agent's host build")
}

/// What the JSON messages of a build said.
struct Artifacts {
    agent_out_dir: Option<PathBuf>,
}

/// Runs a `cargo build --message-format=json-render-diagnostics` (diagnostics on stderr).
fn run_json(command: &mut std::process::Command) -> Result<Artifacts> {
    command
        .current_dir(util::workspace_root())
        .stdout(Stdio::piped());
    let line = util::command_line(command);
    eprintln!("+ {line}");
    let mut child = command
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut artifacts = Artifacts {
        agent_out_dir: None,
    };
    for message in BufReader::new(stdout).lines() {
        let message = message.with_context(|| format!("cannot read the output of `{line}`"))?;
        if let Some(dir) = crate::build_ebpf::agent_out_dir(&message) {
            artifacts.agent_out_dir = Some(dir);
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("`{line}` did not finish"))?;
    if !status.success() {
        bail!(
            "`{line}` failed with {status}; the compiler's errors are above ({})",
            util::free_space_of(&util::workspace_root().join("target"))
        );
    }
    Ok(artifacts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_an_object_inside_a_binary() {
        let binary = b"\x7fELF....\x7fELF\x02\x01 object bytes .....";
        assert!(contains(binary, b"\x7fELF\x02\x01 object"));
        assert!(!contains(binary, b"\x7fELF\x02\x01 other"));
    }

    #[test]
    fn a_build_for_the_host_needs_no_cross_setup() {
        let host = Arch::host().unwrap();
        assert_eq!(host.setup_scope().unwrap(), Scope::Build);
        let other = if host == Arch::Amd64 {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        if other == Arch::Arm64 {
            assert_eq!(other.setup_scope().unwrap(), Scope::Arm64);
        }
    }
}
