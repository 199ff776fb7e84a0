//! `cargo xtask setup`: idempotent bootstrap of the tools building and testing ipq needs.
//!
//! Every step first checks whether its tool is already there and only installs what is missing,
//! so running setup again is cheap and changes nothing.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::util::{self, cmd, nightly};

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

fn bpf_linker() -> Result<Outcome> {
    if find_bpf_linker().is_some() {
        return Ok(Outcome::Present);
    }
    install_bpf_linker()?;
    if find_bpf_linker().is_none() {
        bail!(
            "`cargo install bpf-linker` succeeded but `rustup run nightly bpf-linker --version` \
             still fails; check that {} is on PATH and run that command to see why",
            cargo_bin_dir().display()
        );
    }
    Ok(Outcome::Installed)
}

/// Finds a `bpf-linker` that runs, on PATH or in cargo's bin directory. It is run the way the
/// eBPF build runs it: aya-build builds with `rustup run nightly cargo`, so the linker runs with
/// nightly's `lib` on LD_LIBRARY_PATH (a bpf-linker linked to nightly's LLVM needs that, and
/// stops running when nightly's LLVM changes; setup then rebuilds it). When it is only in cargo's
/// bin directory, that directory is put on this process's PATH, so that the builds xtask starts
/// (which invoke `bpf-linker` by name) find it too.
fn find_bpf_linker() -> Option<PathBuf> {
    let candidates = which::which("bpf-linker")
        .ok()
        .into_iter()
        .chain([cargo_bin_dir().join("bpf-linker")]);
    for path in candidates {
        let runs =
            util::probe(&mut nightly(&path, ["--version"])).is_ok_and(|o| o.status.success());
        if runs {
            if which::which("bpf-linker").ok().as_ref() != Some(&path) {
                prepend_to_path(path.parent()?);
            }
            return Some(path);
        }
    }
    None
}

/// Builds bpf-linker against the nightly toolchain's own LLVM (no system LLVM needed): cargo
/// install with `LLVM_PREFIX` pointing at a directory whose `lib/libLLVM.so` links to the
/// toolchain's `libLLVM.so.*`, and the `llvm-<major>` feature matching that LLVM.
fn install_bpf_linker() -> Result<()> {
    let sysroot = util::output(&mut nightly("rustc", ["--print", "sysroot"]))
        .context("cannot find the nightly toolchain's sysroot")?;
    let sysroot_lib = Path::new(sysroot.trim()).join("lib");
    let version = util::output(&mut nightly("rustc", ["-vV"]))?;
    let major = llvm_major(&version).with_context(|| {
        format!("cannot read the LLVM version from `rustc +nightly -vV`:\n{version}")
    })?;
    let libllvm = find_libllvm(&sysroot_lib)?;

    let prefix = util::workspace_root().join("target/xtask/llvm-prefix");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    // `lib/libLLVM.so` is what the build links against. The second link, under the library's
    // own name, lets the installed binary (whose RUNPATH is this `lib`) also run outside
    // `rustup run nightly`, for as long as this directory exists.
    let soname = libllvm.file_name().context("libLLVM has a file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(soname)] {
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("cannot link {} -> {}", link.display(), libllvm.display()))?;
    }

    let features = format!("llvm-{major}");
    // --force: a bpf-linker that no longer runs (built against an older nightly's LLVM) is
    // still "installed" as far as cargo is concerned.
    let args = [
        "install",
        "bpf-linker",
        "--force",
        "--no-default-features",
        "--features",
        &features,
    ];
    util::run(nightly("cargo", args).env("LLVM_PREFIX", &prefix)).with_context(|| {
        format!(
            "building bpf-linker against nightly's LLVM {major} failed (see the compiler \
             output above); check network access to crates.io, or install a bpf-linker built \
             for LLVM {major} on PATH by hand"
        )
    })
}

/// `LLVM version: 22.1.4` -> 22.
fn llvm_major(rustc_vv: &str) -> Option<u32> {
    let version = rustc_vv
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version:"))?;
    version.trim().split('.').next()?.parse().ok()
}

fn find_libllvm(sysroot_lib: &Path) -> Result<PathBuf> {
    let entries = fs::read_dir(sysroot_lib)
        .with_context(|| format!("cannot list {}", sysroot_lib.display()))?;
    for entry in entries {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("libLLVM.so.")
        {
            return Ok(entry.path());
        }
    }
    bail!(
        "no libLLVM.so.* in {}: this nightly ships no shared LLVM to build bpf-linker against; \
         install bpf-linker by hand (with an LLVM matching `rustc +nightly -vV`)",
        sysroot_lib.display()
    )
}

/// Where `cargo install` puts binaries.
fn cargo_bin_dir() -> PathBuf {
    if let Some(root) = env::var_os("CARGO_INSTALL_ROOT") {
        return PathBuf::from(root).join("bin");
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"));
    cargo_home.join("bin")
}

fn prepend_to_path(dir: &Path) {
    let old = env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(env::split_paths(&old));
    if let Ok(new) = env::join_paths(dirs) {
        // Only xtask's own thread runs at this point; the children it starts inherit this.
        env::set_var("PATH", new);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_vv() {
        let vv = "rustc 1.97.0-nightly\nbinary: rustc\nLLVM version: 22.1.4\n";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(llvm_major("rustc 1.97.0-nightly\n"), None);
    }
}
