//! The initramfs of one kernel: a static busybox, iproute2's `ip` and `tc`, iputils' `ping`
//! and util-linux's `unshare` (the labs start the agent through it, in PID and mount
//! namespaces of its own as the DaemonSet runs it; busybox's has no `--kill-child`) with the
//! libraries `ldd` lists, the test executables and the agent binaries (debug info
//! stripped), the kernel's modules the tests need (decompressed), and an `/init` that mounts
//! what the tests need, loads the modules, runs the tests and powers off.
//!
//! Guest layout: test executables in `/ipq/deps/<target>` and the agent binaries in `/ipq/`,
//! as in `target/debug`, so the tests find the agent next to themselves. PATH puts
//! `/usr/sbin` and `/usr/bin` (iproute2, ping) ahead of `/bin` (busybox's applets), so the
//! tests' `ip` is iproute2's, which has `netns`; `/init` itself calls iproute2 by full path,
//! since Debian's busybox sh runs its own applets ahead of PATH.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use super::cpio;
use super::fetch::Tree;
use super::foreign_userland::ForeignUserland;
use super::{cache_dir, Config, Kernel, TestSet};
use crate::cross::Arch;
use crate::util::{self, cmd};

/// The agent's binaries the tests start (`workspace_binary`).
const AGENT_BINARIES: [&str; 3] = ["ipq-agent", "ipq", "ipq-cni"];

/// Host tools copied in, with the path they get in the guest.
const TOOLS: [(&str, &str); 4] = [
    ("ip", "/usr/sbin/ip"),
    ("tc", "/usr/sbin/tc"),
    ("ping", "/usr/bin/ping"),
    ("unshare", "/usr/bin/unshare"),
];

/// Printed by `/init` at the start of every line the host reads as a marker.
pub const MARKER: &str = "IPQ-TIER:";

/// The tests to run, built, each with its stripped copy for the guest.
pub struct TestBinaries {
    /// What they were built for.
    arch: Arch,
    /// (test set, stripped executable).
    pub sets: Vec<(TestSet, PathBuf)>,
    /// Stripped agent binaries, by name.
    agent: Vec<(String, PathBuf)>,
}

impl TestBinaries {
    /// Builds the test targets and the agent binaries (a no-op when `cargo xtask test` built
    /// them already) and makes stripped copies under `target/kernels/stage`.
    pub fn build(arch: Arch, sets: &[TestSet]) -> Result<TestBinaries> {
        let root = util::workspace_root();
        let profile_dir = if arch == Arch::host()? {
            // The packages of AGENT_BINARIES: the agent's, the CLI's (`ipq`) and the plugin's.
            let mut build = util::cargo([
                "build", "-p", "ipq", "-p", "ipq-cli", "-p", "ipq-cni", "--bins",
            ]);
            util::run(build.current_dir(&root))
                .context("building the agent and plugin binaries for the kernel tier")?;
            root.join("target/debug")
        } else {
            // Cross-built, and checked: aarch64 ELFs, the host's eBPF object embedded.
            crate::cross::build(arch, false, &["--bins"])
                .context("building the agent and plugin binaries for the kernel tier")?;
            root.join("target").join(arch.triple()).join("debug")
        };
        let built = test_executables(arch, sets)?;
        let stage = match arch {
            Arch::Amd64 => cache_dir().join("stage"),
            other => cache_dir().join(format!("stage-{}", other.name())),
        };
        fs::create_dir_all(stage.join("deps"))
            .with_context(|| format!("cannot create {}", stage.display()))?;
        let mut staged = Vec::new();
        for set in sets {
            let exe = built.get(&set.target).with_context(|| {
                format!(
                    "cargo built no test executable for target {:?} of ipq-tests \
                     (xtask/kernels.toml names it)",
                    set.target
                )
            })?;
            staged.push((
                set.clone(),
                strip(arch, exe, &stage.join("deps").join(&set.target))?,
            ));
        }
        let mut agent = Vec::new();
        for name in AGENT_BINARIES {
            let built = profile_dir.join(name);
            agent.push((name.to_owned(), strip(arch, &built, &stage.join(name))?));
        }
        Ok(TestBinaries {
            arch,
            sets: staged,
            agent,
        })
    }
}

/// `cargo test --no-run --message-format=json` of the selected targets: target name →
/// executable.
fn test_executables(arch: Arch, sets: &[TestSet]) -> Result<BTreeMap<String, PathBuf>> {
    let mut build = util::cargo([
        "test",
        "--no-run",
        "--message-format=json",
        "--package",
        "ipq-tests",
    ]);
    if arch != Arch::host()? {
        build.args(["--target", arch.triple()]);
        crate::cross::cross_environment(&mut build, arch);
    }
    for set in sets {
        build.args(["--test", &set.target]);
    }
    build
        .current_dir(util::workspace_root())
        .stdout(Stdio::piped());
    let line = util::command_line(&build);
    eprintln!("+ {line}");
    let out = build
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        // With --message-format=json the compiler's own errors go to stdout as JSON, so
        // without this the run would end with a bare exit status.
        for text in out.stdout.lines().map_while(std::result::Result::ok) {
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(message) => {
                    if let Some(rendered) = message["message"]["rendered"].as_str() {
                        eprint!("{rendered}");
                    }
                }
                Err(_) => eprintln!("{text}"),
            }
        }
        bail!(
            "`{line}` failed with {} ({})",
            out.status,
            util::free_space_of(&util::workspace_root().join("target"))
        );
    }
    let mut found = BTreeMap::new();
    for text in out.stdout.lines() {
        let text = text?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let is_test = message["profile"]["test"].as_bool() == Some(true);
        let (Some(name), Some(exe)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        if message["reason"] == "compiler-artifact" && is_test {
            found.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    Ok(found)
}

/// A copy of `from` without debug info at `to` (a test binary shrinks ~10x); a foreign
/// binary with its cross binutils' strip (`aarch64-linux-gnu-strip`, which Debian's cross gcc
/// pulls in).
fn strip(arch: Arch, from: &Path, to: &Path) -> Result<PathBuf> {
    if !from.is_file() {
        bail!("{} is missing", from.display());
    }
    let program = match (arch, arch == Arch::host()?) {
        (_, true) => "strip",
        (Arch::Arm64, false) => "aarch64-linux-gnu-strip",
        (Arch::Amd64, false) => "x86_64-linux-gnu-strip",
    };
    util::run(cmd(program, ["--strip-debug", "-o"]).arg(to).arg(from))
        .with_context(|| format!("{program} (binutils, in setup's package lists) failed"))?;
    Ok(to.to_owned())
}

/// Writes `target/kernels/<name>/initramfs.cpio` and returns its path.
pub fn build(
    config: &Config,
    kernel: &Kernel,
    tree: &Tree,
    binaries: &TestBinaries,
) -> Result<PathBuf> {
    let dir = cache_dir().join(&kernel.name);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("initramfs.cpio");

    // Every file: guest path → (mode, host path).
    let mut files: BTreeMap<String, (u32, PathBuf)> = BTreeMap::new();
    if kernel.arch != binaries.arch {
        bail!(
            "kernel {} is {}, the test binaries {}",
            kernel.name,
            kernel.arch.name(),
            binaries.arch.name()
        );
    }
    let mut guest_executables: Vec<(String, PathBuf)> = Vec::new();
    for (set, exe) in &binaries.sets {
        guest_executables.push((format!("/ipq/deps/{}", set.target), exe.clone()));
    }
    for (name, exe) in &binaries.agent {
        guest_executables.push((format!("/ipq/{name}"), exe.clone()));
    }
    if kernel.arch == Arch::host()? {
        files.insert("/bin/busybox".into(), (0o755, static_busybox()?));
        for (tool, guest) in TOOLS {
            let host = which::which(tool).with_context(|| {
                format!(
                    "{tool} is not on PATH (iproute2 and iputils-ping are in setup's list, \
                     util-linux is in every Debian)"
                )
            })?;
            add_with_libraries(&mut files, guest, &host)?;
        }
        for (guest, exe) in &guest_executables {
            add_with_libraries(&mut files, guest, exe)?;
        }
    } else {
        let userland = ForeignUserland::fetch(kernel.arch)?;
        files.insert(
            "/bin/busybox".into(),
            (0o755, userland.busybox().to_owned()),
        );
        for (tool, guest) in TOOLS {
            let host = userland.tool(tool)?;
            userland.add_with_libraries(&mut files, guest, &host)?;
        }
        for (guest, exe) in &guest_executables {
            userland.add_with_libraries(&mut files, guest, exe)?;
        }
    }
    let wanted: Vec<String> = kernel
        .modules
        .iter()
        .chain(&config.modules)
        .cloned()
        .collect();
    let modules = modules_to_load(&wanted, &tree.modules)?;

    let mut dirs: BTreeSet<String> = [
        "/bin",
        "/dev",
        "/proc",
        "/sys",
        "/tmp",
        "/run",
        "/root",
        "/var",
        "/lib/modules",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for guest in files.keys() {
        let mut parent = Path::new(guest).parent();
        while let Some(p) = parent.filter(|p| *p != Path::new("/")) {
            dirs.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
    }

    let mut out = cpio::Writer::create(&path)?;
    for d in &dirs {
        out.dir(d)?;
    }
    out.char_device("/dev/console", 5, 1)?;
    for (guest, (mode, host)) in &files {
        out.copy(guest, *mode, host)?;
    }
    let mut load_order = Vec::new();
    for module in &modules {
        let name = module_file_name(module);
        out.file(&format!("/lib/modules/{name}"), 0o644, &decompress(module)?)?;
        load_order.push(name);
    }
    let init = init_script(config, kernel, &binaries.sets, &load_order);
    out.file("/init", 0o755, init.as_bytes())?;
    let size = out.finish()?;
    println!(
        "initramfs {}: {} MiB, modules: {}",
        path.display(),
        size >> 20,
        if load_order.is_empty() {
            "(all built in)".to_owned()
        } else {
            load_order.join(" ")
        }
    );
    Ok(path)
}

/// `/bin/busybox`, which must be the static one (package busybox-static): the guest has no
/// libraries for it to load before `/init` runs.
fn static_busybox() -> Result<PathBuf> {
    let path = which::which("busybox")
        .context("busybox is not on PATH (busybox-static is in setup's package list)")?;
    let out = util::probe(&mut cmd("ldd", [&path]))?;
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    if !(said.contains("not a dynamic executable") || said.contains("statically linked")) {
        bail!(
            "{} is dynamically linked; install busybox-static (it replaces busybox)",
            path.display()
        );
    }
    Ok(path)
}

/// Adds `host` as `guest`, and every shared library `ldd` lists for it at its own path.
fn add_with_libraries(
    files: &mut BTreeMap<String, (u32, PathBuf)>,
    guest: &str,
    host: &Path,
) -> Result<()> {
    files.insert(guest.to_owned(), (0o755, host.to_owned()));
    let listing = util::output(&mut cmd("ldd", [host]))
        .with_context(|| format!("cannot list the libraries of {}", host.display()))?;
    for line in listing.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        let real = fs::canonicalize(path).with_context(|| format!("cannot resolve {path}"))?;
        files.insert(path.to_owned(), (0o755, real));
    }
    Ok(())
}

/// The `.ko` files to load, dependencies first, for the `wanted` module names; built-in
/// modules need nothing.
fn modules_to_load(wanted: &[String], modules_dir: &Path) -> Result<Vec<PathBuf>> {
    let read = |file: &str| {
        let path = modules_dir.join(file);
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let normal = |name: &str| name.replace('-', "_");
    let stem = |path: &str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        normal(file.split(".ko").next().unwrap_or(file))
    };
    let builtin: BTreeSet<String> = read("modules.builtin")?.lines().map(stem).collect();
    // name → (relative path, dependencies' relative paths in modules.dep order).
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in read("modules.dep")?.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        let needs = rest.split_whitespace().map(String::from).collect();
        deps.insert(stem(module), (module.to_owned(), needs));
    }
    let mut order: Vec<String> = Vec::new();
    for name in wanted {
        let name = normal(name);
        if builtin.contains(&name) {
            continue;
        }
        let (path, needs) = deps.get(&name).with_context(|| {
            format!(
                "module {name} (xtask/kernels.toml) is neither built into this kernel nor in \
                 {}/modules.dep",
                modules_dir.display()
            )
        })?;
        // modules.dep lists the dependencies so that loading them last-first works.
        for dep in needs.iter().rev().chain([path]) {
            if !order.contains(dep) {
                order.push(dep.clone());
            }
        }
    }
    Ok(order.iter().map(|rel| modules_dir.join(rel)).collect())
}

/// `bridge.ko.xz` → `bridge.ko`.
fn module_file_name(path: &Path) -> String {
    let file = path.file_name().unwrap_or_default().to_string_lossy();
    let stem = file.split(".ko").next().unwrap_or(&file);
    format!("{stem}.ko")
}

/// The module's ELF: `.ko` as is, `.ko.xz` decompressed on the host (busybox's insmod in
/// the guest does not read compressed modules).
fn decompress(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    if name.ends_with(".ko") {
        return fs::read(path).with_context(|| format!("cannot read {}", path.display()));
    }
    if !name.ends_with(".ko.xz") {
        bail!(
            "{} is compressed in a way the kernel tier does not handle yet",
            path.display()
        );
    }
    let out = util::probe(cmd("busybox", ["xz", "-dc"]).arg(path))?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!(
            "`busybox xz -dc {}` failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// `/init`: a busybox shell script. Every line the host reads is prefixed with [`MARKER`].
fn init_script(
    config: &Config,
    kernel: &Kernel,
    sets: &[(TestSet, PathBuf)],
    modules: &[String],
) -> String {
    let scale = kernel.time_scale.unwrap_or(config.qemu.time_scale);
    let kernel = kernel.name.as_str();
    let mut s = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=0
export IPQ_TEST_TIME_SCALE={scale}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
ln -s /run /var/run
/usr/sbin/ip link set lo up
echo "{MARKER} booted $(uname -r)"
"#
    );
    for module in modules {
        s.push_str(&format!(
            "insmod /lib/modules/{module} || echo \"{MARKER} insmod-failed {module}\"\n"
        ));
    }
    for set in TestSet::for_kernel(sets.iter().map(|(set, _)| set), kernel) {
        let mut args = String::from("--test-threads=1");
        if !set.names.is_empty() {
            args.push_str(" --exact");
            for name in &set.names {
                args.push(' ');
                args.push_str(name);
            }
        }
        s.push_str(&format!(
            "echo \"{MARKER} run {t}\"\n/ipq/deps/{t} {args} 2>&1\necho \"{MARKER} exit {t} $?\"\n",
            t = set.target
        ));
    }
    s.push_str(&format!("echo \"{MARKER} done\"\npoweroff -f\n"));
    s
}
