//! `cargo xtask setup`: idempotent bootstrap of the tools building and testing ipq needs.
//!
//! Every step first checks whether its tool is already there and only installs what is missing,
//! so running setup again is cheap and changes nothing.

use std::fs;

use anyhow::{bail, Context, Result};

use crate::toolchain;
use crate::util::{self, cmd};

mod bpf_linker;

use bpf_linker::bpf_linker;

/// Debian packages, grouped by who runs them, so that each command installs only what it uses
/// (the netns demo must not wait for QEMU or Prometheus). Add a package to the group of the
/// first command that starts using it.
///
/// What the netns demo (and every privileged test) runs: namespaces and veths, ping, the
/// metrics fetched with curl, nsenter, kill.
const NETNS_PACKAGES: &[&str] = &["iproute2", "iputils-ping", "procps", "curl", "util-linux"];

/// What running pods needs: the reference CNI plugins chained with ipq-cni, runc, busybox for
/// the images built locally, and protoc for the CRI client's generated code (k8s-cri's build
/// script, so the test crate does not build without it).
const POD_PACKAGES: &[&str] = &[
    "containernetworking-plugins",
    "runc",
    "busybox-static",
    "protobuf-compiler",
];

/// The cluster tier (Debian's Prometheus scraping the agent's pod with the shipped rules) and
/// the observability tests (promtool, a Prometheus server scraping the lab).
///
/// netcat-openbsd: the image of Kubernetes' networking e2e tests (agnhost) runs `nc -u` for
/// their UDP checks from a node (busybox's nc has no UDP), and dig (bind9-dnsutils) for their
/// DNS probes. iptables: kube-proxy's (iptables mode) on the three-node cluster's nodes, and
/// flannel's image.
const CLUSTER_PACKAGES: &[&str] = &["prometheus", "netcat-openbsd", "bind9-dnsutils", "iptables"];

/// The CRI tier and its demo: Debian's containerd 1.6 (its CRI plugin built in).
const CRI_PACKAGES: &[&str] = &["containerd"];

/// The rest of `cargo xtask test` (and bench, and the kernel tier).
const TEST_ONLY_PACKAGES: &[&str] = &[
    "bpftool",
    "tcpdump",
    "podman",
    // ipq-ipam's dhcp delegate test: a real DHCP server in the lab's namespaces.
    "dnsmasq-base",
    // The kernel tier (xtask/src/kernels): QEMU, Debian's keyring for the kernel packages'
    // signatures, strip for the initramfs (busybox-static above is its userland).
    "qemu-system-x86",
    // The arm64 kernel tier (`test-kernels --arch arm64`): qemu-system-aarch64.
    "qemu-system-arm",
    "debian-archive-keyring",
    "binutils",
    // `cargo xtask bench`: the nftables netdev set the datapath is compared with.
    "nftables",
    // Reuse-hygiene tests: a Service DNAT in nftables (above), and conntrack -L as the witness.
    "conntrack",
];

/// Building for aarch64 (`cargo xtask build --arch arm64`): Debian's cross gcc links the
/// binaries (and compiles `ring`'s C), the cross libc is what it links against (the gcc package
/// only recommends it).
const ARM64_PACKAGES: &[&str] = &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];

/// How much of the setup a command needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    /// What building the eBPF programs needs: the pinned nightly, its rust-src, bpf-linker.
    Build,
    /// The default demo: Build, bpffs and the netns tools.
    Demo,
    /// The containerd demo: Demo, plus pods and Debian's containerd.
    DemoContainerd,
    /// The cluster tier: Demo, plus pods and the Kubernetes components built from Go modules.
    Cluster,
    /// Building for aarch64 on another machine: Build, the rustup target and Debian's cross
    /// gcc.
    Arm64,
    /// Everything `cargo xtask test` (and bench, test-kernels, plain `setup`) needs.
    #[value(name = "test")]
    All,
}

impl Scope {
    fn packages(self) -> Vec<&'static str> {
        let groups: &[&[&str]] = match self {
            Scope::Build => &[],
            Scope::Arm64 => &[ARM64_PACKAGES],
            Scope::Demo => &[NETNS_PACKAGES],
            Scope::DemoContainerd => &[NETNS_PACKAGES, POD_PACKAGES, CRI_PACKAGES],
            Scope::Cluster => &[NETNS_PACKAGES, POD_PACKAGES, CLUSTER_PACKAGES],
            Scope::All => &[
                NETNS_PACKAGES,
                POD_PACKAGES,
                CRI_PACKAGES,
                CLUSTER_PACKAGES,
                TEST_ONLY_PACKAGES,
                ARM64_PACKAGES,
            ],
        };
        groups.concat()
    }

    fn steps(self) -> Vec<&'static Step> {
        let mut steps: Vec<&Step> = BUILD_STEPS.iter().collect();
        match self {
            Scope::Build => {}
            // A cross build mounts nothing: no bpffs.
            Scope::Arm64 => steps.push(&DEBIAN_PACKAGES),
            _ => steps.extend([&BPF_FILESYSTEM, &DEBIAN_PACKAGES]),
        }
        match self {
            Scope::Cluster => steps.extend(&CLUSTER_STEPS),
            Scope::Arm64 => steps.push(&AARCH64_TARGET),
            Scope::All => steps.extend(
                CLUSTER_STEPS
                    .iter()
                    .chain(&TEST_STEPS)
                    .chain([&AARCH64_TARGET]),
            ),
            _ => {}
        }
        steps
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Present,
    Installed,
}

struct Step {
    name: &'static str,
    run: fn(Scope) -> Result<Outcome>,
}

const BUILD_STEPS: [Step; 3] = [
    Step {
        name: "pinned nightly toolchain",
        run: |_| nightly_toolchain(),
    },
    Step {
        name: "pinned nightly rust-src",
        run: |_| rust_src(),
    },
    Step {
        name: "bpf-linker",
        run: |_| bpf_linker(),
    },
];

const BPF_FILESYSTEM: Step = Step {
    name: "bpf filesystem",
    run: |_| bpf_filesystem(),
};

const DEBIAN_PACKAGES: Step = Step {
    name: "debian packages",
    run: debian_packages,
};

/// After the Debian packages: the target's standard library is useless without the cross gcc.
const AARCH64_TARGET: Step = Step {
    name: "rustup target aarch64-unknown-linux-gnu",
    run: |_| rustup_target(crate::cross::Arch::Arm64.triple()),
};

/// The cluster tier's Go components, helm among them: in `Scope::All` too, because the host
/// suite's Helm chart tests (tests/tests/helm_chart.rs) lint and render with that helm.
const CLUSTER_STEPS: [Step; 1] = [Step {
    name: "cluster components and helm (go)",
    run: |_| crate::cluster_build::ensure(),
}];

const TEST_STEPS: [Step; 3] = [
    Step {
        name: "pinned nightly clippy",
        run: |_| nightly_clippy(),
    },
    // The deploy tests' checkers, after the Debian packages (they need python3 and npm).
    Step {
        name: "kubernetes-validate",
        run: |_| crate::tools::kubernetes_validate(),
    },
    Step {
        name: "grafana dashboard schema",
        run: |_| crate::tools::grafana_schema(),
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

/// Waits until no other xtask on this machine is setting up, and holds that until the returned
/// file is dropped: two at once (a `cargo xtask test` and a `test-kernels` started beside it)
/// would each run apt and build the same Go binaries into the same paths. No step sets up
/// another scope itself: a nested call would wait for its own caller.
fn setup_lock() -> Result<fs::File> {
    let path = util::workspace_root()
        .join("target")
        .join(".xtask-setup.lock");
    util::exclusive_lock(&path, "setup: another xtask is setting up this machine")
}

/// Runs the steps of `scope`; returns whether any of them installed something.
fn run_steps(scope: Scope, verbose: bool) -> Result<bool> {
    let _lock = setup_lock()?;
    let mut changed = false;
    for step in scope.steps() {
        let outcome = (step.run)(scope).with_context(|| format!("setup: {}: failed", step.name))?;
        match outcome {
            Outcome::Present if verbose => println!("setup: {}: ok (already present)", step.name),
            Outcome::Present => {}
            Outcome::Installed => println!("setup: {}: installed", step.name),
        }
        changed |= outcome == Outcome::Installed;
    }
    Ok(changed)
}

/// Installs exactly the pinned nightly (with rust-src, minimal profile) when rustup does not list
/// it. The check reads `rustup toolchain list`: running the toolchain to see whether it is there
/// would make rustup install it on its own, quietly.
fn nightly_toolchain() -> Result<Outcome> {
    let pinned = toolchain::pinned_nightly()?;
    let has_pinned = || -> Result<bool> {
        let list = util::output(&mut cmd("rustup", ["toolchain", "list"]))
            .context("cannot list rustup toolchains; install rustup from https://rustup.rs")?;
        let prefix = format!("{pinned}-");
        Ok(list.lines().any(|line| {
            line.split_whitespace().next() == Some(pinned) || line.starts_with(&prefix)
        }))
    };
    if has_pinned()? {
        return Ok(Outcome::Present);
    }
    let args = [
        "toolchain",
        "install",
        pinned,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ];
    util::run(&mut cmd("rustup", args)).with_context(|| {
        format!(
            "cannot install the pinned nightly {pinned} (from {}), which builds the eBPF \
             programs; check network access to static.rust-lang.org, or run `rustup toolchain \
             install {pinned} --profile minimal --component rust-src` by hand",
            toolchain::PIN_FILE
        )
    })?;
    if !has_pinned()? {
        bail!("rustup installed {pinned} but `rustup toolchain list` does not show it");
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

/// Makes sure the pinned nightly has `component`; `why` is for the error message.
fn nightly_component(component: &str, why: &str) -> Result<Outcome> {
    let pinned = toolchain::pinned_nightly()?;
    let installed = || -> Result<bool> {
        let args = ["component", "list", "--toolchain", pinned, "--installed"];
        let list = util::output(&mut cmd("rustup", args))
            .with_context(|| format!("cannot list the components of {pinned}"))?;
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
    let args = ["component", "add", component, "--toolchain", pinned];
    util::run(&mut cmd("rustup", args)).with_context(|| {
        format!(
            "adding {component} to {pinned} failed ({why}); check network access or run \
             `rustup component add {component} --toolchain {pinned}` by hand"
        )
    })?;
    if !installed()? {
        bail!("rustup added {component} but does not list it as installed on {pinned}");
    }
    Ok(Outcome::Installed)
}

/// Adds `triple`'s standard library to the toolchain that builds the workspace (the one rustup
/// picks in its root), unless `rustup target list --installed` lists it there already.
fn rustup_target(triple: &str) -> Result<Outcome> {
    let root = util::workspace_root();
    let installed = || -> Result<bool> {
        let mut list = cmd("rustup", ["target", "list", "--installed"]);
        let list = util::output(list.current_dir(&root)).context(
            "cannot list rustup's installed targets; install rustup from https://rustup.rs",
        )?;
        Ok(list.lines().any(|line| line.trim() == triple))
    };
    if installed()? {
        return Ok(Outcome::Present);
    }
    let mut add = cmd("rustup", ["target", "add", triple]);
    util::run(add.current_dir(&root)).with_context(|| {
        format!(
            "cannot add the rust target {triple} (cross builds need its standard library); \
             check network access to static.rust-lang.org, or run `rustup target add {triple}` \
             by hand"
        )
    })?;
    if !installed()? {
        bail!("rustup added {triple} but `rustup target list --installed` does not show it");
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

fn debian_packages(scope: Scope) -> Result<Outcome> {
    let missing = missing_packages(scope)?;
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
    let still_missing = missing_packages(scope)?;
    if !still_missing.is_empty() {
        bail!(
            "apt-get ran but these are still not installed: {}",
            still_missing.join(" ")
        );
    }
    Ok(Outcome::Installed)
}

fn missing_packages(scope: Scope) -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for package in scope.packages() {
        let mut query = cmd("dpkg-query", ["-W", "-f=${Status}", package]);
        let out = util::probe(&mut query).context(
            "dpkg-query is missing: setup installs the test packages with apt on Debian-like \
             systems only; elsewhere install the equivalents of the package lists in \
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
