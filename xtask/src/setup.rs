//! `cargo xtask setup`: idempotent bootstrap of the tools building and testing ipq needs.
//!
//! Every step first checks whether its tool is already there and only installs what is missing,
//! so running setup again is cheap and changes nothing.

use std::fs;

use anyhow::{bail, Context, Result};

use crate::util::{self, cmd};

mod bpf_linker;

use bpf_linker::bpf_linker;

/// Debian packages the integration tests run. The one list: add a package here when a test
/// starts using a new tool.
pub const TEST_PACKAGES: &[&str] = &[
    "iproute2",
    "iputils-ping",
    "bpftool",
    "tcpdump",
    "procps",
    "curl",
    "util-linux",
    // CNI tests: the reference plugins chained with ipq-cni, and a real runtime.
    "containernetworking-plugins",
    "podman",
    "runc",
    "busybox-static",
    // ipq-ipam's dhcp delegate test: a real DHCP server in the lab's namespaces.
    "dnsmasq-base",
    // The CRI tier: containerd (its CRI plugin built in) run by the tests, and protoc for the
    // CRI client's generated code (k8s-cri's build script).
    "containerd",
    "protobuf-compiler",
    // Observability tests: promtool and a real Prometheus server scraping the lab.
    "prometheus",
    // The kernel tier (xtask/src/kernels): QEMU, Debian's keyring for the kernel packages'
    // signatures, strip for the initramfs (busybox-static above is its userland).
    "qemu-system-x86",
    "debian-archive-keyring",
    "binutils",
    // `cargo xtask bench`: the nftables netdev set the datapath is compared with.
    "nftables",
    // Reuse-hygiene tests: a Service DNAT in nftables (above), and conntrack -L as the witness.
    "conntrack",
];

/// How much of the setup a command needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// What building the eBPF programs needs: nightly, its rust-src, bpf-linker.
    Build,
    /// Everything `cargo xtask test` needs besides: nightly's clippy, bpffs, Debian packages.
    All,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Present,
    Installed,
}

struct Step {
    name: &'static str,
    run: fn() -> Result<Outcome>,
}

const BUILD_STEPS: &[Step] = &[
    Step {
        name: "nightly toolchain",
        run: nightly_toolchain,
    },
    Step {
        name: "nightly rust-src",
        run: rust_src,
    },
    Step {
        name: "bpf-linker",
        run: bpf_linker,
    },
];

const SYSTEM_STEPS: &[Step] = &[
    Step {
        name: "nightly clippy",
        run: nightly_clippy,
    },
    Step {
        name: "bpf filesystem",
        run: bpf_filesystem,
    },
    Step {
        name: "debian packages",
        run: debian_packages,
    },
    // The deploy tests' checkers, after the Debian packages (they need python3 and npm).
    Step {
        name: "kubernetes-validate",
        run: crate::tools::kubernetes_validate,
    },
    Step {
        name: "grafana dashboard schema",
        run: crate::tools::grafana_schema,
    },
];

/// `cargo xtask setup`: runs every step of `scope`, one line per step.
pub fn run(scope: Scope) -> Result<()> {
    if !run_steps(scope, true)? {
        println!("setup: nothing to do");
    }
    Ok(())
}

/// What other commands call before they work: the same steps as [`run`], but only the steps that
/// had to install something are reported.
pub fn ensure(scope: Scope) -> Result<()> {
    run_steps(scope, false).map(|_| ())
}

/// Runs the steps of `scope`; returns whether any of them installed something.
fn run_steps(scope: Scope, verbose: bool) -> Result<bool> {
    let system: &[Step] = match scope {
        Scope::Build => &[],
        Scope::All => SYSTEM_STEPS,
    };
    let mut changed = false;
    for step in BUILD_STEPS.iter().chain(system) {
        let outcome = (step.run)().with_context(|| format!("setup: {}: failed", step.name))?;
        match outcome {
            Outcome::Present if verbose => println!("setup: {}: ok (already present)", step.name),
            Outcome::Present => {}
            Outcome::Installed => println!("setup: {}: installed", step.name),
        }
        changed |= outcome == Outcome::Installed;
    }
    Ok(changed)
}

fn nightly_toolchain() -> Result<Outcome> {
    let has_nightly = || -> Result<bool> {
        let list = util::output(&mut cmd("rustup", ["toolchain", "list"]))
            .context("cannot list rustup toolchains; install rustup from https://rustup.rs")?;
        Ok(list.lines().any(|line| line.starts_with("nightly")))
    };
    if has_nightly()? {
        return Ok(Outcome::Present);
    }
    util::run(&mut cmd(
        "rustup",
        ["toolchain", "install", "nightly", "--profile", "minimal"],
    ))
    .context(
        "installing the nightly toolchain failed; check network access to static.rust-lang.org \
         or run `rustup toolchain install nightly --profile minimal` by hand",
    )?;
    if !has_nightly()? {
        bail!("rustup installed nightly but `rustup toolchain list` does not show it");
    }
    Ok(Outcome::Installed)
}

fn rust_src() -> Result<Outcome> {
    nightly_component("rust-src", "building for the bpf target needs it")
}

fn nightly_clippy() -> Result<Outcome> {
    nightly_component(
        "clippy",
        "`cargo xtask test` lints the kernel crate for the bpf target",
    )
}

/// Makes sure the nightly toolchain has `component`; `why` is for the error message.
fn nightly_component(component: &str, why: &str) -> Result<Outcome> {
    let installed = || -> Result<bool> {
        let args = ["component", "list", "--toolchain", "nightly", "--installed"];
        let list = util::output(&mut cmd("rustup", args))
            .context("cannot list the nightly toolchain's components")?;
        // Lines are `rust-src` or, for per-target components, `clippy-x86_64-unknown-linux-gnu`.
        let prefix = format!("{component}-");
        Ok(list
            .lines()
            .map(str::trim)
            .any(|line| line == component || line.starts_with(&prefix)))
    };
    if installed()? {
        return Ok(Outcome::Present);
    }
    let args = ["component", "add", component, "--toolchain", "nightly"];
    util::run(&mut cmd("rustup", args)).with_context(|| {
        format!(
            "adding {component} to nightly failed ({why}); check network access or run \
             `rustup component add {component} --toolchain nightly` by hand"
        )
    })?;
    if !installed()? {
        bail!("rustup added {component} but does not list it as installed on nightly");
    }
    Ok(Outcome::Installed)
}

fn bpf_filesystem() -> Result<Outcome> {
    let mounted = || -> Result<bool> {
        let mounts = fs::read_to_string("/proc/mounts").context("cannot read /proc/mounts")?;
        Ok(mounts.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            matches!(fields.as_slice(), [_, "/sys/fs/bpf", "bpf", ..])
        }))
    };
    if mounted()? {
        return Ok(Outcome::Present);
    }
    util::require_root(
        "mounting the bpf filesystem at /sys/fs/bpf",
        "run `cargo xtask setup` as root, or `sudo mount -t bpf bpf /sys/fs/bpf`",
    )?;
    util::run(&mut cmd("mount", ["-t", "bpf", "bpf", "/sys/fs/bpf"]))
        .context("cannot mount the bpf filesystem; does the kernel have CONFIG_BPF_SYSCALL?")?;
    if !mounted()? {
        bail!("`mount -t bpf bpf /sys/fs/bpf` succeeded but /proc/mounts does not show it");
    }
    Ok(Outcome::Installed)
}

fn debian_packages() -> Result<Outcome> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        return Ok(Outcome::Present);
    }
    let list = missing.join(" ");
    util::require_root(
        &format!("installing the test packages ({list})"),
        &format!("run `cargo xtask setup` as root, or `sudo apt-get install {list}`"),
    )?;
    util::run(&mut cmd("apt-get", ["update"]))
        .context("`apt-get update` failed; check the apt sources and network access")?;
    let mut install = cmd("apt-get", ["install", "-y", "--no-install-recommends"]);
    install
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut install).with_context(|| format!("cannot install {list} with apt-get"))?;
    let still_missing = missing_packages()?;
    if !still_missing.is_empty() {
        bail!(
            "apt-get ran but these are still not installed: {}",
            still_missing.join(" ")
        );
    }
    Ok(Outcome::Installed)
}

fn missing_packages() -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for &package in TEST_PACKAGES {
        let mut query = cmd("dpkg-query", ["-W", "-f=${Status}", package]);
        let out = util::probe(&mut query).context(
            "dpkg-query is missing: setup installs the test packages with apt on Debian-like \
             systems only; elsewhere install the equivalents of TEST_PACKAGES in \
             xtask/src/setup.rs by hand",
        )?;
        // Unknown packages make dpkg-query exit non-zero; both mean "not installed".
        let status = String::from_utf8_lossy(&out.stdout);
        if !(out.status.success() && status.contains("install ok installed")) {
            missing.push(package);
        }
    }
    Ok(missing)
}
