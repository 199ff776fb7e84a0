//! The kernel tier: Debian's own kernels booted under QEMU (TCG), each running the datapath
//! verdict table and the netns labs (traffic, stale traffic, duplicate source, a restart) from
//! an initramfs, with the results read back from the serial console.
//!
//! The kernels, the modules and the tests are listed in `xtask/kernels.toml`. Downloads and
//! unpacked kernels are cached under `target/kernels/`.

mod cpio;
mod fetch;
mod foreign_userland;
mod initramfs;
mod qemu;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::cross::Arch;
use crate::test::Totals;
use crate::util;

/// `xtask/kernels.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kernels: Vec<Kernel>,
    pub modules: Vec<String>,
    pub tests: Vec<TestSet>,
    pub qemu: QemuConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    pub name: String,
    /// The architecture it boots on (amd64 when left out): arm64 kernels boot in
    /// `qemu-system-aarch64` and run the tests built for aarch64.
    #[serde(default)]
    pub arch: Arch,
    pub package: String,
    /// `URI SUITE` of the apt source that has `package`.
    pub source: String,
    /// Modules this kernel needs loaded ahead of the common ones (`modules`), e.g. a crypto
    /// algorithm a module asks for at init through modprobe, which the initramfs has not.
    #[serde(default)]
    pub modules: Vec<String>,
    /// This kernel's limit in seconds, where it differs from `qemu.timeout_secs`: an arm64
    /// guest under TCG on an x86-64 host runs the same tests several times slower.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// This kernel's time scale, where it differs from `qemu.time_scale`: the same reason.
    #[serde(default)]
    pub time_scale: Option<u32>,
    /// Whether `cargo xtask test` (and so CI) boots this kernel. Every amd64 kernel is booted
    /// there whatever this says; an arm64 kernel only when it is set: aarch64 under TCG runs
    /// the tier several times slower, so CI boots one arm64 kernel and `cargo xtask
    /// test-kernels --arch arm64` the rest.
    #[serde(default)]
    pub in_test: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestSet {
    /// A `[[test]]` target of the ipq-tests package.
    pub target: String,
    /// Exact test names; every test of the target when empty.
    #[serde(default)]
    pub names: Vec<String>,
    /// The kernels (by name) that run this set; every kernel when empty. For what only some
    /// kernels have (the watcher's trampolines attach where BTF lets fentry take every hook's
    /// arguments: not 5.10).
    #[serde(default)]
    pub kernels: Vec<String>,
}

impl TestSet {
    /// Whether the kernel named `kernel` runs this set.
    pub fn runs_on(&self, kernel: &str) -> bool {
        self.kernels.is_empty() || self.kernels.iter().any(|k| k == kernel)
    }

    /// The sets `kernel` runs, one per target: two sets of a target that both run on it (tests
    /// only some kernels run, beside those every kernel runs) are one run of the target with
    /// both sets' names, so that the console's one exit per run answers for both. A set that
    /// names no test runs the whole target.
    pub fn for_kernel<'a>(sets: impl IntoIterator<Item = &'a TestSet>, kernel: &str) -> Vec<Self> {
        let mut merged: Vec<TestSet> = Vec::new();
        for set in sets.into_iter().filter(|set| set.runs_on(kernel)) {
            match merged.iter_mut().find(|m| m.target == set.target) {
                None => merged.push(set.clone()),
                Some(m) if m.names.is_empty() => {}
                Some(m) if set.names.is_empty() => m.names.clear(),
                Some(m) => {
                    for name in &set.names {
                        if !m.names.contains(name) {
                            m.names.push(name.clone());
                        }
                    }
                }
            }
        }
        merged
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QemuConfig {
    pub memory_mib: u32,
    pub cpus: u32,
    pub time_scale: u32,
    pub timeout_secs: u64,
}

fn config_path() -> PathBuf {
    util::workspace_root().join("xtask/kernels.toml")
}

pub fn load_config() -> Result<Config> {
    let path = config_path();
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let config: Config =
        toml::from_str(&text).with_context(|| format!("{} is not valid", path.display()))?;
    if config.kernels.is_empty() || config.tests.is_empty() {
        bail!("{}: needs at least one kernel and one test", path.display());
    }
    for set in &config.tests {
        for kernel in &set.kernels {
            if !config.kernels.iter().any(|k| &k.name == kernel) {
                bail!(
                    "{}: test target {} names kernel {kernel:?}, which is not in `kernels`",
                    path.display(),
                    set.target
                );
            }
        }
    }
    if config.qemu.time_scale == 0
        || config.qemu.cpus == 0
        || config.kernels.iter().any(|k| k.time_scale == Some(0))
    {
        bail!(
            "{}: qemu.time_scale, a kernel's time_scale and qemu.cpus must be at least 1",
            path.display()
        );
    }
    Ok(config)
}

/// The root of everything the tier caches: `target/kernels`.
pub fn cache_dir() -> PathBuf {
    util::workspace_root().join("target/kernels")
}

/// What one kernel did.
struct Outcome {
    name: String,
    took: Duration,
    totals: Totals,
    /// Why the kernel failed, if it did.
    failure: Option<String>,
}

/// What the whole tier did.
#[derive(Default)]
pub struct Tier {
    /// The libtest totals of every kernel.
    pub totals: Totals,
    /// `<kernel>: <why>` for every kernel that could not be booted or had a test fail.
    pub failures: Vec<String>,
}

/// Runs the tier on the kernels named in `only` (every kernel when empty). An error means the
/// tier could not even start (bad config, no test binaries, apt sources unreachable); a kernel
/// that fails is reported in [`Tier::failures`] and the next one still runs.
pub fn run(arch: Arch, only: &[String]) -> Result<Tier> {
    Ok(prepare(arch, only)?.boot_all())
}

/// What a tier needs before its first boot: the test binaries built and every kernel
/// downloaded and unpacked. Made on one thread, so that two tiers booted at once (amd64 and
/// arm64, `cargo xtask test`) never build into one target dir or download into one apt cache
/// together; [`Prepared::boot_all`] then touches only its own kernels' directories.
pub struct Prepared {
    config: Config,
    kernels: Vec<(Kernel, fetch::Tree)>,
    binaries: initramfs::TestBinaries,
    started: Instant,
}

/// Builds the test binaries for `arch` and fetches the kernels named in `only` (all of
/// `arch` when empty).
pub fn prepare(arch: Arch, only: &[String]) -> Result<Prepared> {
    let started = Instant::now();
    let config = load_config()?;
    let selected = select(&config, arch, only)?;
    let binaries = initramfs::TestBinaries::build(arch, &config.tests)?;
    let mut fetcher = fetch::Fetcher::new(arch, &config.kernels);
    let mut kernels = Vec::new();
    for kernel in selected {
        let tree = fetcher
            .kernel(&kernel)
            .with_context(|| format!("kernel {}: {}", kernel.name, kernel.package))?;
        kernels.push((kernel, tree));
    }
    Ok(Prepared {
        config,
        kernels,
        binaries,
        started,
    })
}

impl Prepared {
    /// Boots every kernel in turn; a kernel that fails is reported and the next one runs.
    pub fn boot_all(self) -> Tier {
        let mut outcomes = Vec::new();
        for (kernel, tree) in &self.kernels {
            let began = Instant::now();
            println!("==> kernel {}: {}", kernel.name, kernel.package);
            let result = initramfs::build(&self.config, kernel, tree, &self.binaries)
                .and_then(|initrd| qemu::boot(&self.config, kernel, tree, &initrd));
            let (totals, failure) = match result {
                Ok(report) => (report.totals, report.failure),
                Err(e) => (Totals::default(), Some(format!("{e:#}"))),
            };
            let outcome = Outcome {
                name: kernel.name.clone(),
                took: began.elapsed(),
                totals,
                failure,
            };
            println!(
                "==> kernel {}: {} in {:.0?} ({} passed, {} failed)",
                outcome.name,
                if outcome.failure.is_none() {
                    "ok"
                } else {
                    "FAILED"
                },
                outcome.took,
                outcome.totals.passed,
                outcome.totals.failed
            );
            outcomes.push(outcome);
        }
        summarise(&outcomes, self.started)
    }
}

fn summarise(outcomes: &[Outcome], started: Instant) -> Tier {
    let mut totals = Totals::default();
    println!(
        "kernel tier: {} kernels in {:.0?}",
        outcomes.len(),
        started.elapsed()
    );
    let mut failures = Vec::new();
    for outcome in outcomes {
        totals.add(&outcome.totals);
        let verdict = match &outcome.failure {
            None => "ok".to_owned(),
            Some(why) => {
                failures.push(format!("{}: {why}", outcome.name));
                "FAILED".to_owned()
            }
        };
        println!(
            "  {:<6} {verdict:<6} {:>6.0?}  {} passed, {} failed",
            outcome.name, outcome.took, outcome.totals.passed, outcome.totals.failed
        );
    }
    Tier { totals, failures }
}

/// The names of the kernels of `arch` that `cargo xtask test` boots: every amd64 kernel, the
/// arm64 kernels marked `in_test`. Empty when there are none (then the step is left out).
pub fn in_test(arch: Arch) -> Result<Vec<String>> {
    let config = load_config()?;
    Ok(config
        .kernels
        .iter()
        .filter(|k| k.arch == arch && (arch == Arch::Amd64 || k.in_test))
        .map(|k| k.name.clone())
        .collect())
}

/// The kernels of `arch` named in `only` (all of `arch` when empty).
fn select(config: &Config, arch: Arch, only: &[String]) -> Result<Vec<Kernel>> {
    let of_arch: Vec<&Kernel> = config.kernels.iter().filter(|k| k.arch == arch).collect();
    if of_arch.is_empty() {
        bail!(
            "{} lists no kernel for {}",
            config_path().display(),
            arch.name()
        );
    }
    if only.is_empty() {
        return Ok(of_arch.into_iter().cloned().collect());
    }
    only.iter()
        .map(|name| {
            of_arch
                .iter()
                .find(|k| &k.name == name)
                .map(|k| (*k).clone())
                .with_context(|| {
                    let known: Vec<&str> = of_arch.iter().map(|k| k.name.as_str()).collect();
                    format!(
                        "no {} kernel {name:?} in {} (known: {})",
                        arch.name(),
                        config_path().display(),
                        known.join(", ")
                    )
                })
        })
        .collect()
}
